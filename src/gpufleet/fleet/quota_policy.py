"""Kueue quota policy: each ClusterQueue's nominalQuota per ResourceFlavor.

One function of a :class:`QuotaPolicy` (the ClusterQueues with their shares
and pins, the ResourceFlavors, the reserve) and a capacity per flavor. The
kueue role renders its ClusterQueues with it (the inventory's hosts are the
capacity), and quota sync and ``invoke status`` recompute it from what the
nodes can schedule, so all three agree by construction. Quota sync's
configuration is a :class:`QuotaPolicy` (``gpufleet.quota_sync.config``),
built by the kueue role from the inventory (``roles/kueue/config.py``). GPUs
are split by share (gpufleet.fleet.shares: pins and the reserve apply); cpu
and memory follow each queue's GPU quota so no queue holds CPU it has no
GPUs for.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field, model_validator

from gpufleet import componentconfig as cc
from gpufleet.fleet.shares import gpu_quotas, split


class ClusterQueue(BaseModel):
    """One ClusterQueue: its share of every flavor's capacity, or pinned GPUs per flavor.

    Attributes:
        name: the ClusterQueue's name.
        share: integer weight for splitting each flavor's capacity (largest-remainder rounding).
        nominal_gpus: ``{flavor: GPUs}`` pinning the queue's quota of those flavors (None: none pinned).
    """

    model_config = cc.STRICT

    name: cc.DnsLabel
    share: cc.PositiveInt = 1
    nominal_gpus: dict[str, cc.NonNegativeInt] | None = None


class QuotaPolicy(BaseModel):
    """What the quota of every ClusterQueue follows from (besides the capacity).

    Attributes:
        flavors: the ResourceFlavors the queues cover (one per GPU model of the inventory's hosts).
        cluster_queues: the ClusterQueues, in order; names unique, pins naming a flavor of ``flavors``.
        reserve_gpus: GPUs per flavor kept out of every queue's quota (spares for swaps and debugging).
    """

    model_config = cc.STRICT

    flavors: tuple[cc.DnsLabel, ...] = ()
    cluster_queues: tuple[ClusterQueue, ...] = Field(default=(ClusterQueue(name="training"),), min_length=1)
    reserve_gpus: cc.NonNegativeInt = 0

    @model_validator(mode="after")
    def _queues(self) -> "QuotaPolicy":
        names = [q.name for q in self.cluster_queues]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"cluster_queues with unique names ({', '.join(twice)} more than once)")
        for q in self.cluster_queues:
            unknown = sorted(set(q.nominal_gpus or {}) - set(self.flavors))
            if unknown:
                raise ValueError(f"cluster_queues pinning (nominal_gpus) ResourceFlavors of flavors "
                                 f"({', '.join(self.flavors) or 'none'}): {q.name} pins {', '.join(unknown)}")
        return self


def quotas(policy: QuotaPolicy, capacity: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, dict[str, int]]]:
    """nominalQuota per ClusterQueue and flavor: ``{queue: {flavor: {"gpu", "cpu", "memory"}}}``.

    Args:
        policy: the queues, shares, pins, flavors and reserve.
        capacity: flavor -> ``{"gpu": GPUs, "cpu": cores, "memory": bytes}`` to share: what the
            cluster's nodes can schedule (quota sync, :func:`gpufleet.fleet.capacity.quota_capacity`:
            allocatable minus what pods Kueue does not manage request), or the inventory's hosts
            (``pulumi up``, before any node exists). A flavor of ``policy.flavors`` it lacks has none;
            a flavor not in ``policy.flavors`` is no queue's.

    The flavor's GPUs are shared by the queues' shares (pins and the reserve
    apply); its cpu and memory in proportion to each queue's GPUs, so no
    queue holds CPU it has no GPUs for.
    """
    shares = {q.name: q.share for q in policy.cluster_queues}
    out: dict[str, dict[str, dict[str, int]]] = {q: {} for q in shares}
    for flavor in sorted(policy.flavors):
        have = capacity.get(flavor, {"gpu": 0, "cpu": 0, "memory": 0})
        pinned = {q.name: q.nominal_gpus[flavor] for q in policy.cluster_queues
                  if q.nominal_gpus and flavor in q.nominal_gpus}
        gpus = gpu_quotas(have["gpu"], policy.reserve_gpus, shares, pinned)
        weights = {q: g for q, g in gpus.items() if g > 0}
        cpu = split(max(int(have["cpu"]), 0), weights) if weights else {}
        mem = split(max(int(have["memory"]), 0), weights) if weights else {}
        for q in shares:
            out[q][flavor] = {"gpu": gpus[q], "cpu": cpu.get(q, 0), "memory": mem.get(q, 0)}
    return out
