"""The quota-sync service: watch Nodes, debounce, resync, export what it did.

* A watcher thread lists and watches Nodes (JSON, resuming from bookmarks,
  relisting on 410 Gone) and keeps a slim cache: only the fields capacity
  depends on (:func:`slim`). A node event marks the state dirty only when
  the node's capacity signature changes (flavor, GPUs, schedulable,
  virtual), so heartbeats cost nothing.
* With ``kueue_quota_subtract_unmanaged_gpus`` a pod watcher (bound,
  non-terminal pods) marks it dirty when the GPUs held by pods Kueue does
  not manage change (:class:`PodWatch`): those GPUs are subtracted.
* A further watcher marks the state dirty when a ClusterQueue's resource
  groups change (:class:`QueueWatch`): ``pulumi up`` force-applies the
  inventory's quotas (``pulumi.com/patchForce``, roles/kueue), and this
  puts the schedulable capacity back within the debounce.
* The loop waits for dirty (or ``resync_seconds`` for a periodic resync
  that also repairs quota someone else edited), then ``debounce_seconds``
  more so a burst (a rack going down) gives one resync, then computes
  the plan from the cache plus a fresh read of ClusterQueues, Workloads
  and LocalQueues, and applies it (:func:`gpufleet.quota.resync.apply`,
  optimistic concurrency, retried on 409).
* Zero-capacity flavors are applied (the controller sees the cluster it
  runs in; the one-shot task is the one that guards against a wrong
  kubeconfig), with a Warning Event.
* Drift and gangs that cannot fit get their Events once per new finding.

Metrics (``gpufleet_quota_*``): nominal and schedulable GPUs, drift, gangs
that cannot fit, resyncs by result, 409 conflicts, resync duration, and
convergence: seconds from the first node event of a burst to its quota
applied.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.inventory import Inventory
from gpufleet.fleet import nodes as nodeutil
from gpufleet.ops.kube import list_items, watch_json
from gpufleet.names import FLAVOR_LABEL, GPU_RESOURCE, KUEUE_GROUP, KUEUE_VERSION, VIRTUAL_NODE_LABEL
from gpufleet.fleet.capacity import unmanaged_holders
from gpufleet.fleet.classify import classify
from gpufleet.quantities import GpuCountError
from gpufleet.quota import resync

log = logging.getLogger(__name__)
Obj = dict[str, Any]

#: Seconds after the first node event of a burst before resyncing.
DEBOUNCE_SECONDS = 1.0
#: Seconds between resyncs without node events (repairs quota edited by others).
RESYNC_SECONDS = 300.0
#: Server-side timeout of one watch request.
WATCH_SECONDS = 240


def slim(node: Obj) -> Obj:
    """The fields of a Node capacity depends on, in the Node's own shape (so every ``nodes`` function works)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    keep = {k: labels[k] for k in (FLAVOR_LABEL, VIRTUAL_NODE_LABEL[0]) if k in labels}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    gpus = (status.get("allocatable") or {}).get(GPU_RESOURCE)
    cap = (status.get("capacity") or {}).get(GPU_RESOURCE)
    return {"metadata": {"name": meta.get("name"), "labels": keep},
            "spec": {"unschedulable": spec.get("unschedulable", False), "taints": spec.get("taints") or []},
            "status": {"allocatable": {GPU_RESOURCE: gpus} if gpus is not None else {},
                       "capacity": {GPU_RESOURCE: cap} if cap is not None else {},
                       "conditions": [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]}}


def signature(node: Obj) -> tuple:
    """What quota depends on: flavor, virtual, and the classifier's view (GPUs, reasons for every class)."""
    nc = classify(node)
    return (nodeutil.flavor(node), nodeutil.is_virtual(node), nc.facts.allocatable, nc.facts.capacity,
            tuple(sorted(nc.reasons.items())))


def slim_pod(pod: Obj) -> Obj:
    """The fields of a Pod quota depends on (GPUs held, node, Kueue labels, priority), in the Pod's own shape."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith("kueue.x-k8s.io/")}
    keep = {k: spec[k] for k in ("nodeName", "priority", "containers", "initContainers") if k in spec}
    keep["containers"] = [{"name": c.get("name"), "resources": c.get("resources") or {}} for c in keep.get("containers") or []]
    keep["initContainers"] = [{"name": c.get("name"), "resources": c.get("resources") or {}}
                              for c in keep.get("initContainers") or []]
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "labels": labels},
            "spec": keep, "status": {"phase": (pod.get("status") or {}).get("phase")}}


class NodeCache:
    """Slim Nodes by name, fed by :meth:`run` (list + watch); ``dirty`` is set on capacity changes."""

    def __init__(self, api: client.ApiClient):
        self.api = api
        self.nodes: dict[str, Obj] = {}
        self.lock = threading.Lock()
        self.dirty = threading.Event()
        self.synced = threading.Event()
        #: monotonic time of the first change not yet resynced.
        self.first_change: float | None = None
        self.events = 0

    def _mark(self) -> None:
        """Note a capacity change: dirty, and the time of the first change of the burst."""
        with self.lock:
            if self.first_change is None:
                self.first_change = time.monotonic()
        self.dirty.set()

    def take(self) -> tuple[list[Obj], float | None]:
        """The cached nodes and the time of the first unsynced change; clears dirty."""
        with self.lock:
            first, self.first_change = self.first_change, None
            self.dirty.clear()
            return list(self.nodes.values()), first

    def _relist(self) -> str:
        """List every Node into the cache; returns the list's resourceVersion for the watch."""
        items, rv = list_items(self.api, "/api/v1/nodes")
        fresh = {nodeutil.name(n): slim(n) for n in items}
        with self.lock:
            changed = {k: signature(v) for k, v in fresh.items()} != {k: signature(v) for k, v in self.nodes.items()}
            self.nodes = fresh
        if changed or not self.synced.is_set():
            self._mark()
        self.synced.set()
        return rv

    def apply_event(self, kind: str, obj: Obj) -> None:
        """Apply one watch event to the cache (ADDED, MODIFIED, DELETED)."""
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        self.events += 1
        with self.lock:
            old = self.nodes.get(name)
            if kind == "DELETED":
                self.nodes.pop(name, None)
                new = None
            else:
                new = slim(obj)
                self.nodes[name] = new
        if (old is None) != (new is None) or (old is not None and new is not None and signature(old) != signature(new)):
            self._mark()

    def run(self, stop: threading.Event) -> None:
        """List, then watch Nodes until ``stop`` (:func:`list_watch`)."""
        list_watch(self.api, "/api/v1/nodes", stop, self._relist, self.apply_event, "node")


class PodWatch:
    """Bound, non-terminal pods (slim), watched; marks ``cache`` dirty when the GPUs unmanaged pods hold change.

    Only what quota depends on triggers a resync: a pod Kueue does not manage
    starting or ending on a node with GPUs (:func:`gpufleet.fleet.capacity.unmanaged_holders`).
    """

    def __init__(self, api: client.ApiClient, cache: NodeCache, reclaim_below: int | None):
        self.api, self.cache, self.reclaim_below = api, cache, reclaim_below
        self.pods: dict[str, Obj] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self._holders: dict = {}

    def items(self) -> list[Obj]:
        """The cached pods."""
        with self.lock:
            return list(self.pods.values())

    def _check(self) -> None:
        with self.lock:
            pods = list(self.pods.values())
        try:
            holders = unmanaged_holders(pods, self.reclaim_below)
        except GpuCountError as exc:
            log.error("%s", exc)
            return
        if holders != self._holders:
            self._holders = holders
            self.cache._mark()

    def _relist(self) -> str:
        items, rv = list_items(self.api, "/api/v1/pods", field_selector=resync.HOLDING_PODS)
        with self.lock:
            self.pods = {f"{p['metadata'].get('namespace')}/{p['metadata']['name']}": slim_pod(p) for p in items}
        self._check()
        self.synced.set()
        return rv

    def apply_event(self, kind: str, obj: Obj) -> None:
        """Apply one watch event (a pod leaving the selector arrives as DELETED)."""
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(key, None)
            else:
                self.pods[key] = slim_pod(obj)
        self._check()

    def run(self, stop: threading.Event) -> None:
        """List, then watch bound non-terminal pods until ``stop``."""
        list_watch(self.api, "/api/v1/pods", stop, self._relist, self.apply_event, "pod",
                   field_selector=resync.HOLDING_PODS)


class QueueWatch:
    """ClusterQueue resource groups as last seen; marks ``cache`` dirty when they change.

    quota-sync's own patches change them too; the resync that follows finds
    nothing to do. Anyone else's change (``pulumi up`` writing the
    inventory's quotas back, a person's edit) is corrected within the
    debounce instead of at the next periodic resync.
    """

    def __init__(self, api: client.ApiClient, cache: NodeCache):
        self.api, self.cache = api, cache
        self.groups: dict[str, str] = {}

    @staticmethod
    def _groups(obj: Obj) -> str:
        return json.dumps((obj.get("spec") or {}).get("resourceGroups"), sort_keys=True)

    def _relist(self) -> str:
        items, rv = list_items(self.api, resync.CQ_PATH)
        fresh = {(q.get("metadata") or {}).get("name"): self._groups(q) for q in items}
        if self.groups and fresh != self.groups:
            self.cache._mark()
        self.groups = fresh
        return rv

    def apply_event(self, kind: str, obj: Obj) -> None:
        """Note one watch event; a change of resource groups (or a new or deleted queue) marks dirty."""
        name = (obj.get("metadata") or {}).get("name")
        groups = None if kind == "DELETED" else self._groups(obj)
        if self.groups.get(name) != groups:
            if groups is None:
                self.groups.pop(name, None)
            else:
                self.groups[name] = groups
            self.cache._mark()

    def run(self, stop: threading.Event) -> None:
        """List, then watch ClusterQueues until ``stop`` (:func:`list_watch`)."""
        list_watch(self.api, resync.CQ_PATH, stop, self._relist, self.apply_event, "ClusterQueue")


def list_watch(api: client.ApiClient, path: str, stop: threading.Event, relist: Callable[[], str],
               on_event: Callable[[str, Obj], None], what: str, *, field_selector: str | None = None) -> None:
    """``relist()`` (returns the list's resourceVersion), then watch ``path`` until ``stop``.

    Relists on 410 Gone and after errors, backing off from 1 s to 30 s.
    """
    rv = None
    backoff = 1.0
    while not stop.is_set():
        try:
            if rv is None:
                rv = relist()
            for kind, obj in watch_json(api, path, resource_version=rv, timeout_seconds=WATCH_SECONDS,
                                        field_selector=field_selector):
                if stop.is_set():
                    return
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        rv = None
                    break
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                if kind != "BOOKMARK":
                    on_event(kind, obj)
            backoff = 1.0
        except Exception as exc:  # noqa: BLE001 - the watch reconnects
            log.warning("%s watch: %s; relisting in %.0fs", what, exc, backoff)
            rv = None
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)


class Metrics:
    """``gpufleet_quota_*`` metrics in one registry."""

    def __init__(self, registry: CollectorRegistry):
        p = "gpufleet_quota_"
        self.nominal = Gauge(p + "nominal_gpus", "GPU nominalQuota per ClusterQueue and flavor after the last resync.",
                             ["cluster_queue", "flavor"], registry=registry)
        self.schedulable = Gauge(p + "schedulable_gpus", "Schedulable GPUs per flavor at the last resync.", ["flavor"], registry=registry)
        self.drift = Gauge(p + "drift_gpus", "GPUs admitted above the ClusterQueue's nominal quota (capacity fell below "
                           "usage; nothing is evicted).", ["cluster_queue", "flavor"], registry=registry)
        self.cannot_fit = Gauge(p + "gangs_cannot_fit", "Pending workloads wanting more GPUs than their ClusterQueue can get "
                                "with the capacity schedulable now.", ["cluster_queue"], registry=registry)
        self.resyncs = Counter(p + "sync_resyncs_total", "Resyncs by result (changed, unchanged, error).", ["result"], registry=registry)
        self.conflicts = Counter(p + "sync_conflicts_total", "409 Conflicts met while patching ClusterQueues (each retried).",
                                 registry=registry)
        self.duration = Histogram(p + "sync_duration_seconds", "Seconds to compute and apply one resync.",
                                  buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=registry)
        self.convergence = Histogram(p + "sync_convergence_seconds", "Seconds from the first node event of a burst to "
                                     "its quota applied.", buckets=(0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60), registry=registry)
        self.last_success = Gauge(p + "sync_last_success_timestamp_seconds", "Unix time of the last successful resync.",
                                  registry=registry)


@dataclass
class SyncOutcome:
    """One controller resync: the plan, what was applied, and the convergence time (None: periodic resync)."""

    plan: resync.ResyncPlan | None
    applied: resync.ApplyResult | None
    convergence: float | None
    error: str | None = None
    seconds: float = 0.0
    at: float = field(default_factory=time.time)


class QuotaSync:
    """The service behind ``gpufleet quota-sync`` (module docstring).

    Args:
        api: API client (built once).
        inv: the environment's inventory (queues, shares, reserve).
        registry: metrics registry.
        debounce_seconds, resync_seconds: see the module constants.
    """

    def __init__(self, api: client.ApiClient, inv: Inventory, registry: CollectorRegistry | None = None, *,
                 debounce_seconds: float = DEBOUNCE_SECONDS, resync_seconds: float = RESYNC_SECONDS):
        self.api, self.inv = api, inv
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.cache = NodeCache(api)
        kv = inv.role("kueue")
        #: Pods holding GPUs, watched only when the inventory subtracts unmanaged ones.
        self.pods = (PodWatch(api, self.cache, max(pc.value for pc in kv.kueue_priority_classes))
                     if kv.kueue_quota_subtract_unmanaged_gpus else None)
        self.debounce_seconds, self.resync_seconds = debounce_seconds, resync_seconds
        self._reported: set[tuple] = set()
        self.history: list[SyncOutcome] = []

    def resync_once(self, first_change: float | None = None) -> SyncOutcome:
        """Compute from the cache and apply; record metrics and Events for new findings."""
        t0 = time.monotonic()
        nodes, first = self.cache.take()
        first = first if first_change is None else first_change
        try:
            cqs = list_items(self.api, resync.CQ_PATH)[0]
            wls = list_items(self.api, resync.WL_PATH)[0]
            lqs = list_items(self.api, f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/localqueues")[0]
            pods = self.pods.items() if self.pods is not None else None
            plan = resync.plan_from(self.inv, nodes, cqs, wls, lqs, pods)
            applied = resync.apply(self.api, plan, allow_zero=True, events=False)
        except (ApiException, resync.OpsError, OSError, GpuCountError) as exc:
            self.metrics.resyncs.labels("error").inc()
            log.error("resync failed: %s", exc)
            if first is not None:  # keep the burst pending
                with self.cache.lock:
                    self.cache.first_change = min(first, self.cache.first_change or first)
                self.cache.dirty.set()
            out = SyncOutcome(None, None, None, error=str(exc), seconds=time.monotonic() - t0)
            self.history.append(out)
            return out
        self.metrics.conflicts.inc(applied.conflicts)
        self.metrics.resyncs.labels("changed" if applied.patched else "unchanged").inc()
        self._export(plan)
        self._report(plan)
        done = time.monotonic()
        conv = done - first if first is not None else None
        if conv is not None and applied.patched:
            self.metrics.convergence.observe(conv)
        self.metrics.duration.observe(done - t0)
        self.metrics.last_success.set(time.time())
        out = SyncOutcome(plan, applied, conv if applied.patched else None, seconds=done - t0)
        self.history = self.history[-99:] + [out]
        if applied.patched:
            log.info("quota resynced in %.2fs (%s): %s", done - t0, ", ".join(applied.patched),
                     "; ".join(f"{c.cluster_queue}/{c.flavor}/{c.resource}: {c.before} -> {c.after}" for c in plan.changes))
        return out

    def _export(self, plan: resync.ResyncPlan) -> None:
        """Set the gauges from a plan."""
        for q, flavors in plan.desired.items():
            for f, r in flavors.items():
                self.metrics.nominal.labels(q, f).set(r["gpu"])
        for f, c in plan.capacity.items():
            self.metrics.schedulable.labels(f).set(c.schedulable_gpus)
        drift = {(d.cluster_queue, d.flavor): d.gpus for d in plan.drift}
        for q, flavors in plan.desired.items():
            for f in flavors:
                self.metrics.drift.labels(q, f).set(drift.get((q, f), 0))
            self.metrics.cannot_fit.labels(q).set(sum(1 for g in plan.cannot_fit if g.cluster_queue == q))

    def _report(self, plan: resync.ResyncPlan) -> None:
        """Events for drift and gangs not reported before; a log line for zero-capacity flavors."""
        new_drift = [d for d in plan.drift if ("drift", d.cluster_queue, d.flavor, d.reserved, d.nominal) not in self._reported]
        new_gangs = [g for g in plan.cannot_fit if ("gang", g.workload, g.max_gpus) not in self._reported]
        for d in new_drift:
            self._reported.add(("drift", d.cluster_queue, d.flavor, d.reserved, d.nominal))
        for g in new_gangs:
            self._reported.add(("gang", g.workload, g.max_gpus))
        if new_drift or new_gangs:
            resync.record_findings(self.api, plan, new_drift, new_gangs)
        for f in plan.zero_flavors:
            key = ("zero", f, plan.capacity[f].nodes)
            if key not in self._reported:
                self._reported.add(key)
                log.warning("flavor %s has no schedulable GPU: quota 0 in every ClusterQueue", f)

    def run(self, stop: threading.Event, on_beat=lambda: None) -> None:
        """Watch and resync until ``stop`` (module docstring); ``on_beat`` after every wait (liveness)."""
        watches = [("nodes", self.cache.run), ("queues", QueueWatch(self.api, self.cache).run)]
        if self.pods is not None:
            watches.append(("pods", self.pods.run))
        for name, target in watches:
            threading.Thread(target=target, args=(stop,), daemon=True, name=f"quota-sync-watch-{name}").start()
        self.cache.synced.wait(60)
        if self.pods is not None:
            self.pods.synced.wait(60)
        last = 0.0
        while not stop.is_set():
            woke = self.cache.dirty.wait(min(5.0, self.resync_seconds))
            on_beat()
            if stop.is_set():
                break
            if not woke and time.monotonic() - last < self.resync_seconds:
                continue
            if woke:
                stop.wait(self.debounce_seconds)
            self.resync_once()
            last = time.monotonic()
