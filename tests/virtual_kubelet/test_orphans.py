"""Endpoints whose publisher is gone: the decision (Lease expired, node NotReady, node deleted) and the pass that
acts on it, against the in-memory API server (:mod:`gpufleet_workshop.testing`); the publisher that comes back takes its slices over."""

from __future__ import annotations

import pytest

from gpufleet.kube import api_path
from gpufleet.kube.informer import Informer
from gpufleet.virtual_kubelet.endpoints import SLICES_API, EndpointPublisher
from gpufleet_workshop.testing import FakeKube
from gpufleet.virtual_kubelet.orphans import EVENT_REASON, KEEP, NOT_READY, REMOVE, OrphanedEndpoints, decide, not_ready_endpoints


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def writes(kube: FakeKube) -> list[tuple]:
    """The EndpointSlice writes the fake served: ``(verb, namespace, name)``."""
    return [(a.verb, a.namespace, a.name) for a in kube.writes() if a.resource == "endpointslices"]


def events(kube: FakeKube) -> list[dict]:
    """Events of cluster-scoped objects (they live in ``default``)."""
    return kube.objects("events", "default")


def stored(kube: FakeKube, name: str) -> dict | None:
    return kube.object("endpointslices", name, "inference")


def add_node(kube: FakeKube, name: str) -> None:
    kube.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}"}})


def slice_of(node: str, name: str = "chat-gf-1", *, uid: str = "s-uid", terminating: bool = False) -> dict:
    return {"apiVersion": SLICES_API, "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": "inference", "uid": uid,
                         "labels": {"kubernetes.io/service-name": "chat",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice.gpufleet.io",
                                    "gpufleet.io/virtual-node": node}},
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [{"addresses": [f"10.0.0.{i}"], "nodeName": node,
                           "conditions": {"ready": True, "serving": True, "terminating": terminating}}
                          for i in (1, 2)]}


def lease(node: str, renew: str, duration: int = 10) -> dict:
    return {"metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": duration, "renewTime": renew}}


# ------------------------------------------------------------------ the decision


@pytest.mark.parametrize("node, age, duration, expected", [
    ({"ready": True}, 3.0, 10.0, KEEP),
    ({"ready": True}, 10.0, 10.0, KEEP),  # at the duration, not yet past it
    ({"ready": True}, 10.5, 10.0, NOT_READY),  # the Lease expired
    ({"ready": True}, None, None, NOT_READY),  # no Lease at all
    ({"ready": False}, 1.0, 10.0, NOT_READY),  # NotReady (or Unknown) however fresh the Lease
    (None, 1.0, 10.0, REMOVE),  # the node is deleted
    (None, None, None, REMOVE),
])
def test_the_decision_follows_the_node_lifecycle_controller(node, age, duration, expected):
    assert decide(node, age, duration) == expected


def test_not_ready_endpoints_keep_terminating_and_say_when_there_is_nothing_to_write():
    s = slice_of("vk-a", terminating=True)
    eps = not_ready_endpoints(s)
    assert [e["conditions"] for e in eps] == [{"ready": False, "serving": False, "terminating": True}] * 2
    assert [e["addresses"] for e in eps] == [["10.0.0.1"], ["10.0.0.2"]]
    assert not_ready_endpoints({**s, "endpoints": eps}) is None


# ------------------------------------------------------------------ the pass


@pytest.fixture
def world():
    kube, clock = FakeKube(), Clock()
    nodes = Informer(kube, api_path("v1", "nodes"), name="nodes")
    orphans = OrphanedEndpoints(kube, nodes, clock=clock)
    for inf in (nodes, orphans.slices, orphans.leases):
        inf.synced.set()
    return kube, clock, nodes, orphans


def node(name: str, ready: bool = True) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "name": name, "uid": f"uid-{name}", "ready": ready}


def test_a_silent_publishers_endpoints_are_marked_not_ready_once_its_lease_expires_then_removed_with_its_node(world):
    kube, clock, nodes, orphans = world
    for n in ("vk-a", "vk-b"):
        add_node(kube, n)
        nodes.apply("ADDED", node(n))
        orphans.slices.apply("ADDED", kube.add_one(slice_of(n, f"chat-gf-{n}", uid=f"s-{n}")))
        orphans.leases.apply("ADDED", lease(n, "2026-01-01T00:00:00.000000Z"))
    clock.t += 9
    orphans.leases.apply("MODIFIED", lease("vk-b", "2026-01-01T00:00:09.000000Z"))  # b renews, a does not
    assert orphans.tick() == 0 and writes(kube) == []
    clock.t += 1.5  # a's Lease seen renewed 10.5 s ago, duration 10 s
    assert orphans.decisions() == {"vk-a": NOT_READY, "vk-b": KEEP}
    assert orphans.tick() == 1 and writes(kube) == [("patch", "inference", "chat-gf-vk-a")]
    a = stored(kube, "chat-gf-vk-a")
    assert all(e["conditions"] == {"ready": False, "serving": False, "terminating": False} for e in a["endpoints"])
    assert all(e["conditions"]["ready"] for e in stored(kube, "chat-gf-vk-b")["endpoints"])
    (event,) = events(kube)
    assert (event["type"], event["reason"], event["involvedObject"]["name"]) == ("Warning", EVENT_REASON, "vk-a")
    clock.t += 1
    assert orphans.tick() == 0 and len(events(kube)) == 1  # nothing more to write, nothing more to say
    # The node is deleted: its slices go, by UID; b's stay.
    nodes.apply("DELETED", node("vk-a"))
    kube.remove("nodes", "vk-a")
    assert orphans.decisions()["vk-a"] == REMOVE
    assert orphans.tick() == 1 and stored(kube, "chat-gf-vk-a") is None
    assert stored(kube, "chat-gf-vk-b") is not None and orphans.tick() == 0


def test_a_not_ready_node_is_acted_on_at_once_and_a_cache_that_lags_behind_a_new_node_deletes_nothing(world):
    kube, clock, nodes, orphans = world
    add_node(kube, "vk-a")
    nodes.apply("ADDED", node("vk-a", ready=False))
    orphans.leases.apply("ADDED", lease("vk-a", "t0"))
    orphans.slices.apply("ADDED", kube.add_one(slice_of("vk-a")))
    assert orphans.tick() == 1  # NotReady: not waiting for the Lease
    # A slice of a node the cache does not know but the API server does (registered again): left alone.
    orphans.slices.apply("ADDED", kube.add_one(slice_of("vk-new", "chat-gf-new", uid="s-new")))
    add_node(kube, "vk-new")
    assert orphans.decisions()["vk-new"] == REMOVE
    assert orphans.tick() == 0 and stored(kube, "chat-gf-new") is not None


def test_writes_carry_preconditions_so_a_publisher_writing_meanwhile_wins(world):
    kube, clock, nodes, orphans = world
    nodes.apply("ADDED", node("vk-a"))
    orphans.leases.apply("ADDED", lease("vk-a", "t0"))
    stale = kube.add_one(slice_of("vk-a"))
    orphans.slices.apply("ADDED", stale)
    kube.add_one(slice_of("vk-a"))  # the publisher rewrote it: a newer resourceVersion
    clock.t += 11
    assert orphans.tick() == 0, "refused: 409"
    (patch,) = [a for a in kube.writes() if a.verb == "patch"]
    assert patch.body["metadata"]["resourceVersion"] == stale["metadata"]["resourceVersion"]
    assert all(e["conditions"]["ready"] for e in stored(kube, "chat-gf-1")["endpoints"]), "the publisher's write stands"
    nodes.apply("DELETED", node("vk-a"))
    kube.modify("endpointslices", "chat-gf-1", "inference",
                lambda s: s["metadata"].update(uid="another-slice"))  # recreated under the same name
    assert orphans.tick() == 0 and stored(kube, "chat-gf-1") is not None


def test_until_the_caches_are_synced_nothing_is_decided(world):
    kube, clock, nodes, orphans = world
    orphans.slices.apply("ADDED", kube.add_one(slice_of("vk-a")))
    orphans.leases.synced.clear()
    assert orphans.decisions() == {} and orphans.tick() == 0


def test_a_lease_first_seen_now_gets_its_full_duration_whatever_its_renew_time_says(world):
    """Ages are this process's observations (nodelifecycle's way), not the publisher's clock against this one."""
    kube, clock, nodes, orphans = world
    nodes.apply("ADDED", node("vk-a"))
    orphans.slices.apply("ADDED", kube.add_one(slice_of("vk-a")))
    orphans.leases.apply("ADDED", lease("vk-a", "1999-01-01T00:00:00.000000Z"))
    clock.t += 10
    assert orphans.decisions() == {"vk-a": KEEP}
    orphans.leases.apply("MODIFIED", lease("vk-a", "1999-01-01T00:00:00.000000Z"))  # a relist: no renewal
    clock.t += 0.5
    assert orphans.decisions() == {"vk-a": NOT_READY}


# ------------------------------------------------------------------ the publisher takes its slices back


def test_a_publisher_republishes_a_slice_someone_else_changed_or_deleted():
    pods = Informer(FakeKube(), api_path("v1", "pods"), name="pods")
    pub = EndpointPublisher(FakeKube(), "vk-a", pods, lambda p: None)
    mine = slice_of("vk-a")
    pub.slices.apply("ADDED", mine)
    pub.slices.apply("MODIFIED", {**mine, "metadata": {**mine["metadata"], "resourceVersion": "9"}})  # same essence
    assert pub.queue.get(timeout=0) is None
    pub.slices.apply("MODIFIED", {**mine, "endpoints": not_ready_endpoints(mine)})
    assert pub.queue.get(timeout=0) == "inference/chat"
    pub.queue.done("inference/chat")
    pub.slices.apply("DELETED", mine)
    assert pub.queue.get(timeout=0) == "inference/chat"


# ------------------------------------------------------------------ where it runs: the taint controller


def test_the_taint_controller_carries_the_pass_and_runs_it_every_tick(world):
    from gpufleet.taint_controller.decision import Hysteresis
    from gpufleet.taint_controller.main import build
    from gpufleet.taint_controller.controller import TaintController
    from roles.registry import load
    from roles.taint_controller.config import configuration

    ctl, caches = build(FakeKube(), configuration(load("local")))
    assert isinstance(ctl.orphans, OrphanedEndpoints) and ctl.orphans.nodes is caches.nodes

    kube, clock, nodes, orphans = world
    nodes.apply("ADDED", node("vk-a", ready=False))
    orphans.slices.apply("ADDED", kube.add_one(slice_of("vk-a")))

    class Signal:
        def value(self):
            return None

    class Caches:
        nodes = Informer(FakeKube(), api_path("v1", "nodes"), name="none")

    TaintController(kube, Signal(), Caches(), Hysteresis(16, 8, 0), orphans=orphans, clock=clock).tick()
    assert writes(kube) == [("patch", "inference", "chat-gf-1")]
