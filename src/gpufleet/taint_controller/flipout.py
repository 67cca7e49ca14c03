"""The flip-out: make room for pending training pods by evicting inference through the Eviction API.

Why: kube-scheduler's preemption deletes victims at once and treats
PodDisruptionBudgets as best effort. A training job that needs every GPU
would kill every in-cluster inference replica in the same second, before
any replacement runs outside. So training pods do not preempt
(their PriorityClass has ``preemptionPolicy: Never``) and this loop
preempts for them, PDB-respecting:

1. A *preemptor* is a pod that is Pending, marked ``Unschedulable`` by the
   scheduler, asks for GPUs, and whose PriorityClass is one of
   ``priority_classes`` (default: gpufleet-training).
2. :func:`plan` picks for each preemptor (highest priority, then oldest,
   first) an in-cluster node where evicting lower-priority GPU pods makes it
   fit (node selector and taints respected; fewest victims, then fewest
   victim GPUs). If a node fits without victims the scheduler will place
   the pod: nothing to do.
3. The node is *reserved*: taint ``gpufleet.io/reserved-for=<pod UID>:NoSchedule``,
   and the preemptor gets the matching toleration (pods may gain
   tolerations while pending). Replacements of the evicted pods cannot land
   there again, and the free-GPU signal stops counting the node, so the
   taint controller opens the virtual nodes. A preemptor that finds no
   node of its own *joins* a reservation where the victims can make room
   for it too (:func:`plan`): it gets the same toleration (the lead's
   UID), and the victims are chosen for the GPUs of every member still
   pending. Pods smaller than a node, pinned to one (Kueue's
   topology-aware scheduling pins each pod to a hostname), are so served
   together, not one reservation after another.
4. Victims are evicted through the Eviction API, lowest priority first;
   on every tick they are chosen again as in step 2 (:func:`victims_for`:
   only as many as the preemptor needs, pods already terminating counted
   as gone), so the others keep serving and get no replacement; a
   PDB refusal (429) is retried on the next tick, once the replacement runs
   outside. In mode ``make_before_break`` (the default) a replacement of
   each victim of a Deployment starts outside, and once it is Ready and
   published it takes the victim's place (its ReplicaSet removes the
   victim: :mod:`gpufleet.taint_controller.surge`); a victim without one after
   ``surge_max_wait_seconds`` is evicted as in mode ``evict_first``. After ``max_wait_seconds`` the
   remaining victims are deleted (training always wins, just not at once).
5. When no member is pending any more (each bound, or gone) the
   reservation taint is removed.

Reservations are served side by side (``concurrent_syncs`` at once, each
one's requests in order), so a gang of preemptors waits for the slowest of
its nodes to be cleared, not for the sum of the clearings; the victims are
disjoint (one node each), and each is still evicted through its PDB.

Pure planning (:func:`plan`) is separate from the I/O (:class:`FlipOut`).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

from gpufleet.fleet.classify import tolerated
from gpufleet.kube import Conflict, Invalid, Kube, KubeError, NotFound, TooManyRequests, api_path
from gpufleet.kube.retry import update_with_retry
from gpufleet.names import RESERVED_TAINT

from .config import DEFAULTS
from .signal import (BY_BINDING, BY_GPU_NODE, BY_LABEL, BY_RESERVATION, NODE_INDEXES, POD_INDEXES, RESERVED, UNBOUND,
                     holds_gpus, label_key, reservation_leads)
from .surge import Deployments, Surges

log = logging.getLogger(__name__)
#: Name prefix of the worker threads that serve reservations side by side (the tick's CPU counts theirs).
WORKER_THREAD_PREFIX = "flip-out"

RESERVATIONS = Gauge("gpufleet_flip_out_reservations", "In-cluster nodes reserved for a pending training pod.")
EVICTIONS = Counter("gpufleet_flip_out_evictions_total",
                    "Flip-out evictions of lower-priority pods, by result (evicted, blocked by a PDB, deleted after "
                    "the deadline, gone).", ["result"])


@dataclass(frozen=True)
class Reservation:
    """A planned reservation: ``pod`` (a pod view) gets ``node``; ``victims`` (pod views) must go, in order.

    ``lead``: None for a new reservation (``pod`` leads it: the taint's value is its UID); else the UID of
    the reservation's lead that ``pod`` joins (``victims`` are then the whole group's).
    """

    pod: dict[str, Any]
    node: str
    victims: tuple[dict[str, Any], ...]
    lead: str | None = None


def reservations_of(nodes: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Existing reservations from node taints: ``{pod UID: node name}``."""
    return {uid: n["name"] for n in nodes for uid in reservation_leads(n)}


def reservation_members(pods: Iterable[dict[str, Any]], reserved: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """The pending members of each reservation: ``{node name: [pod view]}``; pure.

    A member is a pod Pending, bound to no node, not terminating, that is
    the reservation's lead (its UID is the taint's value) or tolerates the
    reservation taint with that value (``operator: Equal``: one that joined).
    ``reserved``: :func:`reservations_of`. A reservation with no pending
    member is absent.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        if p["node"] or p["phase"] != "Pending" or p["metadata"].get("deletionTimestamp"):
            continue
        leads = {p["metadata"].get("uid")} | {t.get("value") for t in p["tolerations"] if t.get("key") == RESERVED_TAINT
                                             and t.get("operator", "Equal") == "Equal"}
        for node in {reserved[u] for u in leads if u in reserved}:
            out.setdefault(node, []).append(p)
    return out


def group_need(members: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What a reservation's pending ``members`` (pod views) need of the node, as :func:`victims_for` reads a
    preemptor: ``gpus`` (their sum) and ``priority`` (the lowest: victims rank below every member)."""
    members = list(members)
    return {"gpus": sum(m["gpus"] for m in members), "priority": min(m["priority"] for m in members)}


def is_pending_training(pod: dict[str, Any], classes: Iterable[str]) -> bool:
    """Bound to no node, Pending, asks for GPUs, not terminating, in one of ``classes`` (a pod view)."""
    return (not pod["node"] and pod["phase"] == "Pending" and pod["gpus"] > 0
            and not pod["metadata"].get("deletionTimestamp") and pod["priorityClassName"] in set(classes))


def is_preemptor(pod: dict[str, Any], classes: Iterable[str]) -> bool:
    """A pending training pod (:func:`is_pending_training`) the scheduler marked Unschedulable."""
    return pod["unschedulable"] and is_pending_training(pod, classes)


def _fits_node(pod: dict[str, Any], node: dict[str, Any], reserved_for: str | None = None) -> bool:
    """Whether ``pod`` may go to ``node`` (a real node, Ready, schedulable, its selector and taints); a
    reservation taint is refused unless its value is ``reserved_for`` (the lead of the reservation it joins)."""
    if node["virtual"] or not node["ready"] or node["unschedulable"]:
        return False
    if any(node["labels"].get(k) != v for k, v in pod["nodeSelector"].items()):
        return False
    for t in node["taints"]:
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if t.get("key") == RESERVED_TAINT:
            if reserved_for is not None and t.get("value") == reserved_for:
                continue
            return False
        if not tolerated(pod["tolerations"], t):
            return False
    return True


def victims_for(pod: dict[str, Any], node: dict[str, Any], bound: Iterable[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The fewest lower-priority pods to evict from ``node`` so that ``pod`` fits; pure.

    Args:
        pod: the preemptor (pod view); node: a node view; bound: the non-terminal GPU pods bound to ``node``
            (terminating ones still hold their GPUs and are never chosen).

    Returns:
        ``[]`` when ``pod`` fits without evicting anything; None when even
        every lower-priority pod would not make room; else the victims,
        lowest priority first, then the largest, then by name.
    """
    bound = list(bound)
    free = node["gpus"] - sum(p["gpus"] for p in bound)
    if free >= pod["gpus"]:
        return []
    # Namespace and UID last: the same choice on every tick, whatever order the pods come in.
    lower = sorted((p for p in bound if p["priority"] < pod["priority"] and not p["metadata"].get("deletionTimestamp")),
                   key=lambda p: (p["priority"], -p["gpus"], p["metadata"]["name"], p["metadata"].get("namespace", ""),
                                  p["metadata"].get("uid", "")))
    victims = []
    for v in lower:
        if free >= pod["gpus"]:
            break
        victims.append(v)
        free += v["gpus"]
    return victims if free >= pod["gpus"] else None


def plan(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], classes: Iterable[str],
         members: dict[str, list[dict[str, Any]]] | None = None,
         bound: Callable[[str], list[dict[str, Any]]] | None = None, reserved: dict[str, str] | None = None,
         with_label: Callable[[str, str], list[dict[str, Any]]] | None = None) -> list[Reservation]:
    """New reservations to make now, and preemptors joining one (module docstring, step 2); pure.

    Args:
        nodes: node views (:func:`gpufleet.taint_controller.signal.node_view`).
        pods: non-terminal pod views (:func:`gpufleet.taint_controller.signal.pod_view`): every one, or with
            ``bound`` the unbound ones only (preemptors and reservation members are among them).
        classes: PriorityClass names of preemptors.
        members: :func:`reservation_members` of ``pods`` (computed when None).
        bound: node name -> the pod views holding GPUs there (:func:`~gpufleet.taint_controller.signal.holds_gpus`),
            as the pod cache's index answers it, so that a tick looks only at the nodes it ranks; None:
            gathered from ``pods``.
        reserved: :func:`reservations_of` ``nodes`` (computed when None).
        with_label: ``(key, value)`` -> the node views with that label, as the node cache's index answers it;
            None: indexed here from ``nodes``.

    Returns:
        The reservations in the order to make them: a new one (``lead`` None) before any pod joining it.
    """
    classes = set(classes)
    if reserved is None:
        reserved = reservations_of(nodes)
    taken = set(reserved.values())
    if members is None:
        members = reservation_members(pods, reserved)
    in_one = {p["metadata"]["uid"] for ms in members.values() for p in ms}
    if bound is None:
        by_node: dict[str, list[dict[str, Any]]] = {}
        for p in pods:
            if holds_gpus(p):
                by_node.setdefault(p["node"], []).append(p)

        def bound(name: str) -> list[dict[str, Any]]:
            return by_node.get(name, [])
    preemptors = sorted((p for p in pods if is_preemptor(p, classes) and p["metadata"]["uid"] not in reserved
                         and p["metadata"]["uid"] not in in_one),
                        key=lambda p: (-p["priority"], p["created"], p["metadata"]["name"]))
    # The reservations a preemptor may join: {node: (lead UID, pending members)}. One whose members are
    # all bound is being released this tick: it is no one's to join (the node is free again next tick).
    groups = {node: (lead, list(members[node])) for lead, node in reserved.items() if members.get(node)}
    no_join: set[tuple] = set()
    out = []
    # Pods of one shape (GPUs, priority, node selector, tolerations: all that decides where a pod may go and
    # what it must evict) rank the nodes alike: the nodes are ranked once per shape, and each pod of the shape
    # takes the best one not taken yet (reservations only take nodes away, they change no other node's rank).
    # So a gang of P pods costs one pass over the nodes, not P (kube-scheduler's equivalence classes): the
    # same choices as searching every node for every pod. A pod that fits on a node as it is is the
    # scheduler's job (maybe CPU-bound; not ours), and so is the next of its shape while that node is not
    # taken; once a reservation takes it, the shape is ranked again. A shape with no node at all is not
    # searched again.
    # A shape with a node selector is ranked over the nodes of its most selective label only: a gang that
    # Kueue's topology-aware scheduling pins (a hostname each) is one shape per pod, one node each.
    rankings: dict[tuple, _Ranking] = {}
    if with_label is None:
        with_label = _label_index(nodes)
    for pod in preemptors:
        shape = _shape(pod)
        r = rankings.get(shape)
        if r is None or (r.fits_on is not None and r.fits_on in taken):
            r = rankings[shape] = _rank(pod, _candidates(pod, nodes, with_label), bound, taken)
        if r.fits_on is not None:
            continue  # fits on that node as it is
        while r.ranked and r.ranked[0][1]["name"] in taken:
            r.ranked.popleft()
        if not r.ranked:
            # No node of its own: share one being cleared, if its victims can make room for this pod too.
            # A shape that fits in no group now is not tried again this tick (its groups only fill up;
            # a group made later in this tick is tried on the next one).
            if shape not in no_join:
                joined = _join(pod, groups, _candidates(pod, nodes, with_label), bound)
                if joined is None:
                    no_join.add(shape)
                else:
                    out.append(joined)
                    groups[joined.node][1].append(pod)
            continue
        _, node, victims = r.ranked.popleft()
        taken.add(node["name"])
        out.append(Reservation(pod, node["name"], tuple(victims)))
        groups[node["name"]] = (pod["metadata"]["uid"], [pod])
    return out


def _label_index(nodes: list[dict[str, Any]]) -> Callable[[str, str], list[dict[str, Any]]]:
    """``(key, value)`` -> the node views of ``nodes`` with that label, indexed on the first call (the pure
    callers' stand-in for the node cache's index)."""
    index: dict[tuple[str, str], list[dict[str, Any]]] | None = None

    def with_label(key: str, value: str) -> list[dict[str, Any]]:
        nonlocal index
        if index is None:
            index = {}
            for n in nodes:
                for kv in n["labels"].items():
                    index.setdefault(kv, []).append(n)
        return index.get((key, value), [])
    return with_label


def _candidates(pod: dict[str, Any], nodes: list[dict[str, Any]],
                with_label: Callable[[str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The nodes ``pod``'s node selector allows to look at: those with its most selective label (a superset of
    the nodes it fits on); all ``nodes`` without a selector."""
    selector = pod["nodeSelector"]
    if not selector:
        return nodes
    return min((with_label(k, v) for k, v in selector.items()), key=len)


def _join(pod: dict[str, Any], groups: dict[str, tuple[str, list[dict[str, Any]]]], candidates: list[dict[str, Any]],
          bound: Callable[[str], list[dict[str, Any]]]) -> Reservation | None:
    """The reservation of ``groups`` (``{node: (lead UID, pending members)}``) ``pod`` joins: one on a node of
    ``candidates`` it may go to, where evicting lower-priority pods makes room for every member and for it
    (fewest victims, then fewest victim GPUs, then node name); None if there is none."""
    best = None
    for node in candidates:
        name = node["name"]
        if name not in groups:
            continue
        lead, ms = groups[name]
        if not _fits_node(pod, node, reserved_for=lead):
            continue
        victims = victims_for(group_need([*ms, pod]), node, bound(name))
        if victims is None:
            continue
        score = (len(victims), sum(v["gpus"] for v in victims), name)
        if best is None or score < best[0]:
            best = (score, name, lead, victims)
    return None if best is None else Reservation(pod, best[1], tuple(best[3]), lead=best[2])


@dataclass
class _Ranking:
    """What :func:`_rank` found for one preemptor shape.

    Attributes:
        fits_on: a node not taken that fits the shape as it is (then ``ranked`` is empty), else None.
        ranked: ``(score, node, victims)`` of the nodes not taken where evicting lower-priority pods makes
            room, best first (fewest victims, then fewest victim GPUs, then name).
    """

    fits_on: str | None
    ranked: deque[tuple] = field(default_factory=deque)


def _rank(pod: dict[str, Any], nodes: list[dict[str, Any]], bound: Callable[[str], list[dict[str, Any]]],
          taken: set[str]) -> _Ranking:
    """The nodes not ``taken`` for ``pod``'s shape (:class:`_Ranking`): one that fits it as is, if one does
    (the search stops there), else those where evictions make room, best first."""
    out = []
    for node in nodes:
        if node["name"] in taken or not _fits_node(pod, node):
            continue
        victims = victims_for(pod, node, bound(node["name"]))
        if victims == []:
            return _Ranking(node["name"])
        if victims is not None:
            out.append(((len(victims), sum(v["gpus"] for v in victims), node["name"]), node, victims))
    out.sort(key=lambda c: c[0])
    return _Ranking(None, deque(out))


def _shape(pod: dict[str, Any]) -> tuple:
    """What decides where a preemptor may go and what it must evict: GPUs, priority, node selector, tolerations."""
    return (pod["gpus"], pod["priority"], tuple(sorted(pod["nodeSelector"].items())),
            tuple(sorted(json.dumps(t, sort_keys=True) for t in pod["tolerations"])))


class FlipOut:
    """Runs the flip-out against the API (module docstring, steps 3-5).

    Args:
        kube: client.
        nodes / pods: informers of node and pod views (shared with the signal): nodes keyed by name; their
            :data:`~gpufleet.taint_controller.signal.NODE_INDEXES` and
            :data:`~gpufleet.taint_controller.signal.POD_INDEXES` are added when missing.
        priority_classes: PriorityClass names of preemptors.
        max_wait_seconds: after this long, victims are deleted instead of evicted.
        mode: ``make_before_break`` (a replacement outside is Ready before each eviction) or ``evict_first``.
        surge_max_wait_seconds: in ``make_before_break``, evict anyway this long after the reservation
            (of the order of the provider's start latency plus the taint controller's hold, plus a margin).
        surge_priority_class: in ``make_before_break``, the replacements' PriorityClass
            (:func:`gpufleet.taint_controller.surge.surge_replicaset`); None: the workload's.
        deployments: Deployment caches shared with the flip-back (:class:`gpufleet.taint_controller.surge.Deployments`).
        concurrent_syncs: reservations worked on at once (each one's requests in order).
        clock: monotonic seconds.

    The values are checked once, by :class:`gpufleet.taint_controller.config.Configuration`, whose defaults these are.
    """

    def __init__(self, kube: Kube, nodes, pods, priority_classes: Iterable[str], *,
                 max_wait_seconds: float = DEFAULTS.flip_out_max_wait_seconds, mode: str = DEFAULTS.flip_mode,
                 surge_max_wait_seconds: float = DEFAULTS.surge_max_wait_seconds,
                 surge_priority_class: str | None = DEFAULTS.surge_priority_class,
                 deployments: Deployments | None = None,
                 concurrent_syncs: int = DEFAULTS.flip_out_concurrent_syncs, clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.concurrent_syncs = concurrent_syncs
        self._pool: ThreadPoolExecutor | None = None
        pods.add_indexers(POD_INDEXES)
        nodes.add_indexers(NODE_INDEXES)
        self.nodes = nodes
        self.pods = pods
        self.classes = set(priority_classes)
        self.max_wait = max_wait_seconds
        self.mode = mode
        self.surge_max_wait = surge_max_wait_seconds
        self.clock = clock
        self.reserved_at: dict[str, float] = {}
        self.surges = Surges(kube, pods, direction="out", deployments=deployments, priority_class=surge_priority_class,
                             clock=clock) if mode == "make_before_break" else None
        self._recovered = False
        self.wanted: set[str] = set()

    def tick(self) -> None:
        """One pass: drop stale reservations, push existing ones, make new ones. Never raises for API errors."""
        nodes = self.nodes.items()
        if self.surges is not None and not self._recovered:
            self.surges.recover()
            self._recovered = True
        reserved = self._reserved()
        unbound = self.pods.by_index(BY_BINDING, UNBOUND)  # preemptors and reservation members are unbound
        members = reservation_members(unbound, reserved)
        new: dict[str, list[Reservation]] = {}
        for r in plan(nodes, unbound, self.classes, members=members, bound=self._holding_gpus, reserved=reserved,
                      with_label=self._with_label):
            new.setdefault(r.node, []).append(r)
        work: list[Callable[[], set[str]]] = []
        for uid, node in reserved.items():
            if node not in members:
                work.append(functools.partial(self._release, node, uid))
                continue
            self.reserved_at.setdefault(uid, self.clock())
            work.append(functools.partial(self._serve, node, uid, members[node], new.pop(node, [])))
        for node, rs in new.items():  # new reservations: rs[0] leads, the others join it
            work.append(functools.partial(self._serve, node, rs[0].pod["metadata"]["uid"], [], rs))
        # Each reservation's requests stay in order; reservations are served side by side, so training waits
        # for the slowest one, not for the sum of all of them (their victims are disjoint: one node each).
        self.wanted = set()
        for wanted in self._each(work):
            self.wanted |= wanted
        if self.surges is not None:
            self.surges.reconcile(self.wanted)
        RESERVATIONS.set(len(self._reserved()))

    def _reserved(self) -> dict[str, str]:
        """:func:`reservations_of` the cached nodes that carry a reservation taint (the node cache's index)."""
        return reservations_of(self.nodes.by_index(BY_RESERVATION, RESERVED))

    def _with_label(self, key: str, value: str) -> list[dict[str, Any]]:
        """The cached node views labelled ``key`` = ``value`` (the node cache's index)."""
        return self.nodes.by_index(BY_LABEL, label_key(key, value))

    def _holding_gpus(self, node: str) -> list[dict[str, Any]]:
        """The cached pod views holding GPUs on ``node`` (:func:`~gpufleet.taint_controller.signal.holds_gpus`)."""
        return self.pods.by_index(BY_GPU_NODE, node)

    def _each(self, work: list[Callable[[], set[str]]]) -> list[set[str]]:
        """Run ``work`` (one callable per reservation), up to ``concurrent_syncs`` at once; their results in order.

        Every item runs to its end before the tick goes on, even when one raises (logged, its result empty):
        the next tick must not find this one's work on a reservation still running.
        """
        if len(work) <= 1 or self.concurrent_syncs == 1:
            futures = None
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrent_syncs, thread_name_prefix=WORKER_THREAD_PREFIX)
            futures = [self._pool.submit(w) for w in work]
        out: list[set[str]] = []
        for i, w in enumerate(work):
            try:
                out.append(w() if futures is None else futures[i].result())
            except Exception:
                log.exception("flip-out: a reservation's pass failed")
                out.append(set())
        return out

    def _release(self, node: str, uid: str) -> set[str]:
        """No member of the reservation led by ``uid`` is pending (each bound, or gone): remove it from ``node``."""
        self._guard(self._untaint, node, uid)
        self.reserved_at.pop(uid, None)
        return set()

    def _serve(self, node: str, uid: str, members: list[dict], new: list[Reservation]) -> set[str]:
        """Make the reservation of ``node`` led by ``uid`` (``new[0]`` when it is new) and let the preemptors of
        ``new`` join it, then move the victims that its pending members (``members`` and those who joined)
        need gone; the UIDs of the victims still to move."""
        for r in new:
            if self._guard(self._reserve, r) is None:
                if r.lead is None:
                    return set()  # no reservation: nothing to join, nothing to move
                continue
            if r.lead is None:
                self.reserved_at[uid] = self.clock()
            members = [*members, r.pod]
        return self._push(node, uid, members) if members else set()

    def close(self) -> None:
        """Stop the worker threads (after the tick in progress) and the surges' Deployment watches."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.surges is not None:
            self.surges.deployments.stop()

    def _guard(self, fn, *args):
        try:
            return fn(*args) or True
        except KubeError as exc:
            log.warning("flip-out: %s: %s", fn.__name__.strip("_"), exc)
            return None

    def _push(self, node: str, uid: str, members: list[dict]) -> set[str]:
        """Evict (or after the deadline delete) the lower-priority GPU pods on ``node`` that the pending
        ``members`` of the reservation led by ``uid`` need gone; returns their UIDs (the victims a surge may
        still be wanted for). The deadlines count from the reservation's start."""
        waited = self.clock() - self.reserved_at.get(uid, self.clock())
        late = waited > self.max_wait
        need = group_need(members)
        for_whom = members[0]["metadata"]["name"] + (f" and {len(members) - 1} more" if len(members) > 1 else "")
        # Only the pods the preemptors need gone (the same choice as plan()): the others keep serving, and
        # get no replacement outside. Pods already terminating count as gone (their GPUs are on the way).
        staying = [p for p in self._holding_gpus(node) if not p["metadata"].get("deletionTimestamp")]
        view = self.nodes.get(node)
        needed = victims_for(need, view, staying) if view is not None else None
        if needed is None:  # the node shrank or changed: every lower-priority pod, as a last resort
            needed = [p for p in staying if p["priority"] < need["priority"]]
        victims = sorted(needed, key=lambda p: (p["priority"], p["metadata"]["name"], p["metadata"].get("namespace", "")))
        wanted = {v["metadata"]["uid"] for v in victims}
        if self.surges is not None and waited > self.surge_max_wait:
            self.surges.give_up(victims)
        for v in victims:
            ns, name = v["metadata"]["namespace"], v["metadata"]["name"]
            if self.surges is not None and not late:
                if not self.surges.ready(v):
                    continue  # its replacement outside is not Ready and published yet: the next tick looks again
                if self.surges.hand_over(v) is not False:
                    continue  # its ReplicaSet removes it (or the hand-over is tried again next tick)
            try:
                if late:
                    self.kube.delete("v1", "pods", name, ns, uid=v["metadata"]["uid"])
                    EVICTIONS.labels("deleted").inc()
                    log.info("flip-out: deleted %s/%s from %s after %.0fs of PDB refusals", ns, name, node, self.max_wait)
                else:
                    self.kube.evict(ns, name)
                    EVICTIONS.labels("evicted").inc()
                    log.info("flip-out: evicted %s/%s from %s for %s", ns, name, node, for_whom)
            except TooManyRequests:
                EVICTIONS.labels("blocked").inc()
                return wanted  # the PDB allows nothing more now; the next tick tries again
            except (NotFound, Conflict):
                EVICTIONS.labels("gone").inc()
            except KubeError as exc:
                log.warning("flip-out: evicting %s/%s: %s", ns, name, exc)
                return wanted
        return wanted

    def _reserve(self, r: Reservation) -> None:
        """Tolerate on the pod, then taint the node: one request each when the caches are current.

        The toleration is appended by a JSON patch that first tests the pod's tolerations are the ones
        the cache holds (a pod's tolerations can only be added to, and a merge patch would replace the
        list); the taint is written from the node cache's resourceVersion (:func:`set_taint`). A cache
        that was behind costs a read: the test fails (422) or the precondition does (409). A pod that
        joins a reservation (``r.lead``) gets the lead's toleration, and the node is left as it is.
        """
        meta = r.pod["metadata"]
        uid = r.lead or meta["uid"]
        toleration = {"key": RESERVED_TAINT, "operator": "Equal", "value": uid, "effect": "NoSchedule"}
        cached = r.pod.get("tolerations") or []
        if toleration not in cached:
            patched = False
            if cached:
                try:
                    self.kube.patch("v1", "pods", meta["name"], [
                        {"op": "test", "path": "/spec/tolerations", "value": cached},
                        {"op": "add", "path": "/spec/tolerations/-", "value": toleration}], meta["namespace"],
                        patch="json")
                    patched = True
                except Invalid:
                    pass  # the cache was behind: read the pod
            if not patched:
                live = self.kube.get("v1", "pods", meta["name"], meta["namespace"])
                tols = live["spec"].get("tolerations") or []
                if toleration not in tols:
                    self.kube.patch("v1", "pods", meta["name"], {"spec": {"tolerations": tols + [toleration]}},
                                    meta["namespace"])
        if r.lead is not None:
            log.info("flip-out: %s/%s joins the reservation of %s (%d victims in all)", meta["namespace"], meta["name"],
                     r.node, len(r.victims))
            return
        set_taint(self.kube, r.node, {"key": RESERVED_TAINT, "value": uid, "effect": "NoSchedule"}, add=True,
                  view=self.nodes.get(r.node))
        log.info("flip-out: reserved %s for %s/%s (%d victims)", r.node, meta["namespace"], meta["name"], len(r.victims))

    def _untaint(self, node: str, uid: str) -> None:
        set_taint(self.kube, node, {"key": RESERVED_TAINT, "value": uid, "effect": "NoSchedule"}, add=False,
                  view=self.nodes.get(node))


def set_taint(kube: Kube, node: str, taint: dict, *, add: bool, any_value: bool = False,
              view: dict | None = None) -> bool:
    """Add or remove exactly ``taint`` (key, value, effect) on ``node``; other taints stay.

    With ``any_value``, a taint of the same key and effect counts whatever its value: one is not added
    beside it, and removing takes every one away (a key the caller owns, set by hand with a value).

    Read-modify-write guarded by the Node's resourceVersion, re-read on a
    conflict (:func:`gpufleet.kube.retry.update_with_retry`). With ``view``
    (the node cache's view of it: ``taints``, ``resourceVersion``), a write
    the view calls for is made from it without a read.

    Returns:
        Whether the Node was changed.

    Raises:
        Conflict: the Node kept changing; NotFound: no such node; KubeError: other refusals.
    """
    value = taint.get("value") or ""

    def change(live: dict) -> dict | None:
        taints = (live.get("spec") or {}).get("taints") or []
        same = [t for t in taints if t.get("key") == taint["key"] and t.get("effect") == taint["effect"]]
        matching = same if any_value else [t for t in same if (t.get("value") or "") == value]
        if add == bool(matching):
            return None
        if add:
            new = [t for t in taints if t not in same] + [{k: v for k, v in taint.items() if v is not None}]
        else:
            new = [t for t in taints if t not in matching]
        return {"spec": {"taints": new or None}}

    cached = None
    if view is not None and view.get("resourceVersion"):
        cached = {"metadata": {"resourceVersion": view["resourceVersion"]}, "spec": {"taints": list(view["taints"])}}
    return update_with_retry(kube, api_path("v1", "nodes", name=node), change, cached=cached)[1] is not None
