"""One active instance per controller: leader election through a ``coordination.k8s.io/v1`` Lease.

client-go's ``leaderelection`` with a ``LeaseLock``, on the caller's own
client (no second client, no process-wide configuration):

* a candidate creates the Lease, or takes it over when the holder has not
  renewed it within ``leaseDurationSeconds`` (measured on this process's
  clock from when it last saw the record change, so clock skew between
  nodes does not matter), writing with the read resourceVersion so that
  two candidates never both win;
* the leader renews ``renewTime`` every ``retry_period`` seconds; each
  renewal's requests are sent once and may take only the time left to
  the renew deadline;
* the renew deadline is kept by the clock, not by a request's return: the
  leader holds its :class:`~gpufleet.kube.fence.Fence` until the start of
  its last successful renewal plus ``renew_deadline``; a thread of its own
  (not the renewing one) ends leadership at that instant, and the fenced
  client refuses writes from then on (and had cut every write's timeout to
  it), so a leader whose requests hang stops acting at the deadline. The
  controller then exits and restarts as a follower;
* a leader that sees another holder on the Lease stops acting at once;
* a leader that stops cleanly releases the Lease (empty holder, duration
  1 s), so a follower takes over at once instead of after the duration
  (client-go's ``ReleaseOnCancel``).

Why two leaders never act at once: the follower takes over only
``lease_duration`` after it last saw the record change, which is after the
leader's last successful renewal was written, so after that renewal
started; the leader stopped ``renew_deadline`` after it started, and
``lease_duration > renew_deadline`` (:class:`Timings`). The margin
(5 s by default) absorbs the clocks' rates, not their offsets: only
durations on each process's own monotonic clock are compared.

Timings default to client-go's (lease 15 s, renew deadline 10 s, retry 2 s).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .client import Kube, api_path
from .errors import Conflict, KubeError, NotFound, Unreachable
from .fence import Fence
from .times import now_micro

log = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
RENEW_DEADLINE_SECONDS = 10.0
RETRY_SECONDS = 2.0
#: Longest seconds the leader's watch over its deadline sleeps (a stop or a lost Lease is noticed within it).
WATCH_POLL_SECONDS = 0.1


def holder_identity() -> str:
    """This instance's holder identity: the pod name in-cluster (``$POD_NAME``), else host and pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Timings:
    """Leader-election timings in seconds (``--leader-elect-lease-duration`` etc.).

    Raises:
        ValueError: not ``lease_duration > renew_deadline > retry_period > 0``.
    """

    lease_duration: float = LEASE_SECONDS
    renew_deadline: float = RENEW_DEADLINE_SECONDS
    retry_period: float = RETRY_SECONDS

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(f"leader election: expected lease duration ({self.lease_duration:g} s) > renew deadline "
                             f"({self.renew_deadline:g} s) > retry period ({self.retry_period:g} s) > 0")


class LeaderElector:
    """Acquires and renews Lease ``namespace/name`` for ``identity`` (module docstring).

    Args:
        kube: the client (the controller's own); fence its writes with
            ``kube.fence_writes(elector.fence)`` so that they stop at the deadline.
        name / namespace: the Lease.
        identity: holder identity (default :func:`holder_identity`).
        timings: :class:`Timings`.
        clock: monotonic seconds (tests inject one).

    Attributes:
        leading: set while this instance holds the Lease (cleared at the deadline, not after a request returns).
        fence: the :class:`~gpufleet.kube.fence.Fence` held while leading.
        holder: the holder identity last seen on the Lease ("" when none).
    """

    def __init__(self, kube: Kube, name: str, namespace: str, *, identity: str | None = None,
                 timings: Timings = Timings(), clock: Callable[[], float] = time.monotonic):
        self.kube, self.name, self.namespace = kube, name, namespace
        self.identity = identity or holder_identity()
        self.timings = timings
        self.clock = clock
        self.leading = threading.Event()
        self.holder = ""
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._path = api_path("coordination.k8s.io/v1", "leases", namespace, name)
        self._collection = api_path("coordination.k8s.io/v1", "leases", namespace)
        self.fence = Fence(f"{namespace}/{name}", exempt=(self._path, self._collection), clock=clock)
        self._taken = threading.Event()  # the renewer saw another holder

    def is_leader(self) -> bool:
        """Whether this instance acts now: it holds the Lease and its renew deadline is ahead (by the clock)."""
        return self.leading.is_set() and self.fence.holding()

    def _spec(self, acquire: bool, transitions: int) -> dict:
        now = now_micro()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.timings.lease_duration)),
                "renewTime": now, "leaseTransitions": transitions}
        if acquire:
            spec["acquireTime"] = now
        return spec

    def _call(self, method: str, path: str, deadline: float | None, body: Any = None) -> dict:
        """One Lease request; with ``deadline`` (clock seconds), sent once and bounded by the time left to it."""
        if deadline is None:
            return self.kube.request(method, path, body=body)
        left = deadline - self.clock()
        if left <= 0:
            raise Unreachable(f"renew deadline of Lease {self.namespace}/{self.name} passed; not sent",
                              path=f"{method} {path}")
        return self.kube.request(method, path, body=body, timeout=left, retry=False)

    def try_acquire_or_renew(self, deadline: float | None = None) -> bool:
        """One attempt: create, take over or renew the Lease; True when this instance holds it afterwards.

        Args:
            deadline: clock seconds by which the attempt must be over: each
                request is sent once with the time left as its timeout (None:
                the client's timeout and retries).

        Raises:
            KubeError: the API server refused for another reason than a lost
                race (RBAC, unreachable, the deadline passed).
        """
        try:
            lease = self._call("GET", self._path, deadline)
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(True, 0)}
            try:
                self._call("POST", self._collection, deadline, body)
            except Conflict:
                return False  # another candidate created it first
            self._observe(body["spec"])
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        self._observe(spec)
        mine = holder == self.identity
        duration = float(spec.get("leaseDurationSeconds") or self.timings.lease_duration)
        if holder and not mine and self.clock() < self._observed_at + duration:
            return False  # held, and renewed within its duration as far as we have seen
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        new = dict(spec, **self._spec(not mine, transitions))
        if mine and spec.get("acquireTime"):
            new["acquireTime"] = spec["acquireTime"]
        lease["spec"] = new
        try:
            self._call("PUT", self._path, deadline, lease)  # resourceVersion of the read: one winner
        except Conflict:
            return False
        self._observe(new)
        return True

    def _observe(self, spec: dict) -> None:
        self.holder = spec.get("holderIdentity") or ""
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()

    def release(self, deadline: float | None = None) -> None:
        """Give the Lease up if held (empty holder, 1 s duration) so a follower takes over now; never raises.

        Only before the renew deadline (``deadline``, clock seconds; default
        the fence's): after it the Lease may be another's. Its requests are
        bounded by the time left.
        """
        deadline = self.fence.deadline if deadline is None else deadline
        self.leading.clear()
        if deadline is None or deadline <= self.clock():
            return
        try:
            lease = self._call("GET", self._path, deadline)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=now_micro())
            self._call("PUT", self._path, deadline, lease)
        except KubeError as exc:
            log.info("Lease %s/%s not released (%s); it expires by itself", self.namespace, self.name, exc)

    def _attempt(self, deadline: float) -> bool:
        try:
            return self.try_acquire_or_renew(deadline)
        except KubeError as exc:
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def acquire(self, stop: threading.Event, on_wait: Callable[[], None] | None = None) -> bool:
        """Block until this instance holds the Lease (True) or ``stop`` is set (False).

        Each attempt is bounded by the renew deadline; on success the fence is
        held until the attempt's start plus the renew deadline. ``on_wait`` is
        called after every attempt (a follower's liveness: waiting is healthy).
        """
        while not stop.is_set():
            if on_wait is not None:
                on_wait()
            start = self.clock()
            if self._attempt(start + self.timings.renew_deadline):
                self.fence.hold_until(start + self.timings.renew_deadline)
                self.leading.set()
                log.info("Lease %s/%s acquired by %s", self.namespace, self.name, self.identity)
                return True
            stop.wait(self.timings.retry_period)
        return False

    def _renew(self, leader_stop: threading.Event) -> None:
        """The renewing thread: every retry period, renew within the time left; extend the fence on success."""
        while not leader_stop.wait(self.timings.retry_period):
            deadline = self.fence.deadline
            start = self.clock()
            if deadline is None or start >= deadline:
                return  # the deadline passed: the watch ends leadership
            if self._attempt(deadline):
                self.fence.hold_until(start + self.timings.renew_deadline)
            elif self.holder and self.holder != self.identity:
                self._taken.set()
                return

    def _watch(self, stop: threading.Event, worker: threading.Thread) -> str | None:
        """Wait, by the clock, for the deadline, another holder, ``stop`` or the end of ``worker``.

        Returns why leadership was lost, or None (a stop, or ``worker`` returned).
        """
        while True:
            if self._taken.is_set():
                return f"the Lease is held by {self.holder}"
            deadline = self.fence.deadline
            now = self.clock()
            if deadline is None or now >= deadline:
                return f"not renewed within the renew deadline ({self.timings.renew_deadline:g} s)"
            if stop.is_set() or not worker.is_alive():
                return None
            stop.wait(min(deadline - now, WATCH_POLL_SECONDS))

    def run(self, lead: Callable[[threading.Event], None], stop: threading.Event,
            on_wait: Callable[[], None] | None = None) -> bool:
        """Acquire, then run ``lead(leader_stop)`` in a thread while renewing; returns True when the Lease was lost.

        Leadership ends at the renew deadline by the clock, whatever the
        renewing request is doing: then the fence trips (a fenced client
        writes no more and drops its connections), :attr:`leading` is cleared
        and ``leader_stop`` is set; ``lead`` is waited for one retry period
        at most (a thread stuck in a request is abandoned: the process
        exits). ``leader_stop`` is also set when ``stop`` is set; ``lead``
        must return soon after. When ``lead`` returns by
        itself, or on a clean stop, the fence trips and the Lease is released.
        ``on_wait``: see :meth:`acquire`.
        """
        if not self.acquire(stop, on_wait):
            return False
        leader_stop = threading.Event()
        worker = threading.Thread(target=lead, args=(leader_stop,), daemon=True, name=f"lead-{self.name}")
        worker.start()
        threading.Thread(target=self._renew, args=(leader_stop,), daemon=True, name=f"renew-{self.name}").start()
        why = self._watch(stop, worker)
        if why is not None:
            self.fence.trip(why)
            self.leading.clear()
            leader_stop.set()
            log.warning("Lease %s/%s lost by %s: %s; stopped acting", self.namespace, self.name, self.identity, why)
            # Not waited for long: its writes are refused from now on, and a write in flight may hang.
            worker.join(timeout=self.timings.retry_period)
            return True
        leader_stop.set()
        worker.join(timeout=max(self.timings.renew_deadline, 5.0))
        deadline = self.fence.deadline
        self.fence.trip("stopped")  # the worker writes no more, whether it returned or not
        self.release(deadline)
        return False
