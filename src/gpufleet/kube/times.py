"""The API's time formats: RFC 3339 timestamps (``Time``) and microsecond ``MicroTime``, in UTC; durations (``metav1.Duration``)."""

from __future__ import annotations

import calendar
import datetime
import re
import time


def now_rfc3339() -> str:
    """The current UTC time as the API's RFC 3339 timestamp, seconds precision (``2026-01-02T03:04:05Z``)."""
    return rfc3339(time.time())


def rfc3339(t: float) -> str:
    """``t`` (Unix seconds) as the API's RFC 3339 timestamp in UTC, seconds precision (``metav1.Time``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def now_micro() -> str:
    """The current UTC time as a MicroTime (Lease ``renewTime``, Event ``eventTime``): ``...05.123456Z``."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


#: RFC 3339 ``date-time`` (section 5.6): ``T`` (or a space, as RFC 3339 allows), any fraction, ``Z`` or an offset.
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch (float, fraction kept) of a Kubernetes API time, or None when absent (None or ``""``).

    The one parser of API times in gpufleet: ``metav1.Time`` (``2026-01-02T03:04:05Z``),
    ``MicroTime`` (``...05.123456Z``), RFC3339Nano fractions, and offsets
    (``+02:00``), all RFC 3339 (section 5.6) as apimachinery writes and reads them.
    A caller reading a value people may edit (an annotation, a ConfigMap key)
    catches the ValueError and says where it read it.

    Raises:
        ValueError: not an RFC 3339 time; the message quotes the value and the expected form.
    """
    if value is None or value == "":
        return None
    m = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"{value!r} is not an RFC 3339 time (expected e.g. 2026-01-02T03:04:05Z)")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7), m.group(8)
    try:
        datetime.datetime(year, month, day, hour, minute, second)  # the ranges (month 13, Feb 30) calendar skips
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an RFC 3339 time ({exc})") from None
    offset = 0 if zone in ("Z", "z") else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    secs = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) - offset
    return secs + (float(frac) if frac else 0.0)


#: One term of a Go duration (``time.ParseDuration``): a decimal number and its unit.
_DURATION_TERM = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str) -> float:
    """Seconds of a ``metav1.Duration`` (Go's ``time.Duration`` string: ``15s``, ``1m0.5s``, ``250ms``, ``-2h``, ``0``).

    Read as Go's ``time.ParseDuration`` reads it: an optional sign, then one
    or more decimal numbers each with a unit (ns, us, µs, ms, s, m, h); a lone
    ``0`` is zero.

    Raises:
        ValueError: not a Go duration; the message quotes the value and the expected form.
    """
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a Go duration (expected e.g. 15s, 1m0.5s)")
    body = value[1:] if value[:1] in ("+", "-") else value
    if body == "0":
        return 0.0
    terms = _DURATION_TERM.findall(body)
    if not body or "".join(n + u for n, u in terms) != body:
        raise ValueError(f"{value!r} is not a Go duration (expected e.g. 15s, 1m0.5s)")
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in terms)
    return -seconds if value.startswith("-") else seconds
