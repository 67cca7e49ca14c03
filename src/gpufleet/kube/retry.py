"""Retries and backoff: the one policy every gpufleet loop follows when the API server says no.

* Transport (:func:`transport_retries`): a request that never reached the
  server (connection refused or reset) is sent again up to 3 times, 0.1 s
  apart and doubling; an idempotent one (GET, PUT, DELETE: PUTs carry their
  resourceVersion) also when the connection broke before the answer (a
  pooled keep-alive connection the server had closed), twice at most.
* Answers with ``Retry-After`` (:func:`retry_after`): a 429 or 5xx that
  carries the header was not processed (API priority and fairness
  rejected it, or the resource's storage is still initializing after its
  CRD was created), so the request is sent again after the delay the
  server asks for, up to :data:`RETRY_AFTER_ATTEMPTS` times, as client-go
  does. A 429 without the header (a PodDisruptionBudget refusing an
  eviction) is the caller's to handle.
* Loops (:class:`Backoff`): watches and lease renewals wait ``initial``
  seconds after a failure, doubling up to ``cap``, with ±10 % jitter so
  replicas do not retry in step (client-go's ``wait.Backoff``); a success
  resets it.
* Keys of a work queue (:mod:`gpufleet.kube.ratelimit`): a reconcile
  worker's failed key waits the same 0.5 s doubling to 10 s, counted per
  key, with a bucket over all keys (client-go's ``workqueue`` rate
  limiters): one slow key does not slow the others.
* Which failures are worth retrying (:func:`retryable`): no answer, 429
  (throttled) and 5xx; not 4xx, which repeat until someone changes
  something.
* Optimistic concurrency (:func:`update_with_retry`): read, change, write
  with the read ``resourceVersion`` as precondition; a 409 means someone
  wrote in between, so read again (client-go's ``RetryOnConflict``:
  8 attempts, 50 ms doubling to 1 s).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from urllib3.util.retry import Retry

from .errors import Conflict, ServerError, TooManyRequests, Unreachable

if TYPE_CHECKING:
    from .client import Kube

log = logging.getLogger(__name__)

Obj = dict[str, Any]

#: Attempts of :func:`update_with_retry` (client-go ``retry.DefaultRetry`` has 5; lists of taints are busier).
CONFLICT_ATTEMPTS = 8
#: Times a request answered with ``Retry-After`` is sent again (client-go: 10).
RETRY_AFTER_ATTEMPTS = 10
#: Longest wait honoured from a ``Retry-After`` header, seconds.
RETRY_AFTER_CAP = 10.0


def transport_retries() -> Retry:
    """urllib3's retry policy for requests that got no answer (see the module docstring)."""
    return Retry(total=3, connect=3, read=2, redirect=0, status=0, other=0, backoff_factor=0.1,
                 raise_on_status=False, respect_retry_after_header=False)


class Backoff:
    """Exponential backoff with jitter for a loop that retries after failures.

    Args:
        initial: seconds after the first failure.
        cap: most seconds between attempts.
        factor: growth per failure.
        jitter: fraction of randomness (0.1: ±10 %).
    """

    def __init__(self, initial: float = 0.5, cap: float = 10.0, factor: float = 2.0, jitter: float = 0.1):
        self.initial, self.cap, self.factor, self.jitter = initial, cap, factor, jitter
        self._next = initial

    def next(self) -> float:
        """Seconds to wait now; the following wait grows by ``factor`` up to ``cap``."""
        wait = self._next
        self._next = min(self._next * self.factor, self.cap)
        return wait * (1 + random.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        """After a success: the next failure waits ``initial`` again."""
        self._next = self.initial


def retry_after(status: int, header: str | None, attempt: int) -> float | None:
    """Seconds to wait before sending again a request answered ``status`` with ``Retry-After: header``; None: do not.

    Only 429 and 5xx with a numeric header qualify, for the first
    :data:`RETRY_AFTER_ATTEMPTS` attempts (0-based ``attempt``); the wait is
    capped at :data:`RETRY_AFTER_CAP`.
    """
    if attempt >= RETRY_AFTER_ATTEMPTS or not header or not (status == 429 or status >= 500):
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)


def retryable(exc: BaseException) -> bool:
    """Whether retrying the same call later may succeed: no answer, 429 or 5xx."""
    return isinstance(exc, (Unreachable, TooManyRequests, ServerError))


def conflict_wait(attempt: int) -> float:
    """Seconds before re-reading after the ``attempt``-th conflict (0-based): 50 ms doubling to 1 s, for any count."""
    return min(0.05 * 2.0 ** min(attempt, 5), 1.0)


def update_with_retry(kube: "Kube", path: str, change: Callable[[Obj], Obj | None], *,
                      attempts: int = CONFLICT_ATTEMPTS,
                      on_conflict: Callable[[int], None] | None = None,
                      cached: Obj | None = None) -> tuple[Obj, Obj | None]:
    """Read ``path``, merge-patch it with ``change(obj)`` guarded by the read resourceVersion; retry on 409.

    ``change`` returns the JSON merge patch (without ``metadata.resourceVersion``,
    which is added as the precondition) or None when nothing is to change.
    Lists in a merge patch replace the whole list (taints, resource groups),
    which is why the precondition matters.

    ``cached``: the object as a watch cache holds it (its ``metadata.resourceVersion``
    and whatever ``change`` reads). When ``change`` finds something to write in
    it, the first patch is made from it without a read, as client-go's
    controllers update from their informers: a cache that was behind gets a
    409 and the next attempt reads. When it finds nothing to write, the object
    is read all the same (a cache behind must not make a needed write look done).

    Returns:
        ``(object after, patch applied or None)``.

    Raises:
        Conflict: still 409 after ``attempts`` reads (message says so).
        KubeError: any other error.
    """
    for attempt in range(attempts):
        first = cached if attempt == 0 and cached is not None and change(cached) is not None else None
        obj = first if first is not None else kube.request("GET", path)
        body = change(obj)
        if body is None:
            return obj, None
        body = dict(body)
        body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": obj["metadata"]["resourceVersion"]}
        try:
            return kube.request("PATCH", path, body=body, patch="merge"), body
        except Conflict:
            if on_conflict:
                on_conflict(attempt + 1)
            log.info("409 on %s (attempt %d): re-reading", path, attempt + 1)
            time.sleep(conflict_wait(attempt))
    raise Conflict(409, "Conflict", f"{path}: the object kept changing under us (409 Conflict {attempts} times); "
                   "try again", path=f"PATCH {path}")


