"""client-go's work queue: a key is queued at most once, never handed to two workers at once, and can wait.

Controllers queue object keys (``namespace/name``) from watch handlers and
timers; ``workers`` threads :meth:`WorkQueue.get` a key, reconcile it and
call :meth:`WorkQueue.done`.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """A de-duplicating work queue with delayed re-queueing (client-go's semantics).

    A key added while queued is not queued twice; a key added while a worker
    holds it is queued again once that worker calls :meth:`done`, so a key is
    never processed by two workers at once.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[K] = []
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []
        self._seq = 0
        self._shutdown = False

    def add(self, key: K) -> None:
        """Queue ``key`` now (no-op if already queued)."""
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds (now if ``delay`` <= 0)."""
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            self._seq += 1
            heapq.heappush(self._delayed, (time.monotonic() + delay, self._seq, key))
            self._cond.notify()

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to process (mark it done with :meth:`done`), or None on timeout/shutdown."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    _, _, key = heapq.heappop(self._delayed)
                    self._add_locked(key)
                if self._queue:
                    key = self._queue.pop(0)
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if self._shutdown:
                    return None
                wait = None if deadline is None else deadline - now
                if self._delayed:
                    due = self._delayed[0][0] - now
                    wait = due if wait is None else min(wait, due)
                if wait is not None and wait <= 0 and deadline is not None and now >= deadline:
                    return None
                self._cond.wait(wait if wait is None else max(wait, 0.001))

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
        with self._cond:
            return len(self._queue) + len(self._delayed)
