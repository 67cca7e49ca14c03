"""client-go's work queue: a key is queued at most once, never handed to two workers at once, waits at most once.

Controllers queue object keys (``namespace/name``) from watch handlers and
timers; ``workers`` threads :meth:`WorkQueue.get` a key, reconcile it and
call :meth:`WorkQueue.done`.

* :class:`WorkQueue` is client-go's ``Type`` plus its delaying queue: a
  key is pending at most once. A key waiting (:meth:`WorkQueue.add_after`)
  keeps one ready time: a second ``add_after`` only moves it earlier
  (client-go's ``waitingForQueue``), and :meth:`WorkQueue.add` makes it
  ready now and drops the wait. So however many watch events, resyncs and
  retries name a key, it has one pending entry, and a periodic resync never
  starts a second retry chain beside the first.
* :class:`RateLimitingQueue` adds client-go's rate-limited requeue: a
  worker whose reconcile failed calls :meth:`RateLimitingQueue.add_rate_limited`
  (the key comes back after its limiter's wait, per key and capped:
  :mod:`gpufleet.kube.ratelimit`), and one that succeeded calls
  :meth:`RateLimitingQueue.forget`. A reconcile answers :data:`BACKOFF` to
  say "not done yet, try again at this key's pace" (controller-runtime's
  ``Result{Requeue: true}``). :meth:`RateLimitingQueue.process` is that whole
  worker step, the one every controller's worker runs.

Time: ready times are on the queue's ``clock`` (monotonic seconds,
injectable so tests need no sleeping); ``get``'s own ``timeout`` is real
seconds.
"""

from __future__ import annotations

import enum
import heapq
import logging
import threading
import time
from collections.abc import Callable
from typing import Final, Generic, Hashable, TypeVar

from .ratelimit import RateLimiter, default_controller_rate_limiter

K = TypeVar("K", bound=Hashable)

log = logging.getLogger(__name__)


class Requeue(enum.Enum):
    """What a reconcile may answer besides "done" (None) and "look again in N seconds" (a float)."""

    #: Not done: queue the key again after its rate limiter's wait (a failure of that key).
    BACKOFF = "backoff"


#: A reconcile's answer "not done: queue this key again after its rate limiter's wait" (compare with ``is``).
BACKOFF: Final = Requeue.BACKOFF


class WorkQueue(Generic[K]):
    """A de-duplicating work queue with delayed re-queueing, one pending entry per key (client-go's semantics).

    A key added while queued is not queued twice; a key added while a worker
    holds it is queued again once that worker calls :meth:`done`, so a key is
    never processed by two workers at once.

    Args:
        clock: monotonic seconds, the time of :meth:`add_after`'s ready times.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: list[K] = []
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        #: key -> (ready time, sequence number of its heap entry): the one wait of each key.
        self._waiting: dict[K, tuple[float, int]] = {}
        #: (ready time, sequence, key); entries whose sequence is no longer the key's in ``_waiting`` are stale.
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0
        self._shutdown = False

    def add(self, key: K) -> None:
        """Queue ``key`` now (no-op if already queued); a wait of ``key`` is dropped."""
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shutdown:
            return
        if self._waiting.pop(key, None) is not None:
            self._compact_locked()
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds (now if ``delay`` <= 0).

        A key already waiting keeps the earlier of its ready time and
        ``now + delay``: one pending entry per key.
        """
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            ready = self.clock() + delay
            known = self._waiting.get(key)
            if known is not None and known[0] <= ready:
                return
            self._seq += 1
            self._waiting[key] = (ready, self._seq)
            heapq.heappush(self._heap, (ready, self._seq, key))
            self._compact_locked()
            self._cond.notify()

    def ready_at(self, key: K) -> float | None:
        """The clock time at which waiting ``key`` is queued, or None when it is not waiting."""
        with self._cond:
            known = self._waiting.get(key)
            return None if known is None else known[0]

    def _compact_locked(self) -> None:
        """Rebuild the heap once stale entries (moved earlier, or dropped by :meth:`add`) outnumber the live ones."""
        if len(self._heap) > 2 * len(self._waiting) + 64:
            self._heap = [(ready, seq, key) for key, (ready, seq) in self._waiting.items()]
            heapq.heapify(self._heap)

    def _release_due_locked(self) -> None:
        now = self.clock()
        while self._heap and self._heap[0][0] <= now:
            _, seq, key = heapq.heappop(self._heap)
            known = self._waiting.get(key)
            if known is not None and known[1] == seq:
                self._add_locked(key)

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to process (mark it done with :meth:`done`), or None on timeout (real seconds)/shutdown.

        ``timeout=0`` looks once: the keys due on the clock, then the queue.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._release_due_locked()
                if self._queue:
                    key = self._queue.pop(0)
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if self._shutdown:
                    return None
                waits = []
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    waits.append(left)
                if self._heap:
                    waits.append(max(self._heap[0][0] - self.clock(), 0.001))
                self._cond.wait(min(waits) if waits else None)

    def done(self, key: K) -> None:
        """Mark ``key`` processed; re-queue it if it was added meanwhile."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        """Wake every waiting worker; :meth:`get` returns None from now on."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        """Keys queued plus keys waiting."""
        with self._cond:
            return len(self._queue) + len(self._waiting)


class RateLimitingQueue(WorkQueue[K]):
    """A :class:`WorkQueue` whose failed keys come back at their rate limiter's pace (client-go's
    ``RateLimitingInterface``).

    Args:
        rate_limiter: default :func:`gpufleet.kube.ratelimit.default_controller_rate_limiter` on ``clock``
            (0.5 s doubling to 10 s per key, 10 retries a second overall after a burst of 100).
        clock: monotonic seconds.
    """

    def __init__(self, rate_limiter: RateLimiter | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.rate_limiter = rate_limiter if rate_limiter is not None else default_controller_rate_limiter(clock=clock)

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` again once its rate limiter allows (one more failure counted); returns the wait, seconds."""
        delay = self.rate_limiter.when(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """``key`` succeeded: its next failure waits the shortest time again (a wait already set stays)."""
        self.rate_limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        """Failures of ``key`` since it was last forgotten."""
        return self.rate_limiter.num_requeues(key)

    def process(self, key: K, fn: Callable[[K], float | Requeue | None], *, what: str | None = None,
                retry_on: tuple[type[BaseException], ...] = (), quiet: tuple[type[BaseException], ...] = (),
                logger: logging.Logger | None = None) -> None:
        """One worker step for ``key`` (handed out by :meth:`get`): run ``fn(key)``, requeue as it says, mark done.

        client-go's ``processNextWorkItem``: ``fn`` answering None is done
        (:meth:`forget`), a float is done for now and looked at again after
        that many seconds (:meth:`forget`, then :meth:`add_after`), :data:`BACKOFF`
        comes back at the key's rate-limited pace (:meth:`add_rate_limited`),
        and so does any exception. :meth:`done` is called whatever happens. Never
        raises (an ``Exception``), so one key never kills a worker.

        Args:
            key: the key.
            fn: the reconcile.
            what: the key as log lines name it (default ``str(key)``).
            retry_on: expected failures (an API or backend error): one warning line, no traceback.
            quiet: failures that are routine (a write conflict from a stale cache): a debug line.
            logger: where to log (default this module's).
        """
        logger = logger or log
        what = str(key) if what is None else what
        try:
            outcome = fn(key)
            if outcome is BACKOFF:
                self.add_rate_limited(key)
            else:
                self.forget(key)
                if outcome is not None:
                    self.add_after(key, outcome)
        except quiet as exc:
            logger.debug("%s: %s; retrying", what, exc)
            self.add_rate_limited(key)
        except retry_on as exc:
            logger.warning("%s: %s; retrying", what, exc)
            self.add_rate_limited(key)
        except Exception:  # never let one key kill the worker
            logger.exception("%s: failed; retrying", what)
            self.add_rate_limited(key)
        finally:
            self.done(key)
