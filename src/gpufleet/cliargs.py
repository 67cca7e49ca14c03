"""Flag value checks shared by the ``gpufleet`` subcommands (one place, one wording).

Each ``*_type`` helper returns (or is) an argparse ``type=`` callable: it
converts the text and raises :class:`argparse.ArgumentTypeError` when the
value is out of range, so argparse exits 2 before the command runs, with
``argument --FLAG: 'VALUE': expected ...`` on stderr. Numbers are always
finite: ``nan`` and ``inf`` are refused wherever a number is expected.

The same checks are usable on values that did not come from the command
line (inventory defaults) through :func:`check`.

:func:`listen_error` is the start-up check of a ``/metrics`` port: a port in
use becomes one line naming the address (exit 1) instead of an ``OSError``
traceback from ``bind()`` deep inside the server.
"""

from __future__ import annotations

import argparse
import math
import re
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

#: The levels every command's ``--log-level`` accepts.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-level`` (one of :data:`LOG_LEVELS`, default ``INFO``) to ``parser``."""
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, help="logging threshold (default INFO)")


def _fail(text: str, expected: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{text!r}: expected {expected}")


def port_type(*, allow_zero: bool) -> Callable[[str], int]:
    """An argparse type for a TCP port: 1..65535, or 0..65535 when ``allow_zero`` (0 meaning "off")."""
    low = 0 if allow_zero else 1
    expected = "a TCP port, 0 (off) to 65535" if allow_zero else "a TCP port, 1 to 65535"

    def port(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _fail(text, expected) from None
        if not low <= value <= 65535:
            raise _fail(text, expected)
        return value

    port.__name__ = "port"
    return port


#: ``--port`` of a server that must listen (1..65535).
port = port_type(allow_zero=False)
#: ``--port``/``--metrics-port`` where 0 turns the endpoint off (0..65535).
port_or_off = port_type(allow_zero=True)


def integer_type(minimum: int) -> Callable[[str], int]:
    """An argparse type for a whole number ``>= minimum`` (counts, thresholds)."""
    expected = f"a whole number >= {minimum}"

    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _fail(text, expected) from None
        if value < minimum:
            raise _fail(text, expected)
        return value

    integer.__name__ = "integer"
    return integer


def number_type(*, positive: bool, unit: str | None = None) -> Callable[[str], float]:
    """An argparse type for a finite float, ``> 0`` when ``positive`` else ``>= 0``.

    Args:
        positive: refuse 0 too (intervals, rates); otherwise 0 is allowed (delays, marks).
        unit: what the number counts, for the message (``"seconds"`` gives
            ``expected a finite number of seconds > 0``).
    """
    noun = f"a finite number of {unit}" if unit else "a finite number"
    expected = f"{noun} > 0" if positive else f"{noun} >= 0"

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _fail(text, expected) from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise _fail(text, expected)
        return value

    number.__name__ = "number"
    return number


#: Seconds that must be > 0 (intervals, windows, timeouts).
positive_seconds = number_type(positive=True, unit="seconds")
#: Seconds that may be 0 (debounce, hold, grace).
nonnegative_seconds = number_type(positive=False, unit="seconds")
#: A finite number >= 0 (GPU marks).
nonnegative_number = number_type(positive=False)
#: A finite number > 0 (rates).
positive_number = number_type(positive=True)


#: The taint effects the API accepts (``core/v1`` ``TaintEffect``).
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: A label key as the API validates it: optional DNS-subdomain prefix and ``/``, then a name of at most 63
#: characters (``k8s.io/apimachinery/pkg/util/validation.IsQualifiedName``).
_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def taints(text: str) -> list[dict[str, str]]:
    """An argparse type for the kubelet's ``--register-with-taints``: ``key[=value]:Effect`` comma-separated.

    Returns the taints as the API writes them (``{"key", "effect"[, "value"]}``); ``""`` is none.
    """
    expected = "key[=value]:Effect[,...] with Effect one of " + ", ".join(TAINT_EFFECTS)
    out: list[dict[str, str]] = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        spec, sep, effect = item.rpartition(":")
        key, _, value = spec.partition("=")
        if not sep or effect not in TAINT_EFFECTS or not _QUALIFIED_NAME.match(key) or len(value) > 63:
            raise _fail(item, expected)
        out.append({"key": key, **({"value": value} if value else {}), "effect": effect})
    return out


def http_url(text: str) -> str:
    """An argparse type for a base URL: ``http(s)://host[:port][/path]``, returned unchanged."""
    expected = "an http:// or https:// URL with a host, e.g. http://prometheus.monitoring:9090"
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise _fail(text, expected)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        raise _fail(text, expected) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(text, expected)
    return text


def share(text: str) -> float:
    """An argparse type for a share of a whole: a finite number from 0 to 1 (0.5 = half)."""
    expected = "a share from 0 to 1 (0.5 = half)"
    try:
        value = float(text)
    except ValueError:
        raise _fail(text, expected) from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise _fail(text, expected)
    return value


def check(flag: str, kind: Callable[[str], Any], value: Any) -> Any:
    """Apply the argparse type ``kind`` to a value from elsewhere (an inventory), as if given as ``flag``.

    Returns the converted value.

    Raises:
        ValueError: ``"FLAG 'VALUE': expected ..."``, the wording argparse would use.
    """
    try:
        return kind(str(value))
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{flag} {exc}") from None


def listen_error(port: int, host: str = "0.0.0.0") -> str | None:
    """Why ``host:port`` cannot be listened on (``"cannot listen on HOST:PORT: ..."``), or None when it can.

    Binds and closes a probe socket with ``SO_REUSEADDR``, like the metrics
    servers do, so a port held by another process is found before the
    command has side effects. Port 0 (endpoint off) is never an error.
    """
    if not port:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None
