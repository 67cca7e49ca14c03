"""One node classifier, four users: one table of node shapes drives quota sync, the taint controller's
free-GPU signal, ``invoke status`` and node health, and they must agree on every row."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufleet.taint_controller.signal import free_gpus, node_view, pod_view
from gpufleet.fleet.classify import INFERENCE, TRAINING, NodeFacts, classify, tolerates
from gpufleet.node_health.config import Configuration
from roles.node_health.config import configuration as node_health_configuration
from gpufleet.node_health.remediate import decide, partial_gpu_faults
from gpufleet.names import DEGRADED_TAINT, RESERVED_TAINT, SWAP_TAINT
from gpufleet.quota_sync.resync import capacity_of
from roles.kueue.config import configuration as quota_configuration
from gpufleet_workshop.tasks import fleet_status
from roles.registry import load

from ..builders import FLAVOR, node, pod

NOW = 1_800_000_000.0
TRAINING_PC, INFERENCE_PC = 100000, 1000  # the local inventory's PriorityClass values


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


def with_gpus(n: dict, allocatable: str, capacity: str | None = None) -> dict:
    n = copy.deepcopy(n)
    n["status"]["allocatable"]["nvidia.com/gpu"] = allocatable
    if capacity is not None:
        n["status"]["capacity"]["nvidia.com/gpu"] = capacity
    return n


def holder(name: str, gpus: int, *, priority: int, kueue: bool = False) -> dict[str, Any]:
    p = pod(name, "n1", gpus=gpus, labels={"kueue.x-k8s.io/queue-name": "research"} if kueue else None)
    p["spec"]["priority"] = priority
    return p


@dataclass
class Case:
    """One node (``n1``, flavor h100) and the pods on it; what every user must conclude.

    training / inference: the node's GPUs count for the class; gpus: its allocatable;
    unmanaged: GPUs pods Kueue does not manage (and the flip-out cannot reclaim) hold there;
    used: GPUs all pods hold there; partial: node health raises a gpu_partial fault.
    """

    node: dict
    training: bool
    inference: bool
    gpus: int = 8
    pods: list = field(default_factory=list)
    unmanaged: int = 0
    used: int = 0
    partial: bool = False


TABLE: dict[str, Case] = {
    "healthy": Case(node("n1"), True, True),
    "not-ready": Case(node("n1", ready=False), False, False),
    "cordoned": Case(node("n1", cordoned=True), False, False),
    "out-for-swap": Case(node("n1", taints=[taint(SWAP_TAINT, "gpu_temp")]), False, False),
    "degraded-tier": Case(node("n1", taints=[taint(DEGRADED_TAINT, "ib_errors")]), False, True),
    # Any key: a node tainted for another purpose is nobody's capacity here.
    "dedicated-to-someone-else": Case(node("n1", taints=[taint("dedicated", "inference")]), False, False),
    "unreachable-noexecute": Case(node("n1", taints=[taint("node.kubernetes.io/unreachable", effect="NoExecute")]), False, False),
    "prefer-no-schedule-only": Case(node("n1", taints=[taint("example.com/busy", effect="PreferNoSchedule")]), True, True),
    # Exists on the GPU taint tolerates any value, but only the NoSchedule effect.
    "gpu-taint-other-value": Case(node("n1", taints=[taint("nvidia.com/gpu", "absent")]), True, True),
    "gpu-taint-noexecute": Case(node("n1", taints=[taint("nvidia.com/gpu", "present", "NoExecute")]), False, False),
    # Reserved by the flip-out for a pending training pod: held for training, closed to inference.
    "reserved-for-training": Case(node("n1", taints=[taint(RESERVED_TAINT, "uid-1")]), True, False),
    "virtual-kubelet-taint": Case(node("n1", taints=[taint("virtual-kubelet.io/provider", "x")]), False, True),
    # A GPU withdrawn by the device plugin: out for gangs, in for inference.
    "allocatable-below-capacity": Case(with_gpus(node("n1"), "7", "8"), False, True, gpus=7, partial=True),
    "fractional-allocatable-refused": Case(with_gpus(node("n1"), "7500m", "8"), False, False, gpus=0),
    # GPUs held by pods Kueue does not manage: subtracted from quota unless the flip-out reclaims them.
    "unmanaged-pod": Case(node("n1"), True, True, pods=[holder("debug", 2, priority=TRAINING_PC)], unmanaged=2, used=2),
    "inference-pod-reclaimable": Case(node("n1"), True, True, pods=[holder("chat", 3, priority=INFERENCE_PC)], used=3),
    "kueue-managed-pod": Case(node("n1"), True, True, pods=[holder("gang-0", 4, priority=TRAINING_PC, kueue=True)], used=4),
}


@pytest.fixture(scope="module")
def inv():
    return load("local")


@pytest.mark.parametrize("case", TABLE.values(), ids=TABLE.keys())
def test_quota_sync_counts_training_capacity(inv, case):
    cap = capacity_of(quota_configuration(inv), [case.node], case.pods)[FLAVOR]
    assert cap.schedulable_gpus == (case.gpus - case.unmanaged if case.training else 0)
    assert cap.unmanaged_gpus == (case.unmanaged if case.training else 0)
    assert ("n1" in cap.out) == (not case.training)


@pytest.mark.parametrize("case", TABLE.values(), ids=TABLE.keys())
def test_taint_controller_signal_counts_room_for_inference(case):
    free = free_gpus([node_view(case.node)], [pod_view(p) for p in case.pods])
    assert free == (max(0, case.gpus - case.used) if case.inference else 0)


@pytest.mark.parametrize("case", TABLE.values(), ids=TABLE.keys())
def test_status_shows_what_counts_for_whom(inv, case):
    st = fleet_status.build(inv, [case.node], case.pods, [])
    assert st.gpus_schedulable == (case.gpus if case.training else 0)
    assert st.gpus_schedulable_inference == (case.gpus if case.inference else 0)
    assert st.unmanaged == (case.unmanaged if case.training else 0)
    out = {s.name: s for s in st.nodes_out}
    assert ("n1" in out) == (not case.training)
    if not case.training:
        assert out["n1"].reasons == classify(case.node).reasons[TRAINING]
        assert ("n1" in st.inference_ok) == case.inference


@pytest.mark.parametrize("case", TABLE.values(), ids=TABLE.keys())
def test_node_health_acts_on_partial_nodes(case):
    faults = partial_gpu_faults({"n1": case.node}, Configuration(), NOW)
    assert ("n1" in faults) == case.partial
    if case.partial:
        assert faults["n1"].kind == "gpu_partial" and "allocatable 7 < capacity 8" in faults["n1"].detail
        (d,) = decide({"n1": [faults["n1"]]}, {"n1": case.node}, Configuration(), NOW)
        assert d.action == "degrade"  # the degraded tier: out for gangs, in for inference


def test_the_inventory_lets_partial_nodes_count_for_training():
    inv = load("local", overrides={"kueue_partial_gpu_nodes_count": True})
    n = TABLE["allocatable-below-capacity"].node
    assert capacity_of(quota_configuration(inv), [n])[FLAVOR].schedulable_gpus == 7
    assert fleet_status.build(inv, [n], [], []).gpus_schedulable == 7
    settings = node_health_configuration(inv)
    assert settings.partial_nodes_train and partial_gpu_faults({"n1": n}, settings, NOW) == {}


def test_the_inventory_can_leave_unmanaged_gpus_in_quota():
    inv = load("local", overrides={"kueue_quota_subtract_unmanaged_gpus": False})
    case = TABLE["unmanaged-pod"]
    assert capacity_of(quota_configuration(inv), [case.node], case.pods)[FLAVOR].schedulable_gpus == 8


@pytest.mark.parametrize(
    ("toleration", "taint_", "expected"),
    [
        ({"key": "k", "operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoExecute"}, True),  # effect empty: all
        ({"operator": "Exists"}, {"key": "anything", "effect": "NoSchedule"}, True),  # empty key + Exists: every taint
        ({"operator": "Exists", "effect": "NoSchedule"}, {"key": "anything", "effect": "NoExecute"}, False),
        ({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),  # empty operator: Equal
        ({"key": "k", "operator": "Equal", "value": "v"}, {"key": "k", "value": "w", "effect": "NoSchedule"}, False),
        ({"key": "k", "operator": "Equal"}, {"key": "k", "effect": "NoSchedule"}, True),  # both values empty
        ({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, {"key": "other", "effect": "NoSchedule"}, False),
        ({"key": "k", "operator": "Gt", "value": "3"}, {"key": "k", "value": "5", "effect": "NoSchedule"}, False),  # gate off
        ({"key": "k", "operator": "Bogus"}, {"key": "k", "effect": "NoSchedule"}, False),
    ],
)
def test_tolerations_match_as_the_scheduler_matches_them(toleration, taint_, expected):
    assert tolerates(toleration, taint_) is expected


@pytest.mark.parametrize(("op", "tol", "value", "expected"), [
    ("Gt", "3", "5", True), ("Gt", "5", "5", False), ("Lt", "10", "5", True), ("Lt", "10", "-20", True),
    ("Gt", "3", "05", False), ("Gt", "3", "five", False), ("Lt", "9223372036854775808", "1", False),
])
def test_comparison_operators_behind_their_feature_gate(op, tol, value, expected):
    t = {"key": "k", "operator": op, "value": tol}
    assert tolerates(t, {"key": "k", "value": value, "effect": "NoSchedule"}, comparison_operators=True) is expected


def test_a_fractional_gpu_count_is_refused_naming_the_node_and_value():
    facts = NodeFacts.of(with_gpus(node("gpu-a-007"), "7.5"))
    assert facts.allocatable is None
    assert facts.problem.startswith("node gpu-a-007 status.allocatable: nvidia.com/gpu '7.5' is not a whole number")
    assert classify(facts).reasons[INFERENCE] == (facts.problem,)


def test_the_classes_carry_the_tolerations_of_the_pods_gpufleet_runs(inv):
    """Training: what templates/training gives every pod (the flip-out adds the reservation per pod);
    inference: what roles/inference gives its Deployments."""
    from roles.inference.manifests import objects as inference_objects

    from gpufleet.fleet.classify import INFERENCE_TOLERATIONS, TRAINING_TOLERATIONS
    import yaml

    from gpufleet_admin.training.render import render

    job = [d for d in yaml.safe_load_all(render("local", "jobset", "run1", 2)) if d][-1]
    pods = [rj["template"]["spec"]["template"]["spec"] for rj in job["spec"]["replicatedJobs"]]
    for spec in pods:
        assert list(TRAINING_TOLERATIONS) == spec["tolerations"]  # the reservation too: Kueue judges taints by the template
    deployments = [o for o in inference_objects(inv) if o["kind"] == "Deployment"]
    assert deployments and all(d["spec"]["template"]["spec"]["tolerations"] == [dict(t) for t in INFERENCE_TOLERATIONS]
                               for d in deployments)
