"""The HTTP endpoint of every controller: ``/metrics`` (Prometheus) and ``/healthz``."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Liveness:
    """A heartbeat: the controller loop calls ``beat()``; ``/healthz`` fails when it is older than ``max_age`` seconds."""

    def __init__(self, max_age: float = 120.0):
        self.max_age = max_age
        self._last = time.monotonic()

    def beat(self) -> None:
        """Record that the loop made progress now."""
        self._last = time.monotonic()

    def ok(self) -> bool:
        """Whether the last beat is recent enough."""
        return time.monotonic() - self._last <= self.max_age


def serve(port: int, liveness: Liveness, registry: CollectorRegistry = REGISTRY, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``/metrics`` and ``/healthz`` on ``host:port`` in a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/healthz":
                ok = liveness.ok()
                body, code, ctype = (b"ok\n" if ok else b"stalled\n"), (200 if ok else 503), "text/plain"
            elif self.path == "/metrics":
                body, code, ctype = generate_latest(registry), 200, CONTENT_TYPE_LATEST
            else:
                body, code, ctype = b"not found\n", 404, "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
