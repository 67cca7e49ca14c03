"""Make before break on the local cluster: each inference pod's replacement is Ready and published before it goes.

The flip-out and flip-back run in the test process against the real API
server, their caches on real watches. The virtual node is a kwok node
labelled as a virtual-kubelet node (kwok reports its pods Running and
Ready); the way back's replacements run in-cluster, published by the
standard EndpointSlice controller. The order of events is read from a watch
of the namespace's pods: the API server's own order. Replacements outside,
published by a real virtual kubelet: ``test_flip_handover.py``.
"""

from __future__ import annotations

import threading
import time

import pytest

from gpufleet.taint_controller.budget import MigrationBudget
from gpufleet.taint_controller.flipback import FlipBack
from gpufleet.taint_controller.flipout import FlipOut
from gpufleet.taint_controller.published import ServiceEndpoints
from gpufleet.taint_controller.controller import TaintController
from gpufleet.taint_controller.decision import Hysteresis
from gpufleet.taint_controller.signal import BY_NODE, ApiServerSignal, free_gpus
from gpufleet.kube import Kube, KubeError, NotFound, api_path
from gpufleet_workshop.local.kwok import MANAGED_ANNOTATION as KWOK_MANAGED
from gpufleet.names import FREE_GPUS_EFFECT, FREE_GPUS_TAINT, POOL_LABEL, SURGE_FOR_LABEL, VIRTUAL_NODE_TAINT
from gpufleet_workshop.sim.flip import gated_policy, use_descheduler_policy
from roles.registry import load

from .helpers import wait
from .vk_helpers import (MARK, SURGE_CLASS, TRAINING_CLASS, delete_namespace, deployment, flip_classes, free_nodes,
                         mark, namespace, pods, ready, release)

pytestmark = pytest.mark.cluster

VNODE = "vk-surge-test"
POOL = "surge-test"


def virtual_node() -> dict:
    conditions = [{"type": "Ready", "status": "True", "reason": "Test", "message": "",
                   "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": VNODE, "labels": {"type": "virtual-kubelet", MARK[0]: MARK[1], POOL_LABEL: POOL},
                         "annotations": {KWOK_MANAGED[0]: KWOK_MANAGED[1]}},
            "spec": {"taints": [{"key": VIRTUAL_NODE_TAINT, "value": "simulated", "effect": "NoSchedule"},
                                {"key": FREE_GPUS_TAINT, "value": "true", "effect": FREE_GPUS_EFFECT}]},
            "status": {"capacity": {"nvidia.com/gpu": "32", "pods": "20", "cpu": "64", "memory": "256Gi"},
                       "allocatable": {"nvidia.com/gpu": "32", "pods": "20", "cpu": "64", "memory": "256Gi"},
                       "conditions": conditions}}


@pytest.fixture
def setup(local_cluster):
    """A marked free kwok node, the kwok virtual node :data:`VNODE` (marked, closed by the free-GPU taint), the
    flip's PriorityClasses, a namespace and the flip's caches; undone after."""
    kube = local_cluster.kube
    node = free_nodes(kube, 1)[0]
    mark(kube, node)
    try:
        kube.delete("v1", "nodes", VNODE)
    except NotFound:
        pass
    kube.create("v1", "nodes", virtual_node())
    flip_classes(kube)
    ns = namespace(kube, "surge")
    caches = ApiServerSignal(kube).start()
    yield kube, ns, node, caches
    caches.stop()
    delete_namespace(kube, ns)
    try:
        kube.delete("v1", "nodes", VNODE)
    except NotFound:
        pass
    release(kube, node)


def record(kube: Kube, ns: str) -> list[tuple[str, dict]]:
    """Start recording the watch events of ``ns``'s pods in the API server's order; the list they go into."""
    events: list[tuple[str, dict]] = []
    rv = kube.list("v1", "pods", ns)["metadata"]["resourceVersion"]

    def run() -> None:
        try:
            for kind, obj in kube.watch(api_path("v1", "pods", ns), resource_version=rv, timeout_seconds=600):
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    events.append((kind, obj))
        except KubeError:
            pass  # the cluster stops at the end of the session; the events were read by then

    threading.Thread(target=run, daemon=True, name="surge-test-watch").start()
    return events


def trainer(ns: str) -> dict:
    """A pod of the training PriorityClass (preemptionPolicy Never) needing the marked node's 8 GPUs."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": ns},
            "spec": {"priorityClassName": TRAINING_CLASS, "nodeSelector": dict([MARK]),
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "t", "image": "registry.invalid/train:1",
                                     "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}]}}


def serve(kube: Kube, ns: str, gpus: int, node: str) -> None:
    """Two inference replicas of ``gpus`` GPUs each under a PDB of maxUnavailable 1, both Ready on ``node``."""
    kube.create("apps/v1", "deployments", deployment("srv", ns, 2, node_selector=dict([MARK]), gpus=gpus), ns)
    kube.create("policy/v1", "poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "srv", "namespace": ns},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "srv"}}}}, ns)
    wait(f"2 inference pods Ready on {node}", lambda: sum(
        ready(p) and p["spec"].get("nodeName") == node for p in pods(kube, ns, "app=srv")) == 2)


def surge_replicasets(kube: Kube, ns: str) -> list[dict]:
    """The surge ReplicaSets of ``ns``."""
    return kube.list("apps/v1", "replicasets", ns, labelSelector=SURGE_FOR_LABEL)["items"]


def replaced_before_evicted(events: list[tuple[str, dict]], victims: set[str]) -> None:
    """Assert that every victim was evicted, each after its surge pod was Ready (in watch order)."""
    surge_ready, evicted = {}, {}
    for i, (kind, pod) in enumerate(list(events)):
        meta = pod["metadata"]
        if (meta.get("labels") or {}).get(SURGE_FOR_LABEL) and ready(pod):
            surge_ready.setdefault(meta["labels"][SURGE_FOR_LABEL], i)
        if meta["uid"] in victims and (kind == "DELETED" or meta.get("deletionTimestamp")):
            evicted.setdefault(meta["uid"], i)
    trail = [(i, kind, pod["metadata"]["name"], pod["spec"].get("nodeName"), ready(pod),
              bool(pod["metadata"].get("deletionTimestamp"))) for i, (kind, pod) in enumerate(list(events))]
    assert set(evicted) == victims, trail
    assert all(surge_ready.get(uid, len(events)) < evicted[uid] for uid in victims), \
        f"evicted before its replacement was Ready (event index): ready {surge_ready}, evicted {evicted}: {trail}"


def in_cluster_published(kube: Kube, ns: str, service: str, uid: str) -> bool:
    """Whether the standard controller's slices of ``service`` hold pod ``uid`` as a ready endpoint now."""
    return any((e.get("targetRef") or {}).get("uid") == uid and (e.get("conditions") or {}).get("ready")
               for s in kube.list("discovery.k8s.io/v1", "endpointslices", ns,
                                  labelSelector=f"kubernetes.io/service-name={service}")["items"]
               for e in s.get("endpoints") or [])


class NodeFree:
    """The free-GPU signal of one in-cluster node (the test's fleet), from the flip's caches."""

    def __init__(self, caches: ApiServerSignal, node: str):
        self.caches, self.node = caches, node

    def value(self) -> float:
        return float(free_gpus([self.caches.nodes.get(self.node)], self.caches.pods.by_index(BY_NODE, self.node)))


@pytest.mark.parametrize("decided", [False, True], ids=["flip-back", "under-the-taint-decision"])
def test_on_the_way_back_at_exact_capacity_each_in_cluster_replacement_takes_its_pods_place(setup, local_cluster,
                                                                                            decided):
    """The in-cluster node's 8 GPUs are exactly what the two 4-GPU pods outside need. Each pod's replacement
    starts in-cluster and, once Ready and published (a ready endpoint of the Service, by the standard
    EndpointSlice controller), takes the pod's place in the Deployment: its ReplicaSet removes the pod outside and
    starts no other replica, so the last replacement's GPUs are the last free ones and the move still ends.
    Release mode: the descheduler (gated to released pods) has nothing to evict. Under the taint decision
    (the taint controller ticking, low-water mark 5 GPUs, no hold), the replacements taking the last free
    GPUs does not reopen the virtual node while its pod is still outside: the GPUs returning pods take are not
    a shortage."""
    kube, ns, node, caches = setup
    use_descheduler_policy(local_cluster.cluster, gated_policy(load("local")))
    kube.patch("v1", "nodes", node, {"spec": {"unschedulable": True}})
    kube.patch("v1", "nodes", VNODE, {"spec": {"taints": [virtual_node()["spec"]["taints"][0]]}})
    kube.create("v1", "services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "srv", "namespace": ns},
                                   "spec": {"selector": {"app": "srv"}, "ports": [{"port": 80, "targetPort": 8000}]}}, ns)
    serve(kube, ns, 4, VNODE)
    outside = {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv")}
    events = record(kube, ns)
    # GPUs free again: the taint controller taints the virtual node; the in-cluster node takes pods again.
    kube.patch("v1", "nodes", node, {"spec": {"unschedulable": None}})
    kube.patch("v1", "nodes", VNODE, {"spec": {"taints": virtual_node()["spec"]["taints"]}})
    endpoints = ServiceEndpoints(kube).start()
    back = FlipBack(kube, caches.nodes, caches.pods, MigrationBudget(600, max_in_flight=1), mode="release",
                    make_before_break=True, endpoints=endpoints, surge_max_wait_seconds=600)
    published_then: list[bool] = []
    hand_over = back.surges.hand_over

    def spy(victim: dict):
        uid = victim["metadata"]["uid"]
        surge = next((p for p in pods(kube, ns, f"{SURGE_FOR_LABEL}={uid}") if ready(p)), None)
        published_then.append(surge is not None and in_cluster_published(kube, ns, "srv", surge["metadata"]["uid"]))
        return hand_over(victim)

    back.surges.hand_over = spy
    serving: list[int] = []
    ctl = TaintController(kube, NodeFree(caches, node), caches, Hysteresis(high=6, low=5, hold=0, tainted=True),
                          pools=(POOL,), flip_back=back).start()
    opened_with_pods_outside: list[int] = []

    def step() -> None:
        if decided:
            ctl.tick()
            vnode = kube.get("v1", "nodes", VNODE)
            if not any(t.get("key") == FREE_GPUS_TAINT for t in vnode["spec"].get("taints") or []):
                left = [p for p in pods(kube, ns, "app=srv") if p["spec"].get("nodeName") == VNODE
                        and not p["metadata"].get("deletionTimestamp")]
                if left:
                    opened_with_pods_outside.append(len(left))
        else:
            back.tick()
        serving.append(sum(ready(p) for p in pods(kube, ns, "app=srv")))

    try:
        wait("both pods back in-cluster and the surges removed", lambda: (step(), all(
            p["spec"].get("nodeName") == node for p in pods(kube, ns, "app=srv")
            if not p["metadata"].get("deletionTimestamp"))
            and not kube.list("apps/v1", "replicasets", ns, labelSelector=SURGE_FOR_LABEL)["items"]
            and not outside & {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv")})[1], timeout=120)
    finally:
        endpoints.stop()
    assert min(serving) >= 2, f"serving dropped below the 2 desired replicas: {serving}"
    assert not opened_with_pods_outside, f"the virtual node reopened with pods outside: {opened_with_pods_outside}"
    assert published_then and all(published_then), f"a replacement took a place before it was published: {published_then}"
    replaced_before_evicted(events, outside)
    now = [p for p in pods(kube, ns, "app=srv") if not p["metadata"].get("deletionTimestamp")]
    assert len(now) == 2 and all(ready(p) and p["spec"]["nodeName"] == node for p in now)
    assert not [p for p in now if SURGE_FOR_LABEL in p["metadata"]["labels"]], "a surge pod left over"
    rs = kube.list("apps/v1", "replicasets", ns)["items"]
    assert [r["spec"]["replicas"] for r in rs] == [2], "the user's Deployment was changed"
    assert {o["name"] for p in now for o in p["metadata"]["ownerReferences"]} == {rs[0]["metadata"]["name"]}


def test_a_replacement_that_never_becomes_ready_is_given_up_at_the_bound(setup):
    """The virtual node never opens, so no surge pod runs: nothing is evicted before the bound; at the bound the
    surges go (a pending surge would count against the PDB's maxUnavailable) and the flip-out evicts as before;
    past its deadline the rest is deleted and the trainer binds."""
    kube, ns, node, caches = setup
    serve(kube, ns, 4, node)
    victims = {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv")}
    kube.create("v1", "pods", trainer(ns), ns)
    bound, deadline = 5.0, 20.0
    out = FlipOut(kube, caches.nodes, caches.pods, [TRAINING_CLASS], surge_priority_class=SURGE_CLASS,
                  max_wait_seconds=deadline,
                  mode="make_before_break", surge_max_wait_seconds=bound)
    started = time.monotonic()
    early: list[int] = []

    def step() -> None:
        out.tick()
        if time.monotonic() - started < bound:
            early.append(len(victims & {p["metadata"]["uid"] for p in pods(kube, ns, "app=srv")
                                        if not p["metadata"].get("deletionTimestamp")}))

    wait("two surge ReplicaSets", lambda: (step(), len(surge_replicasets(kube, ns)) == 2)[1])
    wait("the surges given up at the bound", lambda: (step(), not surge_replicasets(kube, ns))[1], timeout=60)
    assert time.monotonic() - started >= bound and early and min(early) == 2, "a pod went before the bound"
    wait("the trainer bound", lambda: (step(), kube.get("v1", "pods", "trainer", ns)["spec"].get("nodeName") == node)[1],
         timeout=120)


def test_a_replacement_the_namespaces_quota_refuses_lets_its_pod_go_at_once(setup):
    """A ResourceQuota that counts the surge pods (here one scoped to their PriorityClass, so that the trainer of the
    same namespace is not counted) makes the real ReplicaSet controller report ReplicaFailure on each surge: the
    flip-out removes the surges and evicts within the PDB, as in evict_first, instead of waiting out
    surge_max_wait_seconds; the Deployment's own replacements start on the open virtual node and the trainer binds."""
    from gpufleet.taint_controller.surge import SURGES

    kube, ns, node, caches = setup
    kube.create("v1", "resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-surges", "namespace": ns},
        "spec": {"hard": {"pods": "0"}, "scopeSelector": {"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": [SURGE_CLASS]}]}}}, ns)
    serve(kube, ns, 4, node)
    kube.patch("v1", "nodes", VNODE, {"spec": {"taints": [virtual_node()["spec"]["taints"][0]]}})
    kube.create("v1", "pods", trainer(ns), ns)
    bound = 900.0
    out = FlipOut(kube, caches.nodes, caches.pods, [TRAINING_CLASS], surge_priority_class=SURGE_CLASS,
                  max_wait_seconds=bound, mode="make_before_break", surge_max_wait_seconds=bound)
    refused = SURGES.labels("refused")._value.get()

    wait("the trainer bound well before the bound", lambda: (
        out.tick(), kube.get("v1", "pods", "trainer", ns)["spec"].get("nodeName") == node)[1], timeout=180)
    assert SURGES.labels("refused")._value.get() - refused == 2
    wait("the refused surges removed", lambda: not surge_replicasets(kube, ns))
    wait("both replicas on the virtual node",
         lambda: sum(p["spec"].get("nodeName") == VNODE for p in pods(kube, ns, "app=srv")) == 2)
