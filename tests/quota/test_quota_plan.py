"""Pure parts of the quota resync: capacity, diff, rebuild, drift, gangs that cannot fit."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufleet.ops.kube import OpsError
from gpufleet.names import SWAP_TAINT
from gpufleet.fleet.capacity import flavor_capacity, gpu_map
from gpufleet.quota.resync import (find_cannot_fit, find_drift, max_admittable, plan_from, rebuild_resource_groups,
                                   workload_gpus, zero_message)

from ..builders import FLAVOR, cluster_queue, local_queue, node, workload

SWAP = {"key": SWAP_TAINT, "value": "hot", "effect": "NoSchedule"}


def fleet(n: int = 16, out: int = 0) -> list[dict]:
    return [node(f"gpu-{i:02d}", taints=[SWAP] if i < out else None) for i in range(n)]


def test_capacity_counts_only_schedulable_in_cluster_nodes():
    nodes = fleet(4, out=1) + [node("nr", ready=False), node("other", flavor="a100"),
                               node("vk", flavor=FLAVOR, labels={"type": "virtual-kubelet"}), node("cpu", gpus=0, flavor=None)]
    cap = flavor_capacity(nodes, ["empty"])
    assert cap[FLAVOR].nodes == 5 and cap[FLAVOR].gpus == 40
    assert cap[FLAVOR].schedulable_nodes == 3 and cap[FLAVOR].schedulable_gpus == 24
    assert cap[FLAVOR].out == {"gpu-00": ["swap: hot"], "nr": ["NotReady"]}
    assert gpu_map(cap) == {"a100": 8, "empty": 0, FLAVOR: 24}


def test_rebuild_changes_only_nominal_quota():
    cq = cluster_queue("training", 96, borrowing_limit=10)
    groups, changes, missing = rebuild_resource_groups(cq, {FLAVOR: {"gpu": 48, "cpu": 1000, "memory": 2**40 * 10},
                                                            "b200": {"gpu": 8, "cpu": 1, "memory": 1}})
    assert [(c.resource, c.before, c.after) for c in changes] == [("nvidia.com/gpu", Decimal(96), 48)]
    gpu = groups[0]["flavors"][0]["resources"][2]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": "48", "borrowingLimit": "10"}
    assert missing == ["b200"]
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] == "96"  # input untouched


def test_workload_gpus():
    assert workload_gpus(workload("w", "q", pods=12)) == 96


def test_max_admittable_with_cohort_and_borrowing_limit():
    queues = {"training": cluster_queue("training", 96), "research": cluster_queue("research", 32),
              "alone": cluster_queue("alone", 8, cohort=None),
              "capped": cluster_queue("capped", 8, cohort="gpufleet", borrowing_limit=4)}
    nominal = {"training": {FLAVOR: 48}, "research": {FLAVOR: 16}}
    assert max_admittable("training", FLAVOR, queues, nominal) == 48 + 16 + 8
    assert max_admittable("alone", FLAVOR, queues, nominal) == 8
    assert max_admittable("capped", FLAVOR, queues, nominal) == 12


def test_drift_and_cannot_fit():
    queues = {"training": cluster_queue("training", 96, reserved=80), "research": cluster_queue("research", 32, reserved=0)}
    nominal = {"training": {FLAVOR: 48}, "research": {FLAVOR: 16}}
    wls = [workload("running", "pretrain", pods=10, admitted_cq="training"),
           workload("big", "pretrain", pods=12), workload("small", "pretrain", pods=2),
           workload("elsewhere", "nobody", pods=100)]
    drift = find_drift(queues, nominal, wls)
    assert [(d.cluster_queue, d.reserved, d.nominal, d.gpus, d.workloads) for d in drift] == [
        ("training", 80, 48, 32, ("team-pretrain/running",))]
    lqs = {("team-pretrain", "pretrain"): "training"}
    gangs = find_cannot_fit(queues, nominal, wls, lqs)
    assert [(g.workload, g.gpus, g.max_gpus) for g in gangs] == [("team-pretrain/big", 96, 64)]


def test_plan_from_follows_nodes(local_inv):
    cqs = [cluster_queue("training", 96), cluster_queue("research", 32)]
    lqs = [local_queue("team-pretrain", "pretrain", "training")]
    plan = plan_from(local_inv, fleet(16, out=8), cqs, [workload("big", "pretrain", pods=12)], lqs)
    assert plan.capacity[FLAVOR].schedulable_gpus == 64
    gpu = {c.cluster_queue: c.after for c in plan.changes if c.resource == "nvidia.com/gpu"}
    assert gpu == {"training": 48, "research": 16}
    assert sum(gpu.values()) <= plan.capacity[FLAVOR].schedulable_gpus
    assert [g.workload for g in plan.cannot_fit] == ["team-pretrain/big"]
    assert not plan.zero_flavors and not plan.missing_queues
    # in sync: nothing to change
    synced = [cluster_queue("training", 96), cluster_queue("research", 32)]
    for cq, (q, f) in zip(synced, (("training", 96), ("research", 32))):
        r = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
        r[0]["nominalQuota"] = str(plan_from(local_inv, fleet(16), synced, [], []).desired[q][FLAVOR]["cpu"])
        r[1]["nominalQuota"] = str(plan_from(local_inv, fleet(16), synced, [], []).desired[q][FLAVOR]["memory"])
    assert plan_from(local_inv, fleet(16), synced, [], []).changes == []


def test_plan_zero_capacity_flavor_is_explained(local_inv):
    plan = plan_from(local_inv, fleet(2, out=2), [cluster_queue("training", 96), cluster_queue("research", 32)], [], [])
    assert plan.zero_flavors == [FLAVOR]
    msg = zero_message(plan)
    assert "0 schedulable GPUs of 16 on 2 nodes" in msg and "gpu-00: swap: hot" in msg and "--allow-zero" in msg
    plan = plan_from(local_inv, [], [cluster_queue("training", 96)], [], [])
    assert "no node carries label gpufleet.io/flavor=h100-sxm-80gb" in zero_message(plan)
    assert plan.missing_queues == ["research"]


def test_plan_refuses_a_cluster_without_the_queues(local_inv):
    with pytest.raises(OpsError, match=r"none of inventory local's ClusterQueues \(training, research\)"):
        plan_from(local_inv, fleet(2), [cluster_queue("someone-else", 8)], [], [])
