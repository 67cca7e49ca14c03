"""``invoke preview``, ``invoke up``, ``invoke destroy``: the Pulumi stack of an environment, for real.

Each task runs the real engine (:mod:`gpufleet_admin.stack.engine`) against a
cluster and streams the engine's output. The Pulumi CLI and the Kubernetes
provider are built from the Go module proxy on first use (``invoke install``
builds them ahead; cold builds take many minutes), cached under
``cache_dir()/components``. State lives in a local file
backend; the passphrase comes from ``PULUMI_CONFIG_PASSPHRASE`` when set.

Which cluster: ``--kubeconfig`` when given; for the ``local`` environment,
the local cluster ``--cluster`` (``invoke local.up``); otherwise
``$KUBECONFIG``. Exit codes: 1 when the engine fails, 2 for a bad
argument or inventory.

Helm releases are not installed by the local environment's stack: the local
cluster runs Kueue, JobSet and the descheduler itself, so
``inventories/local`` switches their chart installs off
(``kueue_install: false``, ``descheduler_install: false``) and the stack
only declares their configuration objects. Chart installs are covered by the
render tests (``tests/stack/test_render.py``: each release's chart,
pinned version and values); a real chart install needs the chart
registries (``registry.k8s.io``, ``*.github.io``), which this machine
cannot reach.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from invoke import Context, task
from invoke.exceptions import Exit

from gpufleet_workshop.tasks.common import fail_on_inventory_error

_HELP = {
    "env": "environment: a folder of inventories/ (local, staging, prod); also the stack name",
    "kubeconfig": "kubeconfig of the target cluster (default: the local cluster for env local, else $KUBECONFIG)",
    "cluster": "local cluster name, for env local without --kubeconfig (default gpufleet)",
    "backend": "folder of the file backend (default: state_dir()/pulumi/backend)",
}


def _target(env: str, kubeconfig: str, cluster: str, backend: str):
    """Resolve the task's flags into an engine Target (exit 2 when no cluster can be named)."""
    from gpufleet_admin.stack.engine import Target, default_backend
    from roles.registry import load

    with fail_on_inventory_error():
        load(env)  # validate before building or starting anything
    config: dict[str, str] = {}
    if kubeconfig:
        path = Path(kubeconfig)
    elif env == "local":
        from gpufleet_workshop.local import cluster as local_cluster

        try:
            lc = local_cluster.get(cluster or local_cluster.DEFAULT_NAME)
        except (LookupError, ValueError) as exc:
            raise Exit(f"local cluster: {exc} (start it with `invoke local.up`)", code=2) from None
        path = lc.kubeconfig
        config.update(local_environment(lc, env))
    elif os.environ.get("KUBECONFIG"):
        path = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    else:
        raise Exit(f"--env {env}: give --kubeconfig (or set KUBECONFIG) for the target cluster", code=2)
    if not path.is_file():
        raise Exit(f"kubeconfig {path} does not exist (is the cluster up?)", code=2)
    from gpufleet_workshop.local.kubeconfig import local_cluster_of

    if env != "local" and (local := local_cluster_of(path)) is not None:
        raise Exit(f"--env {env}: kubeconfig {path} is the local cluster {local!r}; give the {env} cluster's "
                   f"kubeconfig (--kubeconfig or KUBECONFIG)", code=2)
    # Local clusters are recreated often (local.up --fresh, local.down --purge): read the live objects first.
    return Target(env=env, kubeconfig=path.resolve(), backend=Path(backend) if backend else default_backend(),
                  config=config, refresh=env == "local")


def local_environment(lc, env: str = "local") -> dict[str, str]:
    """Make the local cluster ``lc`` ready for the stack of ``env`` and return the stack config it needs.

    gpufleet's pods go to ``lc``'s real node (:func:`gpufleet_workshop.sim.incluster.stack_config`);
    each ``kubernetes`` pool's cluster is started and its Secret written
    (:func:`gpufleet_workshop.sim.incluster.pool_clusters`), so that every virtual kubelet can start.
    """
    from gpufleet_workshop.sim import incluster
    from roles.registry import load

    inv = load(env)
    with lc.kube() as kube:
        incluster.pool_clusters(kube, inv, inv.role("virtual_kubelet").virtual_kubelet_pools,
                                say=lambda m: print(m, flush=True))
    return incluster.stack_config(lc)


def _print(line: str) -> None:
    """Stream one line of the engine's output at once."""
    print(line, flush=True)


def _run(op, target):
    """Run one engine operation; engine failures exit 1 with the engine's message."""
    from gpufleet_admin.stack.engine import EngineError
    from gpufleet_admin.build.gobuild import GoError

    with fail_on_inventory_error():
        try:
            return op(target, _print)
        except (EngineError, GoError) as exc:
            raise Exit(str(exc), code=1) from None


def _confirm(question: str) -> bool:
    """Ask on a terminal; without one, never proceed."""
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _previewed_and_confirmed(preview_op, target, unchanged: str, question: str, refused: str) -> bool:
    """Preview first; False (after printing ``unchanged``) when nothing would change, True on a "y".

    Raises:
        Exit(1): not confirmed (``refused``); the preview's own engine failures.
    """
    result = _run(preview_op, target)
    if not result.changed:
        print(unchanged)
        return False
    if not _confirm(question.format(n=len(result.changes)) + "?"):
        raise Exit(f"{refused} (rerun with --yes)", code=1)
    return True


@task(help=_HELP)
def preview(c: Context, env: str, kubeconfig: str = "", cluster: str = "", backend: str = "") -> None:
    """Show what `invoke up` would change for ENV on its cluster (the engine's preview; nothing is changed)."""
    from gpufleet_admin.stack import engine

    result = _run(engine.preview, _target(env, kubeconfig, cluster, backend))
    print(f"preview --env {env}: {_counts(result.summary)}")


@task(help={**_HELP, "yes": "apply without asking (without it: preview, then ask on a terminal)"})
def up(c: Context, env: str, kubeconfig: str = "", cluster: str = "", backend: str = "", yes: bool = False) -> None:
    """Create or update every object the stack declares for ENV on its cluster (`pulumi up`).

    Without --yes the preview is shown first and the update runs only after
    a "y" on a terminal. The stack is named after ENV; ``gpufleet:*`` values
    in ``Pulumi.<ENV>.yaml`` override inventory variables.
    """
    from gpufleet_admin.stack import engine

    target = _target(env, kubeconfig, cluster, backend)
    if not yes and not _previewed_and_confirmed(engine.preview, target, f"up --env {env}: no changes",
                                                 "apply {n} changes to " + env, "not applied"):
        return
    result = _run(engine.up, target)
    print(f"up --env {env}: {_counts(result.summary)}")


@task(help={**_HELP, "yes": "destroy without asking (without it: show what would go, then ask on a terminal)",
            "remove": "also remove the stack (its history and config) after deleting its resources"})
def destroy(c: Context, env: str, kubeconfig: str = "", cluster: str = "", backend: str = "", yes: bool = False,
            remove: bool = False) -> None:
    """Delete every object the stack created for ENV from its cluster (`pulumi destroy`).

    Only what the stack's state records is deleted; the cluster's own
    objects (and Kueue, JobSet, descheduler of the local cluster) stay.
    """
    from gpufleet_admin.stack import engine

    target = _target(env, kubeconfig, cluster, backend)
    if not yes and not _previewed_and_confirmed(engine.destroy_preview, target, f"destroy --env {env}: nothing to delete",
                                                 "delete {n} resources of " + env, "not destroyed"):
        return
    result = _run(lambda t, p: engine.destroy(t, p, remove=remove), target)
    print(f"destroy --env {env}: {_counts(result.summary)}")


def _counts(summary: dict[str, int]) -> str:
    """``"59 same, 2 update"``: a change summary on one line."""
    return ", ".join(f"{n} {op}" for op, n in sorted(summary.items())) or "nothing"

