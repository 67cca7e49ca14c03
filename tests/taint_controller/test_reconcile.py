"""The taint controller's reconcile loops against the in-memory API server (:mod:`gpufleet_workshop.testing`):
the free-GPU taint with its hysteresis, the flip-out (reservation, eviction within the budget, surge and hand-over,
the deadlines) and the flip-back (release and evict at the budget's pace). Real informers, the real client; the
fake plays the scheduler, the ReplicaSet controller, the kubelet and the virtual kubelet where a step needs them."""

from __future__ import annotations

import threading

import pytest

from gpufleet.kube import api_path
from gpufleet.names import (FREE_GPUS_TAINT, POD_DELETION_COST_ANNOTATION, POOL_LABEL, PUBLISHED_CONDITION,
                            RELEASE_LABEL, RESERVED_TAINT, SURGE_FOR_LABEL, VIRTUAL_NODE_TAINT)
from gpufleet.taint_controller.budget import MigrationBudget
from gpufleet.taint_controller.controller import TaintController
from gpufleet.taint_controller.decision import Hysteresis
from gpufleet.taint_controller.flipback import FlipBack
from gpufleet.taint_controller.flipout import FlipOut, plan
from gpufleet.taint_controller.signal import ApiServerSignal
from gpufleet_workshop.testing import FakeKube

from ..builders import node, pod

NS = "inference"
TRAINING = "gpufleet-training"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def virtual(name: str, pool: str, *, tainted: bool = False) -> dict:
    taints = [{"key": VIRTUAL_NODE_TAINT, "value": "gpufleet", "effect": "NoSchedule"}]
    if tainted:
        taints.append({"key": FREE_GPUS_TAINT, "effect": "NoSchedule"})
    n = node(name, flavor=None, labels={"type": "virtual-kubelet", POOL_LABEL: pool}, gpus=32)
    n["spec"]["taints"] = taints
    return n


def ready(p: dict, *, published: bool | None = None) -> dict:
    conds = [{"type": "Ready", "status": "True"}]
    if published is not None:
        conds.append({"type": PUBLISHED_CONDITION, "status": "True" if published else "False"})
    p["status"] = {"phase": "Running", "conditions": conds}
    return p


def inference(name: str, node_name: str, *, gpus: int = 4, rs: dict | None = None) -> dict:
    p = ready(pod(name, node_name, gpus=gpus, ns=NS, owner=None, priority=0,
                  labels={"app": "chat", "pod-template-hash": "7d9f"}))
    if rs is not None:
        p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
                                             "uid": rs["metadata"]["uid"], "controller": True}]
    return p


def trainer(name: str = "train-0", gpus: int = 8) -> dict:
    p = pod(name, None, gpus=gpus, ns="team-pretrain", owner=None, priority_class=TRAINING, priority=1000,
            phase="Pending")
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    p["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return p


def deployment(kube: FakeKube, replicas: int = 2) -> dict:
    """The Deployment ``chat`` and its ReplicaSet ``chat-7d9f`` (returned)."""
    dep = kube.add({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat", "namespace": NS},
                    "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "chat"}}},
                    "status": {"availableReplicas": replicas}})[0]
    template = {"metadata": {"labels": {"app": "chat", "pod-template-hash": "7d9f"}},
                "spec": {"containers": [{"name": "srv", "image": "srv",
                                         "resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}
    return kube.add({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {
        "name": "chat-7d9f", "namespace": NS, "labels": {"app": "chat", "pod-template-hash": "7d9f"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat",
                             "uid": dep["metadata"]["uid"], "controller": True}]},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "chat", "pod-template-hash": "7d9f"}},
                 "template": template}})[0]


@pytest.fixture
def kube():
    k = FakeKube(bookmark_seconds=0.02)
    yield k
    k.close()


@pytest.fixture
def caches(kube):
    started: list[ApiServerSignal] = []

    def start() -> ApiServerSignal:
        sig = ApiServerSignal(kube).start(timeout=5)
        started.append(sig)
        return sig

    yield start
    for sig in started:
        sig.stop()


def sync(kube: FakeKube, sig: ApiServerSignal) -> None:
    kube.sync(sig.nodes, sig.pods)


def taints(kube: FakeKube, name: str) -> list[dict]:
    return kube.get("v1", "nodes", name)["spec"].get("taints") or []


def has_free_taint(kube: FakeKube, name: str) -> bool:
    return any(t["key"] == FREE_GPUS_TAINT for t in taints(kube, name))


# ------------------------------------------------------------------ the free-GPU taint


def test_the_taint_follows_free_gpus_with_hysteresis_on_the_pools_virtual_nodes(kube, caches):
    kube.add(node("gpu-0"), node("gpu-1"), virtual("vk-rental", "rental"), virtual("vk-other", "other"))
    clock = Clock()
    sig = caches()
    ctl = TaintController(kube, sig, sig, Hysteresis(high=8, low=4, hold=30), pools=("rental",), clock=clock).start()
    assert ctl.machine.tainted is False, "the initial state comes from the virtual nodes: none carries the taint"
    ctl.tick()  # 16 free > 8: the streak starts
    clock.t += 29
    ctl.tick()
    assert not has_free_taint(kube, "vk-rental"), "held for less than the hold time"
    clock.t += 2
    ctl.tick()
    assert has_free_taint(kube, "vk-rental") and not has_free_taint(kube, "vk-other"), "only the managed pool"
    assert [t.tainted for t in ctl.transitions] == [True]
    # Training takes the GPUs: free 0 < 4; a dip back above the low mark restarts the streak.
    kube.add(pod("t0", "gpu-0", gpus=8, ns="team-pretrain"), pod("t1", "gpu-1", gpus=8, ns="team-pretrain"))
    sync(kube, sig)
    ctl.tick()
    clock.t += 20
    kube.delete("v1", "pods", "t1", "team-pretrain", grace_seconds=0)
    sync(kube, sig)
    ctl.tick()  # 8 free: between the marks
    kube.add(pod("t1", "gpu-1", gpus=8, ns="team-pretrain"))
    sync(kube, sig)
    clock.t += 20
    ctl.tick()
    assert has_free_taint(kube, "vk-rental"), "the streak below low restarted 20 s ago"
    clock.t += 31
    ctl.tick()
    assert not has_free_taint(kube, "vk-rental") and [t.tainted for t in ctl.transitions] == [True, False]
    assert taints(kube, "vk-rental") == [{"key": VIRTUAL_NODE_TAINT, "value": "gpufleet", "effect": "NoSchedule"}]


def test_a_taint_removed_by_someone_else_is_restored_once_then_the_removal_is_honoured(kube, caches):
    kube.add(node("gpu-0"), virtual("vk-rental", "rental", tainted=True))
    sig = caches()
    clock = Clock()
    ctl = TaintController(kube, sig, sig, Hysteresis(high=4, low=2, hold=0), pools=("rental",), clock=clock).start()
    assert ctl.machine.tainted is True, "a restarted controller resumes from the nodes"
    ctl.tick()

    def untaint() -> None:
        kube.patch("v1", "nodes", "vk-rental", {"spec": {"taints": [
            {"key": VIRTUAL_NODE_TAINT, "value": "gpufleet", "effect": "NoSchedule"}]}})
        sync(kube, sig)

    untaint()
    ctl.tick()
    assert has_free_taint(kube, "vk-rental")
    sync(kube, sig)
    untaint()
    ctl.tick()
    assert not has_free_taint(kube, "vk-rental"), "the second removal is honoured"
    reasons = [a.body["reason"] for a in kube.writes() if a.resource == "events"]
    assert len(kube.objects("events", "default")) == 2
    assert reasons == ["FreeGpusTaintRestored", "FreeGpusTaintRemovalHonoured"]


# ------------------------------------------------------------------ the flip-out


def test_evict_first_reserves_the_node_and_evicts_within_the_budget(kube, caches):
    rs = deployment(kube)
    kube.add(node("gpu-0"), node("gpu-1", cordoned=True), trainer(),
             inference("chat-a", "gpu-0", rs=rs), inference("chat-b", "gpu-0", rs=rs),
             {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "chat", "namespace": NS},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "chat"}}}})
    sig = caches()
    clock = Clock()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], mode="evict_first", max_wait_seconds=300, clock=clock)
    out.tick()
    uid = kube.get("v1", "pods", "train-0", "team-pretrain")["metadata"]["uid"]
    assert {"key": RESERVED_TAINT, "value": uid, "effect": "NoSchedule"} in taints(kube, "gpu-0")
    assert {"key": RESERVED_TAINT, "operator": "Equal", "value": uid, "effect": "NoSchedule"} in kube.get(
        "v1", "pods", "train-0", "team-pretrain")["spec"]["tolerations"]
    terminating = [p["metadata"]["name"] for p in kube.objects("pods", NS) if p["metadata"].get("deletionTimestamp")]
    assert terminating == ["chat-a"], "the budget allowed one eviction; the second was refused (429)"
    # The kubelet finishes chat-a; its replacement runs elsewhere and is Ready: the budget allows one more.
    kube.complete_deletions()
    kube.add(inference("chat-c", "vk-rental", rs=rs))
    sync(kube, sig)
    out.tick()
    assert kube.get("v1", "pods", "chat-b", NS)["metadata"].get("deletionTimestamp")
    # The training pod is bound: the reservation goes.
    kube.complete_deletions()
    kube.modify("pods", "train-0", "team-pretrain", lambda p: p["spec"].update(nodeName="gpu-0"))
    sync(kube, sig)
    out.tick()
    assert not any(t["key"] == RESERVED_TAINT for t in taints(kube, "gpu-0"))


def test_a_reservation_is_one_write_to_the_pod_and_one_to_the_node_when_the_caches_are_current(kube, caches):
    kube.add(node("gpu-0"), trainer(), inference("chat-a", "gpu-0", gpus=8, rs=deployment(kube)))
    sig = caches()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], mode="evict_first", clock=Clock())
    (r,) = plan(sig.nodes.items(), sig.pods.items(), [TRAINING])
    before = len(kube.actions)
    out._reserve(r)
    calls = [(a.verb, a.resource) for a in kube.actions[before:]]
    assert calls == [("patch", "pods"), ("patch", "nodes")], "no reads: the pod and the node come from the caches"
    uid = r.pod["metadata"]["uid"]
    assert kube.get("v1", "pods", "train-0", "team-pretrain")["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": RESERVED_TAINT, "operator": "Equal", "value": uid, "effect": "NoSchedule"}]
    assert {"key": RESERVED_TAINT, "value": uid, "effect": "NoSchedule"} in taints(kube, "gpu-0")


def test_a_reservation_from_caches_that_were_behind_reads_and_loses_nothing_written_meanwhile(kube, caches):
    kube.add(node("gpu-0"), trainer(), inference("chat-a", "gpu-0", gpus=8, rs=deployment(kube)))
    sig = caches()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], mode="evict_first", clock=Clock())
    (r,) = plan(sig.nodes.items(), sig.pods.items(), [TRAINING])
    # Written after the caches' view of them (and the views kept as they were): a toleration and a taint.
    theirs_tol = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
    kube.modify("pods", "train-0", "team-pretrain", lambda p: p["spec"]["tolerations"].append(theirs_tol))
    theirs_taint = {"key": "maintenance", "effect": "NoSchedule"}
    kube.modify("nodes", "gpu-0", None, lambda n: n["spec"].setdefault("taints", []).append(theirs_taint))
    stale = dict(sig.nodes.get("gpu-0"))
    out.nodes = type("Stale", (), {"get": staticmethod(lambda name: stale), "items": sig.nodes.items})()
    before = len(kube.actions)
    out._reserve(r)
    # The toleration's test failed (422) and the taint's precondition did (409): each was read, then written.
    assert [(a.verb, a.resource) for a in kube.actions[before:]] == [
        ("patch", "pods"), ("get", "pods"), ("patch", "pods"), ("patch", "nodes"), ("get", "nodes"), ("patch", "nodes")]
    uid = r.pod["metadata"]["uid"]
    tols = kube.get("v1", "pods", "train-0", "team-pretrain")["spec"]["tolerations"]
    assert theirs_tol in tols and {"key": RESERVED_TAINT, "operator": "Equal", "value": uid,
                                   "effect": "NoSchedule"} in tols
    assert theirs_taint in taints(kube, "gpu-0") and {"key": RESERVED_TAINT, "value": uid,
                                                      "effect": "NoSchedule"} in taints(kube, "gpu-0")


def test_preemptors_are_served_side_by_side_not_one_after_another(kube, caches):
    """Four training pods each need a node held by inference: the four reservations are made at once (each
    one's toleration patch waits at a barrier that only opens when all four are in flight), and every victim
    is evicted in the same tick, each through its PDB."""
    rs = deployment(kube, replicas=4)
    kube.add(*(node(f"gpu-{i}") for i in range(4)), *(trainer(f"train-{i}", gpus=8) for i in range(4)),
             *(inference(f"chat-{i}", f"gpu-{i}", gpus=8, rs=rs) for i in range(4)),
             {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "chat", "namespace": NS},
              "spec": {"maxUnavailable": 4, "selector": {"matchLabels": {"app": "chat"}}}})
    together = threading.Barrier(4, timeout=5)

    def all_in_flight(a):
        if (a.name or "").startswith("train-"):
            together.wait()  # BrokenBarrierError (the test fails) if the reservations come one at a time
        return None

    kube.prepend_reactor("patch", "pods", all_in_flight)
    sig = caches()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], mode="evict_first", concurrent_syncs=4, clock=Clock())
    try:
        out.tick()
    finally:
        out.close()
    reserved = sorted(t["value"] for i in range(4) for t in taints(kube, f"gpu-{i}") if t["key"] == RESERVED_TAINT)
    assert reserved == sorted(kube.get("v1", "pods", f"train-{i}", "team-pretrain")["metadata"]["uid"] for i in range(4))
    assert sorted(a.name for a in kube.writes() if a.subresource == "eviction") == [f"chat-{i}" for i in range(4)]


def test_preemptors_pinned_to_one_node_are_served_by_one_reservation(kube, caches):
    """Four 2-GPU training pods pinned to gpu-0, which four 2-GPU inference pods fill: one taint (the first
    pod's UID), every pod tolerating it, every victim evicted in the first tick; the reservation stays until
    the last of the four is bound, not the first."""
    rs = deployment(kube, replicas=4)
    gang = [trainer(f"train-{i}", gpus=2) for i in range(4)]
    for t in gang:
        t["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-0"}
    kube.add(node("gpu-0"), *gang, *(inference(f"chat-{i}", "gpu-0", gpus=2, rs=rs) for i in range(4)),
             {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "chat", "namespace": NS},
              "spec": {"maxUnavailable": 4, "selector": {"matchLabels": {"app": "chat"}}}})
    sig = caches()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], mode="evict_first", clock=Clock())
    out.tick()
    lead = kube.get("v1", "pods", "train-0", "team-pretrain")["metadata"]["uid"]
    assert [t["value"] for t in taints(kube, "gpu-0") if t["key"] == RESERVED_TAINT] == [lead]
    for i in range(4):
        assert {"key": RESERVED_TAINT, "operator": "Equal", "value": lead, "effect": "NoSchedule"} in kube.get(
            "v1", "pods", f"train-{i}", "team-pretrain")["spec"]["tolerations"]
    assert sorted(a.name for a in kube.writes() if a.subresource == "eviction") == [f"chat-{i}" for i in range(4)]
    kube.complete_deletions()
    for i in range(3):  # the lead and two more are bound; train-3 still waits
        kube.modify("pods", f"train-{i}", "team-pretrain", lambda p: p["spec"].update(nodeName="gpu-0"))
    sync(kube, sig)
    out.tick()
    assert any(t["key"] == RESERVED_TAINT for t in taints(kube, "gpu-0")), "train-3 is still pending"
    kube.modify("pods", "train-3", "team-pretrain", lambda p: p["spec"].update(nodeName="gpu-0"))
    sync(kube, sig)
    out.tick()
    assert not any(t["key"] == RESERVED_TAINT for t in taints(kube, "gpu-0"))


def test_past_the_deadline_the_victims_are_deleted(kube, caches):
    rs = deployment(kube)
    kube.add(node("gpu-0"), trainer(), inference("chat-a", "gpu-0", rs=rs), inference("chat-b", "gpu-0", rs=rs),
             {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "chat", "namespace": NS},
              "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "chat"}}}})
    sig = caches()
    clock = Clock()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], mode="evict_first", max_wait_seconds=300, clock=clock)
    out.tick()
    assert not [p for p in kube.objects("pods", NS) if p["metadata"].get("deletionTimestamp")], "the PDB refuses all"
    clock.t += 301
    sync(kube, sig)
    out.tick()
    deletes = [(a.name, a.body.get("preconditions")) for a in kube.writes() if a.verb == "delete"]
    assert [d[0] for d in deletes] == ["chat-a", "chat-b"] and all(d[1] and d[1]["uid"] for d in deletes)


def test_make_before_break_starts_a_surge_outside_and_hands_the_victims_place_over(kube, caches):
    rs = deployment(kube, replicas=1)
    kube.add(node("gpu-0"), virtual("vk-rental", "rental"), trainer(gpus=4), inference("chat-a", "gpu-0", gpus=8, rs=rs))
    sig = caches()
    clock = Clock()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], mode="make_before_break", surge_max_wait_seconds=180,
                  clock=clock)
    out.tick()
    (surge,) = [r for r in kube.objects("replicasets", NS) if r["metadata"]["name"] != "chat-7d9f"]
    victim_uid = kube.get("v1", "pods", "chat-a", NS)["metadata"]["uid"]
    assert surge["spec"]["template"]["metadata"]["labels"][SURGE_FOR_LABEL] == victim_uid
    assert "pod-template-hash" not in surge["spec"]["template"]["metadata"]["labels"]
    assert surge["spec"]["template"]["spec"]["nodeSelector"] == {"type": "virtual-kubelet"}
    assert not kube.get("v1", "pods", "chat-a", NS)["metadata"].get("deletionTimestamp"), "not before its surge"
    # The ReplicaSet controller starts the surge pod, the virtual kubelet runs it: Ready, not yet published.
    surge_pod = inference("chat-a-surge-x", "vk-rental", gpus=8, rs=surge)
    surge_pod["metadata"]["labels"] = dict(surge["spec"]["template"]["metadata"]["labels"])
    kube.add(ready(surge_pod, published=False))
    sync(kube, sig)
    out.tick()
    assert kube.get("v1", "pods", "chat-a", NS)["metadata"].get("annotations", {}).get(POD_DELETION_COST_ANNOTATION) is None
    kube.modify("pods", "chat-a-surge-x", NS, lambda p: ready(p, published=True))
    sync(kube, sig)
    out.tick()
    victim = kube.get("v1", "pods", "chat-a", NS)
    assert victim["metadata"]["annotations"][POD_DELETION_COST_ANNOTATION] == "-2147483648"
    assert kube.object("replicasets", surge["metadata"]["name"], NS) is None
    handed = kube.get("v1", "pods", "chat-a-surge-x", NS)
    (owner,) = handed["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ReplicaSet", "chat-7d9f", True), \
        "the victim's ReplicaSet's pod now, not the garbage collector's to orphan first"
    assert handed["metadata"]["labels"] == {"app": "chat", "pod-template-hash": "7d9f"}, "selected by chat-7d9f"
    assert not victim["metadata"].get("deletionTimestamp"), "its ReplicaSet removes it; nothing is evicted"
    assert not [a for a in kube.writes() if a.subresource == "eviction"]


def test_a_surge_that_never_gets_ready_is_given_up_and_the_victim_evicted(kube, caches):
    rs = deployment(kube, replicas=1)
    kube.add(node("gpu-0"), virtual("vk-rental", "rental"), trainer(gpus=4), inference("chat-a", "gpu-0", gpus=8, rs=rs))
    sig = caches()
    clock = Clock()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], surge_max_wait_seconds=180, clock=clock)
    out.tick()
    assert len(kube.objects("replicasets", NS)) == 2
    sync(kube, sig)
    clock.t += 181
    out.tick()
    assert len(kube.objects("replicasets", NS)) == 1, "the surge is removed before the eviction"
    assert kube.get("v1", "pods", "chat-a", NS)["metadata"].get("deletionTimestamp")


# ------------------------------------------------------------------ the flip-back


def test_flip_back_releases_at_the_budgets_pace_lowest_priority_first(kube, caches):
    rs = deployment(kube, replicas=3)
    kube.add(virtual("vk-rental", "rental", tainted=True), node("gpu-0"))
    for name, prio in (("chat-a", 5), ("chat-b", 1), ("chat-c", 3)):
        p = inference(name, "vk-rental", rs=rs)
        p["spec"]["priority"] = prio
        kube.add(p)
    sig = caches()
    clock = Clock()
    back = FlipBack(kube, sig.nodes, sig.pods, MigrationBudget(1.0, max_in_flight=1), mode="release", clock=clock)
    assert [c.name for c in back.tick()] == ["chat-b"]
    assert kube.get("v1", "pods", "chat-b", NS)["metadata"]["labels"][RELEASE_LABEL[0]] == RELEASE_LABEL[1]
    sync(kube, sig)
    clock.t += 60
    assert back.tick() == [], "one in flight per workload until the released pod is gone"
    kube.delete("v1", "pods", "chat-b", NS, grace_seconds=0)  # the descheduler evicted it
    sync(kube, sig)
    assert [c.name for c in back.tick()] == ["chat-c"]
    clock.t += 1
    kube.delete("v1", "pods", "chat-c", NS, grace_seconds=0)
    sync(kube, sig)
    assert back.tick() == [], "a token a minute"


def test_flip_back_evict_mode_gives_the_token_back_when_the_budget_refuses(kube, caches):
    rs = deployment(kube, replicas=2)
    kube.disruption_controller = False
    kube.add(virtual("vk-rental", "rental", tainted=True), inference("chat-a", "vk-rental", rs=rs),
             {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "chat", "namespace": NS},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "chat"}}},
              "status": {"disruptionsAllowed": 0, "observedGeneration": 1}})
    sig = caches()
    clock = Clock()
    back = FlipBack(kube, sig.nodes, sig.pods, MigrationBudget(1.0), mode="evict", clock=clock)
    back.tick()
    assert kube.object("pods", "chat-a", NS)["metadata"].get("deletionTimestamp") is None
    kube.patch("policy/v1", "poddisruptionbudgets", "chat", {"status": {"disruptionsAllowed": 1}}, NS,
               subresource="status")
    back.tick()  # the same second: the refunded token is there
    assert kube.object("pods", "chat-a", NS)["metadata"]["deletionTimestamp"]


def test_a_controller_tick_runs_every_pass_and_survives_an_api_outage(kube, caches):
    kube.add(node("gpu-0"), virtual("vk-rental", "rental"))
    sig = caches()
    clock = Clock()
    ctl = TaintController(kube, sig, sig, Hysteresis(high=4, low=2, hold=0), pools=("rental",), clock=clock,
                          flip_out=FlipOut(kube, sig.nodes, sig.pods, [TRAINING], clock=clock)).start()
    failing = kube.fail("patch", "nodes", __import__("gpufleet.kube", fromlist=["ServerError"]).ServerError(
        503, "ServiceUnavailable", "etcd is down"), times=None)
    ctl.tick()
    assert not has_free_taint(kube, "vk-rental")
    kube.remove_reactor(failing)
    ctl.tick()
    assert has_free_taint(kube, "vk-rental"), "retried on the next tick"
    assert api_path("v1", "nodes", name="vk-rental") in {a.path for a in kube.writes()}


def test_inference_coming_back_at_exact_capacity_does_not_reopen_the_virtual_nodes_a_waiting_trainer_does(kube, caches):
    # The real node is full with two returned replicas; the third is still outside, its flip-back under way.
    rs = deployment(kube, replicas=3)
    kube.add(node("gpu-0"), virtual("vk-rental", "rental", tainted=True), inference("chat-a", "gpu-0", rs=rs),
             inference("chat-b", "gpu-0", rs=rs), inference("chat-c", "vk-rental", rs=rs))
    sig = caches()
    clock = Clock()
    back = FlipBack(kube, sig.nodes, sig.pods, MigrationBudget(0.001), mode="release", clock=clock)
    ctl = TaintController(kube, sig, sig, Hysteresis(high=4, low=2, hold=0), pools=("rental",), clock=clock,
                          flip_back=back).start()
    decision = ctl.tick()  # 0 free < 2, but what takes the GPUs is inference coming back
    assert has_free_taint(kube, "vk-rental") and not decision.changed, decision.reason
    assert "1 pods are coming back in-cluster" in decision.reason
    # A trainer that cannot be placed is a shortage: the virtual nodes open.
    kube.add(trainer())
    sync(kube, sig)
    assert ctl.tick().changed and not has_free_taint(kube, "vk-rental")


def test_without_a_flip_back_under_way_low_free_gpus_reopen_the_virtual_nodes(kube, caches):
    rs = deployment(kube, replicas=2)
    kube.add(node("gpu-0"), virtual("vk-rental", "rental", tainted=True), inference("chat-a", "gpu-0", rs=rs),
             inference("chat-b", "gpu-0", rs=rs))
    sig = caches()
    clock = Clock()
    back = FlipBack(kube, sig.nodes, sig.pods, MigrationBudget(0.001), mode="release", clock=clock)
    ctl = TaintController(kube, sig, sig, Hysteresis(high=4, low=2, hold=0), pools=("rental",), clock=clock,
                          flip_back=back).start()
    assert ctl.tick().changed and not has_free_taint(kube, "vk-rental"), "every pod is in: the cluster is full"


def test_a_free_gpu_taint_set_by_hand_with_a_value_is_removed_when_the_cluster_is_short(kube, caches):
    vnode = virtual("vk-rental", "rental")
    vnode["spec"]["taints"].append({"key": FREE_GPUS_TAINT, "value": "true", "effect": "NoSchedule"})
    kube.add(vnode, pod("t0", node_name=None, gpus=8, ns="team-pretrain"))
    sig = caches()
    clock = Clock()
    ctl = TaintController(kube, sig, sig, Hysteresis(high=4, low=2, hold=0), pools=("rental",), clock=clock).start()
    assert ctl.machine.tainted is True
    assert ctl.tick().changed and not has_free_taint(kube, "vk-rental"), taints(kube, "vk-rental")


def test_a_reservation_opens_the_virtual_nodes_while_the_cluster_still_counts_free_gpus(kube, caches):
    # A gang's pod is pinned to gpu-0 (the node its admission chose) where inference runs; gpu-1 and gpu-2
    # are free, but the gang's next pods will take them: waiting for the free GPUs to fall would make the
    # surge, and the training, wait for the gang's own pods to be created.
    rs = deployment(kube, replicas=1)
    pinned = trainer(gpus=8)
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-0"}
    for n in ("gpu-0", "gpu-1", "gpu-2"):
        kube.add(node(n))
    kube.add(virtual("vk-rental", "rental", tainted=True), pinned, inference("chat-a", "gpu-0", gpus=8, rs=rs))
    sig = caches()
    clock = Clock()
    out = FlipOut(kube, sig.nodes, sig.pods, [TRAINING], mode="make_before_break", surge_max_wait_seconds=180,
                  clock=clock)
    ctl = TaintController(kube, sig, sig, Hysteresis(high=4, low=2, hold=30, tainted=True), pools=("rental",),
                          clock=clock, flip_out=out).start()
    first = ctl.tick()  # 16 free GPUs > high: no change; the flip-out reserves gpu-0 and starts the surge
    assert not first.changed and has_free_taint(kube, "vk-rental")
    assert out.wanted == {"uid-chat-a"}
    sync(kube, sig)
    clock.t += 1
    second = ctl.tick()
    assert second.changed and not has_free_taint(kube, "vk-rental"), second.reason
    assert "1 inference pods must leave nodes reserved for training" in second.reason
    # Still 16 free GPUs and the trainer unplaced: they stay open past the hold.
    sync(kube, sig)
    clock.t += 60
    assert not ctl.tick().changed and not has_free_taint(kube, "vk-rental")


def open_controller_with_flip_out(kube: FakeKube, caches) -> tuple[ApiServerSignal, TaintController]:
    """The caches and a taint controller (virtual nodes open, high 4, low 2, no hold) with a flip-out for training."""
    sig = caches()
    clock = Clock()
    ctl = TaintController(kube, sig, sig, Hysteresis(high=4, low=2, hold=0, tainted=False), pools=("rental",),
                          clock=clock, flip_out=FlipOut(kube, sig.nodes, sig.pods, [TRAINING], clock=clock)).start()
    return sig, ctl


def test_training_pods_still_to_be_placed_keep_the_virtual_nodes_open(kube, caches):
    kube.add(node("gpu-0"), node("gpu-1"), virtual("vk-rental", "rental"))
    gated = pod("train-1", None, gpus=8, ns="team-pretrain", owner=None, priority_class=TRAINING, priority=1000,
                phase="Pending")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/topology"}]
    kube.add(gated)
    sig, ctl = open_controller_with_flip_out(kube, caches)
    assert ctl.training_waiting() == (0, 1)
    d = ctl.tick()
    assert not d.changed and not has_free_taint(kube, "vk-rental"), d.reason
    kube.modify("pods", "train-1", "team-pretrain", lambda p: p["spec"].update(nodeName="gpu-0", schedulingGates=None))
    sync(kube, sig)
    assert ctl.training_waiting() == (0, 0)
    assert ctl.tick().changed and has_free_taint(kube, "vk-rental"), "placed: 8 free GPUs > 4 close them again"


def test_a_training_pod_nothing_can_place_does_not_keep_inference_outside(kube, caches):
    kube.add(node("gpu-0"), node("gpu-1"), virtual("vk-rental", "rental"))
    lost = trainer(gpus=8)
    lost["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-9"}  # no such node
    kube.add(lost)
    _, ctl = open_controller_with_flip_out(kube, caches)
    assert ctl.training_waiting() == (0, 0)
    assert ctl.tick().changed and has_free_taint(kube, "vk-rental"), "16 free GPUs > 4: inference may come back"
