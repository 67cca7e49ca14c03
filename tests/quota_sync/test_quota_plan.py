"""Pure parts of the quota resync: capacity, diff, rebuild, drift, gangs that cannot fit."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufleet.ops.reads import OpsError
from gpufleet.names import SWAP_TAINT
from gpufleet.fleet.capacity import flavor_capacity, gpu_map
from gpufleet.quota_sync.resync import (find_cannot_fit, find_drift, max_admittable, plan_from, rebuild_resource_groups,
                                   workload_gpus, zero_message)

from ..builders import FLAVOR, cluster_queue, local_queue, node, pod, workload

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


def test_plan_from_follows_nodes(local_quota):
    cqs = [cluster_queue("training", 96), cluster_queue("research", 32)]
    lqs = [local_queue("team-pretrain", "pretrain", "training")]
    plan = plan_from(local_quota, fleet(16, out=8), cqs, [workload("big", "pretrain", pods=12)], lqs)
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
        r[0]["nominalQuota"] = str(plan_from(local_quota, fleet(16), synced, [], []).desired[q][FLAVOR]["cpu"])
        r[1]["nominalQuota"] = str(plan_from(local_quota, fleet(16), synced, [], []).desired[q][FLAVOR]["memory"])
    assert plan_from(local_quota, fleet(16), synced, [], []).changes == []


def test_plan_zero_capacity_flavor_is_explained(local_quota):
    plan = plan_from(local_quota, fleet(2, out=2), [cluster_queue("training", 96), cluster_queue("research", 32)], [], [])
    assert plan.zero_flavors == [FLAVOR]
    msg = zero_message(plan)
    assert "0 schedulable GPUs of 16 on 2 nodes" in msg and "gpu-00: swap: hot" in msg and "--allow-zero" in msg
    plan = plan_from(local_quota, [], [cluster_queue("training", 96)], [], [])
    assert "no node carries label gpufleet.io/flavor=h100-sxm-80gb" in zero_message(plan)
    assert plan.missing_queues == ["research"]


def test_plan_refuses_a_cluster_without_the_queues(local_quota):
    with pytest.raises(OpsError, match=r"none of the configured ClusterQueues \(training, research\)"):
        plan_from(local_quota, fleet(2), [cluster_queue("someone-else", 8)], [], [])


# --------------------------------------------------------------------------- cpu and memory from the nodes

GI = 2**30
TI = 2**40


def queues():
    return [cluster_queue("training", 96), cluster_queue("research", 32)]


def quota(plan, resource: str) -> dict[str, int]:
    return {q: plan.desired[q][FLAVOR][resource] for q in ("training", "research")}


def training_priority(inv) -> int:
    return max(pc.value for pc in inv.role("kueue").kueue_priority_classes)


def test_cpu_and_memory_quota_are_the_nodes_allocatable_minus_daemonset_requests(local_quota):
    nodes = fleet(4, out=1)  # 3 counted nodes of 224 cores and 2 TiB each
    daemons = [pod(f"fabric-exporter-{i}", f"gpu-{i:02d}", owner="DaemonSet", ns="gpufleet-system", cpu="1500m",
                   memory="4Gi") for i in range(4)]
    system = [pod("coredns-0", "gpu-01", ns="kube-system", cpu="100m", memory="70Mi", owner="ReplicaSet")]
    plan = plan_from(local_quota, nodes, queues(), [], [], daemons + system)
    cap = plan.capacity[FLAVOR]
    # gpu-00 is out: neither its cores nor its DaemonSet pod count
    assert cap.cpu == 3 * 224 and cap.unmanaged_cpu == Decimal("4.6") and cap.schedulable_cpu == 667  # 672 - 4.6, floored
    assert cap.schedulable_memory_bytes == 3 * 2 * TI - 3 * 4 * GI - 70 * 2**20
    # shared by GPU quota (24 GPUs: 18 + 6, shares 3:1), whole cores, nothing lost to rounding
    assert quota(plan, "gpu") == {"training": 18, "research": 6}
    assert quota(plan, "cpu") == {"training": 500, "research": 167} and sum(quota(plan, "cpu").values()) == 667
    assert sum(quota(plan, "memory").values()) == cap.schedulable_memory_bytes
    # without the pods nothing is subtracted: the nodes' allocatable, not the inventory's node size
    bare = plan_from(local_quota, nodes, queues(), [], [], [])
    assert sum(quota(bare, "cpu").values()) == 3 * 224 and sum(quota(bare, "memory").values()) == 3 * 2 * TI
    assert [c for c in plan.changes if c.resource == "cpu"]  # the diff shows it before anything is applied


def test_a_node_reporting_less_allocatable_cpu_lowers_quota_by_that_much(local_quota):
    nodes = fleet(4)
    nodes[0]["status"]["allocatable"]["cpu"] = "200500m"  # kube-reserved/system-reserved on one node
    plan = plan_from(local_quota, nodes, queues(), [], [], [])
    assert sum(quota(plan, "cpu").values()) == 3 * 224 + 200


def test_removing_a_gpu_pod_moves_gpu_quota_not_a_gpus_share_of_cpu(local_inv, local_quota):
    nodes = fleet(4)
    high = training_priority(local_inv)
    debug = pod("debug", "gpu-02", gpus=4, cpu="2", memory="16Gi", priority=high)  # unmanaged, not reclaimable
    ds = [pod(f"ds-{i}", f"gpu-{i:02d}", owner="DaemonSet", cpu="1") for i in range(4)]
    with_pod = plan_from(local_quota, nodes, queues(), [], [], ds + [debug])
    without = plan_from(local_quota, nodes, queues(), [], [], ds)
    assert with_pod.capacity[FLAVOR].schedulable_gpus == 28 and without.capacity[FLAVOR].schedulable_gpus == 32
    # CPU moves by what the pod requested (2 cores), not by 4/32 of the fleet's 896 cores (112)
    assert sum(quota(with_pod, "cpu").values()) == 4 * 224 - 4 - 2
    assert sum(quota(without, "cpu").values()) == 4 * 224 - 4
    assert sum(quota(without, "memory").values()) - sum(quota(with_pod, "memory").values()) == 16 * GI
    # a GPU pod that requests no CPU leaves CPU quota where it was
    bare_gpu = pod("bare", "gpu-02", gpus=4, priority=high)
    assert sum(quota(plan_from(local_quota, nodes, queues(), [], [], ds + [bare_gpu]), "cpu").values()) == 4 * 224 - 4


def test_kueue_pods_and_pods_the_flip_out_reclaims_take_nothing_from_quota(local_inv, local_quota):
    nodes = fleet(2)
    managed = pod("trainer-0", "gpu-00", gpus=8, cpu="100", memory="1Ti",
                  labels={"kueue.x-k8s.io/queue-name": "pretrain"}, owner="Job")
    inference = pod("infer-0", "gpu-01", gpus=2, cpu="16", memory="128Gi", priority=training_priority(local_inv) - 1)
    finished = pod("done", "gpu-01", cpu="50", owner="DaemonSet", phase="Succeeded")
    pending = pod("pending", None, cpu="50", owner="DaemonSet")
    plan = plan_from(local_quota, nodes, queues(), [], [], [managed, inference, finished, pending])
    cap = plan.capacity[FLAVOR]
    assert (cap.schedulable_gpus, cap.schedulable_cpu, cap.schedulable_memory_bytes) == (16, 448, 4 * TI)
    # a low-priority pod without GPUs is not the flip-out's to take: it is subtracted
    sidecar = pod("log-agent", "gpu-01", cpu="3", priority=0)
    assert plan_from(local_quota, nodes, queues(), [], [], [sidecar]).capacity[FLAVOR].schedulable_cpu == 445


def test_the_inventory_can_leave_what_unmanaged_pods_take_in_quota():
    from roles.kueue.config import configuration
    from roles.registry import load

    inv = configuration(load("local", overrides={"kueue_quota_subtract_unmanaged_gpus": False}))
    ds = [pod("ds-0", "gpu-00", owner="DaemonSet", cpu="8", memory="8Gi")]
    plan = plan_from(inv, fleet(2), queues(), [], [], ds)
    assert plan.capacity[FLAVOR].schedulable_cpu == 448 and plan.capacity[FLAVOR].schedulable_memory_bytes == 4 * TI
