"""Kueue quota policy: each ClusterQueue's nominalQuota per ResourceFlavor.

One function of the inventory's kueue variables and a capacity per flavor.
The kueue role renders its ClusterQueues with it (the inventory's hosts are
the capacity) and quota sync and ``invoke status`` recompute it from what
the nodes can schedule, so all three agree by construction. GPUs are split
by share (gpufleet.fleet.shares: pins and the reserve apply); cpu and memory
follow each queue's GPU quota so no queue holds CPU it has no GPUs for.
"""

from __future__ import annotations

from gpufleet.fleet.shares import gpu_quotas, split
from gpufleet_admin.inventory import Inventory


def quotas(inv: Inventory, capacity: dict[str, dict[str, int]] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """nominalQuota per ClusterQueue and flavor: ``{queue: {flavor: {"gpu", "cpu", "memory"}}}``.

    ``capacity`` (flavor -> ``{"gpu": GPUs, "cpu": cores, "memory": bytes}``
    schedulable, :func:`gpufleet.fleet.capacity.quota_capacity`) replaces the
    inventory's sizes: quota sync passes what the cluster's nodes can really
    schedule, CPU and memory included (allocatable minus what pods Kueue does
    not manage request); a flavor it lacks has none. Without it (``pulumi
    up``, before any node exists) the inventory's hosts are the capacity. The
    flavor's GPUs are shared by the queues' shares (pins and the reserve
    apply); its cpu and memory in proportion to each queue's GPUs, so no
    queue holds CPU it has no GPUs for.
    """
    v = inv.role("kueue")
    shares = {q.name: q.share for q in v.kueue_cluster_queues}
    out: dict[str, dict[str, dict[str, int]]] = {q: {} for q in shares}
    for flavor, cap in inv.flavors().items():
        have = ({"gpu": cap.gpus, "cpu": cap.cpu, "memory": cap.memory_bytes} if capacity is None
                else capacity.get(flavor, {"gpu": 0, "cpu": 0, "memory": 0}))
        pinned = {q.name: q.nominal_gpus[flavor] for q in v.kueue_cluster_queues if q.nominal_gpus and flavor in q.nominal_gpus}
        gpus = gpu_quotas(have["gpu"], v.kueue_reserve_gpus, shares, pinned)
        weights = {q: g for q, g in gpus.items() if g > 0}
        cpu = split(max(int(have["cpu"]), 0), weights) if weights else {}
        mem = split(max(int(have["memory"]), 0), weights) if weights else {}
        for q in shares:
            out[q][flavor] = {"gpu": gpus[q], "cpu": cpu.get(q, 0), "memory": mem.get(q, 0)}
    return out
