"""invoke tasks for one GPU of a DRA node: ``gpu.remove`` and ``gpu.return``.

A GPU of a node whose GPUs are allocated through DRA goes out of service by
a ``DeviceTaintRule`` selecting it alone (:mod:`gpufleet.ops.gpus`); the node
and its other GPUs stay in service. A node whose GPUs come from the device
plugin has no GPU to remove one by one: ``invoke node.swap`` takes the node.

Exit codes: 0 done, or nothing to do (a GPU already out with that taint, a
GPU not out: both tasks are idempotent); 1 the operation cannot proceed (a
lemon without --clear-lemon, failed node checks, a DeviceTaintRule of that
name gpufleet does not own, the API server refused); 2 bad input, refused
before anything is written (unknown node or GPU, empty reason, bad effect).
"""

from __future__ import annotations

from invoke import Collection, Context, task
from rich.console import Console

from gpufleet.ops.exits import fail_on_ops_error
from gpufleet.ops.nodechecks import RETURN_CHECKS_TIMEOUT_SECONDS

_KUBE_HELP = {
    "kubeconfig": "kubeconfig file (default: $KUBECONFIG or ~/.kube/config; for --env local, the local cluster's)",
    "context": "kubeconfig context (default: the current one)",
}


def remove_gpu(node: str, gpu: str, reason: str, *, effect: str = "NoExecute", dry_run: bool = False,
               env: str | None = None, kubeconfig: str | None = None, context: str | None = None,
               console: Console | None = None):
    """Take GPU ``gpu`` of ``node`` out of service (``gpufleet.io/gpu-unhealthy=manual:<effect>``); a person's removal,
    which node health never returns.

    Returns:
        The :class:`gpufleet.ops.gpus.GpuResult`.

    Raises:
        gpufleet.ops.reads.InputError: empty reason, bad effect, unknown node or GPU.
        gpufleet.ops.gpus.ForeignRule: a rule of that name is not gpufleet's.
    """
    from gpufleet.ops import gpus as gpuops
    from gpufleet.ops.reads import InputError
    from gpufleet_workshop.tasks.common import kube_for

    console = console or Console()
    if not reason.strip():
        raise InputError("--reason is empty: say why the GPU goes out (it is recorded on the rule and the node)")
    taint = gpuops.taint_of("manual", effect, degraded=False)
    kube = kube_for(env, kubeconfig, context)
    try:
        target = gpuops.resolve(kube, node, gpu)
        result = gpuops.remove(kube, target, taint, detail=reason.strip(), by=gpuops.BY_PERSON, dry_run=dry_run)
    finally:
        kube.close()
    name = gpuops.rule_name(target.node, target.device)
    what = f"{taint['key']}={taint['value']}:{taint['effect']}"
    if dry_run:
        console.print(f"dry run: would {'write' if result.changed else 'keep'} DeviceTaintRule {name} ({what}) on GPU "
                      f"{target.label} of {node}; nothing changed", highlight=False)
    elif result.changed:
        console.print(f"GPU {target.label} (uuid {target.uuid}) of {node} out of service: DeviceTaintRule {name} ({what}); "
                      f"the node and its other GPUs stay in service", highlight=False)
    else:
        console.print(f"GPU {target.label} of {node} is already out ({what}): nothing to do", highlight=False)
    return result


def return_gpu(node: str, gpu: str, *, clear_lemon: bool = False, dry_run: bool = False, skip_checks: bool = False,
               env: str | None = None, checks_inventory: str | None = None, checks_args: str = "",
               checks_timeout: float = RETURN_CHECKS_TIMEOUT_SECONDS, kubeconfig: str | None = None,
               context: str | None = None, console: Console | None = None):
    """Run the node checks of GPU ``gpu`` of ``node``, then delete its gpufleet DeviceTaintRule.

    The checks are ``tests/nodes`` on host ``node`` (``inventories/<env>/hosts.yml``
    or ``checks_inventory``), and only the ones about this GPU decide
    (:func:`gpufleet.ops.gpus.gpu_check_ids`).

    Raises:
        gpufleet.ops.reads.InputError: no inventory for the checks, unknown node or GPU.
        gpufleet.ops.gpus.LemonGpu: a lemon without ``clear_lemon``.
        gpufleet.ops.gpus.ChecksRefused: the GPU's checks failed.
    """
    from gpufleet.ops import gpus as gpuops
    from gpufleet.ops.nodechecks import NodeChecks
    from gpufleet.ops.reads import InputError
    from gpufleet_workshop.tasks.common import kube_for

    console = console or Console()
    if not (skip_checks or env or checks_inventory):
        raise InputError("--env is needed: the GPU's node checks run with inventories/ENV/hosts.yml before it returns "
                         "(or pass --inventory FILE, or --skip-checks to return it unchecked)")
    node_checks = None if skip_checks else NodeChecks.for_env(env or "", checks_inventory, checks_args, checks_timeout)

    def checks(g):
        console.print(f"running the node checks of {node} for GPU {g.label}: {node_checks.command(node)}",
                      markup=False, highlight=False)
        return gpuops.gpu_check_ids(g, [r.test for r in node_checks.run(node).failed])

    kube = kube_for(env, kubeconfig, context)
    try:
        target = gpuops.resolve(kube, node, gpu)
        result = gpuops.give_back(kube, target, clear_lemon=clear_lemon, dry_run=dry_run,
                                  checks=None if node_checks is None else checks)
    finally:
        kube.close()
    for note in result.notes:
        console.print(note, highlight=False)
    if skip_checks and result.changed and not dry_run:
        console.print("[bold yellow]warning: returned without its node checks (--skip-checks)[/bold yellow]")
    if dry_run:
        console.print(f"dry run: would return GPU {target.label} of {node}; nothing changed" if result.changed
                      else f"dry run: GPU {target.label} of {node} is not out; nothing to do", highlight=False)
    elif result.changed:
        console.print(f"GPU {target.label} of {node} back in service", highlight=False)
    return result


@task(help={
    "node": "node name (kubectl get nodes)",
    "gpu": "the GPU: device name (gpu-3), index (3), UUID or PCI bus id",
    "reason": "why it goes out (free text; recorded on the DeviceTaintRule and in the node's GPU history)",
    "effect": "NoExecute (default: pods using the GPU are evicted) or NoSchedule (they keep running; no new claim gets it)",
    "dry_run": "show what would be written; change nothing",
    "env": "environment (--env local picks the local cluster's kubeconfig)",
    **_KUBE_HELP,
})
def remove(c: Context, node: str, gpu: str, reason: str = "", effect: str = "NoExecute", dry_run: bool = False,
           env: str = "", kubeconfig: str = "", context: str = "") -> None:
    """Take one GPU of NODE out of service with a DRA device taint; the node and its other GPUs stay in service.

    Writes DeviceTaintRule gpufleet-<node>-<device> selecting that device
    (driver gpu.nvidia.com, pool, device) with taint
    gpufleet.io/gpu-unhealthy=manual:<effect>. Node health never returns a
    GPU a person removed. Idempotent. Example:
    invoke gpu.remove gpu-rack-a-0003 5 --reason "fan noise, RMA ticket 4711"
    """
    with fail_on_ops_error("gpu.remove"):
        remove_gpu(node, gpu, reason, effect=effect, dry_run=dry_run, env=env or None, kubeconfig=kubeconfig or None,
                   context=context or None)


@task(name="return", help={
    "node": "node name",
    "gpu": "the GPU: device name (gpu-3), index (3), UUID or PCI bus id",
    "clear_lemon": "also return a lemon GPU (a person's decision, after its hardware was replaced or checked)",
    "dry_run": "show what would change; run no checks, change nothing",
    "skip_checks": "return it without running its node checks (tests/nodes) first (a warning says so)",
    "env": "environment whose inventory the node checks connect with: inventories/ENV/hosts.yml (needed unless "
           "--inventory or --skip-checks; --env local also picks the local cluster's kubeconfig)",
    "inventory": "Ansible inventory the node checks use instead of inventories/ENV/hosts.yml",
    **_KUBE_HELP,
})
def return_(c: Context, node: str, gpu: str, clear_lemon: bool = False, dry_run: bool = False, skip_checks: bool = False,
            env: str = "", inventory: str = "", kubeconfig: str = "", context: str = "") -> None:
    """Run the node checks of one GPU of NODE, then bring it back into service (delete its gpufleet DeviceTaintRule).

    Only the checks about that GPU decide (tests/nodes ids parametrized by
    it); any failure refuses the return (exit 1) naming them, and nothing
    changes. Lemon GPUs need --clear-lemon. Taints gpufleet does not own
    (the driver's, other rules) are named and left alone. Nothing to do:
    exit 0. Example: invoke gpu.return gpu-rack-a-0003 5 --env prod
    """
    with fail_on_ops_error("gpu.return"):
        return_gpu(node, gpu, clear_lemon=clear_lemon, dry_run=dry_run, skip_checks=skip_checks, env=env or None,
                   checks_inventory=inventory or None, kubeconfig=kubeconfig or None, context=context or None)


#: The ``gpu`` collection; tasks.py adds it with ``ns.add_collection(gpu)``.
gpu = Collection("gpu", remove, return_)
