"""The stand-in's ``/metrics``: vLLM's names, a gauge of requests in flight, a counter of answered ones."""

from __future__ import annotations

import argparse
import contextlib
import threading
import urllib.request

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.wait import poll_until
from gpufleet_workshop import inference_standin as standin

LATENCY_MS = 500.0


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    standin.add_arguments(parser)
    args = parser.parse_args(["--address", "127.0.0.1", *argv])
    args.port = 0  # a free port (the flag asks for 1 to 65535)
    return args


@contextlib.contextmanager
def _serving(args: argparse.Namespace):
    """The stand-in for ``args`` serving in a thread; yields its base URL."""
    srv, _ = standin.make_server(args)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def server():
    """The stand-in on a free loopback port, LATENCY_MS per request, model ``m1``; yields its base URL."""
    with _serving(_args("--latency-ms", str(LATENCY_MS), "--model-name", "m1")) as base:
        yield base


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers["Content-Type"], r.read().decode()


def _samples(base: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of one scrape, parsed as Prometheus parses text format."""
    status, content_type, text = _get(base + standin.METRICS_PATH)
    assert status == 200 and content_type == CONTENT_TYPE_LATEST
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _running(base: str, model: str = "m1") -> float:
    return _samples(base)[(standin.REQUESTS_RUNNING, (("model_name", model),))]


def _answered(base: str, model: str = "m1") -> float:
    return _samples(base)[(standin.REQUEST_SUCCESS_TOTAL, (("model_name", model),))]


def test_the_metrics_are_vllms_names_in_text_format_and_start_at_zero(server):
    families = {f.name: f.type for f in text_string_to_metric_families(_get(server + "/metrics")[2])}
    assert families[standin.REQUESTS_RUNNING] == "gauge"
    assert families[standin.REQUEST_SUCCESS] == "counter"
    assert standin.REQUESTS_RUNNING == "vllm:num_requests_running"
    assert standin.REQUEST_SUCCESS_TOTAL == "vllm:request_success_total"
    assert _running(server) == 0 and _answered(server) == 0


def test_the_gauge_counts_requests_in_flight_and_the_counter_those_answered(server):
    threads = [threading.Thread(target=_get, args=(f"{server}/v1/completions",)) for _ in range(3)]
    for t in threads:
        t.start()
    # All three are in the model's time at once for LATENCY_MS: the gauge says so within it.
    poll_until(lambda: _running(server) == 3, what="3 requests in flight", timeout=LATENCY_MS / 1000.0, interval=0.01)
    assert _answered(server) == 0  # still in the model's time
    for t in threads:
        t.join(10)
    # The stand-in counts a request done after its answer is sent: the client may read it first.
    poll_until(lambda: _running(server) == 0 and _answered(server) == 3, what="3 requests answered", timeout=5,
               interval=0.01)


def test_health_and_metrics_are_not_requests(server):
    for path in ("/health", "/metrics", "/metrics?x=1"):
        assert _get(server + path)[0] == 200
    assert _running(server) == 0 and _answered(server) == 0


def test_the_model_name_defaults_to_standin():
    assert _args().model_name == standin.DEFAULT_MODEL_NAME == "standin"
    # As does a caller's namespace without model_name (one built before the flag existed).
    legacy = argparse.Namespace(port=0, address="127.0.0.1", latency_ms=0.0, drain_seconds=0.1, cluster="")
    with _serving(legacy) as base:
        _get(base + "/")
        assert _running(base, "standin") == 0 and _answered(base, "standin") == 1
