"""Endpoints whose publisher is gone: marked not ready, then removed, by something still alive.

Each virtual kubelet publishes its own node's pods into EndpointSlices
(:mod:`gpufleet.virtual_kubelet.endpoints`) and keeps them true while it runs: a pod
that stops, an address its check finds dead, a pod deleted. A virtual
kubelet that stops (its pool removed, its pod crash-looping or evicted, its
process killed) leaves them as they were, and requests keep going to
addresses no one vouches for. This pass does for those endpoints what the
node lifecycle controller does for pods on an unreachable node
(``pkg/controller/nodelifecycle``: a node whose Lease is not renewed within
its grace period gets ``Ready=Unknown``, its pods ``Ready=False``, and the
EndpointSlice controller then publishes them not ready; a deleted node's
pods are garbage-collected and their endpoints go):

* the virtual node's Lease (``kube-node-lease/<node>``) has not been renewed
  for longer than its ``leaseDurationSeconds``, or the Node is not Ready:
  every endpoint of the node's slices is written ``ready: false``,
  ``serving: false`` (``terminating`` kept), by a merge patch carrying the
  slice's resourceVersion (a publisher writing meanwhile wins: 409, looked
  at again on the next tick), with a Warning Event on the Node once;
* the Node is deleted (absent from the cache, and a GET says 404): its
  slices are deleted, each by its UID.

A publisher that comes back takes its slices over: its slice watch sees
the change and it publishes its pods again (:mod:`gpufleet.virtual_kubelet.endpoints`).

``ready`` goes false under ``publishNotReadyAddresses`` too, where the
standard controller keeps it true for a pod that is not Ready: that option
publishes pods known to exist and not yet ready, and no one vouches any
more that these exist at all. A Node that is not Ready while its Lease is
renewed (the virtual kubelet never reports itself so; only another actor
editing the condition would) makes the two disagree: the pass marks, the
living publisher publishes again, at most once per tick per slice, as a
kubelet and the node lifecycle controller disagree over pod readiness
upstream in the same state.

How the Lease's age is measured: as the node lifecycle controller does
(``tryUpdateNodeHealth``), from when *this process* saw ``renewTime``
change, on its own monotonic clock, never by comparing the publisher's
clock with this one. A process that just started (or a Lease it sees for
the first time) therefore waits one full ``leaseDurationSeconds`` before it
calls a publisher dead. The bound from a publisher's last renewal to its
endpoints not ready is ``leaseDurationSeconds`` (the virtual kubelet's
``lease_seconds``, 40 s by default as the kubelet's) plus one tick
(:data:`gpufleet.taint_controller.constants.TICK_SECONDS`) plus a write.

Where it runs, and why there: in the taint controller (one tick of
:class:`gpufleet.taint_controller.controller.TaintController`), which is always
running, leader-elected and already watches every Node. The other way, each
virtual kubelet watching its peers' Leases and taking over for a dead one,
fails exactly when it is needed most: with one pool (the common case) there
is no peer, and when every virtual kubelet is gone (the pool's role
removed, a bad release of the image they share) no one is left to mark
anything; it also needs leader election among the survivors so that two do
not write the same slices. The taint controller reads gpufleet's slices
(label ``endpointslice.kubernetes.io/managed-by=endpointslice.gpufleet.io``)
and the node Leases, and may patch and delete EndpointSlices, nothing else
more than before (``roles/taint_controller``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from prometheus_client import Counter

from gpufleet.kube import Conflict, Kube, KubeError, NotFound, api_path
from gpufleet.kube.events import record_event
from gpufleet.kube.informer import Informer
from gpufleet.names import ENDPOINTSLICE_MANAGED_BY, ENDPOINTSLICE_MANAGED_BY_LABEL, REMOTE_NODE_LABEL

from .endpoints import SLICES_API
from .lease import NAMESPACE as LEASE_NAMESPACE

log = logging.getLogger(__name__)

Action = Literal["keep", "not_ready", "remove"]
KEEP: Action = "keep"
NOT_READY: Action = "not_ready"
REMOVE: Action = "remove"

FENCED = Counter("gpufleet_taint_controller_orphaned_endpoint_writes_total",
                 "EndpointSlice writes for virtual nodes whose publisher is gone, by action (not_ready, remove).",
                 ["action"])
#: Event reason on a Node whose endpoints were marked not ready.
EVENT_REASON = "EndpointsPublisherGone"
EVENT_COMPONENT = "gpufleet-taint-controller"


def decide(node: dict | None, lease_age_seconds: float | None, lease_duration_seconds: float | None) -> Action:
    """What to do with the slices a virtual node's publisher wrote.

    Args:
        node: the Node as :func:`gpufleet.taint_controller.signal.node_view` keeps it (``ready``: condition Ready is True),
            or None when it is deleted.
        lease_age_seconds: seconds since this process saw its Lease's ``renewTime`` change; None: no Lease.
        lease_duration_seconds: the Lease's ``leaseDurationSeconds`` (None: no Lease).

    Returns:
        ``remove`` (the Node is gone), ``not_ready`` (not Ready, no Lease, or the Lease older than its
        duration: nodelifecycle's grace period), else ``keep``.
    """
    if node is None:
        return REMOVE
    if not node.get("ready"):
        return NOT_READY
    if lease_age_seconds is None or lease_duration_seconds is None or lease_age_seconds > lease_duration_seconds:
        return NOT_READY
    return KEEP


def not_ready_endpoints(slice_: dict) -> list[dict] | None:
    """The slice's endpoints with ``ready`` and ``serving`` false (``terminating`` kept), or None when every
    endpoint already is (nothing to write)."""
    endpoints = slice_.get("endpoints") or []
    if all((e.get("conditions") or {}).get("ready") is False and (e.get("conditions") or {}).get("serving") is False
           for e in endpoints):
        return None
    out = []
    for e in endpoints:
        conditions = dict(e.get("conditions") or {})
        conditions.update(ready=False, serving=False)
        out.append({**e, "conditions": conditions})
    return out


def _slim_lease(lease: dict) -> dict:
    meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    return {"name": meta.get("name"), "renewTime": spec.get("renewTime"),
            "leaseDurationSeconds": spec.get("leaseDurationSeconds")}


class OrphanedEndpoints:
    """Marks not ready, then removes, the endpoints of virtual nodes whose publisher is gone (module docstring).

    Args:
        kube: client of the cluster.
        nodes: an informer of Nodes whose values have ``ready`` (:func:`gpufleet.taint_controller.signal.node_view`),
            keyed by node name (the taint controller's).
        clock: monotonic seconds (Lease ages are measured on it).

    Watches gpufleet's EndpointSlices and the node Leases; :meth:`tick` acts.
    """

    def __init__(self, kube: Kube, nodes: Informer, *, clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.nodes = nodes
        self.clock = clock
        self.slices: Informer[dict] = Informer(
            kube, api_path(SLICES_API, "endpointslices"),
            params={"labelSelector": f"{ENDPOINTSLICE_MANAGED_BY_LABEL}={ENDPOINTSLICE_MANAGED_BY}"},
            name="orphaned-endpointslices")
        self.leases: Informer[dict] = Informer(kube, api_path("coordination.k8s.io/v1", "leases", LEASE_NAMESPACE),
                                               transform=_slim_lease, handlers=[self._on_lease], name="node-leases")
        self._lock = threading.Lock()
        #: lease name -> (renewTime last seen, clock() when it was seen changing, leaseDurationSeconds)
        self._renewed: dict[str, tuple[Any, float, float]] = {}
        #: nodes whose endpoints this process marked not ready (their Event said so once)
        self._fenced: set[str] = set()

    def start(self, timeout: float = 60.0) -> "OrphanedEndpoints":
        """Start both watches and wait for their first lists (raises TimeoutError)."""
        self.slices.start()
        self.leases.start()
        if not (self.slices.wait_synced(timeout) and self.leases.wait_synced(timeout)):
            raise TimeoutError(f"EndpointSlices / node Leases not listed within {timeout:.0f}s")
        return self

    def stop(self) -> None:
        """Stop both watches."""
        self.slices.stop()
        self.leases.stop()

    def _on_lease(self, kind: str, new: Any, old: Any) -> None:
        lease = new or old
        with self._lock:
            if kind == "DELETED":
                self._renewed.pop(lease["name"], None)
                return
            seen = self._renewed.get(lease["name"])
            at = self.clock() if seen is None or seen[0] != lease.get("renewTime") else seen[1]
            self._renewed[lease["name"]] = (lease.get("renewTime"), at, float(lease.get("leaseDurationSeconds") or 0))

    def lease_age(self, node_name: str, now: float) -> tuple[float | None, float | None]:
        """``(seconds since its renewTime was seen changing, leaseDurationSeconds)`` of the node's Lease, or
        ``(None, None)`` without one."""
        with self._lock:
            seen = self._renewed.get(node_name)
        return (None, None) if seen is None else (now - seen[1], seen[2])

    def decisions(self) -> dict[str, Action]:
        """``{node name: action}`` for every node that has gpufleet slices (empty until the caches are synced)."""
        if not (self.slices.synced.is_set() and self.leases.synced.is_set() and self.nodes.synced.is_set()):
            return {}
        now = self.clock()
        out: dict[str, Action] = {}
        for s in self.slices.items():
            node_name = ((s.get("metadata") or {}).get("labels") or {}).get(REMOTE_NODE_LABEL)
            if node_name and node_name not in out:
                out[node_name] = decide(self.nodes.get(node_name), *self.lease_age(node_name, now))
        return out

    def tick(self) -> int:
        """Act on every node whose publisher is gone (module docstring); returns how many slices were written.
        Errors on one slice are logged and retried on the next tick."""
        decisions = self.decisions()
        self._fenced &= {n for n, a in decisions.items() if a == NOT_READY}
        writes = 0
        for s in self.slices.items():
            meta = s["metadata"]
            node_name = (meta.get("labels") or {}).get(REMOTE_NODE_LABEL)
            action = decisions.get(node_name or "", KEEP)
            try:
                if action == REMOVE:
                    writes += self._remove(s, node_name)
                elif action == NOT_READY:
                    writes += self._mark_not_ready(s, node_name)
            except KubeError as exc:
                log.warning("orphaned endpoints: EndpointSlice %s/%s of %s: %s; retried on the next tick",
                            meta.get("namespace"), meta.get("name"), node_name, exc)
        return writes

    def _mark_not_ready(self, s: dict, node_name: str) -> int:
        meta = s["metadata"]
        endpoints = not_ready_endpoints(s)
        if endpoints is None:
            return 0
        try:
            live = self.kube.patch(SLICES_API, "endpointslices", meta["name"],
                                   {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "endpoints": endpoints},
                                   meta["namespace"])
        except (NotFound, Conflict):
            return 0  # gone, or its publisher wrote it meanwhile: looked at again next tick
        self.slices.apply("MODIFIED", live)
        FENCED.labels(NOT_READY).inc()
        log.warning("orphaned endpoints: %s's publisher is gone (Lease not renewed or node not Ready): %d endpoints "
                    "of EndpointSlice %s/%s marked not ready", node_name, len(endpoints), meta["namespace"], meta["name"])
        if node_name not in self._fenced:
            self._fenced.add(node_name)
            node = self.nodes.get(node_name) or {}
            record_event(self.kube, {"apiVersion": "v1", "kind": "Node",
                                     "metadata": {"name": node_name, "uid": node.get("uid") or ""}},
                         EVENT_REASON, f"the virtual kubelet of {node_name} stopped publishing (its Lease is not "
                         "renewed or the node is not Ready): the endpoints it published are marked not ready until it "
                         "is back", type_="Warning", component=EVENT_COMPONENT)
        return 1

    def _remove(self, s: dict, node_name: str) -> int:
        meta = s["metadata"]
        try:
            self.kube.get("v1", "nodes", node_name)
            return 0  # the cache lags: the node exists (registered again)
        except NotFound:
            pass
        try:
            self.kube.delete(SLICES_API, "endpointslices", meta["name"], meta["namespace"], uid=meta.get("uid"))
        except (NotFound, Conflict):
            return 0
        self.slices.apply("DELETED", s)
        FENCED.labels(REMOVE).inc()
        log.warning("orphaned endpoints: node %s is deleted: its EndpointSlice %s/%s removed", node_name,
                    meta["namespace"], meta["name"])
        return 1
