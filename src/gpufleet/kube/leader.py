"""One active instance per controller: leader election through a ``coordination.k8s.io/v1`` Lease.

client-go's ``leaderelection`` with a ``LeaseLock``, on the caller's own
client (no second client, no process-wide configuration):

* a candidate creates the Lease, or takes it over when the holder has not
  renewed it within ``leaseDurationSeconds`` (measured on this process's
  clock from when it last saw the record change, so clock skew between
  nodes does not matter), writing with the read resourceVersion so that
  two candidates never both win;
* the leader renews ``renewTime`` every ``retry_period`` seconds; when it
  could not renew for ``renew_deadline`` seconds it has lost the Lease and
  must stop acting (the controller then exits and restarts as a follower);
* a leader that stops cleanly releases the Lease (empty holder, duration
  1 s), so a follower takes over at once instead of after the duration.

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
from .errors import Conflict, KubeError, NotFound
from .times import now_micro

log = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
RENEW_DEADLINE_SECONDS = 10.0
RETRY_SECONDS = 2.0


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
        kube: the client (the controller's own).
        name / namespace: the Lease.
        identity: holder identity (default :func:`holder_identity`).
        timings: :class:`Timings`.
        clock: monotonic seconds (tests inject one).

    Attributes:
        leading: set while this instance holds the Lease.
    """

    def __init__(self, kube: Kube, name: str, namespace: str, *, identity: str | None = None,
                 timings: Timings = Timings(), clock: Callable[[], float] = time.monotonic):
        self.kube, self.name, self.namespace = kube, name, namespace
        self.identity = identity or holder_identity()
        self.timings = timings
        self.clock = clock
        self.leading = threading.Event()
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._path = api_path("coordination.k8s.io/v1", "leases", namespace, name)

    def _spec(self, acquire: bool, transitions: int) -> dict:
        now = now_micro()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.timings.lease_duration)),
                "renewTime": now, "leaseTransitions": transitions}
        if acquire:
            spec["acquireTime"] = now
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One attempt: create, take over or renew the Lease; True when this instance holds it afterwards.

        Raises:
            KubeError: the API server refused for another reason than a lost race (RBAC, unreachable).
        """
        try:
            lease = self.kube.request("GET", self._path)
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(True, 0)}
            try:
                self.kube.create("coordination.k8s.io/v1", "leases", body, self.namespace)
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
            self.kube.request("PUT", self._path, body=lease)  # resourceVersion of the read: one winner
        except Conflict:
            return False
        self._observe(new)
        return True

    def _observe(self, spec: dict) -> None:
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()

    def release(self) -> None:
        """Give the Lease up if held (empty holder, 1 s duration) so a follower takes over now; never raises."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        try:
            lease = self.kube.request("GET", self._path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=now_micro())
            self.kube.request("PUT", self._path, body=lease)
        except KubeError as exc:
            log.info("Lease %s/%s not released (%s); it expires by itself", self.namespace, self.name, exc)

    def _attempt(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except KubeError as exc:
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def acquire(self, stop: threading.Event, on_wait: Callable[[], None] | None = None) -> bool:
        """Block until this instance holds the Lease (True) or ``stop`` is set (False).

        ``on_wait`` is called after every attempt (a follower's liveness: waiting is healthy).
        """
        while not stop.is_set():
            if on_wait is not None:
                on_wait()
            if self._attempt():
                self.leading.set()
                log.info("Lease %s/%s acquired by %s", self.namespace, self.name, self.identity)
                return True
            stop.wait(self.timings.retry_period)
        return False

    def renew_until_lost(self, stop: threading.Event, done: Callable[[], bool] = lambda: False) -> bool:
        """Renew every retry period until ``stop`` or ``done()`` (False) or ``renew_deadline`` passes without success (True: lost)."""
        last = self.clock()
        while not stop.wait(self.timings.retry_period) and not done():
            if self._attempt():
                last = self.clock()
            elif self.clock() - last >= self.timings.renew_deadline:
                self.leading.clear()
                log.warning("Lease %s/%s lost by %s (not renewed for %.0f s)", self.namespace, self.name,
                            self.identity, self.clock() - last)
                return True
        return False

    def run(self, lead: Callable[[threading.Event], None], stop: threading.Event,
            on_wait: Callable[[], None] | None = None) -> bool:
        """Acquire, then run ``lead(leader_stop)`` in a thread while renewing; returns True when the Lease was lost.

        ``leader_stop`` is set when ``stop`` is set or the Lease is lost;
        ``lead`` must return soon after. When ``lead`` returns by itself,
        or on a clean stop, the Lease is released. ``on_wait``: see :meth:`acquire`.
        """
        if not self.acquire(stop, on_wait):
            return False
        leader_stop = threading.Event()
        worker = threading.Thread(target=lead, args=(leader_stop,), daemon=True, name=f"lead-{self.name}")
        worker.start()
        lost = self.renew_until_lost(stop, done=lambda: not worker.is_alive())
        leader_stop.set()
        worker.join(timeout=max(self.timings.renew_deadline, 5.0))
        if not lost:
            self.release()
        return lost
