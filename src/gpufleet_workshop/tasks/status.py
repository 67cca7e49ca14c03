"""``invoke status``: the fleet on one screen (:mod:`gpufleet_workshop.tasks.fleet_status`).

Exit codes: 0 shown, 1 the API server refused or is unreachable, 2 bad
input (unknown environment, bad kubeconfig).
"""

from __future__ import annotations

from invoke import Context, task
from invoke.exceptions import Exit
from rich.console import Console

from gpufleet import cliargs
from gpufleet.ops.exits import fail_on_ops_error
from gpufleet_workshop.tasks.common import fail_on_inventory_error


def show_status(env: str, *, kubeconfig: str | None = None, context: str | None = None, console: Console | None = None,
                prometheus_url: str | None = None):
    """Gather and print the status screen; returns the :class:`gpufleet_workshop.tasks.fleet_status.FleetStatus`.

    ``prometheus_url``: where the virtual kubelets' cost counters are read (None: the cost table shows no totals).
    """
    from gpufleet_workshop.tasks import fleet_status as st
    from gpufleet_workshop.tasks.common import kube_for
    from roles.registry import load

    inv = load(env)
    kube = kube_for(env, kubeconfig, context)
    try:
        fleet = st.gather(kube, inv, prometheus_url)
    finally:
        kube.close()
    (console or Console()).print(st.render(fleet))
    return fleet


@task(help={
    "env": "environment: a folder of inventories/ (local, staging, prod)",
    "kubeconfig": "kubeconfig file (default: $KUBECONFIG or ~/.kube/config; for --env local, the local cluster's)",
    "context": "kubeconfig context (default: the current one)",
    "prometheus_url": "Prometheus base URL, http(s)://host[:port], for the outside capacity's GPU-seconds and cost "
                      "totals (default: none; the burn rate is shown without it)",
})
def status(c: Context, env: str, kubeconfig: str = "", context: str = "", prometheus_url: str = "") -> None:
    """The fleet on one screen: GPUs by holder, quota vs real capacity, nodes out, virtual nodes, topology.

    GPUs total, schedulable, held by training, by inference in the cluster
    and outside (virtual nodes), free; each ClusterQueue's quota against its
    share of the real capacity; nodes out and why; the virtual nodes'
    gpufleet.io/cluster-has-free-gpus taint; what outside capacity costs (burn rate from the virtual nodes' pods
    and prices; GPU-seconds and cost totals with --prometheus-url); per block and rack, GPUs
    schedulable, held by training and free, and the training gangs that span
    more than one. Example: invoke status --env local
    """
    if prometheus_url:
        try:
            cliargs.check("--prometheus-url", cliargs.http_url, prometheus_url)
        except ValueError as exc:
            raise Exit(str(exc), code=2) from None
    with fail_on_inventory_error(), fail_on_ops_error("status"):
        show_status(env, kubeconfig=kubeconfig or None, context=context or None, prometheus_url=prometheus_url or None)
