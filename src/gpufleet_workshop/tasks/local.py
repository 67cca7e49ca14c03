"""invoke tasks for the local cluster: ``local.install``, ``local.up``, ``local.down``, ``local.status``, ``local.kubeconfig``.

Each task parses its flags and calls one function of :mod:`gpufleet_workshop.local`.
A component that fails to build or start exits with code 1 and its log
tail; a bad flag exits with code 2.
"""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, Context, task
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table

from gpufleet_workshop.local import cluster as local_cluster
from gpufleet_admin.build.gobuild import GoError
from gpufleet_workshop.local.install import install as install_components
from gpufleet_workshop.local.processes import ComponentFailed

_NAME_HELP = f"cluster name (default {local_cluster.DEFAULT_NAME}); clusters with distinct names run side by side"


def _console() -> Console:
    return Console(stderr=True, highlight=False)


@task(help={"force": "rebuild every component even if cached and verified", "only": "comma-separated component names"})
def install(c: Context, force: bool = False, only: str = "") -> None:
    """Build/install and verify every component of the local cluster (a no-op when cached)."""
    console = _console()
    names = [n.strip() for n in only.split(",") if n.strip()] or None
    try:
        results = install_components(names, force=force, console=console)
    except (GoError, KeyError) as exc:
        raise Exit(str(exc), code=1) from None
    total = sum(r.seconds for r in results)
    done = [r for r in results if r.action != "cached"]
    console.print(f"{len(results)} components ready ({len(done)} changed) in {total:.1f}s")


@task(
    help={
        "env": "inventory environment the nodes come from (default local)",
        "nodes": "number of simulated nodes (default: the inventory's)",
        "name": _NAME_HELP,
        "timeout": "seconds each startup phase may take (default 120)",
        "descheduler_policy": "DeschedulerPolicy YAML file to run the descheduler with "
        "(default: RemovePodsViolatingNodeTaints for gpufleet.io/cluster-has-free-gpus)",
        "fresh": "start from empty etcd and Prometheus data (refused while the cluster runs)",
        "real_node": "start the real node (containerd, kubelet, gpufleet's image) beside the simulated ones "
                     "(default; --no-real-node skips it)",
    }
)
def up(
    c: Context,
    env: str = "local",
    nodes: int = 0,
    name: str = local_cluster.DEFAULT_NAME,
    timeout: int = 120,
    descheduler_policy: str = "",
    fresh: bool = False,
    real_node: bool = True,
) -> None:
    """Start the local cluster (idempotent) and print its kubeconfig path."""
    console = _console()
    if nodes < 0:
        raise Exit(f"--nodes {nodes}: expected a positive number", code=2)
    policy = Path(descheduler_policy).resolve() if descheduler_policy else None
    if policy is not None and not policy.is_file():
        why = "a folder, expected a file" if policy.is_dir() else "no such file"
        raise Exit(f"--descheduler-policy {descheduler_policy}: {why}", code=2)
    try:
        install_components(console=console)  # shows build progress; a no-op when cached
        cl = local_cluster.up(
            name, env=env, nodes=nodes or None, timeout=timeout, descheduler_policy_file=policy,
            fresh=fresh, real_node=real_node, log=console.print,
        )
    except ValueError as exc:
        raise Exit(str(exc), code=2) from None
    except (GoError, ComponentFailed, TimeoutError, RuntimeError) as exc:  # NodeError, ImageError included
        raise Exit(str(exc), code=1) from None
    print(cl.kubeconfig)


@task(help={"name": _NAME_HELP, "purge": "also delete the state folder (certs, etcd data) and free the port block"})
def down(c: Context, name: str = local_cluster.DEFAULT_NAME, purge: bool = False) -> None:
    """Stop every process of the local cluster; no process or port is left behind."""
    try:
        stopped = local_cluster.down(name, purge=purge)
    except ValueError as exc:
        raise Exit(str(exc), code=2) from None
    except RuntimeError as exc:
        raise Exit(str(exc), code=1) from None
    _console().print(f"stopped {', '.join(stopped) or 'nothing'}" + (" and purged its state" if purge else ""))


@task(help={"name": _NAME_HELP})
def status(c: Context, name: str = local_cluster.DEFAULT_NAME) -> None:
    """Show each component (pid, health, RSS), the nodes, and the ports; exit 1 unless all is up."""
    try:
        st = local_cluster.status(name)
    except (LookupError, ValueError) as exc:
        raise Exit(str(exc), code=1) from None
    table = Table(title=f"local cluster {name}")
    for col in ("component", "pid", "healthy", "RSS MiB", "port"):
        table.add_column(col)
    port_of = {
        "etcd": "etcd_client", "kube-apiserver": "apiserver", "kube-controller-manager": "controller_manager",
        "kube-scheduler": "scheduler", "kwok": "kwok", "kueue": "kueue_webhook", "jobset": "jobset_webhook",
        "descheduler": "descheduler", "prometheus": "prometheus", "kubelet": "kubelet",
    }
    # The forwards listen on the real node's pod-network gateway, not on loopback.
    lc = local_cluster.get(name)
    shown = {"api-forward": lc.in_cluster_api.removeprefix("https://"),
             "prometheus-forward": lc.in_cluster_prometheus.removeprefix("http://")}
    for comp in st.components:
        if st.real_node is None and comp.name in local_cluster.NODE_COMPONENTS:
            continue
        table.add_row(
            comp.name, str(comp.pid or "-"), "yes" if comp.healthy else "NO",
            f"{comp.rss / 2**20:.0f}" if comp.pid else "-",
            str(st.ports[port_of[comp.name]]) if comp.name in port_of else shown.get(comp.name, "socket"),
        )
    console = Console(highlight=False)
    console.print(table)
    nodes = f"{st.nodes[1]}/{st.nodes[0]} Ready" if st.nodes else "unknown (apiserver down)"
    console.print(f"nodes: {nodes}")
    if (rn := st.real_node) is not None:
        state = {True: "Ready", False: "NOT Ready", None: "unknown"}[rn.ready]
        console.print(f"real node: {rn.name} {state}, {rn.pods if rn.pods is not None else '?'} pods running; "
                      f"images: {', '.join(f'{r} {d[:19]}' for r, d in sorted(rn.images.items())) or 'none'}")
    console.print(f"kubeconfig: {st.kubeconfig}")
    if not st.up:
        raise Exit(code=1)


@task(help={"name": _NAME_HELP})
def kubeconfig(c: Context, name: str = local_cluster.DEFAULT_NAME) -> None:
    """Print only the path of the cluster's admin kubeconfig (``export KUBECONFIG=$(invoke local.kubeconfig)``)."""
    try:
        cl = local_cluster.get(name)
    except (LookupError, ValueError) as exc:
        raise Exit(str(exc), code=1) from None
    print(cl.kubeconfig)


ns = Collection("local", install, up, down, status, kubeconfig)
