"""invoke tasks for training jobs: ``train.render``, ``train.submit``, ``train.checkpoint-interval``,
``train.goodput`` (gpufleet_workshop.tasks.goodput).

Each task parses its flags and calls one function of :mod:`gpufleet_admin.training`.
Bad inputs exit with code 2 and one line per problem (``--flag value:
expected ...``); a job Kueue does not admit in time exits with code 1 and
the Workload's reason.
"""

from __future__ import annotations

import math

import sys
from pathlib import Path

import yaml
from invoke import Collection, Context, task
from invoke.exceptions import Exit

from gpufleet_admin.inventory import InventoryError, environments
from gpufleet_workshop.tasks import goodput
from gpufleet_admin.training import checkpoint
from gpufleet_admin.training import gang as native
from gpufleet_admin.training.render import (GANG_MODES, SETTINGS, TEMPLATES, TOPOLOGIES, TOPOLOGY_MODES, TrainingInputError,
                                      build_context, render_context)
from gpufleet.kube import KubeError
from gpufleet.ops.reads import InputError
from gpufleet_workshop.tasks.common import kube_for
from gpufleet_admin.training.submit import SubmitError, submit as submit_job
from roles.registry import load

_SET_HELP = f"key=value, repeatable; keys: {', '.join(SETTINGS)} (templates/training/README.md)"

_JOB_HELP = {
    "env": "environment: an inventory under inventories/ (local, staging, prod)",
    "template": f"job template: {', '.join(f'{t.name} ({t.description})' for t in TEMPLATES.values())}",
    "name": "job name: a DNS label such as llama-8b-run1",
    "nodes": "nodes the job spans; each node brings all its GPUs",
    "set_": _SET_HELP,
    "queue": "LocalQueue as namespace/name (default: the inventory's first kueue_local_queues entry)",
    "flavor": "ResourceFlavor / GPU model, e.g. h100-sxm-80gb (default: the flavor with most GPUs)",
    "gpus_per_node": "GPUs per node; must equal the flavor's (default: the flavor's)",
    "fleet_nodes": "simulated fleets (local) only: nodes in the fleet, as given to local.up --nodes "
                   "(default: the inventory's fleet_simulated_nodes)",
    "topology": f"fabric level Kueue keeps the gang in: {', '.join(TOPOLOGIES)} (default: the inventory's "
                "training_topology)",
    "topology_mode": f"{' or '.join(TOPOLOGY_MODES)}: only inside one domain of --topology (else the job waits), or "
                     "the smallest that fits, else spread (default: training_topology_mode)",
    "gang": f"who schedules the gang all-or-nothing: {', '.join(GANG_MODES)} (Kueue, Kubernetes' own Workload API, "
            "or both; default: training_gang)",
    "scheduling_api": f"native gang API version, {', '.join(native.SHAPES)} (Kubernetes 1.35, 1.36, 1.37 alpha, 1.37 beta), or auto: "
                      "discover it from the cluster (default auto; --gang native and both only)",
    "kubeconfig": "kubeconfig file (default: $KUBECONFIG or ~/.kube/config; for --env local, the local cluster's)",
    "context": "kubeconfig context (default: the current one)",
}


def _gang_api(env: str, inv, gang: str, scheduling_api: str, kubeconfig: str, context: str) -> native.GangApi | None:
    """The native gang API shape to render: given, or discovered from the cluster (None for --gang kueue).

    Raises ``Exit(code=2)`` naming the flag when the version is unknown, the
    cluster cannot be reached, or it serves no gang API.
    """
    mode = gang or inv.role("training").training_gang
    if mode == "kueue" or mode not in GANG_MODES:
        return None  # a bad --gang is reported with the other inputs
    if scheduling_api and scheduling_api != "auto":
        try:
            return native.by_version(scheduling_api)
        except KeyError as e:
            raise Exit(f"--scheduling-api {e.args[0]} or auto", code=2) from None
    try:
        kube = kube_for(env, kubeconfig or None, context or None)
    except InputError as e:
        raise Exit(f"--gang {mode}: cannot discover the cluster's {native.GROUP} version ({e}): "
                   f"give --scheduling-api {'|'.join(native.SHAPES)}", code=2) from None
    try:
        return native.choose(native.discover(kube))
    except native.NativeGangUnavailable as e:
        raise Exit(str(e), code=2) from None
    except KubeError as e:  # unreachable or refusing server: say which flag avoids it
        raise Exit(f"--gang {mode}: API discovery failed ({type(e).__name__}: {e}): give --scheduling-api "
                   f"{'|'.join(native.SHAPES)}", code=2) from None
    finally:
        kube.close()


def _manifest(env: str, template: str, name: str, nodes: int, set_: list[str] | None, queue: str | None,
              flavor: str | None, gpus_per_node: int, fleet_nodes: int = 0, *, topology: str = "",
              topology_mode: str = "", gang: str = "", scheduling_api: str = "auto", kubeconfig: str = "",
              context: str = "") -> tuple[dict, str]:
    """Validate and render; input problems become ``Exit(code=2)``."""
    if env not in environments():
        raise Exit(f"--env {env!r}: expected one of {', '.join(environments())} (folders of inventories/)", code=2)
    try:
        inv = load(env)
        if fleet_nodes:
            if fleet_nodes < 0 or not inv.fleet.fleet_simulated_nodes:
                raise Exit(f"--fleet-nodes {fleet_nodes}: expected a number of nodes > 0, and only for simulated "
                           f"fleets (inventories/{env} lists its hosts)", code=2)
            inv = load(env, nodes=fleet_nodes)
        gang_api = _gang_api(env, inv, gang, scheduling_api, kubeconfig, context)
        ctx = build_context(inv, template, name, nodes, queue=queue or None, flavor=flavor or None,
                            gpus_per_node=gpus_per_node or None, sets=set_ or [], topology=topology or None,
                            topology_mode=topology_mode or None, gang=gang or None, gang_api=gang_api)
    except (TrainingInputError, InventoryError) as e:
        raise Exit(str(e), code=2) from None
    return ctx, render_context(ctx)


@task(
    iterable=["set_"],
    help={**_JOB_HELP, "out": "write the YAML to this file instead of printing it"},
)
def render(c: Context, env: str = "local", template: str = "jobset", name: str = "", nodes: int = 0,
           set_: list[str] | None = None, queue: str = "", flavor: str = "", gpus_per_node: int = 0,
           fleet_nodes: int = 0, out: str = "", topology: str = "", topology_mode: str = "", gang: str = "",
           scheduling_api: str = "auto", kubeconfig: str = "", context: str = "") -> None:
    """Render a training job (JobSet, PyTorchJob or indexed Job) from the environment's inventory.

    Sizes come from the flavor (GPUs per node), the checkpoint volume and
    NCCL/InfiniBand settings from the inventory, and the checkpoint interval
    from the advisor (train.checkpoint-interval) unless --set
    checkpoint_interval_seconds=N. Placement: --topology/--topology-mode
    (Kueue's topology-aware scheduling); --gang native or both add
    Kubernetes' own gang (the Workload API version the cluster serves, found
    by discovery unless --scheduling-api names it). Example:
    invoke train.render --env local --template jobset --name demo --nodes 2 --topology rack
    """
    _, text = _manifest(env, template, name, nodes, set_, queue, flavor, gpus_per_node, fleet_nodes,
                        topology=topology, topology_mode=topology_mode, gang=gang, scheduling_api=scheduling_api,
                        kubeconfig=kubeconfig, context=context)
    if out:
        try:
            Path(out).write_text(text)
        except OSError as exc:
            raise Exit(f"--out {out}: {exc.strerror} (expected a file path in an existing folder)", code=2) from None
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


@task(
    iterable=["set_"],
    help={
        **_JOB_HELP,
        "dry_run": "validate and print the manifest; submit nothing",
        "timeout": "seconds to wait for Kueue admission and all pods running (default 300)",
    },
)
def submit(c: Context, env: str = "local", template: str = "jobset", name: str = "", nodes: int = 0,
           set_: list[str] | None = None, queue: str = "", flavor: str = "", gpus_per_node: int = 0,
           fleet_nodes: int = 0, dry_run: bool = False, timeout: int = 300, kubeconfig: str = "",
           context: str = "", topology: str = "", topology_mode: str = "", gang: str = "",
           scheduling_api: str = "auto") -> None:
    """Validate, render and submit a training job to its Kueue LocalQueue; follow it until its pods run.

    Shows the Workload's admission and the pods starting. Exits 1 with the
    reason from the Workload's conditions (e.g. insufficient quota, or no
    rack with room for a --topology-mode required gang) when the job is not
    admitted and running within --timeout; the job stays queued. With
    --gang native there is no Kueue: the scheduler binds every pod or none,
    and the reason is the scheduler's. Exits 2 on bad inputs, before
    anything is submitted.
    """
    bad_timeout = f"--timeout {timeout}: expected seconds > 0" if timeout <= 0 else ""
    try:
        ctx, text = _manifest(env, template, name, nodes, set_, queue, flavor, gpus_per_node, fleet_nodes,
                              topology=topology, topology_mode=topology_mode, gang=gang,
                              scheduling_api=scheduling_api, kubeconfig=kubeconfig, context=context)
    except Exit as exc:
        raise Exit("\n".join(filter(None, [exc.message, bad_timeout])), code=2) from None
    if bad_timeout:
        raise Exit(bad_timeout, code=2)
    if dry_run:
        sys.stdout.write(text)
        print("dry run: nothing submitted", file=sys.stderr)
        return
    objects = [d for d in yaml.safe_load_all(text) if d]
    try:
        kube = kube_for(env, kubeconfig or None, context or None)
    except InputError as e:
        raise Exit(str(e), code=2) from None
    try:
        if ctx["gang_field"]:
            problem = native.cluster_check(kube, ctx["api_version"], ctx["kind"], ctx["gang_field"])
            if problem:
                raise Exit(f"--gang {ctx['gang']} --template {ctx['template']}: {problem}", code=2)
        result = submit_job(kube, objects, ctx["nodes"], timeout=timeout)
    except SubmitError as e:
        raise Exit(f"train.submit: {e}", code=1) from None
    finally:
        kube.close()
    admitted = f"Workload {result.workload} admitted" if result.workload else "no Kueue (native gang)"
    where = "; ".join(f"{level} {', '.join(f'{d} ({n})' for d, n in sorted(ds.items()))}"
                      for level, ds in result.domains.items())
    print(f"{result.kind} {result.namespace}/{result.name}: {admitted}; "
          f"{result.pods_running} pods running on {', '.join(result.nodes)}" + (f"; {where}" if where else ""))


@task(
    help={
        "gpus": "GPUs the job spans (sizes the default failure model)",
        "checkpoint_seconds": "seconds one checkpoint write stalls training",
        "mttf_hours": f"job mean time to failure in hours (default: {checkpoint.MTTF_GPU_HOURS:,.0f} GPU-hours / GPUs, "
                      "from Llama 3's 419 interruptions in 54 days on 16,384 GPUs)",
        "restart_seconds": f"seconds from a failure to training again (default {checkpoint.DEFAULT_RESTART_SECONDS:g})",
        "measured_window_hours": "measure the MTTF from the cluster's node-health remediations (Events and node "
                                 "health history) over this many hours instead of the published default",
        "env": "with --measured-window-hours: environment, for the local cluster's kubeconfig (default local)",
        "kubeconfig": "with --measured-window-hours: kubeconfig file (default: $KUBECONFIG or ~/.kube/config)",
        "context": "with --measured-window-hours: kubeconfig context (default: the current one)",
    },
)
def checkpoint_interval(c: Context, gpus: int = 0, checkpoint_seconds: float = 0.0, mttf_hours: float = 0.0,
                        restart_seconds: float = checkpoint.DEFAULT_RESTART_SECONDS, measured_window_hours: float = 0.0,
                        env: str = "local", kubeconfig: str = "", context: str = "") -> None:
    """Advise how often to checkpoint: Young's and Daly's optimum intervals and the time lost.

    Young, CACM 1974: sqrt(2*C*M); Daly, FGCS 2006: the higher-order
    refinement. Also shows the fraction of time lost to checkpoints, rework
    and restarts, and how the answer moves if checkpoints take twice as long.
    Default MTTF: see gpufleet_admin.training.checkpoint; --measured-window-hours
    measures it from the cluster's own remediations (gpufleet_admin.training.failures)
    and says which it used. Example:
    invoke train.checkpoint-interval --gpus 1024 --checkpoint-seconds 60 --measured-window-hours 168
    """
    problems = []
    if gpus < 0:
        problems.append(f"--gpus {gpus}: expected GPUs > 0")
    elif gpus == 0 and mttf_hours <= 0:
        problems.append(f"--gpus {gpus}: expected GPUs > 0 (or give --mttf-hours)")
    # NaN fails every comparison, so each check is written as "is finite and in range".
    if not (math.isfinite(checkpoint_seconds) and checkpoint_seconds > 0):
        problems.append(f"--checkpoint-seconds {checkpoint_seconds:g}: expected finite seconds > 0")
    if not (math.isfinite(mttf_hours) and mttf_hours >= 0):
        problems.append(f"--mttf-hours {mttf_hours:g}: expected finite hours > 0 (0: the default failure model)")
    if not (math.isfinite(restart_seconds) and restart_seconds >= 0):
        problems.append(f"--restart-seconds {restart_seconds:g}: expected finite seconds >= 0")
    if not (math.isfinite(measured_window_hours) and measured_window_hours >= 0):
        problems.append(f"--measured-window-hours {measured_window_hours:g}: expected finite hours > 0 "
                        "(0: no measurement)")
    elif measured_window_hours and mttf_hours:
        problems.append("--mttf-hours and --measured-window-hours: expected one of them, not both")
    if problems:
        raise Exit("\n".join(problems), code=2)
    source = None
    if measured_window_hours:
        from gpufleet.goodput import api as gkube
        from gpufleet.ops.exits import fail_on_ops_error
        from gpufleet_admin.training.failures import measure

        try:
            kube = kube_for(env, kubeconfig or None, context or None)
        except InputError as e:
            raise Exit(str(e), code=2) from None
        try:
            with fail_on_ops_error("train.checkpoint-interval"):
                measured = measure(gkube.node_events(kube), gkube.list_nodes(kube), gkube.now(), measured_window_hours)
        finally:
            kube.close()
        if measured.mttf_hours(gpus) is None:
            print(f"MTTF source: published default (no failures to measure: {measured.describe()})")
        else:
            mttf_hours, source = measured.mttf_hours(gpus), measured.describe()
            print(f"MTTF source: {source}")
    else:
        print("MTTF source: " + ("given (--mttf-hours)" if mttf_hours else "published default (Llama 3)"))
    advice = checkpoint.advise(max(gpus, 0), checkpoint_seconds, mttf_hours or None, restart_seconds)
    print("\n".join(checkpoint.report_lines(advice, source)))


#: The ``train`` collection; tasks.py adds it with ``ns.add_collection(train)``.
train = Collection("train", render, submit, checkpoint_interval)
train.add_task(goodput.account_task(), name="goodput")
