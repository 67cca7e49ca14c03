"""Writes only while leading: the fence a leader-elected component's client checks before every write.

client-go stops a leader at its renew deadline whatever a request is doing
(``tools/leaderelection``: the leader's context is cancelled when
``RenewDeadline`` passes without a renewal). gpufleet keeps the same promise
at the one place every write passes, the client (:class:`gpufleet.kube.Kube`,
:meth:`~gpufleet.kube.Kube.fence_writes`):

* the elector (:class:`gpufleet.kube.leader.LeaderElector`) holds the fence
  until a deadline in monotonic seconds: the start of its last successful
  renewal plus the renew deadline (:meth:`Fence.hold_until`);
* a write (POST, PUT, PATCH, DELETE: create, patch, replace, delete,
  eviction, server-side apply, Events) is admitted only before that
  deadline, checked against the clock when it is sent, so a renew thread
  stuck in a request cannot keep writes open;
* an admitted write may take only the time left to the deadline: the
  client cuts its timeout to it and sends it once (no transport retry, no
  ``Retry-After`` resend), so no write of this process is in flight past
  the deadline;
* once leadership is lost (:meth:`Fence.trip`) writes are refused for
  good and the callbacks run (the client drops its pooled connections).

Before the Lease is first acquired, writes are refused too: a follower does
not act. Reads are never fenced. The Lease's own paths are exempt (the
elector bounds its requests by the same deadline itself).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from .errors import LeadershipLost

log = logging.getLogger(__name__)

#: HTTP methods that change something on the API server.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Fence:
    """Whether this process may write now, and for how long (module docstring).

    Args:
        lease: ``namespace/name`` of the Lease (messages, metrics).
        exempt: REST paths never fenced (the Lease and its collection).
        clock: monotonic seconds (tests inject one); the deadline is on this clock.
    """

    def __init__(self, lease: str, *, exempt: Iterable[str] = (), clock: Callable[[], float] = time.monotonic):
        self.lease = lease
        self.exempt = frozenset(exempt)
        self.clock = clock
        self._lock = threading.Lock()
        self._deadline: float | None = None  # None: never held
        self._lost: str | None = None  # why, once tripped
        self._on_trip: list[Callable[[], None]] = []

    @property
    def deadline(self) -> float | None:
        """Clock time (seconds) until which writes are admitted; None before the Lease was first held or once lost."""
        with self._lock:
            return None if self._lost is not None else self._deadline

    @property
    def lost(self) -> str | None:
        """Why leadership was lost (:meth:`trip`), or None while it was not."""
        return self._lost

    def hold_until(self, deadline: float) -> None:
        """Admit writes until ``deadline`` (clock seconds); no effect once tripped (loss is for good)."""
        with self._lock:
            if self._lost is None:
                self._deadline = deadline

    def time_left(self) -> float:
        """Seconds writes stay admitted from now: 0 when never held, past the deadline or tripped."""
        deadline = self.deadline
        return 0.0 if deadline is None else max(0.0, deadline - self.clock())

    def holding(self) -> bool:
        """Whether writes are admitted now."""
        return self.time_left() > 0

    def on_trip(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the fence trips (at once if it has); its errors are logged, not raised."""
        with self._lock:
            if self._lost is None:
                self._on_trip.append(callback)
                return
        self._call(callback)

    def trip(self, why: str) -> None:
        """Leadership is lost (``why``, for messages): refuse every write from now on and run the callbacks once."""
        with self._lock:
            if self._lost is not None:
                return
            self._lost = why
            callbacks, self._on_trip = self._on_trip, []
        for callback in callbacks:
            self._call(callback)

    @staticmethod
    def _call(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:  # a callback cutting connections must not keep the others from running
            log.exception("fence callback %r failed", callback)

    def admit(self, method: str, path: str) -> float | None:
        """Seconds ``METHOD path`` may take from now, or None when it is not fenced (a read, an exempt path).

        Raises:
            LeadershipLost: a write while this process does not hold the Lease
                (not yet acquired, renew deadline passed, or lost); the
                message says which.
        """
        if method.upper() not in WRITE_METHODS or path.split("?", 1)[0] in self.exempt:
            return None
        with self._lock:
            deadline, lost = self._deadline, self._lost
        what = f"{method} {path} refused"
        if lost is not None:
            raise LeadershipLost(f"{what}: leadership of Lease {self.lease} was lost ({lost})", path=f"{method} {path}")
        if deadline is None:
            raise LeadershipLost(f"{what}: this process does not hold Lease {self.lease} (not leading yet)",
                                 path=f"{method} {path}")
        left = deadline - self.clock()
        if left <= 0:
            raise LeadershipLost(f"{what}: Lease {self.lease} was not renewed by its renew deadline "
                                 f"({-left:.1f} s ago); this process has stopped acting", path=f"{method} {path}")
        return left
