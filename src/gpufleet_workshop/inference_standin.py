"""``gpufleet-standin``: an HTTP server standing in for a model server, for the local environment.

It answers what a load balancer and a client of an inference server see:

- ``GET /health``: 200 while serving, 503 once it is draining (a readiness
  probe's target);
- ``GET /metrics``: Prometheus text format (:data:`METRICS_PATH`), below;
- any other ``GET`` or ``POST``: after ``--latency-ms`` milliseconds (the
  model's time per request), 200 with a JSON body naming who served it:
  ``{"pod": ..., "node": ..., "cluster": ...}`` from ``$POD_NAME``,
  ``$NODE_NAME`` (the downward API) and ``--cluster``.

Its metrics are vLLM's, under vLLM's own names, so that one query scales a
real vLLM deployment and the stand-in alike: the inference role scales on
the sum of :data:`REQUESTS_RUNNING` by default (KEDA, through Prometheus,
which scrapes the Service's endpoints).

- :data:`REQUESTS_RUNNING` (``vllm:num_requests_running``, a gauge):
  requests being served now, from the start of the model's time to the
  answer;
- :data:`REQUEST_SUCCESS` (``vllm:request_success``, a counter, exposed as
  :data:`REQUEST_SUCCESS_TOTAL`): requests answered.

Both carry label :data:`MODEL_NAME_LABEL` (``--model-name``). vLLM's series
carry more labels (an engine index; the counter a finish reason); a query
that sums over them, as scaling does, reads both alike. ``/health`` and
``/metrics`` are not requests to the model and are not counted.

On SIGTERM it does what a well-behaved server behind a Service does during
its termination grace period: readiness fails at once, requests keep being
served for ``--drain-seconds`` (endpoints take a moment to leave every data
plane), then it exits 0.

The field has servers enough; this one exists because it must start in a
fraction of a second, need nothing beyond Python and gpufleet's plumbing, and
say who answered. It uses only the standard library's threading HTTP server,
and ``prometheus_client`` (gpufleet's dependency) for the exposition.

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

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from gpufleet import cliargs

#: The console script that runs it (a container's ``command``; what the simulated rental recognises).
COMMAND = "gpufleet-standin"
#: Where a virtual kubelet's provider may say which cluster or rental serves the pod.
CLUSTER_ENV = "GPUFLEET_SERVED_BY"
#: ``--latency-ms``: a finite number of milliseconds >= 0 (a negative sleep would fail every request).
milliseconds = cliargs.number_type(positive=False, unit="milliseconds")
#: Path of the Prometheus exposition.
METRICS_PATH = "/metrics"
#: vLLM's gauge of the requests being served now (what inference scales on).
REQUESTS_RUNNING = "vllm:num_requests_running"
#: vLLM's counter of answered requests (the name given to ``prometheus_client``) and its series' name.
REQUEST_SUCCESS = "vllm:request_success"
REQUEST_SUCCESS_TOTAL = f"{REQUEST_SUCCESS}_total"
#: The label both carry: the served model's name (vLLM's ``--served-model-name``; here ``--model-name``).
MODEL_NAME_LABEL = "model_name"
#: ``--model-name``'s default.
DEFAULT_MODEL_NAME = "standin"


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
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME,
                        help=f"value of the metrics' {MODEL_NAME_LABEL} label (default {DEFAULT_MODEL_NAME})")


class _State:
    draining = False


class _Metrics:
    """One server's metrics, in a registry of its own (two servers in one process never share a series)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.running = Gauge(REQUESTS_RUNNING, "Requests being served now.", [MODEL_NAME_LABEL],
                             registry=self.registry).labels(model_name)
        self.success = Counter(REQUEST_SUCCESS, "Requests answered.", [MODEL_NAME_LABEL],
                               registry=self.registry).labels(model_name)


def _handler(latency: float, identity: bytes, state: _State, metrics: _Metrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            if self.path.startswith("/health"):
                self._reply(503 if state.draining else 200, b'{"draining": true}' if state.draining else b"{}")
                return
            if self.path.split("?", 1)[0] == METRICS_PATH:
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
                return
            metrics.running.inc()
            try:
                time.sleep(latency)
                self._reply(200, identity)
                metrics.success.inc()
            finally:
                metrics.running.dec()

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

    ``args`` holds :func:`add_arguments`' flags; without ``model_name`` (a caller that predates
    ``--model-name``) the label is :data:`DEFAULT_MODEL_NAME`.

    Raises:
        OSError: the port cannot be bound.
    """
    state = _State()
    identity = json.dumps({"pod": os.environ.get("POD_NAME", ""), "node": os.environ.get("NODE_NAME", ""),
                           "cluster": args.cluster}).encode()
    metrics = _Metrics(getattr(args, "model_name", DEFAULT_MODEL_NAME))
    server = ThreadingHTTPServer((args.address, args.port),
                                 _handler(args.latency_ms / 1000.0, identity, state, metrics))
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
