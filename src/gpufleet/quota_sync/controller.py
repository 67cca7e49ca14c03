"""The quota-sync service: watch Nodes, debounce, resync, export what it did.

* An informer (:class:`gpufleet.kube.informer.Informer`: list, then watch,
  resuming from bookmarks, relisting on 410 Gone) keeps a slim cache of
  Nodes: only the fields capacity depends on (:func:`slim`). A node event marks the state dirty only when
  the node's capacity signature changes (flavor, GPUs, schedulable,
  virtual), so heartbeats cost nothing.
* With ``kueue_quota_subtract_unmanaged_gpus`` a pod informer (bound,
  non-terminal pods) marks it dirty when what pods Kueue does not manage
  hold and request changes (:class:`PodWatch`): their GPUs, cores and bytes
  are subtracted (a DaemonSet rolling onto the nodes lowers CPU quota).
* A further informer marks the state dirty when a ClusterQueue's resource
  groups change (:class:`QueueWatch`): ``pulumi up`` force-applies the
  inventory's quotas (``pulumi.com/patchForce``, roles/kueue), and this
  puts the schedulable capacity back within the debounce.
* The loop waits for dirty (or ``resync_seconds`` for a periodic resync
  that also repairs quota someone else edited), then ``debounce_seconds``
  more so a burst (a rack going down) gives one resync, then computes
  the plan from the cache plus a fresh read of ClusterQueues, Workloads
  and LocalQueues, and applies it (:func:`gpufleet.quota_sync.resync.apply`,
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
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet.capacity import allocatable, unmanaged_requests
from gpufleet.quota_sync.devices import DeviceWatch
from gpufleet.fleet.classify import classify
from gpufleet.kube import Kube, KubeError, api_path
from gpufleet.kube.informer import Informer
from gpufleet.kube.quantity import GpuCountError
from gpufleet.names import FLAVOR_LABEL, GPU_RESOURCE, KUEUE_GROUP, VIRTUAL_NODE_LABEL
from gpufleet.quota_sync import resync
from gpufleet.quota_sync.config import Configuration

log = logging.getLogger(__name__)
Obj = dict[str, Any]

#: Server-side timeout of one watch request.
WATCH_SECONDS = 240


def slim(node: Obj) -> Obj:
    """The fields of a Node capacity depends on, in the Node's own shape (so every ``nodes`` function works)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    keep = {k: labels[k] for k in (FLAVOR_LABEL, VIRTUAL_NODE_LABEL[0]) if k in labels}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    alloc = status.get("allocatable") or {}
    cap = (status.get("capacity") or {}).get(GPU_RESOURCE)
    return {"metadata": {"name": meta.get("name"), "labels": keep},
            "spec": {"unschedulable": spec.get("unschedulable", False), "taints": spec.get("taints") or []},
            "status": {"allocatable": {r: alloc[r] for r in (GPU_RESOURCE, "cpu", "memory") if alloc.get(r) is not None},
                       "capacity": {GPU_RESOURCE: cap} if cap is not None else {},
                       "conditions": [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]}}


def signature(node: Obj) -> tuple:
    """What quota depends on: flavor, virtual, the classifier's view (GPUs, reasons for every class), cores and bytes."""
    nc = classify(node)
    return (nodeutil.flavor(node), nodeutil.is_virtual(node), nc.facts.allocatable, nc.facts.capacity,
            tuple(sorted(nc.reasons.items())), allocatable(node, "cpu"), allocatable(node, "memory"))


def slim_pod(pod: Obj) -> Obj:
    """The fields of a Pod quota depends on (requests, node, Kueue labels, priority), in the Pod's own shape."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(f"{KUEUE_GROUP}/")}
    keep = {k: spec[k] for k in ("nodeName", "priority", "containers", "initContainers", "overhead") if k in spec}
    keep["containers"] = [{"name": c.get("name"), "resources": c.get("resources") or {}} for c in keep.get("containers") or []]
    keep["initContainers"] = [{"name": c.get("name"), "resources": c.get("resources") or {},
                               **({"restartPolicy": c["restartPolicy"]} if c.get("restartPolicy") else {})}
                              for c in keep.get("initContainers") or []]
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "labels": labels},
            "spec": keep, "status": {"phase": (pod.get("status") or {}).get("phase")}}


class NodeCache:
    """Slim Nodes kept by an :class:`~gpufleet.kube.informer.Informer`; ``dirty`` is set on capacity changes.

    Attributes:
        informer: the watch cache (slim nodes by name).
        dirty: set when a node's capacity signature changed (or a node came or went).
        first_change: monotonic time of the first change not yet resynced.
        events: node events seen (heartbeats included).
    """

    def __init__(self, kube: Kube | None):
        self.informer: Informer[Obj] = Informer(kube, api_path("v1", "nodes"), transform=slim, handlers=[self.on_event],
                                                name="quota-nodes", watch_timeout=WATCH_SECONDS)
        self.lock = threading.Lock()
        self.dirty = threading.Event()
        self.first_change: float | None = None
        self.events = 0

    @property
    def synced(self) -> threading.Event:
        """Set once the first list is cached."""
        return self.informer.synced

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
        return self.informer.items(), first

    def on_event(self, kind: str, new: Obj, old: Obj | None) -> None:
        """Informer handler: mark dirty when a node comes, goes or changes its capacity signature."""
        self.events += 1
        if kind in ("ADDED", "DELETED") or old is None or signature(old) != signature(new):
            self._mark()


class PodWatch:
    """Bound, non-terminal pods (slim, an Informer); marks ``cache`` dirty when what unmanaged pods take changes.

    Only what quota depends on triggers a resync: a pod Kueue does not manage
    starting, changing its requests or ending
    (:func:`gpufleet.fleet.capacity.unmanaged_requests`: its GPUs, cores, bytes).
    A pod leaving the field selector (finished) arrives as DELETED.
    """

    def __init__(self, kube: Kube | None, cache: NodeCache, reclaim_below: int | None):
        self.cache, self.reclaim_below = cache, reclaim_below
        self.informer: Informer[Obj] = Informer(kube, api_path("v1", "pods"), params={"fieldSelector": resync.HOLDING_PODS},
                                                transform=slim_pod, handlers=[self.on_event], name="quota-pods",
                                                watch_timeout=WATCH_SECONDS)

    @property
    def synced(self) -> threading.Event:
        """Set once the first list is cached."""
        return self.informer.synced

    def items(self) -> list[Obj]:
        """The cached pods."""
        return self.informer.items()

    def _holds(self, pod: Obj | None) -> dict:
        """What ``pod`` adds to :func:`~gpufleet.fleet.capacity.unmanaged_requests` (empty for a managed pod)."""
        if pod is None:
            return {}
        try:
            return unmanaged_requests([pod], self.reclaim_below)
        except ValueError as exc:  # GpuCountError included
            log.error("%s", exc)
            return {}

    def on_event(self, kind: str, new: Obj, old: Obj | None) -> None:
        """Informer handler: mark dirty when the pod's contribution to what is taken outside Kueue changed."""
        after = {} if kind == "DELETED" else self._holds(new)
        if self._holds(old if kind != "DELETED" else (old or new)) != after:
            self.cache._mark()


class QueueWatch:
    """ClusterQueue resource groups as last seen (an Informer); marks ``cache`` dirty when they change.

    quota-sync's own patches change them too; the resync that follows finds
    nothing to do. Anyone else's change (``pulumi up`` writing the
    inventory's quotas back, a person's edit) is corrected within the
    debounce instead of at the next periodic resync.
    """

    def __init__(self, kube: Kube | None, cache: NodeCache):
        self.cache = cache
        self.informer: Informer[str] = Informer(kube, resync.CQ_PATH, transform=self.groups, handlers=[self.on_event],
                                                name="quota-clusterqueues", watch_timeout=WATCH_SECONDS)

    @staticmethod
    def groups(obj: Obj) -> str:
        """What is kept of a ClusterQueue: its resource groups, as canonical JSON."""
        return json.dumps((obj.get("spec") or {}).get("resourceGroups"), sort_keys=True)

    def on_event(self, kind: str, new: str, old: str | None) -> None:
        """Informer handler: a change of resource groups (or a new or deleted queue) after the first list marks dirty."""
        if self.informer.synced.is_set() and (kind != "MODIFIED" or new != old):
            self.cache._mark()


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
        kube: API client (built once).
        config: the quota policy (queues, shares, pins, flavors, reserve) and the loop's settings
            (:class:`gpufleet.quota_sync.config.Configuration`).
        registry: metrics registry.
    """

    def __init__(self, kube: Kube, config: Configuration, registry: CollectorRegistry | None = None):
        self.kube, self.config = kube, config
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.cache = NodeCache(kube)
        self.queues = QueueWatch(kube, self.cache)
        #: GPUs allocated through DRA: ResourceSlices and DeviceTaintRules (gpufleet.quota_sync.devices).
        self.devices = DeviceWatch(kube, self.cache)
        #: Bound pods, watched only when the configuration subtracts what unmanaged ones take.
        self.pods = PodWatch(kube, self.cache, config.reclaim_below_priority) if config.subtract_unmanaged else None
        self.debounce_seconds, self.resync_seconds = config.debounce_seconds, config.resync_seconds
        self._reported: set[tuple] = set()
        self.history: list[SyncOutcome] = []

    def resync_once(self, first_change: float | None = None) -> SyncOutcome:
        """Compute from the cache and apply; record metrics and Events for new findings."""
        t0 = time.monotonic()
        nodes, first = self.cache.take()
        first = first if first_change is None else first_change
        try:
            cqs, wls, lqs = (self.kube.list_all(path)[0] for path in (resync.CQ_PATH, resync.WL_PATH, resync.LQ_PATH))
            pods = self.pods.items() if self.pods is not None else None
            plan = resync.plan_from(self.config, nodes, cqs, wls, lqs, pods, devices=self.devices.gpus())
            applied = resync.apply(self.kube, plan, allow_zero=True, events=False)
        except (KubeError, resync.OpsError, GpuCountError) as exc:
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
            resync.record_findings(self.kube, plan, new_drift, new_gangs)
        for f in plan.zero_flavors:
            key = ("zero", f, plan.capacity[f].nodes)
            if key not in self._reported:
                self._reported.add(key)
                log.warning("flavor %s has no schedulable GPU: quota 0 in every ClusterQueue", f)

    def run(self, stop: threading.Event, on_beat=lambda: None) -> None:
        """Watch and resync until ``stop`` (module docstring); ``on_beat`` after every wait (liveness)."""
        informers = ([self.cache.informer, self.queues.informer, *self.devices.informers]
                     + ([self.pods.informer] if self.pods else []))
        for informer in informers:
            informer.start()
        try:
            self._loop(stop, on_beat)
        finally:
            for informer in informers:
                informer.stop()

    def _loop(self, stop: threading.Event, on_beat) -> None:
        self.cache.synced.wait(60)
        for informer in self.devices.informers:  # not served (Kubernetes < 1.34): count device-plugin GPUs only
            informer.synced.wait(10)
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
