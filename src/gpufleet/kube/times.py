"""The API's time formats: RFC 3339 timestamps (``Time``) and microsecond ``MicroTime``, in UTC."""

from __future__ import annotations

import calendar
import time


def now_rfc3339() -> str:
    """The current UTC time as the API's RFC 3339 timestamp, seconds precision (``2026-01-02T03:04:05Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def now_micro() -> str:
    """The current UTC time as a MicroTime (Lease ``renewTime``, Event ``eventTime``): ``...05.123456Z``."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 UTC timestamp (``...Z``, optional fraction), or None when empty.

    Raises:
        ValueError: not a timestamp of that form.
    """
    if not value:
        return None
    main, _, frac = value.rstrip("Z").partition(".")
    secs = calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S"))
    return secs + (float("0." + frac) if frac else 0.0)
