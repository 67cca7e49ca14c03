"""The HTTP endpoint of every gpufleet process: ``/healthz`` (liveness) and ``/metrics`` (Prometheus).

One server for the exporter and the controllers: prometheus_client's
threaded WSGI server with TCP_NODELAY on every connection and the lean
exposition writer (:mod:`gpufleet.controllers.exposition`, gzip level 1
when the scraper accepts it). ``/healthz`` answers 200 while the process's
:class:`Liveness` is fresh (always, when it has none) and 503 once its loop
stalled; every other path is the exposition (node_exporter answers any path
too).
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from .exposition import CONTENT_TYPE, GZIP_LEVEL, render_text


class Liveness:
    """A heartbeat: the controller loop calls ``beat()``; ``/healthz`` fails when it is older than ``max_age`` seconds."""

    def __init__(self, max_age: float = 120.0, clock: Callable[[], float] = time.monotonic):
        self.max_age = max_age
        self._clock = clock
        self._last = clock()

    def beat(self) -> None:
        """Record that the loop made progress now."""
        self._last = self._clock()

    def ok(self) -> bool:
        """Whether the last beat is recent enough."""
        return self._clock() - self._last <= self.max_age


class NoDelayWSGIServer(ThreadingWSGIServer):
    """prometheus_client's threaded WSGI server with TCP_NODELAY on every connection.

    wsgiref writes the headers and the body in separate sends; with Nagle's
    algorithm the body then waits for the peer's delayed ACK (~40 ms on
    Linux), which alone would exceed a 50 ms scrape budget.
    """

    def get_request(self) -> tuple[socket.socket, object]:
        """Accept a connection and switch Nagle off on it."""
        conn, addr = super().get_request()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr


def make_app(registry: CollectorRegistry = REGISTRY,
             liveness: Liveness | None = None) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    """WSGI app: ``/healthz`` from ``liveness``, any other path ``render_text(registry)`` (gzip level 1 when accepted).

    Errors while collecting become a 500 with the exception text (the
    collectors themselves never raise for bad files or NVML errors).
    """

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        head = environ.get("REQUEST_METHOD", "GET") == "HEAD"
        if environ.get("PATH_INFO") == "/healthz":
            ok = liveness is None or liveness.ok()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [] if head else [b"ok\n" if ok else b"stalled\n"]
        try:
            body = render_text(registry)
        except Exception as exc:  # noqa: BLE001 - report, do not kill the server thread
            message = f"collect failed: {type(exc).__name__}: {exc}\n".encode()
            start_response("500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")])
            return [message]
        headers = [("Content-Type", CONTENT_TYPE)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [] if head else [body]

    return app


def serve(registry: CollectorRegistry = REGISTRY, *, port: int, host: str = "0.0.0.0",
          liveness: Liveness | None = None) -> WSGIServer:
    """Serve ``/metrics`` and ``/healthz`` on ``host:port`` from a daemon thread; returns the server (``shutdown()``).

    IPv6 when ``host`` contains a colon.

    Raises:
        OSError: the address cannot be bound (port in use, no such address).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (NoDelayWSGIServer,), {"address_family": family})
    httpd = make_server(host, port, make_app(registry, liveness), server_class, handler_class=_SilentHandler)
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd
