"""The flip-back budget: how many pods per minute each workload may move back in-cluster, lowest priority first.

The descheduler caps evictions per cycle (``maxNoOfPodsToEvictTotal``,
``...PerNode``) but has no notion of time or workloads: a short interval
moves everything at once. This module decides, on every tick, which pods
running outside may be released for eviction now:

* a token bucket per workload (:class:`gpufleet.kube.ratelimit.TokenBucket`):
  ``pods_per_minute`` tokens a minute, at most ``burst`` saved up
  (``burst=1``: evenly spaced, one pod every ``60 / pods_per_minute``
  seconds);
* optionally a global bucket (``total_per_minute``) shared by all workloads;
* at most ``max_in_flight`` released-but-not-yet-gone pods per workload, so
  a PodDisruptionBudget that blocks evictions does not let releases pile up;
* candidates in order: lowest priority first, then the oldest pod (most
  likely to be replaced by a warmed-up one), then name.

A workload is the pod's controller: for a ReplicaSet owned by a Deployment
(``pod-template-hash`` label), the Deployment; else the owner's kind/name;
a bare pod is its own workload. Pure: the clock is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.kube.ratelimit import TokenBucket

from .config import DEFAULTS

#: Float slack so 6 s at 10 pods/minute is exactly one token.
_EPS = 1e-9


@dataclass(frozen=True)
class Candidate:
    """A pod outside that does not tolerate the free-GPU taint.

    Attributes:
        namespace / name / uid: the pod.
        priority: its ``spec.priority`` (lower moves first).
        workload: :func:`workload_of` key.
        created: creation time, seconds since the epoch.
        node: the virtual node it runs on.
        released: already released (labelled, or eviction attempted) and still there.
    """

    namespace: str
    name: str
    uid: str
    priority: int
    workload: str
    created: float
    node: str
    released: bool = False


def workload_of(pod: dict) -> str:
    """``namespace/Kind/name`` of the pod's controller (Deployment for a ReplicaSet with pod-template-hash)."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace", "")
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner is None:
        return f"{ns}/Pod/{meta.get('name')}"
    name, kind = owner.get("name", ""), owner.get("kind", "")
    pth = (meta.get("labels") or {}).get("pod-template-hash")
    if kind == "ReplicaSet" and pth and name.endswith("-" + pth):
        return f"{ns}/Deployment/{name[: -len(pth) - 1]}"
    return f"{ns}/{kind}/{name}"


class MigrationBudget:
    """Per-workload (and optional global) token buckets plus the in-flight cap (see the module docstring).

    Args:
        pods_per_minute: per workload (``descheduler_migration_pods_per_minute``).
        burst: tokens a workload may save up.
        max_in_flight: released pods per workload not yet gone, at most.
        total_per_minute: a global cap over all workloads, or None.
    """

    def __init__(self, pods_per_minute: float, *, burst: float = 1.0, max_in_flight: int = DEFAULTS.flip_back_max_in_flight,
                 total_per_minute: float | None = None):
        self.pods_per_minute = pods_per_minute
        self.burst = burst
        self.max_in_flight = max_in_flight
        self._buckets: dict[str, TokenBucket] = {}
        self._total = TokenBucket(total_per_minute, burst) if total_per_minute else None
        self._total_started = False

    def bucket(self, workload: str, now: float) -> TokenBucket:
        """The workload's bucket (created full at ``now``)."""
        if workload not in self._buckets:
            self._buckets[workload] = TokenBucket(self.pods_per_minute, self.burst, now)
        return self._buckets[workload]

    def plan(self, candidates: Iterable[Candidate], now: float) -> list[Candidate]:
        """The candidates to release at ``now`` (tokens are taken for them).

        Already-released candidates count against ``max_in_flight`` and are
        not returned again.
        """
        cands = list(candidates)
        if self._total is not None and not self._total_started:
            self._total.at, self._total_started = now, True
        in_flight: dict[str, int] = {}
        for c in cands:
            if c.released:
                in_flight[c.workload] = in_flight.get(c.workload, 0) + 1
        out = []
        for c in sorted((c for c in cands if not c.released), key=lambda c: (c.priority, c.created, c.namespace, c.name)):
            if in_flight.get(c.workload, 0) >= self.max_in_flight:
                continue
            bucket = self.bucket(c.workload, now)
            if bucket.available(now) < 1.0 - _EPS or (self._total is not None and self._total.available(now) < 1.0 - _EPS):
                continue
            bucket.take(now)
            if self._total is not None:
                self._total.take(now)
            in_flight[c.workload] = in_flight.get(c.workload, 0) + 1
            out.append(c)
        return out

    def refund(self, c: Candidate) -> None:
        """Give back the token spent on ``c`` (its eviction was refused, e.g. by a PodDisruptionBudget)."""
        if c.workload in self._buckets:
            self._buckets[c.workload].refund()
        if self._total is not None:
            self._total.refund()
