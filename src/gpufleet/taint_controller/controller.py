"""The taint controller: signal -> hysteresis -> taint on the virtual nodes, plus flip-out and flip-back.

Every :data:`~gpufleet.taint_controller.constants.TICK_SECONDS` (:meth:`TaintController.tick`):

1. read the free-GPU signal (:mod:`gpufleet.taint_controller.signal`);
2. feed it to the state machine (:class:`~gpufleet.taint_controller.decision.Hysteresis`), with what
   the flip-out knows of training waiting (:meth:`TaintController.training_waiting`: inference it
   must move off reserved nodes opens the virtual nodes at once);
3. make every virtual node of the configured pools (labels
   ``type=virtual-kubelet``, ``gpufleet.io/pool in (...)``) carry
   ``gpufleet.io/cluster-has-free-gpus:NoSchedule`` exactly when the state
   is *tainted* (never NoExecute; other taints untouched; a virtual node
   that registers later is brought in line on the next tick);
4. run the flip-out (:mod:`gpufleet.taint_controller.flipout`) and the flip-back
   (:mod:`gpufleet.taint_controller.flipback`) passes;
5. mark not ready, then remove, the endpoints of virtual nodes whose
   virtual kubelet is gone (:mod:`gpufleet.virtual_kubelet.orphans`: Lease not renewed,
   node not Ready, node deleted), as the node lifecycle controller does for
   pods on unreachable nodes.

Initial state: tainted if any virtual node of the pools carries the taint
(a restarted controller resumes what it was doing), unknown if there is
none yet (the first sustained excursion decides).

**A taint removed by someone else.** While the state is *tainted*, a
managed node that carried the taint (the controller saw it there) and now
lacks it was untainted by another actor (a person with kubectl, another
controller). The controller restores it **once** per node and decision,
says so (Warning Event ``FreeGpusTaintRestored`` on the Node, metric
``taint_restored_total{node}``, a log line), and if the taint is removed
again before the next decision it honours the removal instead of fighting
over the node every tick (Event ``FreeGpusTaintRemovalHonoured``, metric
``taint_removals_honoured_total{node}``); the next decision takes the node
back. A node that is new (another UID) or never carried the taint is just
brought in line, silently.

Metrics (prefix ``gpufleet_taint_controller_``): ``free_gpus`` (the
signal), ``tainted`` (1, 0, -1 unknown), ``transitions_total{to}``,
``decision_latency_seconds`` (decision to every virtual node patched),
``reaction_seconds`` (first sample of the streak to every node patched:
the hold time plus the latency), ``signal_errors_total``,
``virtual_nodes{tainted}``, ``orphaned_endpoint_writes_total{action}``
(writes to EndpointSlices of gone virtual kubelets, ``not_ready`` or
``remove``: :mod:`gpufleet.virtual_kubelet.orphans`), ``tick_seconds`` (wall),
``tick_cpu_seconds`` (the CPU of the tick's own threads, the loop and the
flip-out's workers, :mod:`gpufleet.controllers.threadcpu`) and
``tick_process_cpu_seconds`` (the whole process's CPU during the tick,
watch decoding included: the difference is what the informers cost).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from gpufleet.controllers.threadcpu import ThreadCpu
from gpufleet.kube import Kube, KubeError, NotFound
from gpufleet.kube.events import record_event

from .decision import Decision, Hysteresis
from .flipback import FlipBack
from .flipout import WORKER_THREAD_PREFIX, FlipOut, is_pending_training, set_taint
from .signal import BY_BINDING, UNBOUND
from gpufleet.names import FREE_GPUS_EFFECT, FREE_GPUS_TAINT, POOL_LABEL, SURGE_DIRECTION_LABEL
from gpufleet.virtual_kubelet.orphans import OrphanedEndpoints

from .constants import TICK_SECONDS

log = logging.getLogger(__name__)

FREE = Gauge("gpufleet_taint_controller_free_gpus", "Free schedulable GPUs in the cluster (the signal); NaN if unavailable.")
TAINTED = Gauge("gpufleet_taint_controller_tainted",
                "Taint state: 1 virtual nodes tainted (inference stays in), 0 untainted (may run outside), -1 unknown.")
TRANSITIONS = Counter("gpufleet_taint_controller_transitions_total", "Taint state changes, by new state.", ["to"])
LATENCY = Histogram("gpufleet_taint_controller_decision_latency_seconds",
                    "Seconds from a decision to every virtual node carrying it.",
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
REACTION = Histogram("gpufleet_taint_controller_reaction_seconds",
                     "Seconds from the first sample of the deciding streak to every virtual node carrying the decision.",
                     buckets=(1, 2, 5, 10, 15, 30, 60, 90, 120, 300, 600))
SIGNAL_ERRORS = Counter("gpufleet_taint_controller_signal_errors_total", "Ticks without a signal value.")
RESTORED = Counter("gpufleet_taint_controller_taint_restored_total",
                   "Free-GPU taints another actor removed from a virtual node and the controller put back (once per "
                   "node and decision).", ["node"])
HONOURED = Counter("gpufleet_taint_controller_taint_removals_honoured_total",
                   "Free-GPU taints removed again by another actor after a restore: left off until the next decision.",
                   ["node"])
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5)
TICK_CPU = Histogram("gpufleet_taint_controller_tick_cpu_seconds",
                     "CPU seconds of one tick's own threads (the loop and the flip-out's workers: signal, decision, "
                     "flip-out, flip-back, orphaned endpoints), the watches' decoding excluded.", buckets=TICK_BUCKETS)
TICK_PROCESS_CPU = Histogram("gpufleet_taint_controller_tick_process_cpu_seconds",
                             "CPU seconds the whole process spent during one tick (its watch threads' decoding in "
                             "that time included).", buckets=TICK_BUCKETS)
TICK_WALL = Histogram("gpufleet_taint_controller_tick_seconds",
                      "Wall seconds of one tick (API requests included).", buckets=TICK_BUCKETS)
EVENT_COMPONENT = "gpufleet-taint-controller"
VNODES = Gauge("gpufleet_taint_controller_virtual_nodes", "Virtual nodes of the configured pools, by taint.", ["tainted"])
FREE_TAINT = {"key": FREE_GPUS_TAINT, "effect": FREE_GPUS_EFFECT}


#: The log line of each transition (to, reaction seconds, apply milliseconds, reason): readers of the
#: controller's log (``sim.flip``, :func:`gpufleet_workshop.sim.incluster.transitions`) rebuild the transitions from it.
TRANSITION_LOG = "taint controller: %s virtual nodes after %.2fs (apply %.0f ms): %s"


@dataclass
class Transition:
    """One applied state change: when (clock), to what, reaction and latency (seconds), why."""

    at: float
    tainted: bool
    reaction_seconds: float
    latency_seconds: float
    reason: str


@dataclass
class TaintController:
    """See the module docstring.

    Args:
        kube: client.
        signal: an object with ``value() -> float | None`` (ApiServerSignal, PrometheusSignal).
        caches: an ApiServerSignal whose ``nodes``/``pods`` informers are read (may be ``signal`` itself).
        machine: the hysteresis state machine (its ``tainted`` is set from the nodes on :meth:`start`).
        pools: pool names whose virtual nodes are managed (empty: every virtual node).
        flip_out / flip_back: the two passes, or None to skip them.
        orphans: the pass over endpoints whose publisher is gone (:class:`gpufleet.virtual_kubelet.orphans.OrphanedEndpoints`),
            or None.
        clock: monotonic seconds.
    """

    kube: Kube
    signal: object
    caches: object
    machine: Hysteresis
    pools: tuple[str, ...] = ()
    flip_out: FlipOut | None = None
    flip_back: FlipBack | None = None
    orphans: OrphanedEndpoints | None = None
    clock: Callable[[], float] = time.monotonic
    transitions: list[Transition] = field(default_factory=list)
    last_value: float | None = None
    #: node name -> UID of managed nodes seen carrying the taint while tainted.
    carried: dict[str, str] = field(default_factory=dict)
    #: nodes whose taint was restored, and whose second removal was honoured, since the last decision.
    restored: set[str] = field(default_factory=set)
    honoured: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def virtual_nodes(self) -> list[dict]:
        """Node views of the managed virtual nodes."""
        return [n for n in self.caches.nodes.items()
                if n["virtual"] and (not self.pools or n["labels"].get(POOL_LABEL) in self.pools)]

    @staticmethod
    def has_taint(node: dict) -> bool:
        """Whether a node view carries the free-GPU taint (NoSchedule)."""
        return any(t.get("key") == FREE_GPUS_TAINT and t.get("effect") == FREE_GPUS_EFFECT for t in node["taints"])

    def start(self) -> "TaintController":
        """Take the initial state from the virtual nodes (module docstring)."""
        nodes = self.virtual_nodes()
        if nodes and self.machine.tainted is None:
            self.machine.tainted = any(self.has_taint(n) for n in nodes)
        if self.machine.tainted:
            self.carried.update({n["name"]: n.get("uid") or "" for n in nodes if self.has_taint(n)})
        TAINTED.set(-1 if self.machine.tainted is None else int(self.machine.tainted))
        return self

    def apply(self, tainted: bool) -> int:
        """Make every managed virtual node carry (or not) the taint; returns how many were patched.

        While tainted, a taint another actor removed is restored once, or its
        removal honoured (module docstring). Errors on one node are logged and
        retried on the next tick.
        """
        changed = 0
        if not tainted:
            self.carried.clear()
        for n in self.virtual_nodes():
            name, uid = n["name"], n.get("uid") or ""
            if self.has_taint(n) == tainted:
                if tainted:
                    self.carried[name] = uid
                continue
            removed_by_other = tainted and self.carried.get(name) == uid and name in self.carried
            if removed_by_other and name in self.restored:
                if name not in self.honoured:
                    self.honoured.add(name)
                    HONOURED.labels(name).inc()
                    log.warning("taint controller: %s on %s removed again by another actor after it was restored; "
                                "left off until the next decision", FREE_GPUS_TAINT, name)
                    self._node_event(n, "FreeGpusTaintRemovalHonoured",
                                     f"{FREE_GPUS_TAINT}:{FREE_GPUS_EFFECT} removed again after it was restored: left off "
                                     "until the next taint decision (the controller does not fight over the node)")
                continue
            try:
                # The key is the controller's: a free-GPU taint set by hand with a value is still the taint.
                patched = set_taint(self.kube, name, dict(FREE_TAINT), add=tainted, any_value=True)
            except NotFound:
                continue
            except KubeError as exc:
                log.warning("taint controller: node %s: %s", name, exc)
                continue
            if not tainted:
                changed += patched
                continue
            self.carried[name] = uid
            if not patched:
                continue  # the cache lagged: the node carries the taint already
            changed += 1
            if removed_by_other:
                self.restored.add(name)
                RESTORED.labels(name).inc()
                log.warning("taint controller: %s was removed from %s by another actor while the cluster has free GPUs; "
                            "restored (once)", FREE_GPUS_TAINT, name)
                self._node_event(n, "FreeGpusTaintRestored",
                                 f"{FREE_GPUS_TAINT}:{FREE_GPUS_EFFECT} was removed by another actor while the cluster "
                                 f"has free GPUs ({self.last_value:g} free); restored once: inference stays in-cluster. "
                                 "A second removal is left in place until the next decision"
                                 if self.last_value is not None else
                                 f"{FREE_GPUS_TAINT}:{FREE_GPUS_EFFECT} was removed by another actor; restored once")
        return changed

    def _node_event(self, node: dict, reason: str, message: str) -> None:
        """A Warning Event on a Node (cluster-scoped objects' Events live in ``default``); never raises."""
        record_event(self.kube, {"apiVersion": "v1", "kind": "Node",
                                 "metadata": {"name": node["name"], "uid": node.get("uid") or ""}},
                     reason, message, type_="Warning", component=EVENT_COMPONENT)

    def returning(self) -> int:
        """Pods outside the flip-back is bringing in-cluster, 0 while another pod waits for GPUs: pending,
        unschedulable, asking for GPUs, not a flip-back replacement (:meth:`Hysteresis.observe`). Read from the
        caches' indexes (pods by node, unbound pods), and only while tainted."""
        if self.flip_back is None or not self.machine.tainted:
            return 0
        returning = self.flip_back.returning()
        if not returning:
            return 0
        for p in self.flip_back.pods.by_index(BY_BINDING, UNBOUND):
            labels = p["metadata"].get("labels") or {}
            if (p["phase"] == "Pending" and p["unschedulable"] and p["gpus"] > 0
                    and not p["metadata"].get("deletionTimestamp") and labels.get(SURGE_DIRECTION_LABEL) != "back"):
                return 0
        return returning

    def training_waiting(self) -> tuple[int, int]:
        """``(displaced, arriving)`` for :meth:`Hysteresis.observe`: the inference pods the flip-out's last pass
        still had to move off nodes reserved for training, and the pods of its priority classes that ask for GPUs,
        are bound to no node and have no ``Unschedulable`` verdict (scheduling gates not yet lifted, or not yet
        tried by the scheduler). ``(0, 0)`` without a flip-out.

        An unschedulable training pod is left out of ``arriving``: one the flip-out can make room for is
        reserved for, and counts among ``displaced`` through its node's inference; one nothing can place (a
        node selector no node matches, more GPUs than a node has) would otherwise keep inference outside for as
        long as it exists. Read from the flip-out's last pass and the pod cache's index of unbound pods: no scan
        of the fleet."""
        if self.flip_out is None:
            return 0, 0
        arriving = sum(1 for p in self.flip_out.pods.by_index(BY_BINDING, UNBOUND)
                       if not p["unschedulable"] and is_pending_training(p, self.flip_out.classes))
        return len(self.flip_out.wanted), arriving

    def tick(self) -> Decision:
        """One cycle (module docstring); returns the decision taken."""
        value = self.signal.value()
        self.last_value = value
        if value is None:
            SIGNAL_ERRORS.inc()
            FREE.set(float("nan"))
        else:
            FREE.set(value)
        now = self.clock()
        displaced, arriving = self.training_waiting()
        decision = self.machine.observe(value, now, returning=self.returning(), displaced=displaced, arriving=arriving)
        if decision.tainted is not None:
            started = self.clock()
            if decision.changed:
                self.restored.clear()
                self.honoured.clear()
            self.apply(decision.tainted)
            if decision.changed:
                done = self.clock()
                t = Transition(done, decision.tainted, done - decision.since, done - started, decision.reason)
                self.transitions.append(t)
                TRANSITIONS.labels("tainted" if decision.tainted else "untainted").inc()
                LATENCY.observe(t.latency_seconds)
                REACTION.observe(t.reaction_seconds)
                log.info(TRANSITION_LOG, "tainted" if decision.tainted else "untainted", t.reaction_seconds,
                         t.latency_seconds * 1000, decision.reason)
        TAINTED.set(-1 if decision.tainted is None else int(decision.tainted))
        vn = self.virtual_nodes()
        on = sum(self.has_taint(n) for n in vn)
        VNODES.labels("true").set(on)
        VNODES.labels("false").set(len(vn) - on)
        for loop in (self.flip_out, self.flip_back, self.orphans):
            if loop is not None:
                try:
                    loop.tick()
                except Exception:
                    log.exception("taint controller: %s pass failed", type(loop).__name__)
        return decision

    def run(self, tick_seconds: float = TICK_SECONDS, beat: Callable[[], None] = lambda: None) -> None:
        """Tick every ``tick_seconds`` until :meth:`stop`; ``beat`` is called after each tick (liveness)."""
        self.start()
        own = ThreadCpu(lambda name: name.startswith(WORKER_THREAD_PREFIX))
        while not self._stop.is_set():
            began, cpu = time.monotonic(), time.process_time()
            own.start()
            try:
                self.tick()
                beat()
            except Exception:
                log.exception("taint controller: tick failed")
            TICK_CPU.observe(own.seconds())
            TICK_PROCESS_CPU.observe(time.process_time() - cpu)
            TICK_WALL.observe(time.monotonic() - began)
            self._stop.wait(max(0.0, tick_seconds - (time.monotonic() - began)))

    def stop(self) -> None:
        """Stop :meth:`run`."""
        self._stop.set()
