"""Make before break with a real virtual kubelet: a replacement outside takes its pod's place once Ready and published.

Setup as in ``test_flip_failures.py`` (the flip-out in the test process on
real watches, a marked in-cluster kwok node, the virtual kubelet with the
simulated rental behind it, the order read from a watch of the namespace's
pods), with a Service in front of the inference pods: the virtual kubelet
publishes the pods outside into it and marks each
``endpoints.gpufleet.io/Published`` once it is a ready endpoint there. A
replacement outside takes its pod's place only then, adopted by the pod's
own ReplicaSet, which removes the pod and starts nothing else; so with room
outside for one pod fewer than the flip needs, the replacement that runs
still takes its place at once, and only the pod without one waits for the
bound. The Deployment selects its pods as the inference role declares
(surge pods left out), and its scale subresource, which an HPA lists the
pods it averages over by, never lists a surge pod.
"""

from __future__ import annotations

import time

import pytest

from gpufleet.taint_controller.flipout import FlipOut
from gpufleet.kube import Kube
from gpufleet.names import PUBLISHED_CONDITION, SURGE_FOR_LABEL
from roles.inference.manifests import NOT_A_SURGE

from .helpers import wait
from .test_flip_failures import half_trainer, min_ready, reserved, setup, surges  # noqa: F401
from .test_flip_surge import record
from .vk_helpers import MARK, SURGE_CLASS, TRAINING_CLASS, deployment, free_gpus_taint, pods, ready

pytestmark = pytest.mark.cluster

#: Seconds after the reservation past which make-before-break evicts without a Ready, published replacement.
BOUND = 30.0
#: What the flip-out may take beyond the bound: its ticks, an eviction, kwok removing the pod, the bind.
MARGIN = 30.0


def serve(kube: Kube, ns: str, node: str, pdb: dict) -> set[str]:
    """4 inference replicas of 2 GPUs (port ``http`` 8000) on ``node`` behind Service ``srv``, under a PDB of
    ``pdb`` (its spec, less the selector), all Ready; their UIDs."""
    dep = deployment("srv", ns, 4, node_selector=dict([MARK]), gpus=2)
    dep["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
    dep["spec"]["selector"]["matchExpressions"] = [dict(NOT_A_SURGE)]  # as the inference role declares it
    kube.create("v1", "services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "srv", "namespace": ns},
                                   "spec": {"selector": {"app": "srv"},
                                            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}, ns)
    kube.create("apps/v1", "deployments", dep, ns)
    kube.create("policy/v1", "poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "srv", "namespace": ns},
        "spec": {**pdb, "selector": {"matchLabels": {"app": "srv"}}}}, ns)
    wait(f"4 inference pods Ready on {node}", lambda: sum(
        ready(p) and p["spec"].get("nodeName") == node for p in pods(kube, ns, "app=srv")) == 4)
    wait("the PDB observed", lambda: (kube.get("policy/v1", "poddisruptionbudgets", "srv", ns).get("status") or {})
         .get("disruptionsAllowed", 0) >= 1)
    return {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv")}


def scale_selection(kube: Kube, ns: str, name: str) -> list[dict]:
    """The pods an HPA of Deployment ``name`` averages over: those its scale subresource's selector lists."""
    selector = kube.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale")["status"]["selector"]
    return pods(kube, ns, selector)


def published(pod: dict) -> bool:
    return any(c.get("type") == PUBLISHED_CONDITION and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def replaced_once_published(events: list[tuple[str, dict]], victims: set[str]) -> set[str]:
    """The victims that left after their surge pod was Ready and published (watch order), each checked to have left."""
    surge_up, gone = {}, {}
    for i, (kind, pod) in enumerate(list(events)):
        meta = pod["metadata"]
        uid = (meta.get("labels") or {}).get(SURGE_FOR_LABEL)
        if uid and ready(pod) and published(pod):
            surge_up.setdefault(uid, i)
        if meta["uid"] in victims and (kind == "DELETED" or meta.get("deletionTimestamp")):
            gone.setdefault(meta["uid"], i)
    assert set(gone) == victims, f"not every victim left: {sorted(victims - set(gone))}"
    return {uid for uid in victims if surge_up.get(uid, len(events)) < gone[uid]}


def flip_out(kube: Kube, ns: str, node: str, caches, vk, bound: float) -> tuple[FlipOut, float]:
    """Submit the trainer, run the flip-out until it reserved ``node``, open the virtual node (as the taint
    controller does once the reservation took the free GPUs); the flip-out and when the reservation was seen."""
    kube.create("v1", "pods", half_trainer(ns), ns)
    out = FlipOut(kube, caches.nodes, caches.pods, [TRAINING_CLASS], surge_priority_class=SURGE_CLASS,
                  max_wait_seconds=600,
                  mode="make_before_break", surge_max_wait_seconds=bound)
    wait("the node reserved", lambda: (out.tick(), reserved(kube, node))[1])
    started = time.monotonic()
    free_gpus_taint(kube, vk.node_name, on=False)
    return out, started


def place_of(kube: Kube, ns: str) -> tuple[list[dict], list[dict]]:
    """``(inference pods not terminating, the namespace's ReplicaSets)`` now."""
    return ([p for p in pods(kube, ns, "app=srv") if not p["metadata"].get("deletionTimestamp")],
            kube.list("apps/v1", "replicasets", ns)["items"])


@pytest.mark.parametrize("setup", [{}], ids=["rental"], indirect=True)
def test_each_replacement_outside_takes_its_pods_place_once_ready_and_published(setup):
    kube, ns, node, caches, vk = setup
    victims = serve(kube, ns, node, {"minAvailable": 2})
    before = pods(kube, ns, "app=srv")
    events = record(kube, ns)
    out, _ = flip_out(kube, ns, node, caches, vk, 300.0)
    counted: set[str] = set()  # surge pods an HPA would have averaged over

    def tick() -> None:
        out.tick()
        counted.update(p["metadata"]["name"] for p in scale_selection(kube, ns, "srv")
                       if SURGE_FOR_LABEL in p["metadata"]["labels"])

    wait("the trainer bound", lambda: (tick(), kube.get("v1", "pods", "trainer", ns)["spec"].get("nodeName")
                                       == node)[1], timeout=120, interval=0.5)
    wait("no surge ReplicaSet left", lambda: (tick(), not surges(kube, ns))[1], timeout=30)
    now, rs = place_of(kube, ns)
    gone = victims - {p["metadata"]["uid"] for p in now}
    assert len(gone) == 2, "exactly the two victims the trainer needs left"
    assert replaced_once_published(events, gone) == gone, "a pod left before its replacement was Ready and published"
    assert not counted, f"the Deployment's scale selector listed surge pods (an HPA counts them): {sorted(counted)}"
    low = min_ready(events, before)
    assert low >= 4, f"Ready inference pods went down to {low}: a pod left before its replacement served"
    # The replacements are the Deployment's own pods now; nothing else was started, nothing of gpufleet's is left.
    assert [r["spec"]["replicas"] for r in rs] == [4], "the user's Deployment was changed"
    assert len(now) == 4 and all(ready(p) for p in now)
    assert sum(p["spec"]["nodeName"] == vk.node_name for p in now) == 2
    assert all(SURGE_FOR_LABEL not in p["metadata"]["labels"] and p["metadata"]["ownerReferences"][0]["name"]
               == rs[0]["metadata"]["name"] for p in now)
    assert all(published(p) for p in now if p["spec"]["nodeName"] == vk.node_name)
    outside = [p for p in now if p["spec"]["nodeName"] == vk.node_name]
    assert {(p["spec"].get("priorityClassName"), p["spec"].get("preemptionPolicy")) for p in outside} == {
        (SURGE_CLASS, "Never")}, "the replacements went ahead of training in kube-scheduler's queue"
    assert min(p["spec"]["priority"] for p in outside) > kube.get("v1", "pods", "trainer", ns)["spec"]["priority"]


@pytest.mark.parametrize("setup", [{"gpus": 2}], ids=["room-for-one"], indirect=True)
def test_with_room_outside_for_one_pod_fewer_the_replacement_that_runs_takes_its_place_before_the_bound(setup):
    """The flip needs two pods moved, the rental has room for one. The surge that cannot be placed (Pending, and
    so, under maxUnavailable 1, a PDB with no disruption left) does not hold up the one that runs: that one takes
    its pod's place at once; the other pod goes at the bound, as in evict_first, and its Deployment's replacement
    waits for room."""
    kube, ns, node, caches, vk = setup
    victims = serve(kube, ns, node, {"maxUnavailable": 1})
    before = pods(kube, ns, "app=srv")
    events = record(kube, ns)
    out, started = flip_out(kube, ns, node, caches, vk, BOUND)
    left_early: list[int] = []

    def step() -> bool:
        out.tick()
        if time.monotonic() - started < BOUND - 1:
            left_early.append(len(victims - {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv")
                                             if not p["metadata"].get("deletionTimestamp")}))
        return kube.get("v1", "pods", "trainer", ns)["spec"].get("nodeName") == node

    wait("the trainer bound", step, timeout=BOUND + MARGIN, interval=0.5)
    took = time.monotonic() - started
    print(f"trainer bound {took:.1f}s after the reservation (bound {BOUND:g}s)")
    assert left_early and max(left_early) == 1, "the pod with a running replacement did not go before the bound"
    deployment_available = (lambda: (kube.get("apps/v1", "deployments", "srv", ns).get("status") or {})
                            .get("availableReplicas"))
    wait("no surge left, three replicas available", lambda: (out.tick(), not surges(kube, ns)
                                                             and deployment_available() == 3)[1], timeout=30)
    now, rs = place_of(kube, ns)
    gone = victims - {p["metadata"]["uid"] for p in now}
    assert len(gone) == 2 and len(replaced_once_published(events, gone)) == 1
    assert min_ready(events, before) >= 3, "serving went below the PDB's floor"
    outside = [p for p in now if p["spec"].get("nodeName") == vk.node_name]
    assert len(outside) == 1 and ready(outside[0]) and SURGE_FOR_LABEL not in outside[0]["metadata"]["labels"]
    # The evicted pod's replacement is the Deployment's own, waiting for room; the user's Deployment is unchanged.
    assert [r["spec"]["replicas"] for r in rs] == [4]
    assert len([p for p in now if not p["spec"].get("nodeName")]) == 1
