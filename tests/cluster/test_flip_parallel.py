"""The flip-out serves several training pods side by side against a real API server: every node reserved and
every replacement started in one pass, make before break, every replica serving throughout.

Three marked kwok nodes each run one inference replica of 8 GPUs (PDB
maxUnavailable 1); three training pods each need a whole marked node. A
real virtual kubelet (the simulated rental, a 2 s start) is the outside. The
flip-out runs in the test process on real watches (as ``test_flip_failures.py``),
its reservations worked on by its pool of workers sharing one client. That
they are in flight together is shown by the unit test
(``tests/taint_controller/test_reconcile.py``, a barrier only all of them open).
"""

from __future__ import annotations

import pytest

from gpufleet.kube import Kube
from gpufleet.names import RESERVED_TAINT, SURGE_FOR_LABEL
from gpufleet.taint_controller.flipout import FlipOut

from .helpers import wait
from .test_flip_failures import min_ready
from .test_flip_surge import record, trainer
from .vk_helpers import MARK, SURGE_CLASS, TRAINING_CLASS, deployment, flip_stage, free_gpus_taint, pods, ready

pytestmark = pytest.mark.cluster

POOL = "flip-parallel"
NODES = 3


@pytest.fixture
def setup(local_cluster):
    """:func:`~tests.cluster.vk_helpers.flip_stage` with three marked nodes (pool :data:`POOL`)."""
    kube = local_cluster.kube
    with flip_stage(kube, POOL, "flippar", nodes=NODES, start_latency_seconds=2.0) as stage:
        yield kube, stage.ns, stage.nodes, stage.caches, stage.vk


def reserved_nodes(kube: Kube, nodes: list[str]) -> set[str]:
    return {n for n in nodes if any(t.get("key") == RESERVED_TAINT for t in kube.get("v1", "nodes", n)["spec"]
                                    .get("taints") or [])}


def test_several_training_pods_are_served_side_by_side_and_every_replica_keeps_serving(setup):
    kube, ns, nodes, caches, vk = setup
    kube.create("apps/v1", "deployments", deployment("srv", ns, NODES, node_selector=dict([MARK]), gpus=8), ns)
    kube.create("policy/v1", "poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "srv", "namespace": ns},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "srv"}}}}, ns)
    wait(f"{NODES} inference pods Ready on the marked nodes", lambda: sorted(
        p["spec"].get("nodeName") for p in pods(kube, ns, "app=srv") if ready(p)) == nodes)
    before = pods(kube, ns, "app=srv")
    events = record(kube, ns)
    for i in range(NODES):
        t = trainer(ns)
        t["metadata"]["name"] = f"trainer-{i}"
        kube.create("v1", "pods", t, ns)
    out = FlipOut(kube, caches.nodes, caches.pods, [TRAINING_CLASS], surge_priority_class=SURGE_CLASS,
                  max_wait_seconds=600,
                  mode="make_before_break", surge_max_wait_seconds=120, concurrent_syncs=NODES)
    try:
        wait("the trainers unschedulable in the flip-out's cache", lambda: len(
            [p for p in caches.pods.items() if p["metadata"]["name"].startswith("trainer-") and p["unschedulable"]])
            == NODES)
        out.tick()
        assert reserved_nodes(kube, nodes) == set(nodes), "one pass reserves every node the trainers need"
        surge_sets = kube.list("apps/v1", "replicasets", ns, labelSelector=SURGE_FOR_LABEL)["items"]
        assert len(surge_sets) == NODES, "and starts every replacement outside in that same pass"
        free_gpus_taint(kube, vk.node_name, on=False)  # the reservations took the free GPUs: the outside opens

        def bound() -> bool:
            out.tick()
            return all(p["spec"].get("nodeName") in nodes for p in pods(kube, ns)
                       if p["metadata"]["name"].startswith("trainer-"))

        wait("every trainer bound to a marked node", bound, timeout=120, interval=0.5)
    finally:
        out.close()
    low = min_ready(events, before)
    assert low >= NODES, f"Ready inference pods went down to {low}: a victim went before its replacement served"
    outside = [p for p in pods(kube, ns, "app=srv") if p["spec"].get("nodeName") == vk.node_name and ready(p)]
    assert len(outside) == NODES, "every replica serves outside"
