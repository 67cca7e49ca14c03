"""How long a failing work-queue key waits before its next try: client-go's ``util/workqueue`` rate limiters.

A rate limiter answers :meth:`RateLimiter.when` (seconds until ``item``
may be tried again; each call counts one more failure of it),
:meth:`RateLimiter.forget` (it succeeded: start over) and
:meth:`RateLimiter.num_requeues` (its failures since the last forget), as
client-go's ``workqueue.TypedRateLimiter`` does. The ones here are
client-go's ``default_rate_limiters.go``:

* :class:`ItemExponentialFailureRateLimiter`: per item, ``base * 2**n``
  seconds after its ``n``-th failure (0-based), at most ``cap``. The
  exponent is capped where the delay reaches ``cap``, so any number of
  failures (a pod that waits a year for its ConfigMap) gives ``cap``
  seconds, never an overflow.
* :class:`BucketRateLimiter`: one token bucket over all items
  (``golang.org/x/time/rate``'s ``Reserve().Delay()``): a burst of
  ``burst`` retries, then ``qps`` a second. Unlike x/time/rate, it books
  at most ``max_wait`` seconds ahead (default the item cap): when every
  key fails on every resync (the API server down for an hour), the
  reservations beyond that are not kept, so no hours of debt delay every
  retry after the outage, and the combined wait stays within the cap.
* :class:`MaxOfRateLimiter`: the longest wait of several.
* :func:`default_controller_rate_limiter`: the two above combined, as
  client-go's ``DefaultControllerRateLimiter``.

Defaults. client-go's are 5 ms doubling to 1000 s per item, 10 qps with a
burst of 100 overall. gpufleet keeps the bucket (:data:`BUCKET_QPS`,
:data:`BUCKET_BURST`) and paces items as its other loops and the kubelet
do: :data:`FAILURE_BASE_SECONDS` 0.5 s (the first wait of
:class:`gpufleet.kube.retry.Backoff`) doubling to
:data:`FAILURE_CAP_SECONDS` 10 s (the kubelet's ``backOffPeriod``, after
which it syncs again a pod whose sync failed, e.g. one waiting for a
ConfigMap). A retry of ours is a read and often a write (a status, an
Event), so a 5 ms start would spend a dozen API calls in the first second
of a failure that lasts minutes; a 1000 s cap would leave a key whose
failure has ended (the API server back after a restart) untried for up to
a quarter of an hour where nothing else queues it (the virtual kubelet's
endpoint publisher has no resync). There is no jitter, as in client-go:
the bucket spreads many failing items out.

Every limiter takes its clock (monotonic seconds) as an argument, so tests
drive it without sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

#: Seconds after an item's first failure (client-go's default: 0.005).
FAILURE_BASE_SECONDS = 0.5
#: Most seconds between an item's tries (client-go's default: 1000; the kubelet's ``backOffPeriod``: 10).
FAILURE_CAP_SECONDS = 10.0
#: Retries a second over all items, once the burst is spent (client-go's default).
BUCKET_QPS = 10.0
#: Retries over all items that may go at once (client-go's default).
BUCKET_BURST = 100

#: Float slack, so a token refilled in exactly its time is whole.
_EPS = 1e-9


class TokenBucket:
    """``rate_per_minute`` tokens a minute, at most ``burst`` saved; starts full at ``now`` (seconds).

    Raises:
        ValueError: ``rate_per_minute`` <= 0 or ``burst`` < 1.
    """

    def __init__(self, rate_per_minute: float, burst: float = 1.0, now: float = 0.0):
        if rate_per_minute <= 0 or burst < 1:
            raise ValueError(f"token bucket: rate_per_minute {rate_per_minute!r}, burst {burst!r}: expected "
                             "rate_per_minute > 0 and burst >= 1")
        self.rate = rate_per_minute / 60.0
        self.burst = float(burst)
        self.tokens = float(burst)
        self.at = now

    def _fill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def available(self, now: float) -> float:
        """Tokens available at ``now`` (negative while reservations are outstanding)."""
        self._fill(now)
        return self.tokens

    def take(self, now: float) -> bool:
        """Take one token if one is available at ``now``; False (nothing taken) if not."""
        self._fill(now)
        if self.tokens >= 1.0 - _EPS:
            self.tokens = max(0.0, self.tokens - 1.0)
            return True
        return False

    def reserve(self, now: float, max_wait: float = math.inf) -> float:
        """Take one token, available or not; returns the seconds from ``now`` until it is yours (0: now).

        Tokens go negative while reserved ahead, so reservations queue up at
        the bucket's rate (x/time/rate's ``Reserve().Delay()``), but never
        more than ``max_wait`` seconds ahead: a reservation past that waits
        ``max_wait`` and adds no debt.
        """
        self._fill(now)
        self.tokens = max(self.tokens - 1.0, -max_wait * self.rate)
        if self.tokens >= -_EPS:
            return 0.0
        return -self.tokens / self.rate

    def refund(self) -> None:
        """Give one token back (the action it paid for did not happen)."""
        self.tokens = min(self.burst, self.tokens + 1.0)


class RateLimiter(Protocol):
    """What a rate-limiting work queue asks (client-go's ``TypedRateLimiter``)."""

    def when(self, item: Hashable) -> float:
        """Seconds ``item`` waits before its next try; counts one more failure of it."""

    def forget(self, item: Hashable) -> None:
        """``item`` succeeded (or was given up): its next failure starts over."""

    def num_requeues(self, item: Hashable) -> int:
        """Failures of ``item`` since it was last forgotten."""


class ItemExponentialFailureRateLimiter:
    """Per item: ``base * 2**n`` seconds after its ``n``-th failure (0-based), at most ``cap``; never overflows.

    Args:
        base: seconds after the first failure (> 0).
        cap: most seconds (>= ``base``).

    Raises:
        ValueError: ``base`` <= 0 or ``cap`` < ``base`` (names both).
    """

    def __init__(self, base: float = FAILURE_BASE_SECONDS, cap: float = FAILURE_CAP_SECONDS):
        if not base > 0 or not cap >= base or math.isinf(cap):
            raise ValueError(f"exponential rate limiter: base {base!r} s, cap {cap!r} s: expected 0 < base <= cap "
                             "< infinity")
        self.base, self.cap = float(base), float(cap)
        #: The first exponent at which ``base * 2**n`` reaches ``cap``: larger ones are not computed.
        self.max_exponent = max(0, math.ceil(math.log2(self.cap / self.base)))
        self._failures: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def delay(self, failures: int) -> float:
        """Seconds after the ``failures``-th failure (0-based), for any non-negative count."""
        return min(self.base * 2.0 ** min(failures, self.max_exponent), self.cap)

    def when(self, item: Hashable) -> float:
        with self._lock:
            n = self._failures.get(item, 0)
            self._failures[item] = n + 1
        return self.delay(n)

    def forget(self, item: Hashable) -> None:
        with self._lock:
            self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        with self._lock:
            return self._failures.get(item, 0)


class BucketRateLimiter:
    """One token bucket over all items: ``burst`` tries at once, then ``qps`` a second (items are not told apart).

    Args:
        qps: tries a second once the burst is spent (> 0).
        burst: tries that may go at once (>= 1).
        clock: monotonic seconds.
        max_wait: most seconds it books ahead (module docstring).

    Raises:
        ValueError: ``qps`` <= 0 or ``burst`` < 1.
    """

    def __init__(self, qps: float = BUCKET_QPS, burst: int = BUCKET_BURST,
                 clock: Callable[[], float] = time.monotonic, max_wait: float = FAILURE_CAP_SECONDS):
        self.clock = clock
        self.max_wait = max_wait
        self._bucket = TokenBucket(qps * 60.0, burst, clock())
        self._lock = threading.Lock()

    def when(self, item: Hashable) -> float:
        with self._lock:
            return self._bucket.reserve(self.clock(), self.max_wait)

    def forget(self, item: Hashable) -> None:
        pass

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest wait of ``limiters`` (each counts the failure); the most requeues any of them counts."""

    def __init__(self, *limiters: RateLimiter):
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self.limiters = limiters

    def when(self, item: Hashable) -> float:
        return max(lim.when(item) for lim in self.limiters)

    def forget(self, item: Hashable) -> None:
        for lim in self.limiters:
            lim.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(lim.num_requeues(item) for lim in self.limiters)


def default_controller_rate_limiter(*, base: float = FAILURE_BASE_SECONDS, cap: float = FAILURE_CAP_SECONDS,
                                    qps: float = BUCKET_QPS, burst: int = BUCKET_BURST,
                                    clock: Callable[[], float] = time.monotonic) -> MaxOfRateLimiter:
    """Per-item exponential backoff (``base`` doubling to ``cap`` seconds) and an overall bucket (``qps``,
    ``burst``, booking at most ``cap`` ahead), the longer wait winning: client-go's
    ``DefaultControllerRateLimiter`` with gpufleet's defaults (module docstring). No wait exceeds ``cap``.

    Raises:
        ValueError: a bad ``base``/``cap``/``qps``/``burst`` (names it).
    """
    return MaxOfRateLimiter(ItemExponentialFailureRateLimiter(base, cap), BucketRateLimiter(qps, burst, clock, cap))
