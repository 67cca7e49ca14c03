"""``gpufleet-standin``: an HTTP server standing in for a model server, for the local environment.

It answers what a load balancer and a client of an inference server see:

- ``GET /health``: 200 while serving, 503 once it is draining (a readiness
  probe's target);
- any other ``GET`` or ``POST``: after ``--latency-ms`` milliseconds (the
  model's time per request), 200 with a JSON body naming who served it:
  ``{"pod": ..., "node": ..., "cluster": ...}`` from ``$POD_NAME``,
  ``$NODE_NAME`` (the downward API) and ``--cluster``.

On SIGTERM it does what a well-behaved server behind a Service does during
its termination grace period: readiness fails at once, requests keep being
served for ``--drain-seconds`` (endpoints take a moment to leave every data
plane), then it exits 0.

The field has servers enough; this one exists because it must start in a
fraction of a second, need nothing beyond Python and gpufleet's plumbing, and
say who answered. It uses only the standard library's threading HTTP server.

It is a test workload, not part of the product: it ships in the workshop
package and in gpufleet's workshop image (gpufleet's image with the workshop's
run-time part as one more layer, :mod:`gpufleet_workshop.local.workshop_image`),
whose console script :data:`COMMAND` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpufleet import cliargs

#: The console script that runs it (a container's ``command``; what the simulated rental recognises).
COMMAND = "gpufleet-standin"
#: Where a virtual kubelet's provider may say which cluster or rental serves the pod.
CLUSTER_ENV = "GPUFLEET_SERVED_BY"
#: ``--latency-ms``: a finite number of milliseconds >= 0 (a negative sleep would fail every request).
milliseconds = cliargs.number_type(positive=False, unit="milliseconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's flags."""
    parser.add_argument("--port", type=cliargs.port, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--address", default="0.0.0.0",
                        help="address to listen on (default all of the pod's: a pod's network namespace is its own)")
    parser.add_argument("--latency-ms", type=milliseconds, default=20.0,
                        help="milliseconds each request takes (default 20)")
    parser.add_argument("--drain-seconds", type=cliargs.nonnegative_seconds, default=5.0,
                        help="seconds to keep serving after SIGTERM, readiness failing (default 5)")
    parser.add_argument("--cluster", default=os.environ.get(CLUSTER_ENV, ""),
                        help=f"what to report as the serving cluster (default ${CLUSTER_ENV})")


class _State:
    draining = False


def _handler(latency: float, identity: bytes, state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            if self.path.startswith("/health"):
                self._reply(503 if state.draining else 200, b'{"draining": true}' if state.draining else b"{}")
                return
            time.sleep(latency)
            self._reply(200, identity)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self.do_GET()

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet: one line per request is noise
            return

    return Handler


def make_server(args: argparse.Namespace) -> tuple[ThreadingHTTPServer, Callable[[], None]]:
    """The server for ``args`` (bound, not yet serving) and its drain function (what SIGTERM calls).

    Raises:
        OSError: the port cannot be bound.
    """
    state = _State()
    identity = json.dumps({"pod": os.environ.get("POD_NAME", ""), "node": os.environ.get("NODE_NAME", ""),
                           "cluster": args.cluster}).encode()
    server = ThreadingHTTPServer((args.address, args.port), _handler(args.latency_ms / 1000.0, identity, state))
    server.daemon_threads = True

    def drain() -> None:
        state.draining = True
        threading.Timer(args.drain_seconds, server.shutdown).start()

    return server, drain


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM (+ ``--drain-seconds``) or SIGINT; returns 0.

    Raises:
        OSError: the port cannot be bound.
    """
    server, drain = make_server(args)
    signal.signal(signal.SIGTERM, lambda *_: drain())
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``gpufleet-standin`` console script: parse ``argv`` (default ``sys.argv[1:]``) and :func:`run`."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0].split(": ", 1)[1])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
