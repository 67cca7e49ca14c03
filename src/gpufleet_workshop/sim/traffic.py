"""A steady stream of HTTP requests through a Service, each one recorded: the client side of ``sim.flip``.

Open loop, as users are: request ``i`` is sent at ``start + i / rate``
whether or not earlier ones have answered (a closed loop would slow down
exactly when the service does and hide the failure). Each request opens a
new connection, so the Service's data plane chooses an endpoint for every
request, as it does for a fleet of clients; it is not retried: a retry
would hide what a user without one sees.

Run it where the Service's data plane is (``python -m gpufleet_workshop.sim.traffic
--url http://<ClusterIP>:<port>/ --rate 50 --out requests.jsonl`` inside
the local data plane's namespace, :func:`gpufleet_workshop.local.dataplane.exec_argv`);
it sends until SIGTERM or SIGINT and writes one JSON line per request:
``{"t": <send time, Unix seconds>, "ms": <latency, ms>, "ok": <2xx>,
"status": <HTTP status or 0>, "node": <serving node or "">, "error": <text or "">}``.

:func:`read` loads such a file; :func:`summarize` computes the figures
``sim.flip`` reports.

The standard library's ``http.client`` is enough here: load generators of
the field (wrk, vegeta, k6) are not packaged for this machine's Python and
would need their own output parsing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet import cliargs

#: Seconds a request may take before it counts as failed (the client's timeout; ``--timeout``).
TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class Request:
    """One request as recorded: ``t`` (send time, Unix seconds), ``ms`` (latency), ``ok``, ``status``, ``node``, ``error``."""

    t: float
    ms: float
    ok: bool
    status: int
    node: str
    error: str


def send(host: str, port: int, path: str, timeout: float) -> Request:
    """One GET over a new connection, ``timeout`` seconds at most; never raises (a failure is a :class:`Request`
    with ``ok`` False). ``node`` is the ``"node"`` of a 200's JSON object body, "" otherwise."""
    t = time.time()
    began = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        body = resp.read()
        node = ""
        if resp.status == 200:
            try:
                answer = json.loads(body)
            except ValueError:
                answer = None
            # Another server behind the Service may answer any JSON: only a string "node" names who served.
            if isinstance(answer, dict) and isinstance(answer.get("node"), str):
                node = answer["node"]
        return Request(t, (time.monotonic() - began) * 1000, 200 <= resp.status < 300, resp.status, node, "")
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a host name IDNA refuses
        return Request(t, (time.monotonic() - began) * 1000, False, 0, "", f"{type(exc).__name__}: {exc}"[:200])
    finally:
        conn.close()


def stream(url: str, rate: float, out, stop: threading.Event, *, timeout: float = TIMEOUT_SECONDS) -> int:
    """Send ``rate`` requests per second to ``url`` until ``stop``, each allowed ``timeout`` seconds; write each
    as a JSON line to the text file ``out``.

    Returns the number of requests sent.

    Raises:
        ValueError: ``url`` is not ``http://host[:port]/path``, or ``rate`` or ``timeout`` is not a finite
            positive number.
    """
    parts = urlsplit(url)
    try:
        port = parts.port or 80
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(f"--url {url!r}: expected http://HOST[:PORT]/PATH")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"--rate {rate}: expected a positive number of requests per second")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"--timeout {timeout}: expected a positive number of seconds")
    host = parts.hostname
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lock = threading.Lock()

    def one() -> None:
        r = send(host, port, path, timeout)
        with lock:
            out.write(json.dumps(r.__dict__) + "\n")

    start = time.monotonic()
    i = 0
    # Enough workers for every request in flight for a whole timeout, so the open loop never waits on a worker.
    with ThreadPoolExecutor(max_workers=max(8, int(rate * timeout * 1.5))) as pool:
        while not stop.is_set():
            due = start + i / rate
            if (wait := due - time.monotonic()) > 0:
                if stop.wait(wait):
                    break
            pool.submit(one)
            i += 1
            if i % max(1, int(rate)) == 0:
                with lock:
                    out.flush()
    out.flush()
    return i


def read(path: Path) -> list[Request]:
    """The requests recorded in ``path`` (a torn last line is skipped), in send order."""
    reqs = []
    for line in Path(path).read_text().splitlines():
        try:
            reqs.append(Request(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return sorted(reqs, key=lambda r: r.t)


def p99(values: list[float]) -> float | None:
    """The 99th percentile (nearest rank) of ``values``, None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, -(-99 * len(s) // 100) - 1))]


def main(argv: list[str] | None = None) -> int:
    """``python -m gpufleet_workshop.sim.traffic``: stream until SIGTERM or SIGINT; 0, or 2 on a bad flag (on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m gpufleet_workshop.sim.traffic", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="http://HOST:PORT/PATH to send to (a Service's ClusterIP)")
    parser.add_argument("--rate", type=cliargs.positive_number, default=50.0, help="requests per second (default 50)")
    parser.add_argument("--timeout", type=cliargs.positive_seconds, default=TIMEOUT_SECONDS,
                        help=f"seconds a request may take (default {TIMEOUT_SECONDS:g})")
    parser.add_argument("--out", required=True, type=Path, help="JSON-lines file to write")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with args.out.open("a") as out:
        try:
            stream(args.url, args.rate, out, stop, timeout=args.timeout)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
