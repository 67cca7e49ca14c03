"""The taint controller's signal: free schedulable GPUs in the cluster.

Definition (:func:`free_gpus`): over the nodes whose GPUs count for
inference by the one node classifier (:mod:`gpufleet.fleet.classify`: in
cluster, ``Ready``, not cordoned, every ``NoSchedule``/``NoExecute`` taint
tolerated by inference pods, matched as the scheduler matches them; so nodes
out for swap, unreachable, reserved by the flip-out or tainted for another
purpose do not count, degraded ones do), the sum of ``max(0, allocatable
nvidia.com/gpu - GPU requests of the non-terminal pods bound there)``. Unit: GPUs.
Quota sync, ``invoke status`` and node health ask the same classifier.

Two sources:

* :class:`ApiServerSignal`: a watch-based cache of Nodes and of non-terminal
  Pods (``fieldSelector=status.phase!=Succeeded,status.phase!=Failed``;
  a pod that finishes leaves the cache through the watch). Listed once at
  start; no periodic full lists. Its caches are shared with the flip-out
  and flip-back loops.
* :class:`PrometheusSignal`: an instant query (``taint_controller_promql``)
  through :class:`gpufleet.prom.client.PromClient`; the result is a scalar
  or the sum of a vector. An error or an empty result is "no sample" (None).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from gpufleet.fleet.capacity import pod_gpus
from gpufleet.fleet.classify import INFERENCE, NodeFacts, classify, default_classes
from gpufleet.kube import Kube, api_path
from gpufleet.kube.informer import Informer
from gpufleet.kube.quantity import GpuCountError
from gpufleet.kube.times import parse_time
from gpufleet.names import PUBLISHED_CONDITION, RESERVED_TAINT, SURGE_FOR_LABEL
from gpufleet.prom.client import PromClient, PromError

#: The classes the signal classifies nodes for: it counts room for inference.
CLASSES = default_classes()

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- compact objects


def node_view(node: dict) -> dict[str, Any]:
    """What the caches keep of a Node: name, labels, virtual, ready, unschedulable, taints, GPUs, the classifier's
    facts, and ``inference``: whether its GPUs count for inference (:func:`schedulable`), classified once per
    change of the Node rather than on every tick.

    A fractional ``nvidia.com/gpu`` allocatable is refused (``gpus`` 0, the node counts for nobody;
    ``facts.problem`` says why), never truncated.
    """
    meta = node.get("metadata") or {}
    facts = NodeFacts.of(node)
    if facts.problem:
        log.error("%s", facts.problem)
    return {"name": meta.get("name"), "uid": meta.get("uid"), "labels": dict(facts.labels), "virtual": facts.virtual,
            "ready": facts.ready, "unschedulable": facts.unschedulable, "taints": list(facts.taints),
            "gpus": facts.allocatable or 0, "facts": facts, "resourceVersion": meta.get("resourceVersion"),
            "inference": classify(facts, CLASSES).counts(INFERENCE)}


def pod_view(pod: dict) -> dict[str, Any]:
    """What the caches keep of a Pod (enough for the signal, flip-out and flip-back)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    sched = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "labels", "ownerReferences", "deletionTimestamp")
                     if k in meta},
        "created": parse_time(meta.get("creationTimestamp")) or 0.0,
        "node": spec.get("nodeName") or "",
        "gpus": _pod_gpus(pod),
        "priority": int(spec.get("priority") or 0),
        "priorityClassName": spec.get("priorityClassName") or "",
        "preemptionPolicy": spec.get("preemptionPolicy") or "PreemptLowerPriority",
        "nodeSelector": dict(spec.get("nodeSelector") or {}),
        "tolerations": list(spec.get("tolerations") or []),
        "phase": status.get("phase") or "Pending",
        "unschedulable": sched.get("status") == "False" and sched.get("reason") == "Unschedulable",
        "ready": conditions.get("Ready") == "True",
        # A pod outside: its virtual kubelet published it into every Service selecting it (gpufleet.virtual_kubelet.endpoints).
        "published": conditions.get(PUBLISHED_CONDITION) == "True",
        "ip": status.get("podIP") or "",
    }


# ------------------------------------------------------------------------------- indexes of the pod cache
# (gpufleet.kube.informer: what a tick asks about one node or one victim is answered without a scan)

#: Index of pod views by ``uid``.
BY_UID = "uid"
#: Index of pod views by the node they are bound to (unbound pods are in no entry).
BY_NODE = "node"
#: Index of pod views by ``namespace``.
BY_NAMESPACE = "namespace"
#: Index of surge pods by the UID of the pod they replace (:data:`gpufleet.names.SURGE_FOR_LABEL`).
BY_SURGE_FOR = "surge-for"
#: Index of the pods bound to no node, all under the one key :data:`UNBOUND`.
BY_BINDING = "binding"
UNBOUND = "unbound"
#: Index of the pods that hold GPUs on a node (:func:`holds_gpus`) by that node's name.
BY_GPU_NODE = "gpu-node"


def holds_gpus(p: dict[str, Any]) -> bool:
    """The pod view is bound to a node, not finished (Succeeded, Failed) and requests GPUs: they count as used."""
    return bool(p["node"]) and p["phase"] not in ("Succeeded", "Failed") and p["gpus"] > 0


def _by_uid(p: dict[str, Any]) -> tuple[str, ...]:
    return (p["metadata"]["uid"],) if p["metadata"].get("uid") else ()


def _by_node(p: dict[str, Any]) -> tuple[str, ...]:
    return (p["node"],) if p["node"] else ()


def _by_binding(p: dict[str, Any]) -> tuple[str, ...]:
    return () if p["node"] else (UNBOUND,)


def _by_namespace(p: dict[str, Any]) -> tuple[str, ...]:
    return (p["metadata"].get("namespace") or "",)


def _by_gpu_node(p: dict[str, Any]) -> tuple[str, ...]:
    return (p["node"],) if holds_gpus(p) else ()


def _by_surge_for(p: dict[str, Any]) -> tuple[str, ...]:
    victim = (p["metadata"].get("labels") or {}).get(SURGE_FOR_LABEL)
    return (victim,) if victim else ()


# ------------------------------------------------------------------------------- indexes of the node cache

#: Index of node views by each of their labels, keyed ``<key>=<value>`` (:func:`label_key`).
BY_LABEL = "label"
#: Index of the node views that carry a reservation taint (:data:`gpufleet.names.RESERVED_TAINT` with a value),
#: all under the one key :data:`RESERVED`.
BY_RESERVATION = "reservation"
RESERVED = "reserved"


def label_key(key: str, value: str) -> str:
    """The :data:`BY_LABEL` index key of label ``key`` = ``value``."""
    return f"{key}={value}"


def _by_label(n: dict[str, Any]) -> tuple[str, ...]:
    return tuple(label_key(k, v) for k, v in n["labels"].items())


def reservation_leads(n: dict[str, Any]) -> list[str]:
    """The UIDs of the pods that lead a reservation of node view ``n``: its reservation taints' values
    (:data:`gpufleet.names.RESERVED_TAINT`; one without a value reserves for no one)."""
    return [t["value"] for t in n["taints"] if t.get("key") == RESERVED_TAINT and t.get("value")]


def _by_reservation(n: dict[str, Any]) -> tuple[str, ...]:
    return (RESERVED,) if reservation_leads(n) else ()


#: Every index of the node cache, for :class:`gpufleet.kube.informer.Informer`'s ``indexers``.
NODE_INDEXES = {BY_LABEL: _by_label, BY_RESERVATION: _by_reservation}

#: Every index of the pod cache, for :class:`gpufleet.kube.informer.Informer`'s ``indexers``.
POD_INDEXES = {BY_UID: _by_uid, BY_NODE: _by_node, BY_NAMESPACE: _by_namespace, BY_SURGE_FOR: _by_surge_for,
               BY_BINDING: _by_binding, BY_GPU_NODE: _by_gpu_node}


def pod_by_uid(pods: Informer, uid: str) -> dict[str, Any] | None:
    """The cached pod view with ``uid``, or None (``pods`` indexed with :data:`POD_INDEXES`)."""
    found = pods.by_index(BY_UID, uid)
    return found[0] if found else None


def _pod_gpus(pod: dict) -> int:
    """GPUs a pod requests (:func:`gpufleet.fleet.capacity.pod_gpus`). A fraction (the API server refuses
    them for extended resources) is refused as :func:`node_view` refuses one: logged naming the pod and
    value, the pod counted for no GPUs; never rounded."""
    try:
        return pod_gpus(pod)
    except GpuCountError as exc:
        log.error("%s; counted as holding no GPUs", exc)
        return 0


def schedulable(node: dict[str, Any]) -> bool:
    """The node's GPUs count for inference (the classifier, as :func:`node_view` asked it; module docstring)."""
    return node["inference"]


def gpus_used(pods: Iterable[dict[str, Any]]) -> dict[str, int]:
    """GPUs requested per node by the pods that hold them (:func:`holds_gpus`): ``{node: gpus}``."""
    used: dict[str, int] = {}
    for p in pods:
        if holds_gpus(p):
            used[p["node"]] = used.get(p["node"], 0) + p["gpus"]
    return used


def free_gpus(nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]] | Informer) -> int:
    """Free schedulable GPUs (module docstring) from :func:`node_view` values and :func:`pod_view` values, or an
    informer of them indexed by :data:`BY_GPU_NODE`: then each node's pods are looked up, not the fleet's scanned."""
    if isinstance(pods, Informer):
        def used_on(node: str) -> int:
            return sum(p["gpus"] for p in pods.by_index(BY_GPU_NODE, node))
    else:
        used = gpus_used(pods)

        def used_on(node: str) -> int:
            return used.get(node, 0)
    return sum(max(0, n["gpus"] - used_on(n["name"])) for n in nodes if n["inference"])


# ------------------------------------------------------------------------------- sources


class ApiServerSignal:
    """Free GPUs from watch-maintained caches of Nodes and non-terminal Pods.

    Attributes:
        nodes / pods: the informers (shared with the flip-out and flip-back loops); nodes keyed by name and
            indexed by :data:`NODE_INDEXES`, pods indexed by :data:`POD_INDEXES`.
    """

    name = "apiserver"

    def __init__(self, kube: Kube):
        self.nodes: Informer[dict] = Informer(kube, api_path("v1", "nodes"), transform=node_view, name="nodes",
                                              indexers=NODE_INDEXES)
        self.pods: Informer[dict] = Informer(kube, api_path("v1", "pods"), transform=pod_view, name="pods",
                                             params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"},
                                             indexers=POD_INDEXES)

    def start(self, timeout: float = 60.0) -> "ApiServerSignal":
        """Start both watches and wait for their first lists (raises TimeoutError)."""
        self.nodes.start()
        self.pods.start()
        if not (self.nodes.wait_synced(timeout) and self.pods.wait_synced(timeout)):
            raise TimeoutError(f"nodes/pods not listed within {timeout:.0f}s")
        return self

    def stop(self) -> None:
        """Stop both watches."""
        self.nodes.stop()
        self.pods.stop()

    def value(self) -> float | None:
        """Free GPUs now, or None before both caches are synced."""
        if not (self.nodes.synced.is_set() and self.pods.synced.is_set()):
            return None
        return float(free_gpus(self.nodes.items(), self.pods))


class PrometheusSignal:
    """Free GPUs from a PromQL instant query.

    Args:
        url: Prometheus base URL (``http://prometheus.monitoring:9090``).
        query: the PromQL expression (``taint_controller_promql``).
        timeout: seconds per query.
    """

    name = "prometheus"

    def __init__(self, url: str, query: str, timeout: float = 5.0):
        self.url = url.rstrip("/")
        self.query = query
        self.errors = 0
        self._client = PromClient(self.url, timeout=timeout)

    def start(self, timeout: float = 0.0) -> "PrometheusSignal":
        """Nothing to start (queries are made on demand); returns self."""
        return self

    def stop(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def value(self) -> float | None:
        """The query's value now, or None (error or no data; counted in ``errors``)."""
        try:
            value = self._client.value(self.query)
        except PromError as exc:
            self.errors += 1
            log.warning("prometheus signal: %s", exc)
            return None
        if value is None:
            self.errors += 1
        return value
