"""The free-GPU signal, the flip-out's reservation plan and the flip-back's candidates (pure)."""

from __future__ import annotations

from gpufleet.taint_controller.flipback import candidates
from gpufleet.fleet.classify import tolerated as tolerates
from gpufleet.taint_controller.flipout import plan, reservations_of, victims_for
from gpufleet.names import FREE_GPUS_TAINT, RELEASE_LABEL, RESERVED_TAINT
from gpufleet.kube.informer import Informer
from gpufleet.taint_controller.signal import (BY_BINDING, BY_GPU_NODE, BY_LABEL, BY_RESERVATION, NODE_INDEXES,
                                              POD_INDEXES, RESERVED, UNBOUND, free_gpus, label_key, node_view,
                                              pod_view)
from gpufleet_workshop.testing import FakeKube
from gpufleet.prom.client import number

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(name, gpus=8, ready=True, virtual=False, unschedulable=False, taints=(), labels=None):
    lab = {"gpufleet.io/flavor": "h100", **(labels or {})}
    if virtual:
        lab["type"] = "virtual-kubelet"
    return node_view({"metadata": {"name": name, "labels": lab},
                      "spec": {"unschedulable": unschedulable, "taints": [GPU_TAINT, *taints]},
                      "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                 "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def pod(name, node_name="", gpus=1, priority=1000, phase="Running", pc="gpufleet-inference", unschedulable=False,
        tolerations=None, labels=None, created="2026-01-01T00:00:00Z", owner="chat-abc"):
    conds = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}] if unschedulable else []
    return pod_view({
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "creationTimestamp": created,
                     "labels": {"pod-template-hash": "abc", **(labels or {})},
                     "ownerReferences": [{"kind": "ReplicaSet", "name": owner, "controller": True}]},
        "spec": {"nodeName": node_name, "priority": priority, "priorityClassName": pc,
                 "tolerations": tolerations or [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                 "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase, "conditions": conds}})


def test_free_gpus_counts_only_schedulable_in_cluster_nodes():
    nodes = [node("a"), node("b"), node("notready", ready=False), node("cordoned", unschedulable=True),
             node("swap", taints=[{"key": "gpufleet.io/swap", "value": "hot", "effect": "NoSchedule"}]),
             node("degraded", taints=[{"key": "gpufleet.io/degraded", "value": "x", "effect": "NoSchedule"}]),
             node("vk-rental", gpus=64, virtual=True)]
    pods = [pod("i1", "a", 3), pod("t", "b", 8, phase="Running"), pod("done", "a", 5, phase="Succeeded"),
            pod("pending", "", 8, phase="Pending"), pod("out", "vk-rental", 4)]
    assert free_gpus(nodes, pods) == 5 + 0 + 8  # a: 8-3, b: full, degraded: 8 (inference tolerates it)
    # From the pod cache, each node's pods are looked up through its index: the same count.
    assert free_gpus(nodes, caches(nodes, pods)[1]) == 5 + 0 + 8


def caches(nodes, pods) -> tuple[Informer, Informer]:
    """Informers of node and pod views holding ``nodes`` and ``pods`` as if listed, with the controller's
    indexes (their threads are never started)."""
    kube = FakeKube()
    node_cache = Informer(kube, "/api/v1/nodes", name="nodes", indexers=NODE_INDEXES)
    pod_cache = Informer(kube, "/api/v1/pods", name="pods", indexers=POD_INDEXES)
    for n in nodes:
        node_cache.apply("ADDED", {**n, "metadata": {"name": n["name"]}})
    for p in pods:
        pod_cache.apply("ADDED", p)
    return node_cache, pod_cache


def plan_from_caches(nodes, pods, classes):
    """:func:`plan` as the flip-out's tick calls it: the unbound pods, and the rest through the caches' indexes."""
    node_cache, pod_cache = caches(nodes, pods)
    return plan(node_cache.items(), pod_cache.by_index(BY_BINDING, UNBOUND), classes,
                bound=lambda name: pod_cache.by_index(BY_GPU_NODE, name),
                reserved=reservations_of(node_cache.by_index(BY_RESERVATION, RESERVED)),
                with_label=lambda k, v: node_cache.by_index(BY_LABEL, label_key(k, v)))


def test_prometheus_answers():
    assert number({"resultType": "vector", "result": [{"value": [0, "3"]}, {"value": [0, "4.5"]}]}) == 7.5
    assert number({"resultType": "scalar", "result": [0, "12"]}) == 12
    assert number({"resultType": "vector", "result": []}) is None
    assert number({"resultType": "matrix", "result": []}) is None


def test_tolerations_match_like_kubernetes():
    taint = {"key": RESERVED_TAINT, "value": "u1", "effect": "NoSchedule"}
    assert tolerates([{"key": RESERVED_TAINT, "operator": "Equal", "value": "u1", "effect": "NoSchedule"}], taint)
    assert not tolerates([{"key": RESERVED_TAINT, "operator": "Equal", "value": "u2"}], taint)
    assert tolerates([{"operator": "Exists"}], taint)
    assert not tolerates([{"key": RESERVED_TAINT, "operator": "Exists", "effect": "NoExecute"}], taint)


def test_flip_out_reserves_the_node_with_fewest_victims_for_each_unschedulable_training_pod():
    nodes = [node(f"n{i}") for i in range(4)]
    pods = [pod("t0", "n0", 8, 100000, pc="gpufleet-training"),  # training already there
            pod("i1", "n1", 1), pod("i2", "n2", 1), pod("i3", "n2", 1),  # inference: 1 on n1, 2 on n2
            pod("i4", "n3", 1), pod("i5", "n3", 1), pod("i6", "n3", 1),
            pod("t1", gpus=8, priority=100000, phase="Pending", pc="gpufleet-training", unschedulable=True,
                created="2026-01-01T00:00:01Z"),
            pod("t2", gpus=8, priority=100000, phase="Pending", pc="gpufleet-training", unschedulable=True,
                created="2026-01-01T00:00:02Z")]
    out = plan(nodes, pods, ["gpufleet-training"])
    assert [(r.pod["metadata"]["name"], r.node, [v["metadata"]["name"] for v in r.victims]) for r in out] == [
        ("t1", "n1", ["i1"]), ("t2", "n2", ["i2", "i3"])]


def test_flip_out_leaves_pods_that_fit_or_are_not_preemptors_alone():
    nodes = [node("n0"), node("n1")]
    fits = [pod("i1", "n0", 1), pod("t", gpus=8, priority=100000, phase="Pending", pc="gpufleet-training",
                                   unschedulable=True)]
    assert plan(nodes, fits, ["gpufleet-training"]) == []  # n1 is free: the scheduler's job
    full = [pod("i1", "n0", 1), pod("i2", "n1", 1),
            pod("x", gpus=8, priority=100000, phase="Pending", pc="other-class", unschedulable=True),
            pod("y", gpus=8, priority=100000, phase="Pending", pc="gpufleet-training", unschedulable=False)]
    assert plan(nodes, full, ["gpufleet-training"]) == []


def test_flip_out_respects_existing_reservations_and_node_selectors():
    reserved = node("n0", taints=[{"key": RESERVED_TAINT, "value": "uid-t1", "effect": "NoSchedule"}])
    other = node("n1", labels={"gpufleet.io/flavor": "a100"})
    pods = [pod("i1", "n0", 1), pod("i2", "n1", 1),
            pod("t1", gpus=8, priority=100000, phase="Pending", pc="gpufleet-training", unschedulable=True),
            pod("t2", gpus=8, priority=100000, phase="Pending", pc="gpufleet-training", unschedulable=True)]
    pods[-1]["nodeSelector"] = {"gpufleet.io/flavor": "h100"}
    assert reservations_of([reserved, other]) == {"uid-t1": "n0"}
    assert plan([reserved, other], pods, ["gpufleet-training"]) == []  # t1 has n0; t2 wants h100, n1 is a100


def test_preemptors_of_one_shape_are_not_searched_again_once_one_found_no_node(monkeypatch):
    from gpufleet.taint_controller import flipout

    searched = []
    real = flipout.victims_for
    # A reservation's group (what a joining pod would share) has no name: "join" stands for it.
    monkeypatch.setattr(flipout, "victims_for", lambda p, n, b: searched.append(
        (p["metadata"]["name"] if "metadata" in p else "join", n["name"])) or real(p, n, b))
    nodes = [node("n0"), node("n1")]
    gang = [pod(f"t{i}", gpus=8, priority=100000, phase="Pending", pc="gpufleet-training", unschedulable=True,
                created=f"2026-01-01T00:00:0{i}Z") for i in range(1, 5)]
    other = pod("t5", gpus=4, priority=100000, phase="Pending", pc="gpufleet-training", unschedulable=True,
                created="2026-01-01T00:00:09Z")
    pods = [pod("i1", "n0", 1), pod("t0", "n1", 8, 100000, pc="gpufleet-training"), *gang, other]
    out = plan(nodes, pods, ["gpufleet-training"])
    assert [(r.pod["metadata"]["name"], r.node) for r in out] == [("t1", "n0")]
    assert searched == [("t1", "n0"), ("t1", "n1"), ("join", "n0"), ("t5", "n1"), ("join", "n0")], \
        "the gang's shape is ranked once (t2-t4 take from that ranking: nothing is left), and tries t1's " \
        "reservation once (t2 with t1 needs 16 GPUs of 8); t5 has its own ranking and its own try"


def test_a_pod_that_fits_as_is_says_nothing_of_the_next_pod_of_its_shape():
    """A fits on n0 as it is (the scheduler's job); C then reserves n0; B, of A's shape, is still planned."""
    nodes = [node("n0"), node("n1")]
    training = {"priority": 100000, "phase": "Pending", "pc": "gpufleet-training", "unschedulable": True}
    pods = [pod("i0", "n0", 4), pod("i1", "n1", 8),
            pod("a", gpus=4, created="2026-01-01T00:00:01Z", **training),
            pod("c", gpus=8, created="2026-01-01T00:00:02Z", **training),
            pod("b", gpus=4, created="2026-01-01T00:00:03Z", **training)]
    assert [(r.pod["metadata"]["name"], r.node) for r in plan(nodes, pods, ["gpufleet-training"])] == [
        ("c", "n0"), ("b", "n1")]


def test_the_flip_out_moves_only_the_pods_the_preemptor_needs_gone():
    trainer = pod("t", gpus=4, priority=1000000, pc="gpufleet-training", unschedulable=True)
    n = node("a", gpus=8)
    serving = [pod(f"s{i}", "a", gpus=2) for i in range(4)]
    chosen = victims_for(trainer, n, serving)
    assert [v["metadata"]["name"] for v in chosen] == ["s0", "s1"]  # two of four make room; the others stay
    # Once those two are leaving, they no longer hold the room it needs (the caller passes the staying pods).
    assert victims_for(trainer, n, serving[2:]) == []
    assert victims_for(pod("big", gpus=10, priority=1000000), n, serving) is None  # no room even with all gone
    assert victims_for(trainer, n, [pod("other-training", "a", gpus=8, priority=1000000)]) is None


def test_flip_back_candidates_only_on_tainted_virtual_nodes_and_not_tolerating():
    taint = {"key": FREE_GPUS_TAINT, "effect": "NoSchedule"}
    nodes = [node("vk-a", virtual=True, taints=[taint]), node("vk-b", virtual=True), node("n0")]
    pods = [pod("a1", "vk-a"), pod("a2", "vk-a", labels={RELEASE_LABEL[0]: RELEASE_LABEL[1]}),
            pod("tol", "vk-a", tolerations=[{"key": FREE_GPUS_TAINT, "operator": "Exists"}]),
            pod("b1", "vk-b"), pod("in", "n0")]
    got = {c.name: c.released for c in candidates(nodes, pods, set())}
    assert got == {"a1": False, "a2": True}
    assert candidates(nodes, pods, {"uid-a1"})[0].released is True


def _plan_by_search(nodes, pods, classes):
    """The plan as first written: every node searched for every preemptor (the reference ranking by shape must
    agree with)."""
    from gpufleet.taint_controller.flipout import _fits_node, is_preemptor

    reserved = reservations_of(nodes)
    taken = set(reserved.values())
    by_node = {}
    for p in pods:
        if p["node"] and p["gpus"] and p["phase"] not in ("Succeeded", "Failed"):
            by_node.setdefault(p["node"], []).append(p)
    preemptors = sorted((p for p in pods if is_preemptor(p, set(classes)) and p["metadata"]["uid"] not in reserved),
                        key=lambda p: (-p["priority"], p["created"], p["metadata"]["name"]))
    out = []
    for pod_ in preemptors:
        best, fits = None, False
        for n in nodes:
            if n["name"] in taken or not _fits_node(pod_, n):
                continue
            victims = victims_for(pod_, n, by_node.get(n["name"], []))
            if victims == []:
                fits = True
                break
            if victims is not None:
                score = (len(victims), sum(v["gpus"] for v in victims), n["name"])
                if best is None or score < best[0]:
                    best = (score, n, victims)
        if fits or best is None:
            continue
        taken.add(best[1]["name"])
        out.append((pod_["metadata"]["name"], best[1]["name"], tuple(v["metadata"]["name"] for v in best[2])))
    return out


def test_ranking_nodes_once_per_shape_plans_what_searching_every_node_for_every_pod_plans():
    import random

    training = {"phase": "Pending", "pc": "gpufleet-training", "unschedulable": True}
    for seed in range(200):
        rng = random.Random(seed)
        nodes = [node(f"n{i}", gpus=8, labels={"gpufleet.io/flavor": rng.choice(["h100", "a100"])})
                 for i in range(rng.randint(1, 12))]
        pods = []
        for n in nodes:
            left = 8
            while left and rng.random() < 0.7:
                g = rng.randint(1, left)
                pods.append(pod(f"b{len(pods)}", n["name"], g, priority=rng.choice([0, 10, 100000])))
                left -= g
        for i in range(rng.randint(1, 10)):
            p = pod(f"t{i}", gpus=rng.choice([4, 8]), priority=rng.choice([100000, 200000]),
                    created=f"2026-01-01T00:00:{rng.randint(0, 59):02d}Z", **training)
            if rng.random() < 0.3:
                p["nodeSelector"] = {"gpufleet.io/flavor": "h100"}
            pods.append(p)
        got = [(r.pod["metadata"]["name"], r.node, tuple(v["metadata"]["name"] for v in r.victims))
               for r in plan(nodes, pods, ["gpufleet-training"]) if r.lead is None]  # joining takes no node
        assert got == _plan_by_search(nodes, pods, ["gpufleet-training"]), f"seed {seed}"
        # The tick's inputs (unbound pods, the rest looked up through the caches' indexes) plan the same, joins too.
        assert _names(plan_from_caches(nodes, pods, ["gpufleet-training"])) == \
            _names(plan(nodes, pods, ["gpufleet-training"])), f"seed {seed}"


def _names(reservations):
    return [(r.pod["metadata"]["name"], r.node, r.lead, tuple(v["metadata"]["name"] for v in r.victims))
            for r in reservations]


def test_preemptors_pinned_to_one_node_share_its_reservation():
    """Four 2-GPU training pods pinned to n0 (as Kueue's topology-aware scheduling pins them): the first
    reserves n0, the other three join it, and the victims are chosen for all four (8 GPUs: every inference
    pod there); a fifth that would not fit beside them waits for a node of its own."""
    pinned = {"kubernetes.io/hostname": "n0"}
    nodes = [node("n0", labels=pinned), node("n1", labels={"kubernetes.io/hostname": "n1"})]
    training = {"gpus": 2, "priority": 100000, "phase": "Pending", "pc": "gpufleet-training", "unschedulable": True}
    gang = [pod(f"t{i}", created=f"2026-01-01T00:00:0{i}Z", **training) for i in range(5)]
    for p in gang:
        p["nodeSelector"] = pinned
    pods = [*(pod(f"i{i}", "n0", 2) for i in range(4)), pod("j", "n1", 8), *gang]
    out = plan(nodes, pods, ["gpufleet-training"])
    assert [(r.pod["metadata"]["name"], r.lead, len(r.victims)) for r in out] == [
        ("t0", None, 1), ("t1", "uid-t0", 2), ("t2", "uid-t0", 3), ("t3", "uid-t0", 4)]
    assert {r.node for r in out} == {"n0"}


def test_a_reservation_lasts_while_any_member_is_pending_and_is_joined_only_then():
    from gpufleet.taint_controller.flipout import reservation_members

    lead_taint = {"key": RESERVED_TAINT, "value": "uid-t0", "effect": "NoSchedule"}
    joined = [{"key": RESERVED_TAINT, "operator": "Equal", "value": "uid-t0", "effect": "NoSchedule"}]
    n0 = node("n0", taints=[lead_taint])
    training = {"gpus": 2, "priority": 100000, "pc": "gpufleet-training"}
    bound_lead = pod("t0", "n0", **training)
    waiting = pod("t1", phase="Pending", unschedulable=True, tolerations=joined, **training)
    assert reservation_members([bound_lead, waiting], {"uid-t0": "n0"}) == {"n0": [waiting]}
    assert reservation_members([bound_lead, pod("t1", "n0", tolerations=joined, **training)], {"uid-t0": "n0"}) == {}
    # Once no member is pending the reservation is being released: a new preemptor does not join it.
    late = pod("t2", phase="Pending", unschedulable=True, **training)
    assert plan([n0], [bound_lead, pod("i", "n0", 2), late], ["gpufleet-training"]) == []
    assert [(r.pod["metadata"]["name"], r.lead) for r in plan([n0], [bound_lead, pod("i", "n0", 2), waiting, late],
                                                              ["gpufleet-training"])] == [("t2", "uid-t0")]
    assert [(r.pod["metadata"]["name"], r.lead) for r in plan_from_caches(
        [n0], [bound_lead, pod("i", "n0", 2), waiting, late], ["gpufleet-training"])] == [("t2", "uid-t0")]
