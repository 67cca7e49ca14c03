"""The flip-back loop: move pods from tainted virtual nodes back in-cluster, within the migration budget.

While a virtual node carries ``gpufleet.io/cluster-has-free-gpus:NoSchedule``,
every pod on it that does not tolerate that taint is a *candidate*. Each
tick, :class:`~gpufleet.taint_controller.budget.MigrationBudget` picks which candidates
may go now (pods per minute per workload, lowest priority first, at most
``max_in_flight`` per workload at a time). Two modes:

* ``release`` (default; the descheduler evicts): label the pod
  ``gpufleet.io/flip-back=released``. The descheduler's policy selects only
  pods with that label (DefaultEvictor ``labelSelector``), so it evicts
  exactly the released pods, at its interval, within its per-cycle limits,
  through the Eviction API (PDBs respected).
* ``evict`` (clusters without the descheduler): evict the pod through the
  Eviction API here. A PDB refusal (429) gives the token back; the pod is
  tried again on a later tick.

With ``make_before_break`` (the taint controller's flip mode), a
replacement of a pod of a Deployment starts in-cluster
(:mod:`gpufleet.taint_controller.surge`, direction ``back``), and once it is Ready and
published (a ready endpoint of every Service selecting it:
:mod:`gpufleet.taint_controller.published`) it takes the pod's place: the pod's own
ReplicaSet removes the pod outside, neither released nor evicted, and
starts no other replacement, so a fleet whose free GPUs are exactly what
inference needs back moves every pod. A move spends its token when its
replacement starts and counts in flight until its pod is gone, so up to
``max_in_flight`` replacements start at the budget's pace side by side;
after ``surge_max_wait_seconds`` without a Ready and published
replacement, the pod is released or evicted as above.

See README.md in this folder for the split with the descheduler.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import typing
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter, Gauge

from gpufleet.kube import Conflict, Kube, KubeError, NotFound, TooManyRequests

from .budget import Candidate, MigrationBudget, workload_of
from .config import DEFAULTS, FlipBackMode
from .published import ServiceEndpoints
from .signal import BY_NODE, POD_INDEXES, pod_by_uid
from .surge import Deployments, Surges
from gpufleet.fleet.classify import tolerated
from gpufleet.names import FREE_GPUS_EFFECT, FREE_GPUS_TAINT, RELEASE_LABEL, SURGE_FOR_LABEL

log = logging.getLogger(__name__)

RELEASES = Counter("gpufleet_flip_back_releases_total",
                   "Pods the flip-back released (release mode) or evicted (evict mode), or that an in-cluster "
                   "replacement took the place of (replaced), by result.", ["mode", "result"])
CANDIDATES = Gauge("gpufleet_flip_back_candidates", "Pods on tainted virtual nodes that do not tolerate the taint.")

#: The flip-back modes (:data:`gpufleet.taint_controller.config.FlipBackMode`).
MODES = typing.get_args(FlipBackMode)


def candidates(nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]], attempted: set[str]) -> list[Candidate]:
    """Pods on tainted virtual nodes that do not tolerate the free-GPU taint (node/pod views)."""
    taint = {"key": FREE_GPUS_TAINT, "effect": FREE_GPUS_EFFECT}
    tainted = {n["name"] for n in nodes if n["virtual"]
               and any(t.get("key") == FREE_GPUS_TAINT and t.get("effect") == FREE_GPUS_EFFECT for t in n["taints"])}
    out = []
    for p in pods:
        meta = p["metadata"]
        if p["node"] not in tainted or meta.get("deletionTimestamp") or p["phase"] in ("Succeeded", "Failed"):
            continue
        if tolerated(p["tolerations"], taint) or SURGE_FOR_LABEL in (meta.get("labels") or {}):
            continue  # a make-before-break surge pod goes with its ReplicaSet (gpufleet.taint_controller.surge)
        released = (meta.get("labels") or {}).get(RELEASE_LABEL[0]) == RELEASE_LABEL[1] or meta["uid"] in attempted
        out.append(Candidate(meta["namespace"], meta["name"], meta["uid"], p["priority"],
                             workload_of({"metadata": meta}), p["created"], p["node"], released))
    return out


class FlipBack:
    """Releases or evicts flip-back candidates within a :class:`MigrationBudget`.

    Args:
        kube: client.
        nodes / pods: informers of node and pod views.
        budget: the migration budget.
        mode: ``release``, ``evict`` or ``off``.
        make_before_break: an in-cluster replacement takes each pod's place once Ready and published.
        endpoints: with ``make_before_break``, the Service and EndpointSlice caches that say whether an
            in-cluster pod is published (started by the caller).
        surge_max_wait_seconds: release or evict anyway this long after the replacement was started.
        deployments: Deployment caches shared with the flip-out (:class:`gpufleet.taint_controller.surge.Deployments`).
        clock: monotonic seconds (the budget's time base).

    Raises:
        ValueError: an unknown ``mode``; ``make_before_break`` without ``endpoints``.
    """

    def __init__(self, kube: Kube, nodes, pods, budget: MigrationBudget, *, mode: str = DEFAULTS.flip_back,
                 make_before_break: bool = False, endpoints: ServiceEndpoints | None = None,
                 surge_max_wait_seconds: float = DEFAULTS.surge_max_wait_seconds,
                 deployments: Deployments | None = None, clock: Callable[[], float] = time.monotonic):
        if mode not in MODES:
            raise ValueError(f"flip-back mode {mode!r}: expected one of {', '.join(MODES)}")
        if make_before_break and endpoints is None:
            raise ValueError("flip-back make_before_break: expected the Service and EndpointSlice caches (endpoints=)")
        self.kube = kube
        pods.add_indexers(POD_INDEXES)
        self.nodes = nodes
        self.pods = pods
        self.budget = budget
        self.mode = mode
        self.clock = clock
        self.attempted: dict[str, float] = {}  # UID -> when evicted (evict mode) or replaced
        self.endpoints = endpoints
        self.surges = Surges(kube, pods, direction="back", published=endpoints.published, deployments=deployments,
                             clock=clock) if make_before_break else None
        self.surge_max_wait = surge_max_wait_seconds
        self._recovered = False

    def tick(self) -> list[Candidate]:
        """One pass; returns the candidates acted on. Never raises for API errors."""
        if self.mode == "off":
            return []
        now = self.clock()
        # An evicted pod normally leaves the cache within a second; forget attempts after a minute.
        self.attempted = {u: t for u, t in self.attempted.items() if now - t < 60}
        cands = self._candidates()
        CANDIDATES.set(len(cands))
        if self.surges is None:
            chosen, replaced = self.budget.plan(cands, now), []
        else:
            # A pod whose replacement already started is moving: in flight (max_in_flight counts it), its token
            # spent when the replacement started; it is looked at again without taking another.
            moving = [c for c in cands if c.uid in self.surges.live]
            planned = [dataclasses.replace(c, released=True) if c.uid in self.surges.live else c for c in cands]
            chosen, replaced = self._replaced_first(cands, moving, self.budget.plan(planned, now), now)
        for c in replaced:  # its ReplicaSet deletes it; counted in flight until it is gone, as an eviction
            self.attempted[c.uid] = now
            RELEASES.labels(self.mode, "replaced").inc()
        for c in chosen:
            try:
                if self.mode == "release":
                    self.kube.patch("v1", "pods", c.name, {"metadata": {"labels": {RELEASE_LABEL[0]: RELEASE_LABEL[1]}}},
                                    c.namespace)
                    RELEASES.labels(self.mode, "released").inc()
                    log.info("flip-back: released %s/%s (%s, priority %d) on %s", c.namespace, c.name, c.workload,
                             c.priority, c.node)
                else:
                    self.kube.evict(c.namespace, c.name)
                    self.attempted[c.uid] = now
                    RELEASES.labels(self.mode, "evicted").inc()
                    log.info("flip-back: evicted %s/%s (%s, priority %d) from %s", c.namespace, c.name, c.workload,
                             c.priority, c.node)
            except TooManyRequests:
                self.budget.refund(c)
                RELEASES.labels(self.mode, "blocked").inc()
            except (NotFound, Conflict):
                RELEASES.labels(self.mode, "gone").inc()
            except KubeError as exc:
                self.budget.refund(c)
                RELEASES.labels(self.mode, "error").inc()
                log.warning("flip-back: %s/%s: %s", c.namespace, c.name, exc)
        return replaced + chosen

    def _candidates(self) -> list[Candidate]:
        nodes = self.nodes.items()
        # Only the pods on virtual nodes can be candidates: read them by node, not the whole pod cache.
        outside = [p for n in nodes if n["virtual"] for p in self.pods.by_index(BY_NODE, n["name"])]
        return candidates(nodes, outside, set(self.attempted))

    def returning(self) -> int:
        """Pods on tainted virtual nodes still to bring back in-cluster, now (0 in mode ``off``)."""
        return 0 if self.mode == "off" else len(self._candidates())

    def _replaced_first(self, cands: list[Candidate], moving: list[Candidate], chosen: list[Candidate],
                        now: float) -> tuple[list[Candidate], list[Candidate]]:
        """``(to release or evict, replaced)`` of ``moving`` (their replacement started earlier) and ``chosen``
        (a token just taken: their replacement starts now): those that waited for their in-cluster replacement
        long enough or can have none, and those whose replacement took their place (Ready and published,
        :meth:`Surges.hand_over`). A chosen pod whose replacement could not start yet gets its token back; a
        started one keeps it spent. Surges no candidate needs any more are removed."""
        if not self._recovered:
            self.surges.recover()
            self._recovered = True
        fresh = {c.uid for c in chosen}
        go, replaced = [], []
        for c in moving + chosen:
            pod = pod_by_uid(self.pods, c.uid)
            if pod is not None and self.surges.ready(pod):
                handed = self.surges.hand_over(pod)
                if handed:
                    replaced.append(c)
                    log.info("flip-back: %s/%s (%s) replaced in-cluster", c.namespace, c.name, c.workload)
                    continue
                if handed is None:  # a request failed: the next tick tries again
                    if c.uid in fresh and c.uid not in self.surges.live:
                        self.budget.refund(c)
                    continue
            elif pod is not None:
                if c.uid not in self.surges.live:  # its replacement could not be created yet: not moving
                    if c.uid in fresh:
                        self.budget.refund(c)
                    continue
                if now - self.surges.live[c.uid].created <= self.surge_max_wait:
                    continue  # moving: its replacement is starting
                self.surges.abandon(pod)
            go.append(c)
        self.surges.reconcile({c.uid for c in cands})
        return go, replaced
