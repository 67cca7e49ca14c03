"""``invoke status``: the fleet on one screen (:mod:`gpufleet.tasks.fleet_status`).

Exit codes: 0 shown, 1 the API server refused or is unreachable, 2 bad
input (unknown environment, bad kubeconfig).
"""

from __future__ import annotations

from invoke import Context, task
from rich.console import Console

from gpufleet.ops.exits import fail_on_ops_error
from gpufleet.tasks.common import fail_on_inventory_error


def show_status(env: str, *, kubeconfig: str | None = None, context: str | None = None, console: Console | None = None):
    """Gather and print the status screen; returns the :class:`gpufleet.tasks.fleet_status.FleetStatus`."""
    from gpufleet.tasks import fleet_status as st
    from gpufleet.tasks.common import kube_for
    from roles.registry import load

    inv = load(env)
    kube = kube_for(env, kubeconfig, context)
    try:
        fleet = st.gather(kube, inv)
    finally:
        kube.close()
    (console or Console()).print(st.render(fleet))
    return fleet


@task(help={
    "env": "environment: a folder of inventories/ (local, staging, prod)",
    "kubeconfig": "kubeconfig file (default: $KUBECONFIG or ~/.kube/config; for --env local, the local cluster's)",
    "context": "kubeconfig context (default: the current one)",
})
def status(c: Context, env: str, kubeconfig: str = "", context: str = "") -> None:
    """The fleet on one screen: GPUs by holder, quota vs real capacity, nodes out, virtual nodes, topology.

    GPUs total, schedulable, held by training, by inference in the cluster
    and outside (virtual nodes), free; each ClusterQueue's quota against its
    share of the real capacity; nodes out and why; the virtual nodes'
    gpufleet.io/cluster-has-free-gpus taint; per block and rack, GPUs
    schedulable, held by training and free, and the training gangs that span
    more than one. Example: invoke status --env local
    """
    with fail_on_inventory_error(), fail_on_ops_error("status"):
        show_status(env, kubeconfig=kubeconfig or None, context=context or None)
