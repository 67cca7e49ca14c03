"""The remediation service: faults in, swap / degrade / lemon actions out, rate limited.

One :meth:`Remediator.step`:

1. query Prometheus (:class:`gpufleet.node_health.faults.Queries`) and read the Nodes;
2. :func:`gpufleet.node_health.faults.evaluate` -> faults per node;
3. :func:`decide` (pure) -> one :class:`Decision` per faulty node:

   * a node already out for swap, or being acted on, is left alone;
   * a fault whose kind is in ``node_health_degraded_faults`` sends the
     node to the degraded tier (taint ``gpufleet.io/degraded=<kind>``,
     no cordon, no drain); any other fault swaps it (the swap steps of
     :mod:`gpufleet.ops.swap`: cordon, taint, drain, swap request); a
     degraded node with a swap fault is escalated to a swap;
   * **lemons**: this failure and the node's attributable failures
     (history annotation ``gpufleet.io/health-history``) within
     ``node_health_lemon_window_hours`` reaching
     ``node_health_lemon_failures`` make it a lemon: swapped (even for a
     degraded-tier fault), labelled ``gpufleet.io/lemon=true``, and only a
     person returns it (``invoke node.return NODE --clear-lemon``);
   * **rate limit**: a node is only taken out while fewer than
     ``node_health_max_nodes_out`` nodes are out (swap or degraded taint,
     whoever put it there); the others are deferred (Event
     ``RemediationDeferred``) and retried every step. Swaps are decided
     before degrades; escalations need no new slot;
   * **circuit breaker** (:mod:`gpufleet.node_health.breaker`): a node is only
     taken out while the GPU nodes out of service (the node classifier's
     answer for training), that one included, stay within
     ``node_health_max_unhealthy_share`` of the fleet; past it the action
     is deferred (Event ``RemediationHeldByBreaker``), the breaker opens
     (Event ``CircuitBreakerOpen`` on its ConfigMap, metric, alert) and it
     closes by itself once the share allows the actions again, or while a
     person's resume is in force (``invoke health.breaker-resume``).

4. act: every action records an Event on the Node (``NodeSwapRequested``,
   ``NodeDrained``/``NodeDrainIncomplete``, ``NodeDegraded``, ``NodeLemon``,
   ``RemediationDeferred``, ``RemediationHeldByBreaker``, ``NodeReturned`` for a recovered degraded node);
   in dry run nothing changes and one ``RemediationDryRun`` Event per node
   and decision says what would have been done. Swaps run in worker
   threads (a drain may take minutes); the taint is applied first, and
   ``gpufleet_node_health_action_latency_seconds`` measures from the sample
   that completed the evidence to the taint.
   Where a node's GPUs are allocated through DRA, the faults of one GPU go to
   the per-GPU path instead (:mod:`gpufleet.node_health.devices`, given as
   ``gpus``): that GPU alone is taken out with a device taint, and the node
   path sees only the node's own faults.
5. degraded nodes whose fault has been gone for ``degraded_clear_seconds``
   return to service by themselves once their node checks pass (not
   lemons; swapped nodes never: a person or the provider integration
   returns those). The checks are ``tests/nodes`` on that host
   (:class:`gpufleet.ops.nodechecks.NodeChecks`, given as ``return_checks``);
   a failure keeps the node degraded with Event ``ReturnRefused`` naming
   the failed test ids, and it is tried again after another
   ``degraded_clear_seconds``. Without ``return_checks`` (gpufleet's image
   carries no testinfra) no node returns by itself: Event
   ``ReturnAwaitsChecks`` says a person returns it with ``invoke
   node.return``, which runs them.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.node_health import breaker
from gpufleet.node_health.config import FAULT_KINDS, Configuration
from gpufleet.node_health.faults import Fault, Queries, evaluate
from gpufleet.prom.client import PromClient, PromError
from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet.classify import TRAINING, classify, default_classes
from gpufleet.ops import swap as swapper
from gpufleet.kube import Kube
from gpufleet.kube.events import record_event
from gpufleet.kube.retry import update_with_retry
from gpufleet.kube.times import now_rfc3339, parse_time
from gpufleet.kube.selectors import selector_matches
from gpufleet.ops.reads import OpsError, list_nodes
from gpufleet.ops.nodechecks import ChecksFailed, NodeChecks
from gpufleet.names import (ANN_DEGRADED_AT, ANN_HEALTH_HISTORY, ANN_LEMON_REASON, ANN_RETURNED_AT, BREAKER_CONFIGMAP,
                            GPU_RESOURCE, LEMON_LABEL)

log = logging.getLogger(__name__)
COMPONENT = "gpufleet-node-health"
Node = dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """What to do with one faulty node.

    Attributes:
        node: node name.
        action: ``swap``, ``degrade``, ``defer`` (rate limited) or ``skip``.
        faults: the faults seen.
        why: for skip/defer, why; for actions, a summary.
        lemon: the failure makes it a lemon.
        escalation: a degraded node moving to swap.
        intended: for ``defer``, the action deferred.
        breaker: for ``defer``, the circuit breaker held it (not ``max_nodes_out``).
    """

    node: str
    action: str
    faults: tuple[Fault, ...]
    why: str
    lemon: bool = False
    escalation: bool = False
    intended: str = ""
    breaker: bool = False

    @property
    def kinds(self) -> str:
        """Fault kinds, comma-separated (the taint value uses the first)."""
        return ",".join(dict.fromkeys(f.kind for f in self.faults))

    @property
    def detail(self) -> str:
        """Every fault's detail."""
        return "; ".join(f"{f.kind}: {f.detail}" for f in self.faults)


def partial_gpu_faults(nodes: dict[str, Node], settings: Configuration, now: float) -> dict[str, Fault]:
    """``gpu_partial`` faults from the Node objects (pure): the classifier's degraded nodes that no longer count
    for training (allocatable GPUs below capacity, ``partial_nodes_train`` false)."""
    classes = default_classes(partial_nodes_train=settings.partial_nodes_train)
    out = {}
    for name, obj in nodes.items():
        nc = classify(obj, classes)
        if nc.degraded and not nc.facts.virtual and any(r.startswith(f"{GPU_RESOURCE} allocatable")
                                                          for r in nc.reasons[TRAINING]):
            out[name] = Fault(name, "gpu_partial", f"{GPU_RESOURCE} allocatable {nc.facts.allocatable} < capacity "
                                                   f"{nc.facts.capacity}: the device plugin withdrew GPUs", now)
    return out


def recent_failures(node: Node, now: float, window: float) -> list[dict[str, Any]]:
    """History entries of ``node`` within ``window`` seconds before ``now``."""
    out = []
    for e in nodeutil.health_history(node):
        t = nodeutil.recorded_time(e.get("time"), f"node {nodeutil.name(node)} {ANN_HEALTH_HISTORY} time")
        if t is not None and now - t <= window:
            out.append(e)
    return out


def telemetry_nodes(nodes: dict[str, Node], settings: Configuration, now: float) -> list[str]:
    """Nodes whose GPU telemetry is judged (pure): Ready, not virtual, expecting GPUs
    (:func:`gpufleet.fleet.nodes.expected_gpus`), selected by ``telemetry_node_selector``, and
    registered longer than the stale bound ago (a new node's exporter is still starting)."""
    out = []
    for name, obj in nodes.items():
        want = nodeutil.expected_gpus(obj)
        if not want or not nodeutil.is_ready(obj):
            continue
        if not selector_matches(settings.telemetry_node_selector.api(), nodeutil.labels(obj)):
            continue
        created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
        if created is not None and now - created < settings.rules.telemetry_stale_seconds:
            continue
        out.append(name)
    return sorted(out)


def decide(faults: dict[str, list[Fault]], nodes: dict[str, Node], settings: Configuration, now: float,
           busy: set[str] | frozenset[str] = frozenset(), *, resumed: bool = False,
           fleet: breaker.FleetShare | None = None) -> list[Decision]:
    """One decision per faulty node (pure; module docstring for the rules).

    Args:
        faults: node -> faults (:func:`gpufleet.node_health.faults.evaluate`).
        nodes: node name -> Node, the whole cluster (counts nodes out).
        settings: limits and tiers.
        now: Unix seconds (lemon window).
        busy: nodes with an action in flight.
        resumed: a person's resume of the circuit breaker is in force (no share limit).
        fleet: :func:`gpufleet.node_health.breaker.fleet_share` of ``nodes``, when the caller has it already.
    """
    out_now = sum(1 for n in nodes.values() if nodeutil.is_out(n))
    if fleet is None:
        fleet = breaker.fleet_share(nodes, default_classes(partial_nodes_train=settings.partial_nodes_train))
    out_of_service = set(fleet.out)
    decisions: list[Decision] = []
    candidates: list[tuple[int, float, str, bool, bool]] = []
    for name, fs in faults.items():
        node = nodes.get(name)
        if node is None:
            decisions.append(Decision(name, "skip", tuple(fs), "no such node in the cluster"))
            continue
        if name in busy:
            decisions.append(Decision(name, "skip", tuple(fs), "an action is in flight"))
            continue
        if nodeutil.taint(node, swapper.SWAP_TAINT) is not None:
            decisions.append(Decision(name, "skip", tuple(fs), "already out for swap"))
            continue
        needs_swap = any(f.kind not in settings.degraded_faults for f in fs)
        lemon = len(recent_failures(node, now, settings.lemon_window_seconds)) + 1 >= settings.lemon_failures
        degraded = nodeutil.taint(node, swapper.DEGRADED_TAINT) is not None
        if degraded and not needs_swap and not lemon:
            decisions.append(Decision(name, "skip", tuple(fs), "already degraded"))
            continue
        swap = needs_swap or lemon
        candidates.append((0 if swap else 1, min(f.since for f in fs), name, lemon, degraded))
    for _, _, name, lemon, degraded in sorted(candidates):
        fs = tuple(faults[name])
        swap = lemon or any(f.kind not in settings.degraded_faults for f in fs)
        action = "swap" if swap else "degrade"
        if degraded:  # escalation: already counted out
            decisions.append(Decision(name, action, fs, "escalated from the degraded tier", lemon, escalation=True))
            continue
        if (not resumed and name not in out_of_service
                and not breaker.allows(len(out_of_service) + 1, fleet.total, settings.max_unhealthy_share)):
            decisions.append(Decision(
                name, "defer", fs, f"circuit breaker: {len(out_of_service)} of {fleet.total} GPU nodes out of service; "
                f"node_health_max_unhealthy_share {settings.max_unhealthy_share:g} allows "
                f"{breaker.max_out(fleet.total, settings.max_unhealthy_share)}", lemon, intended=action, breaker=True))
            continue
        if out_now >= settings.max_nodes_out:
            decisions.append(Decision(name, "defer", fs, f"{out_now} nodes out, node_health_max_nodes_out is "
                                                         f"{settings.max_nodes_out}", lemon, intended=action))
            continue
        out_now += 1
        out_of_service.add(name)
        decisions.append(Decision(name, action, fs, "lemon: repeated failures" if lemon else action, lemon))
    return decisions


@dataclass
class StepReport:
    """One step: faults found, decisions taken, Prometheus/API errors, duration."""

    faults: dict[str, list[Fault]] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The per-GPU path's step (:class:`gpufleet.node_health.devices.GpuStep`), None without DRA GPUs.
    gpu: Any = None


class Metrics:
    """The controller's Prometheus metrics (``gpufleet_node_health_*``) in one registry."""

    def __init__(self, registry: CollectorRegistry):
        p = "gpufleet_node_health_"
        self.actions = Counter(p + "actions_total", "Remediation actions taken (dry_run=true: only recorded), by action and fault kind.",
                               ["action", "fault", "dry_run"], registry=registry)
        self.deferred = Counter(p + "deferred_total", "Actions deferred because node_health_max_nodes_out nodes were out.",
                                ["fault"], registry=registry)
        self.nodes_out = Gauge(p + "nodes_out", "Nodes out (swap or degraded taint) at the last step.", registry=registry)
        self.faulty = Gauge(p + "faulty_nodes", "Nodes with a fault at the last step, by fault kind.", ["fault"], registry=registry)
        self.latency = Histogram(p + "action_latency_seconds",
                                 "Seconds from the sample that completed a fault's evidence to the node tainted.",
                                 buckets=(1, 2, 5, 10, 15, 20, 30, 60, 120, 300), registry=registry)
        self.step_seconds = Gauge(p + "step_duration_seconds", "Duration of the last evaluation step.", registry=registry)
        self.errors = Counter(p + "errors_total", "Steps or actions that failed, by where.", ["where"], registry=registry)
        self.last_success = Gauge(p + "last_success_timestamp_seconds", "Unix time of the last step without error.",
                                  registry=registry)
        self.expected_gpus = Gauge(p + "expected_gpus", "GPUs each node should have (label nvidia.com/gpu.count, else "
                                   "its nvidia.com/gpu capacity), for nodes whose GPU telemetry is judged; the "
                                   "GpufleetGPUTelemetryAbsent/Incomplete alerts compare it with the exporter's series.",
                                   ["node"], registry=registry)
        self.breaker_open = Gauge(p + "breaker_open", "1 while the circuit breaker holds actions (more than "
                                  "node_health_max_unhealthy_share of the GPU fleet would be out of service), else 0.",
                                  registry=registry)
        self.out_of_service = Gauge(p + "out_of_service_nodes", "GPU nodes out of service (not counting for training, "
                                    "the node classifier), at the last step.", registry=registry)
        self.fleet_nodes = Gauge(p + "fleet_nodes", "GPU nodes in the cluster (not virtual), at the last step.",
                                 registry=registry)
        self.unhealthy_share_limit = Gauge(p + "max_unhealthy_share", "node_health_max_unhealthy_share (0..1).",
                                           registry=registry)
        self.held = Counter(p + "breaker_held_total", "Actions the circuit breaker held, by fault kind (counted every step).",
                            ["fault"], registry=registry)


class Remediator:
    """Runs :meth:`step` against one cluster and one Prometheus.

    Args:
        kube: Kubernetes API client (built once at startup).
        prom: Prometheus client.
        settings: :class:`Configuration`.
        registry: where the metrics go (a fresh one per instance by default).
        return_checks: the node checks a degraded node must pass before it returns by itself
            (None: it waits for a person, see the module docstring).
    """

    def __init__(self, kube: Kube, prom: PromClient, settings: Configuration,
                 registry: CollectorRegistry | None = None, return_checks: NodeChecks | None = None,
                 gpus: Any = None):
        self.kube, self.prom, self.settings = kube, prom, settings
        #: The per-GPU path (:class:`gpufleet.node_health.devices.GpuRemediator`), None: node path only.
        self.gpus = gpus
        self._results: dict[str, list[dict[str, Any]]] = {}
        self.return_checks = return_checks
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.queries = Queries(settings.rules).all()
        self._pool = ThreadPoolExecutor(max_workers=max(settings.max_nodes_out, 1), thread_name_prefix="remediate")
        self._busy: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._announced: set[tuple[str, str, str]] = set()
        self._clear_since: dict[str, float] = {}
        #: node -> seconds from evidence to taint, for every action this instance took.
        self.latencies: dict[str, float] = {}
        #: the circuit breaker's state as last written (None: not read yet), and the nodes it held.
        self._breaker_state: str | None = None
        self._breaker_held: tuple[str, ...] = ()
        self.metrics.unhealthy_share_limit.set(settings.max_unhealthy_share)

    # ------------------------------------------------------------------ evaluation

    def faults(self, nodes: dict[str, Node], now: float) -> tuple[dict[str, list[Fault]], list[str]]:
        """Query every rule at ``now`` and evaluate; returns ``(faults, errors)``."""
        results: dict[str, list[dict[str, Any]]] = {}
        errors = []
        for name, expr in self.queries.items():
            try:
                results[name] = self.prom.query(expr, at=now)
            except PromError as exc:
                errors.append(str(exc))
        returned = {n: t for n, obj in nodes.items()
                    if (t := nodeutil.recorded_time(nodeutil.annotations(obj).get(ANN_RETURNED_AT),
                                                    f"node {n} annotation {ANN_RETURNED_AT}")) is not None}
        expected = {n: c for n, obj in nodes.items() if (c := nodeutil.expected_gpus(obj)) is not None}
        judged = telemetry_nodes(nodes, self.settings, now)
        self.metrics.expected_gpus.clear()
        for n in judged:
            self.metrics.expected_gpus.labels(n).set(expected[n])
        self._results = results
        found = evaluate(results, self.settings.rules, now, returned_at=returned, expected_gpus=expected,
                         telemetry_nodes=judged)
        for n, fault in partial_gpu_faults(nodes, self.settings, now).items():
            found.setdefault(n, []).append(fault)
        return dict(sorted(found.items())), errors

    def step(self, now: float | None = None) -> StepReport:
        """Evaluate and act once (module docstring). Never raises for Prometheus or API errors: they are reported."""
        t0 = time.monotonic()
        now = time.time() if now is None else now
        report = StepReport()
        try:
            nodes = {nodeutil.name(n): n for n in list_nodes(self.kube)}
        except Exception as exc:  # noqa: BLE001 - a controller step reports and retries
            self.metrics.errors.labels("list_nodes").inc()
            report.errors.append(f"listing nodes: {exc}")
            return report
        report.faults, report.errors = self.faults(nodes, now)
        if report.errors:
            self.metrics.errors.labels("prometheus").inc()
        if self.gpus is not None:
            report.faults = self._gpu_step(report, nodes, now)
        with self._lock:
            busy = {n for n, f in self._busy.items() if not f.done()}
        cm = self._read_breaker()
        fleet = breaker.fleet_share(nodes, default_classes(partial_nodes_train=self.settings.partial_nodes_train))
        report.decisions = decide(report.faults, nodes, self.settings, now, busy, resumed=breaker.resumed(cm, now),
                                  fleet=fleet)
        self._breaker(report.decisions, fleet, cm)
        for kind in FAULT_KINDS:
            self.metrics.faulty.labels(kind).set(sum(1 for fs in report.faults.values() if any(f.kind == kind for f in fs)))
        for d in report.decisions:
            self._act(d, nodes.get(d.node))
        report.recovered = self._recover(nodes, report.faults, now)
        self.metrics.nodes_out.set(sum(1 for n in nodes.values() if nodeutil.is_out(n)))
        report.seconds = time.monotonic() - t0
        self.metrics.step_seconds.set(report.seconds)
        if not report.errors:
            self.metrics.last_success.set(time.time())
        return report

    def _gpu_step(self, report: StepReport, nodes: dict[str, Node], now: float) -> dict[str, list[Fault]]:
        """Run the per-GPU path on the DRA nodes; returns the faults left for the node path."""
        from gpufleet.node_health.devices import node_faults_left
        from gpufleet.ops.reads import list_gpus

        try:
            gpus = {n: g for n, g in list_gpus(self.kube).items() if n in nodes}
        except Exception as exc:  # noqa: BLE001 - a controller step reports and retries
            self.metrics.errors.labels("list_gpus").inc()
            report.errors.append(f"listing DRA GPUs: {exc}")
            return report.faults
        if not gpus:
            return report.faults
        report.gpu = self.gpus.step(self._results, self.settings.rules, now, nodes, gpus)
        if report.gpu.errors:
            self.metrics.errors.labels("gpu").inc()
            report.errors += report.gpu.errors
        return node_faults_left(report.faults, gpus, report.gpu.faults)

    # ------------------------------------------------------------------ actions

    def _read_breaker(self) -> dict[str, Any] | None:
        """The breaker ConfigMap, None when absent or unreadable (then no resume is in force; counted as an error)."""
        try:
            return breaker.read(self.kube, self.settings.namespace)
        except Exception as exc:  # noqa: BLE001 - a controller step reports and retries
            self.metrics.errors.labels("breaker").inc()
            log.warning("reading ConfigMap %s/%s: %s", self.settings.namespace, BREAKER_CONFIGMAP, exc)
            return None

    def _breaker(self, decisions: list[Decision], fleet: breaker.FleetShare, cm: dict[str, Any] | None) -> None:
        """Metrics, Events and the ConfigMap of the circuit breaker after one :func:`decide` over ``fleet``
        (:mod:`gpufleet.node_health.breaker`). In dry run the ConfigMap is not written; Events and metrics are."""
        held = tuple(sorted(d.node for d in decisions if d.breaker))
        for d in decisions:
            if d.breaker:
                for f in d.faults:
                    self.metrics.held.labels(f.kind).inc()
        self.metrics.out_of_service.set(len(fleet.out))
        self.metrics.fleet_nodes.set(fleet.total)
        self.metrics.breaker_open.set(1 if held else 0)
        if self._breaker_state is None:
            self._breaker_state = ((cm or {}).get("data") or {}).get(breaker.STATE, breaker.CLOSED)
            self._breaker_held = tuple(n for n in (((cm or {}).get("data") or {}).get(breaker.HELD) or "").split(",") if n)
        state = breaker.OPEN if held else breaker.CLOSED
        if state == self._breaker_state and (state == breaker.CLOSED or held == self._breaker_held):
            return
        share = self.settings.max_unhealthy_share
        if state == breaker.OPEN and self._breaker_state != breaker.OPEN:
            reason, type_ = "CircuitBreakerOpen", "Warning"
            message = (f"holding actions on {', '.join(held[:10])}{' ...' if len(held) > 10 else ''}: {len(fleet.out)} of "
                       f"{fleet.total} GPU nodes out of service, node_health_max_unhealthy_share {share:g} allows "
                       f"{breaker.max_out(fleet.total, share)}; resumes when the share falls, or run "
                       f"invoke health.breaker-resume --env ENV")
        elif state == breaker.CLOSED:
            reason, type_ = "CircuitBreakerClosed", "Normal"
            message = ("a person's resume is in force (invoke health.breaker-resume)" if breaker.resumed(cm, time.time())
                       else f"the share allows actions again: {len(fleet.out)} of {fleet.total} GPU nodes out of service, "
                            f"limit {share:g}")
        else:
            reason = ""
        data = {breaker.STATE: state, breaker.OUT: str(len(fleet.out)), breaker.TOTAL: str(fleet.total),
                breaker.LIMIT: f"{share:g}", breaker.HELD: ",".join(held)}
        if reason:
            data[breaker.SINCE] = now_rfc3339()
            log.warning("circuit breaker %s: %s", state, message)
        obj = cm
        if not self.settings.dry_run:
            try:
                obj = breaker.write_state(self.kube, self.settings.namespace, data)
            except Exception as exc:  # noqa: BLE001
                self.metrics.errors.labels("breaker").inc()
                log.error("writing ConfigMap %s/%s: %s", self.settings.namespace, BREAKER_CONFIGMAP, exc)
                return  # retried next step: the state is not recorded as written
        if state == breaker.CLOSED:  # held nodes are announced again the next time it opens
            self._announced = {k for k in self._announced if k[1] != "RemediationHeldByBreaker"}
        if reason:
            ref = obj or {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": BREAKER_CONFIGMAP, "namespace": self.settings.namespace}}
            record_event(self.kube, {**ref, "apiVersion": "v1", "kind": "ConfigMap"}, reason, message, type_=type_,
                         component=COMPONENT, action="Hold" if state == breaker.OPEN else "Resume")
        self._breaker_state, self._breaker_held = state, held

    def _once(self, node: Node | None, d: Decision, reason: str, message: str, type_: str = "Normal") -> None:
        """Record ``reason`` on the node once per node, reason and fault kinds (dry run and deferrals repeat every step)."""
        key = (d.node, reason, d.kinds)
        if key in self._announced or node is None:
            return
        self._announced.add(key)
        record_event(self.kube, node, reason, message, type_=type_, component=COMPONENT, action=d.action.capitalize())

    def _act(self, d: Decision, node: Node | None) -> None:
        """Carry out one decision: defer (Event), dry run (Event), degrade (now) or swap (worker thread)."""
        if d.action == "skip":
            return
        if d.action == "defer" and d.breaker:
            self._once(node, d, "RemediationHeldByBreaker", f"would {d.intended} for {d.detail}; held by the {d.why}; "
                       f"retried every step", "Warning")
            return
        if d.action == "defer":
            self.metrics.deferred.labels(d.kinds).inc()
            self._once(node, d, "RemediationDeferred", f"would {d.intended} for {d.detail}, "
                       f"but {d.why}: retried every step", "Warning")
            return
        dry = self.settings.dry_run
        for f in d.faults:
            self.metrics.actions.labels(d.action, f.kind, "true" if dry else "false").inc()
        if dry:
            self._once(node, d, "RemediationDryRun", f"dry run: would {d.action}{' (lemon)' if d.lemon else ''}: {d.detail}")
            return
        entry = {"time": now_rfc3339(), "fault": d.kinds, "action": d.action, "detail": d.detail[:300]}
        if d.action == "degrade":
            first = d.faults[0]
            try:
                plan = swapper.degrade(self.kube, d.node, first.kind, d.detail, extra_history=entry)
                if plan is not None:
                    self._observe(d)
            except (OpsError, Exception) as exc:  # noqa: BLE001
                self.metrics.errors.labels("degrade").inc()
                log.error("degrading %s failed: %s", d.node, exc)
            return
        with self._lock:
            self._busy[d.node] = self._pool.submit(self._swap, d, entry)

    def _observe(self, d: Decision) -> None:
        """Record the latency from the evidence to the taint (metric and :attr:`latencies`)."""
        latency = max(time.time() - min(f.since for f in d.faults), 0.0)
        self.latencies[d.node] = latency
        self.metrics.latency.observe(latency)
        log.info("%s %s after %.1fs: %s", d.action, d.node, latency, d.detail)

    def _swap(self, d: Decision, entry: dict[str, Any]) -> None:
        """The swap steps for a decision (worker thread); failures are logged and counted, never raised."""
        reason = f"node-health: {d.detail}"
        try:
            swapper.swap(self.kube, d.node, reason, source="node-health", timeout=self.settings.drain_timeout_seconds,
                         namespace=self.settings.namespace, on_tainted=lambda _n: self._observe(d), extra_history=entry,
                         taint_value=d.faults[0].kind)
            if d.lemon:
                self._mark_lemon(d)
        except swapper.AlreadyOut:
            pass
        except Exception as exc:  # noqa: BLE001 - one node's failure never stops the controller
            self.metrics.errors.labels("swap").inc()
            log.error("swapping %s failed: %s", d.node, exc)

    def _mark_lemon(self, d: Decision) -> None:
        """Label the node a lemon (guarded patch) and record Event ``NodeLemon``."""
        w = self.settings.lemon_window_seconds / 3600

        def change(obj: Node) -> dict[str, Any] | None:
            if nodeutil.is_lemon(obj):
                return None
            n = len(recent_failures(obj, time.time(), self.settings.lemon_window_seconds))
            return {"metadata": {"labels": {LEMON_LABEL: "true"},
                                 "annotations": {ANN_LEMON_REASON: f"{n} attributable failures within {w:g}h"}}}

        node, patch = update_with_retry(self.kube, f"/api/v1/nodes/{d.node}", change)
        if patch is not None:
            self.metrics.actions.labels("lemon", d.faults[0].kind, "false").inc()
            record_event(self.kube, node, "NodeLemon", f"lemon: {nodeutil.annotations(node).get(ANN_LEMON_REASON)}; stays "
                         f"out until a person returns it (invoke node.return {d.node} --clear-lemon)", type_="Warning",
                         component=COMPONENT, action="Lemon")

    def _recover(self, nodes: dict[str, Node], faults: dict[str, list[Fault]], now: float) -> list[str]:
        """Return degraded-by-us nodes whose faults have been gone ``degraded_clear_seconds``."""
        done = []
        for name, node in nodes.items():
            if (nodeutil.taint(node, swapper.DEGRADED_TAINT) is None or nodeutil.taint(node, swapper.SWAP_TAINT) is not None
                    or nodeutil.is_lemon(node) or ANN_DEGRADED_AT not in nodeutil.annotations(node)):
                self._clear_since.pop(name, None)
                continue
            if name in faults:
                self._clear_since.pop(name, None)
                continue
            since = self._clear_since.setdefault(name, now)
            if now - since < self.settings.degraded_clear_seconds or self.settings.dry_run:
                continue
            fault = nodeutil.taint(node, swapper.DEGRADED_TAINT).get("value", "")
            if self.return_checks is None:
                key = (name, "awaits-checks", nodeutil.annotations(node).get(ANN_DEGRADED_AT, ""))
                if key not in self._announced:
                    self._announced.add(key)
                    record_event(self.kube, node, "ReturnAwaitsChecks",
                                 f"degraded ({fault}), no fault for {now - since:.0f}s; this controller runs no node "
                                 f"checks, so a person returns it once they pass: invoke node.return {name} --env ENV",
                                 component=COMPONENT, action="Recover")
                continue
            try:
                swapper.return_node(self.kube, name, checks=self.return_checks, namespace=self.settings.namespace)
                self.metrics.actions.labels("recover", fault, "false").inc()
                done.append(name)
                self._clear_since.pop(name, None)
            except ChecksFailed as exc:
                self.metrics.errors.labels("recover").inc()
                self._clear_since[name] = now  # tried again after another degraded_clear_seconds
                record_event(self.kube, node, "ReturnRefused", f"stays degraded ({fault}): {exc}", type_="Warning",
                             component=COMPONENT, action="Recover")
                log.warning("not returning degraded %s: %s", name, exc)
            except Exception as exc:  # noqa: BLE001
                self.metrics.errors.labels("recover").inc()
                log.error("returning degraded %s failed: %s", name, exc)
        return done

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the swaps in flight (drains) to finish."""
        with self._lock:
            futures = list(self._busy.values())
        for f in futures:
            f.result(timeout=timeout)

    def close(self) -> None:
        """Stop the worker pool (waits for running swaps) and the Prometheus client."""
        self._pool.shutdown(wait=True)
        self.prom.close()
