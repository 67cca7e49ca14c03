"""Waiting for a condition: the one poll loop of gpufleet (apimachinery's ``wait.PollUntilContextTimeout``).

:func:`poll_until` calls a condition every ``interval`` seconds until it
returns something truthy (then returns that value), ``timeout`` seconds
pass (:class:`PollTimeout`, a :class:`TimeoutError` naming what was
awaited, with the condition's last answer or error), or an optional stop
event is set (:class:`PollStopped`). Like
``wait.PollUntilContextTimeout(ctx, interval, timeout, immediate, condition)``:
``immediate`` checks once before the first sleep, and a condition that
raises ends the wait with that error unless the error's type is in
``ignore`` (then it counts as "not yet", as ``wait.ConditionFunc``
callers do with transient API errors).

Every loop of gpufleet, its workshop, tests and benchmarks that waits for
something to become true uses it, so a timeout always says what it was
waiting for and how long, and a loop never spins without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["PollStopped", "PollTimeout", "poll_until"]


class PollTimeout(TimeoutError):
    """The condition did not hold within the timeout.

    Attributes:
        what: what was awaited (the caller's words).
        timeout: the seconds waited.
        last: the condition's last (falsy) answer, or None.
        error: the last error the condition raised among the ignored ones, or None.
    """

    def __init__(self, what: str, timeout: float, last: Any = None, error: BaseException | None = None,
                 detail: str = ""):
        tail = f"; last error: {error}" if error is not None else (f"; last answer: {last!r}" if last is not None
                                                                   and last is not False else "")
        super().__init__(f"timed out after {timeout:g}s waiting for {what}{tail}{detail}")
        self.what, self.timeout, self.last, self.error = what, timeout, last, error


class PollStopped(RuntimeError):
    """The stop event was set before the condition held (a controller shutting down mid-wait)."""

    def __init__(self, what: str):
        super().__init__(f"stopped while waiting for {what}")
        self.what = what


def poll_until(condition: Callable[[], T], *, what: str, timeout: float, interval: float = 0.25,
               immediate: bool = True, stop: threading.Event | None = None,
               ignore: tuple[type[BaseException], ...] = (), detail: Callable[[], str] | None = None,
               clock: Callable[[], float] = time.monotonic) -> T:
    """Call ``condition()`` every ``interval`` seconds until it returns a truthy value; return that value.

    Args:
        condition: no arguments; a truthy answer ends the wait and is returned.
        what: what is awaited, for the timeout's message ("pod x Ready").
        timeout: seconds (>= 0) before giving up; the condition is checked once more at the deadline.
        interval: seconds (> 0) between checks.
        immediate: check before the first sleep (False: sleep ``interval`` first).
        stop: an event that ends the wait early (:class:`PollStopped`); also what the sleeps wait on.
        ignore: exception types that count as "not yet" (e.g. ``(KubeError,)`` for a server still starting);
            others propagate at once.
        detail: called on timeout; its text is appended to the message (a log tail, the last sample).
        clock: monotonic seconds (tests inject one).

    Returns:
        The condition's first truthy answer.

    Raises:
        PollTimeout: (a TimeoutError) still falsy after ``timeout`` seconds.
        PollStopped: ``stop`` was set first.
        ValueError: a negative ``timeout`` or a non-positive ``interval``.
    """
    if timeout < 0 or interval <= 0:
        raise ValueError(f"poll_until({what!r}): timeout {timeout!r} must be >= 0 and interval {interval!r} > 0")
    sleeper = stop or threading.Event()
    deadline = clock() + timeout
    last: Any = None
    error: BaseException | None = None
    check = immediate
    while True:
        if stop is not None and stop.is_set():
            raise PollStopped(what)
        if check:
            try:
                last, error = condition(), None
            except ignore as exc:
                last, error = None, exc
            if last:
                return last
        check = True
        left = deadline - clock()
        if left <= 0:  # the last check was at (or past) the deadline
            raise PollTimeout(what, timeout, last, error, f"\n{detail()}" if detail else "")
        sleeper.wait(min(interval, left))
