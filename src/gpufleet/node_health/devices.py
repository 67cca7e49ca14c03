"""Remove the GPU, not the node: node health's per-GPU path where GPUs are allocated through DRA.

On a node whose GPUs are DRA devices (:mod:`gpufleet.fleet.devices`), a
fault of one GPU takes that GPU out of service with a device taint
(:mod:`gpufleet.ops.gpus`: one ``DeviceTaintRule`` per GPU); the node and its
other GPUs stay in service. Faults of the node itself (InfiniBand and RoCE
ports, GPU telemetry, fewer GPUs on the bus than expected) and every fault
of a device-plugin node keep the node path (:mod:`gpufleet.node_health.remediate`).

**Faults per GPU.** The same fault table and thresholds as the node path
(:func:`gpufleet.node_health.faults.evaluate`), evaluated per GPU: the
exporter's GPU series (labels ``uuid``, ``pci_bus_id``, ``gpu``) are matched
to the node's devices (:func:`gpufleet.fleet.devices.match_series`: UUID,
then bus id, then index) and keyed by GPU, so ``gpu_temp``, ``memory_temp``,
``xid``, ``ecc_uncorrectable``, ``nvlink_errors`` and ``gpu_missing`` (NVML:
lost or erroring) are found for one GPU. Evidence older than the GPU's last
return is ignored, as a returned node's is.

**Taint.** Key ``gpufleet.io/gpu-degraded`` for a fault of
``node_health_degraded_faults`` (fit to serve: inference claims tolerate it),
else ``gpufleet.io/gpu-unhealthy``; effect ``NoExecute`` for a fault of
``node_health_gpu_noexecute_faults`` (default ``xid``, ``ecc_uncorrectable``,
``gpu_missing``: the fault kills what runs on the GPU, so its pods go now),
else ``NoSchedule`` (the running pod is left alone; no new claim gets the
GPU). A GPU already out whose new fault needs the other key or NoExecute is
escalated; never de-escalated while out.

**Hysteresis and recovery.** A GPU out by node health comes back only after
it has shown no fault for ``node_health_gpu_hold_seconds`` (annotation
``gpufleet.io/gpu-healthy-since`` on its rule marks the start; a fault in
between restarts it) *and* the node checks of that GPU pass
(:func:`gpufleet.ops.gpus.gpu_check_ids` of ``tests/nodes``); a failure keeps
it out (Event ``GpuReturnRefused``) and the hold starts again. Without node
checks (gpufleet's image carries no testinfra) it waits for a person (Event
``GpuReturnAwaitsChecks``; ``invoke gpu.return``).

**Lemons.** A GPU whose attributable failures (history on its Node, this one
included) within ``node_health_lemon_window_hours`` reach
``node_health_lemon_failures`` is a lemon: out with ``NoExecute``, and only a
person returns it (``invoke gpu.return NODE GPU --clear-lemon``). A GPU a
person removed (``invoke gpu.remove``) is never returned by node health.

The decisions are a pure function (:func:`decide`); :class:`GpuRemediator`
reads the cluster, decides and acts, and is called by the remediation
controller's step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.fleet.devices import Gpu, match_series
from gpufleet.kube import Kube
from gpufleet.kube.events import record_event
from gpufleet.kube.times import now_rfc3339, parse_time
from gpufleet.names import (ANN_GPU_HEALTHY_SINCE, ANN_GPU_LEMON, ANN_GPU_REMOVED_BY, GPU_DEGRADED_TAINT,
                            GPU_UNHEALTHY_TAINT)
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.faults import Fault, Rules, evaluate
from gpufleet.ops import gpus as gpuops

log = logging.getLogger(__name__)
COMPONENT = "gpufleet-node-health"
#: Fault kinds of one GPU (the rest are the node's).
GPU_KINDS = ("gpu_temp", "memory_temp", "xid", "ecc_uncorrectable", "nvlink_errors", "gpu_missing")
#: The queries of :class:`gpufleet.node_health.faults.Queries` whose series are about one GPU.
GPU_QUERIES = ("gpu_temp", "memory_temp", "xid", "ecc", "remap_failure", "nvlink_errors", "nvlink_down", "gpu_lost",
               "gpu_erroring")
_SEP = "\x1f"
Obj = dict[str, Any]


@dataclass(frozen=True)
class GpuFault:
    """One fault of one GPU: the node path's :class:`~gpufleet.node_health.faults.Fault` and the device."""

    gpu: Gpu
    fault: Fault

    @property
    def kind(self) -> str:
        """Fault kind (:data:`GPU_KINDS`)."""
        return self.fault.kind


def gpu_faults(results: Mapping[str, Sequence[Mapping[str, Any]]], rules: Rules, now: float,
               gpus: Mapping[str, Sequence[Gpu]], returned_at: Mapping[tuple[str, str], float] | None = None,
               ) -> dict[tuple[str, str], list[GpuFault]]:
    """Faults per GPU of the DRA nodes (pure; the module docstring).

    Args:
        results: query name -> result list, as :meth:`gpufleet.node_health.faults.Queries.all` names them.
        rules: thresholds and windows (the node path's).
        now: evaluation time (Unix seconds).
        gpus: node -> its DRA GPUs; series of other nodes, or matching no GPU, are left out.
        returned_at: ``(node, device)`` -> Unix time of the GPU's last return.

    Returns:
        ``(node, device)`` -> its faults (one per kind).
    """
    keyed: dict[str, list[Mapping[str, Any]]] = {}
    index: dict[str, Gpu] = {}
    for name in GPU_QUERIES:
        for s in results.get(name, []):
            labels = s.get("metric") or {}
            node = labels.get(rules.node_label)
            gpu = match_series(gpus.get(node, ()), labels) if node in gpus else None
            if gpu is None:
                continue
            key = f"{node}{_SEP}{gpu.device}"
            index[key] = gpu
            keyed.setdefault(name, []).append({**s, "metric": {**labels, rules.node_label: key}})
    returned = {f"{n}{_SEP}{d}": t for (n, d), t in (returned_at or {}).items()}
    found = evaluate(keyed, rules, now, returned_at=returned, expected_gpus={}, telemetry_nodes=[])
    out: dict[tuple[str, str], list[GpuFault]] = {}
    for key, faults in found.items():
        gpu = index[key]
        out[(gpu.node, gpu.device)] = [GpuFault(gpu, Fault(gpu.node, f.kind, f"{gpu.device}: {f.detail}", f.since))
                                       for f in faults if f.kind in GPU_KINDS]
    return {k: v for k, v in out.items() if v}


def node_faults_left(faults: Mapping[str, list[Fault]], gpus: Mapping[str, Sequence[Gpu]],
                     by_gpu: Mapping[tuple[str, str], Sequence[GpuFault]]) -> dict[str, list[Fault]]:
    """The node path's faults with the GPU faults of DRA nodes taken out (those are the per-GPU path's).

    A DRA node keeps its node-wide faults (InfiniBand, RoCE, telemetry) and
    ``gpu_missing`` when no single GPU explains it (fewer GPUs on the bus than
    expected: the node's own fault). A device-plugin node keeps everything.
    """
    out: dict[str, list[Fault]] = {}
    for node, fs in faults.items():
        if node not in gpus:
            out[node] = list(fs)
            continue
        explained = {k for (n, _), gfs in by_gpu.items() if n == node for k in (g.kind for g in gfs)}
        kept = [f for f in fs if f.kind not in GPU_KINDS or (f.kind == "gpu_missing" and "gpu_missing" not in explained)]
        if kept:
            out[node] = kept
    return out


@dataclass(frozen=True)
class GpuDecision:
    """What to do with one GPU.

    Attributes:
        gpu: the device.
        action: ``remove`` (taint it), ``escalate`` (a stronger taint), ``hold`` (out, fault still there),
            ``reset`` (out, the fault came back during the hold: it starts again once the fault is gone),
            ``cooling`` (out, fault gone: the hold starts), ``return`` (hold over: checks, then back),
            ``wait`` (out, hold not over), ``skip`` (left alone: a person's removal, a lemon, another's rule).
        faults: the faults seen now.
        taint: the taint to apply (remove, escalate).
        lemon: this failure makes it a lemon.
        why: for people.
    """

    gpu: Gpu
    action: str
    faults: tuple[GpuFault, ...] = ()
    taint: Mapping[str, str] | None = None
    lemon: bool = False
    why: str = ""

    @property
    def detail(self) -> str:
        """Every fault's detail."""
        return "; ".join(f"{f.kind}: {f.fault.detail}" for f in self.faults)


def taint_for(kinds: Iterable[str], settings: Configuration, *, lemon: bool = False) -> dict[str, str]:
    """The device taint of a set of fault kinds: degraded only if every kind is, NoExecute if any kind kills (or a lemon).

    The value is the first kind that decided the key (an unhealthy one if any).
    """
    kinds = list(dict.fromkeys(kinds))
    degraded = not lemon and all(k in settings.degraded_faults for k in kinds)
    effect = "NoExecute" if lemon or any(k in settings.gpu_noexecute_faults for k in kinds) else "NoSchedule"
    first = kinds[0] if degraded else next((k for k in kinds if k not in settings.degraded_faults), kinds[0])
    return gpuops.taint_of(first, effect, degraded=degraded)


def _stronger(current: Mapping[str, Any], want: Mapping[str, str]) -> bool:
    """Whether ``want`` is stronger than the rule's ``current`` taint (unhealthy over degraded, NoExecute over NoSchedule)."""
    rank = {GPU_DEGRADED_TAINT: 0, GPU_UNHEALTHY_TAINT: 1}
    return (rank.get(want["key"], 1) > rank.get(current.get("key", ""), 1)
            or (want["effect"] == "NoExecute" and current.get("effect") != "NoExecute"))


def recent_failures(history: Sequence[Mapping[str, Any]], now: float, window: float) -> int:
    """Attributable failures (``remove`` entries by node health) within ``window`` seconds before ``now``."""
    n = 0
    for e in history:
        t = parse_time(e.get("time"))
        if e.get("action") == "remove" and e.get("by") == gpuops.BY_NODE_HEALTH and t is not None and now - t <= window:
            n += 1
    return n


def decide(by_gpu: Mapping[tuple[str, str], Sequence[GpuFault]], gpus: Mapping[str, Sequence[Gpu]],
           rules: Mapping[str, Mapping[str, Any]], histories: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]],
           settings: Configuration, now: float) -> list[GpuDecision]:
    """One decision per GPU that is faulty or out (pure; the module docstring).

    Args:
        by_gpu: :func:`gpu_faults`.
        gpus: node -> its DRA GPUs.
        rules: DeviceTaintRule name -> rule, every rule of the cluster.
        histories: ``(node, device)`` -> its history entries (:func:`gpufleet.ops.gpus.history`).
        settings: taints, hold, lemons.
        now: Unix seconds.
    """
    out: list[GpuDecision] = []
    for node, devs in sorted(gpus.items()):
        for gpu in devs:
            fs = tuple(by_gpu.get((node, gpu.device), ()))
            name = gpuops.rule_name(node, gpu.device)
            rule = rules.get(name)
            if rule is not None and not gpuops.owned(rule):
                if fs:
                    out.append(GpuDecision(gpu, "skip", fs, why=f"DeviceTaintRule {name} is not gpufleet's"))
                continue
            ann = ((rule or {}).get("metadata") or {}).get("annotations") or {}
            if rule is None:
                if not fs:
                    continue
                past = recent_failures(histories.get((node, gpu.device), ()), now, settings.lemon_window_seconds)
                lemon = past + 1 >= settings.lemon_failures
                out.append(GpuDecision(gpu, "remove", fs, taint_for((f.kind for f in fs), settings, lemon=lemon),
                                       lemon, "lemon: repeated failures" if lemon else "fault"))
                continue
            current = (rule.get("spec") or {}).get("taint") or {}
            if fs:
                want = taint_for((f.kind for f in fs), settings)
                if ann.get(ANN_GPU_REMOVED_BY) == gpuops.BY_NODE_HEALTH and _stronger(current, want):
                    out.append(GpuDecision(gpu, "escalate", fs, want, why=f"{current.get('key')}:{current.get('effect')} "
                                                                         f"-> {want['key']}:{want['effect']}"))
                elif ANN_GPU_HEALTHY_SINCE in ann:
                    out.append(GpuDecision(gpu, "reset", fs, why="fault back during the hold"))
                else:
                    out.append(GpuDecision(gpu, "hold", fs, why="fault still there"))
                continue
            if ann.get(ANN_GPU_REMOVED_BY) != gpuops.BY_NODE_HEALTH:
                continue  # a person's removal: a person returns it
            if ann.get(ANN_GPU_LEMON):
                out.append(GpuDecision(gpu, "skip", why="lemon: a person returns it"))
                continue
            since = parse_time(ann.get(ANN_GPU_HEALTHY_SINCE))
            if since is None:
                out.append(GpuDecision(gpu, "cooling", why="fault gone: hold starts"))
            elif now - since >= settings.gpu_hold_seconds:
                out.append(GpuDecision(gpu, "return", why=f"no fault for {now - since:.0f}s "
                                                          f"(node_health_gpu_hold_seconds {settings.gpu_hold_seconds:g})"))
            else:
                out.append(GpuDecision(gpu, "wait", why=f"no fault for {now - since:.0f}s of {settings.gpu_hold_seconds:g}"))
    return out


class GpuMetrics:
    """``gpufleet_node_health_gpu_*`` metrics."""

    def __init__(self, registry: CollectorRegistry):
        p = "gpufleet_node_health_gpu_"
        self.actions = Counter(p + "actions_total", "Per-GPU actions (remove, escalate, return; dry_run=true: only "
                               "recorded), by action and fault kind.", ["action", "fault", "dry_run"], registry=registry)
        self.latency = Histogram(p + "action_latency_seconds", "Seconds from the sample that completed a GPU fault's "
                                 "evidence to the GPU's DeviceTaintRule written.",
                                 buckets=(0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120), registry=registry)
        self.out = Gauge(p + "out", "GPUs out of service by a gpufleet DeviceTaintRule, by taint key.", ["key"],
                         registry=registry)
        self.faulty = Gauge(p + "faulty", "GPUs with a fault at the last step, by fault kind.", ["fault"],
                            registry=registry)


@dataclass
class GpuStep:
    """One per-GPU step: faults, decisions, latencies (seconds from evidence to taint) and errors."""

    faults: dict[tuple[str, str], list[GpuFault]] = field(default_factory=dict)
    decisions: list[GpuDecision] = field(default_factory=list)
    latencies: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: Unix time the decisions were taken (the faults confirmed).
    decided_at: float = 0.0


class GpuRemediator:
    """Acts on :func:`decide`'s decisions against one cluster; called by the remediation controller's step.

    Args:
        kube: the API client.
        settings: node health's :class:`~gpufleet.node_health.config.Configuration` (``degraded_faults``, ``gpu_noexecute_faults``, ``gpu_hold_seconds``, the lemon limits, ``dry_run``).
        registry: where the metrics go.
        checks: a GPU's node checks before it returns: ``gpu -> failed check ids`` (empty: passed);
            None: no GPU returns by itself (a person returns it).
    """

    def __init__(self, kube: Kube, settings: Configuration, registry: CollectorRegistry | None = None,
                 checks: Callable[[Gpu], Sequence[str]] | None = None):
        self.kube, self.settings, self.checks = kube, settings, checks
        self.metrics = GpuMetrics(registry or CollectorRegistry())
        self._announced: set[tuple[str, ...]] = set()
        #: ``(node, device)`` -> seconds from evidence to rule written, of the last removal (for benchmarks).
        self.latencies: dict[tuple[str, str], float] = {}
        #: ``(node, device)`` -> seconds from the decision (the fault confirmed) to the rule written, last removal.
        self.confirm_to_taint: dict[tuple[str, str], float] = {}

    def step(self, results: Mapping[str, Sequence[Mapping[str, Any]]], rules: Rules, now: float,
             nodes: Mapping[str, Obj], gpus: Mapping[str, Sequence[Gpu]]) -> GpuStep:
        """Evaluate the GPUs of ``gpus`` from the query ``results``, decide and act once; never raises for API errors."""
        step = GpuStep()
        hist = {(n, d): e for n, obj in nodes.items() for d, e in gpuops.history(obj).items()}
        returned = {(n, d): t for (n, d) in hist if (t := gpuops.last_return(nodes[n], d)) is not None}
        step.faults = gpu_faults(results, rules, now, gpus, returned)
        try:
            live = {(r.get("metadata") or {}).get("name", ""): r for r in gpuops.rules(self.kube)}
        except Exception as exc:  # noqa: BLE001 - a controller step reports and retries
            step.errors.append(f"listing DeviceTaintRules: {exc}")
            return step
        step.decisions = decide(step.faults, gpus, live, hist, self.settings, now)
        step.decided_at = time.time()
        for d in step.decisions:
            try:
                self._act(d, nodes.get(d.gpu.node), step, now)
            except Exception as exc:  # noqa: BLE001
                step.errors.append(f"{d.action} {d.gpu.node}/{d.gpu.device}: {exc}")
                log.error("per-GPU %s of %s/%s failed: %s", d.action, d.gpu.node, d.gpu.device, exc)
        for kind in GPU_KINDS:
            self.metrics.faulty.labels(kind).set(sum(1 for fs in step.faults.values() if any(f.kind == kind for f in fs)))
        for key in (GPU_UNHEALTHY_TAINT, GPU_DEGRADED_TAINT):
            self.metrics.out.labels(key).set(sum(1 for r in live.values() if gpuops.owned(r)
                                                 and ((r.get("spec") or {}).get("taint") or {}).get("key") == key))
        return step

    def _event(self, node: Obj | None, reason: str, message: str, type_: str = "Normal") -> None:
        if node is not None:
            record_event(self.kube, node, reason, message, type_=type_, component=COMPONENT, action="RemoveGpu")

    def _act(self, d: GpuDecision, node: Obj | None, step: GpuStep, now: float) -> None:
        g, dry = d.gpu, self.settings.dry_run
        where = f"GPU {g.label} of {g.node}"
        if d.action in ("remove", "escalate"):
            assert d.taint is not None
            kind = d.taint["value"]
            taint = f"{d.taint['key']}={kind}:{d.taint['effect']}"
            if dry:
                key = (g.node, g.device, d.action, taint)
                if key not in self._announced:
                    self._announced.add(key)
                    self._event(node, "RemediationDryRun", f"dry run: would {d.action} {where} ({taint}): {d.detail}")
                self.metrics.actions.labels(d.action, kind, "true").inc()
                return
            lemon = f"{d.why} within {self.settings.lemon_window_seconds / 3600:g}h" if d.lemon else ""
            gpuops.remove(self.kube, g, d.taint, detail=d.detail, by=gpuops.BY_NODE_HEALTH, lemon=lemon,
                          history_entry={"time": now_rfc3339(), "fault": kind, "action": "remove",
                                         "by": gpuops.BY_NODE_HEALTH, "detail": d.detail[:300]})
            written = time.time()
            self.confirm_to_taint[(g.node, g.device)] = written - step.decided_at
            since = min(f.fault.since for f in d.faults)
            step.latencies[(g.node, g.device)] = self.latencies[(g.node, g.device)] = latency = max(0.0, written - since)
            self.metrics.latency.observe(latency)
            self.metrics.actions.labels(d.action, kind, "false").inc()
            reason = {"remove": "GpuLemon" if d.lemon else "GpuRemoved", "escalate": "GpuEscalated"}[d.action]
            self._event(node, reason, f"{where} out of service ({taint}); the node and its other GPUs stay in "
                                      f"service: {d.detail}", "Warning")
        elif d.action == "reset":
            if not dry:
                self.kube.patch("resource.k8s.io/v1", "devicetaintrules", gpuops.rule_name(g.node, g.device),
                                {"metadata": {"annotations": {ANN_GPU_HEALTHY_SINCE: None}}})
        elif d.action == "cooling":
            if not dry:
                self.kube.patch("resource.k8s.io/v1", "devicetaintrules", gpuops.rule_name(g.node, g.device),
                                {"metadata": {"annotations": {ANN_GPU_HEALTHY_SINCE: now_rfc3339()}}})
        elif d.action == "return":
            self._return(d, node, now)

    def _return(self, d: GpuDecision, node: Obj | None, now: float) -> None:
        g = d.gpu
        where = f"GPU {g.label} of {g.node}"
        rule = gpuops.rule_name(g.node, g.device)
        if self.settings.dry_run:
            return
        if self.checks is None:
            key = (g.node, g.device, "awaits-checks")
            if key not in self._announced:
                self._announced.add(key)
                self._event(node, "GpuReturnAwaitsChecks", f"{where}: {d.why}; this controller runs no node checks, so "
                                                           f"a person returns it once they pass: invoke gpu.return "
                                                           f"{g.node} {g.device} --env ENV")
            return
        try:
            gpuops.give_back(self.kube, g, checks=self.checks, by=gpuops.BY_NODE_HEALTH)
        except gpuops.ChecksRefused as exc:
            # the hold starts again: tried after another node_health_gpu_hold_seconds
            self.kube.patch("resource.k8s.io/v1", "devicetaintrules", rule,
                            {"metadata": {"annotations": {ANN_GPU_HEALTHY_SINCE: now_rfc3339()}}})
            self._event(node, "GpuReturnRefused", f"{where} stays out: {exc}", "Warning")
            return
        self.metrics.actions.labels("return", "", "false").inc()
        self._event(node, "GpuReturned", f"{where} back in service: {d.why}, node checks passed")
