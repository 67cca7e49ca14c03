"""Make before break when things go wrong outside: a provider that refuses or is slow, training that ends early.

Same setup as ``test_flip_surge.py`` (the flip-out in the test process on
real watches, a marked in-cluster kwok node, the order read from a watch of
the namespace's pods), but the virtual node is a real virtual kubelet with
the simulated rental behind it, so its pods are exactly as fast, slow or
refused as the provider. Inference: 4 replicas of 2 GPUs on the marked
node under a PDB of minAvailable 2; the trainer needs 4 of the node's 8
GPUs, so two victims make room.
"""

from __future__ import annotations

import time

import pytest

from gpufleet.taint_controller.flipout import FlipOut
from gpufleet.kube import Kube
from gpufleet.names import RESERVED_TAINT, SURGE_FOR_LABEL

from .helpers import wait
from .test_flip_surge import record, trainer
from .vk_helpers import MARK, SURGE_CLASS, TRAINING_CLASS, deployment, flip_stage, free_gpus_taint, pods, ready

pytestmark = pytest.mark.cluster

POOL = "flip-fail"
MIN_AVAILABLE = 2
#: Seconds after the reservation past which make-before-break evicts without a Ready replacement.
BOUND = 10.0
#: What the flip-out may take beyond the bound: its ticks, two evictions, kwok removing the pods, the bind.
MARGIN = 30.0


@pytest.fixture
def setup(local_cluster, request):
    """:func:`~tests.cluster.vk_helpers.flip_stage` with one marked node, its simulated rental with
    ``request.param``'s settings (start latency, failure rate; 32 GPUs unless ``gpus`` is given)."""
    kube = local_cluster.kube
    with flip_stage(kube, POOL, "flipfail", **request.param) as stage:
        yield kube, stage.ns, stage.nodes[0], stage.caches, stage.vk


def serve(kube: Kube, ns: str, node: str) -> set[str]:
    """4 inference replicas of 2 GPUs on ``node`` under a PDB of minAvailable 2, all Ready; their UIDs."""
    kube.create("apps/v1", "deployments", deployment("srv", ns, 4, node_selector=dict([MARK]), gpus=2), ns)
    kube.create("policy/v1", "poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "srv", "namespace": ns},
        "spec": {"minAvailable": MIN_AVAILABLE, "selector": {"matchLabels": {"app": "srv"}}}}, ns)
    wait(f"4 inference pods Ready on {node}", lambda: sum(
        ready(p) and p["spec"].get("nodeName") == node for p in pods(kube, ns, "app=srv")) == 4)
    wait("the PDB allows 2 disruptions", lambda: (kube.get("policy/v1", "poddisruptionbudgets", "srv", ns)
                                                  .get("status") or {}).get("disruptionsAllowed") == 2)
    return {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv")}


def half_trainer(ns: str) -> dict:
    """The surge tests' trainer, asking for 4 GPUs: two of the four inference pods must go."""
    pod = trainer(ns)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}}
    return pod


#: Names of every surge ReplicaSet seen, per namespace.
SEEN: dict[str, set[str]] = {}


def surges(kube: Kube, ns: str) -> list[dict]:
    """The namespace's surge ReplicaSets now (each also noted in :data:`SEEN`)."""
    items = kube.list("apps/v1", "replicasets", ns, labelSelector=SURGE_FOR_LABEL)["items"]
    SEEN.setdefault(ns, set()).update(r["metadata"]["name"] for r in items)
    return items


def reserved(kube: Kube, node: str) -> bool:
    return any(t.get("key") == RESERVED_TAINT for t in kube.get("v1", "nodes", node)["spec"].get("taints") or [])


def min_ready(events: list[tuple[str, dict]], before: list[dict]) -> int:
    """The fewest Ready inference pods at any point of the watch, from ``before`` (the pods when it started) on."""
    state = {p["metadata"]["uid"]: ready(p) for p in before}
    low = sum(state.values())
    for kind, pod in list(events):
        if (pod["metadata"].get("labels") or {}).get("app") != "srv":
            continue
        state[pod["metadata"]["uid"]] = kind != "DELETED" and ready(pod)
        n = sum(state.values())
        low = min(low, n)
    return low


@pytest.mark.parametrize("setup", [{"failure_rate": 1.0}, {"start_latency_seconds": 120.0}],
                         ids=["provider-refuses", "provider-slow"], indirect=True)
def test_training_wins_by_the_bound_and_serving_stays_above_the_pdb_when_the_provider_fails(setup):
    kube, ns, node, caches, vk = setup
    victims = serve(kube, ns, node)
    before = pods(kube, ns, "app=srv")
    events = record(kube, ns)
    kube.create("v1", "pods", half_trainer(ns), ns)
    out = FlipOut(kube, caches.nodes, caches.pods, [TRAINING_CLASS], surge_priority_class=SURGE_CLASS,
                  max_wait_seconds=600,
                  mode="make_before_break", surge_max_wait_seconds=BOUND)
    wait("the node reserved", lambda: (out.tick(), reserved(kube, node))[1])
    started = time.monotonic()
    # The reservation took the free GPUs: the taint controller opens the virtual node.
    free_gpus_taint(kube, vk.node_name, on=False)
    wait("surges started outside", lambda: (out.tick(), surges(kube, ns))[1])
    early = []

    def step() -> bool:
        out.tick()
        surges(kube, ns)
        if time.monotonic() - started < BOUND - 1:
            early.append(len(victims & {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv")
                                        if not p["metadata"].get("deletionTimestamp")}))
        return kube.get("v1", "pods", "trainer", ns)["spec"].get("nodeName") == node

    wait("the trainer bound", step, timeout=BOUND + MARGIN, interval=0.5)
    took = time.monotonic() - started
    print(f"trainer bound {took:.1f}s after the reservation (bound {BOUND:g}s)")
    assert took >= BOUND - 1 and early and min(early) == 4, "a pod went before the bound without a Ready replacement"
    wait("no surge left", lambda: (out.tick(), not surges(kube, ns))[1], timeout=30)
    low = min_ready(events, before)
    assert low >= MIN_AVAILABLE, f"Ready inference pods went down to {low}, below the PDB's minAvailable"
    left = {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv") if not p["metadata"].get("deletionTimestamp")}
    assert len(victims - left) == 2, "exactly the two victims the trainer needs are evicted"
    assert len(SEEN[ns]) == 2, f"replacements started for pods that need not move: {sorted(SEEN[ns])}"


@pytest.mark.parametrize("setup", [{"start_latency_seconds": 120.0}], ids=["provider-slow"], indirect=True)
def test_training_that_ends_while_replacements_start_evicts_nothing_and_leaves_nothing_outside(setup):
    kube, ns, node, caches, vk = setup
    victims = serve(kube, ns, node)
    before = pods(kube, ns, "app=srv")
    events = record(kube, ns)
    kube.create("v1", "pods", half_trainer(ns), ns)
    out = FlipOut(kube, caches.nodes, caches.pods, [TRAINING_CLASS], surge_priority_class=SURGE_CLASS,
                  max_wait_seconds=600,
                  mode="make_before_break", surge_max_wait_seconds=60)
    wait("the node reserved", lambda: (out.tick(), reserved(kube, node))[1])
    free_gpus_taint(kube, vk.node_name, on=False)
    wait("surge pods starting outside", lambda: (out.tick(), surges(kube, ns), [
        p for p in pods(kube, ns, SURGE_FOR_LABEL) if p["spec"].get("nodeName") == vk.node_name])[2])
    out.tick()
    assert len(surges(kube, ns)) == 2, "replacements started for pods that need not move"
    # Training ends (cancelled, or done) before any replacement is Ready.
    kube.delete("v1", "pods", "trainer", ns, grace_seconds=0)
    wait("the reservation lifted and the surges removed",
         lambda: (out.tick(), not reserved(kube, node) and not surges(kube, ns))[1], timeout=30)
    free_gpus_taint(kube, vk.node_name, on=True)  # free GPUs again: the taint controller closes the virtual node
    wait("nothing left outside", lambda: not [p for p in pods(kube, ns) if p["spec"].get("nodeName") == vk.node_name],
         timeout=30)
    assert not vk.pods.providers[POOL].get_pods(), "a rental left running"
    now = [p for p in pods(kube, ns, "app=srv") if not p["metadata"].get("deletionTimestamp")]
    assert {p["metadata"]["uid"] for p in now} == victims and all(
        ready(p) and p["spec"]["nodeName"] == node for p in now), "an inference pod was evicted for nothing"
    assert not [e for e in list(events) if e[1]["metadata"]["uid"] in victims
                and (e[0] == "DELETED" or e[1]["metadata"].get("deletionTimestamp"))]
    assert min_ready(events, before) == 4
    dep = kube.get("apps/v1", "deployments", "srv", ns)
    assert dep["spec"]["replicas"] == 4 and (dep.get("status") or {}).get("availableReplicas") == 4
