"""CPU seconds spent by some of a process's threads: a controller's own work apart from its watches' decoding.

Why: a controller's process CPU over one tick also holds what its informer
threads spent decoding watch events in that time; at a thousand nodes
that is most of it and it grows with the fleet's churn, not with the
tick's work. To tell them apart, :class:`ThreadCpu` reads each chosen
thread's own CPU clock (POSIX ``pthread_getcpuclockid`` through
``time.pthread_getcpuclockid`` and ``time.clock_gettime``: user + system,
nanosecond resolution on Linux), the way ``getrusage(RUSAGE_THREAD)`` would
for the calling thread alone. The standard library offers this per thread;
``psutil``'s per-thread times come from ``/proc`` in clock ticks (10 ms),
too coarse for a tick of a few milliseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def _cpu_seconds(thread: threading.Thread) -> float | None:
    """``thread``'s CPU seconds so far, or None when it has ended (its clock is gone) or has none here."""
    if thread.ident is None:
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, AttributeError, ValueError):
        return None


class ThreadCpu:
    """CPU seconds of the calling thread plus the live threads whose name ``chosen`` accepts, between two reads.

    ``start()`` takes every chosen thread's clock, ``seconds()`` the CPU they
    spent since: a thread started in between counts from zero, one that ended
    in between loses what it spent after ``start()`` (it can no longer be
    read). Not thread-safe: one per measuring thread.

    Args:
        chosen: thread name -> whether its CPU counts (e.g. a worker pool's ``thread_name_prefix``).
    """

    def __init__(self, chosen: Callable[[str], bool]):
        self.chosen = chosen
        self._before: dict[int, float] = {}

    def _read(self) -> dict[int, float]:
        me = threading.current_thread()
        out: dict[int, float] = {}
        for t in threading.enumerate():
            if t is me or self.chosen(t.name):
                v = _cpu_seconds(t)
                if v is not None and t.ident is not None:
                    out[t.ident] = v
        return out

    def start(self) -> None:
        """Take the chosen threads' clocks now."""
        self._before = self._read()

    def seconds(self) -> float:
        """CPU seconds the chosen threads spent since :meth:`start` (>= 0)."""
        after = self._read()
        return max(0.0, sum(v - self._before.get(ident, 0.0) for ident, v in after.items()))
