"""invoke tasks for Kueue quota: ``quota.resync``.

The task parses its flags and calls :func:`resync`, a plain function.
Exit codes: 0 done (or nothing to do), 1 the cluster refused or a
zero-capacity flavor without ``--allow-zero``, 2 bad input (unknown
environment, unreadable kubeconfig).
"""

from __future__ import annotations

from invoke import Collection, Context, task
from rich.console import Console

from gpufleet_workshop.tasks.common import fail_on_inventory_error
from gpufleet.ops.exits import fail_on_ops_error

_KUBE_HELP = {
    "kubeconfig": "kubeconfig file (default: $KUBECONFIG or ~/.kube/config; for --env local, the local cluster's)",
    "context": "kubeconfig context (default: the current one)",
}


def resync(env: str, *, apply: bool = False, allow_zero: bool = False, kubeconfig: str | None = None,
           context: str | None = None, console: Console | None = None):
    """Compute (and with ``apply`` write) every ClusterQueue's nominalQuota from the real capacity; print the diff.

    Returns:
        ``(plan, apply result or None)`` (:mod:`gpufleet.quota_sync.resync`).

    Raises:
        gpufleet_admin.inventory.InventoryError: unknown or invalid environment.
        gpufleet.ops.reads.OpsError: wrong cluster, zero-capacity flavor without ``allow_zero``, conflicts.
    """
    from gpufleet_workshop.tasks.common import kube_for
    from gpufleet.quota_sync import resync as rs
    from gpufleet.quota_sync.report import render
    from roles.kueue.config import configuration
    from roles.registry import load

    console = console or Console()
    config = configuration(load(env))  # what the quota-sync controller is configured with
    kube = kube_for(env, kubeconfig, context)
    try:
        plan = rs.compute(kube, config, env=env)
        applied = rs.apply(kube, plan, allow_zero=allow_zero) if apply and plan.changes else None
        if apply and not plan.changes:
            applied = rs.ApplyResult()
            rs.record_findings(kube, plan)
    finally:
        kube.close()
    console.print(render(plan, applied))
    return plan, applied


@task(help={
    "env": "environment: a folder of inventories/ (local, staging, prod)",
    "apply": "write the new quotas (default: only show the diff)",
    "allow_zero": "allow setting a flavor's quota to 0 when none of its nodes is schedulable",
    **_KUBE_HELP,
})
def resync_task(c: Context, env: str, apply: bool = False, allow_zero: bool = False, kubeconfig: str = "",
                context: str = "") -> None:
    """Make every ClusterQueue's nominalQuota its share of the real schedulable GPUs, CPU and memory; show the diff.

    Capacity per ResourceFlavor: nodes Ready, schedulable, without swap,
    degraded or unhealthy taints, minus kueue_reserve_gpus; their
    allocatable cpu and memory minus what pods Kueue does not manage
    request (DaemonSets, system pods); shared by the queues' shares (kueue
    role). Writes with a resourceVersion precondition,
    retried on conflict. Never evicts: workloads admitted above a lowered
    quota keep running and are reported, with pending gangs that can no
    longer fit. Example: invoke quota.resync --env local --apply
    """
    with fail_on_inventory_error(), fail_on_ops_error("quota.resync"):
        resync(env, apply=apply, allow_zero=allow_zero, kubeconfig=kubeconfig or None, context=context or None)


resync_task.__name__ = "resync"
#: The ``quota`` collection; tasks.py adds it with ``ns.add_collection(quota)``.
quota = Collection("quota")
quota.add_task(resync_task, name="resync")
