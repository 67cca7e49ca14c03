"""The request stream of ``sim.flip``: real HTTP to the inference stand-in on loopback, and the figures it gives."""

from __future__ import annotations

import argparse
import io
import json
import threading
import time

import pytest

from gpufleet_workshop import inference_standin as inference_server
from gpufleet_workshop.sim import serving, traffic
from gpufleet_workshop.sim.traffic import Request


@pytest.fixture
def standin():
    """The stand-in serving on a free loopback port (5 ms per request); yields ``(port, drain)``."""
    args = argparse.Namespace(port=0, address="127.0.0.1", latency_ms=5.0, drain_seconds=0.3, cluster="here")
    server, drain = inference_server.make_server(args)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.server_address[1], drain
    server.shutdown()
    server.server_close()


def test_the_stand_in_says_who_served_and_drains_on_sigterm(standin, monkeypatch):
    port, drain = standin
    r = traffic.send("127.0.0.1", port, "/v1/completions", 2)
    assert r.ok and r.status == 200 and r.ms >= 5
    assert traffic.send("127.0.0.1", port, "/health", 2).status == 200
    drain()
    # Draining: readiness fails at once, requests are still served until the drain ends.
    assert traffic.send("127.0.0.1", port, "/health", 2).status == 503
    assert traffic.send("127.0.0.1", port, "/", 2).ok
    time.sleep(0.6)
    assert not traffic.send("127.0.0.1", port, "/", 1).ok


def test_an_open_loop_stream_records_every_request(standin):
    out, stop = io.StringIO(), threading.Event()
    threading.Timer(1.0, stop.set).start()
    sent = traffic.stream(f"http://127.0.0.1:{standin[0]}/", 40, out, stop)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert 35 <= sent <= 45 and len(lines) == sent
    assert all(x["ok"] and x["status"] == 200 for x in lines)


def test_a_request_nobody_answers_is_a_failure_not_an_exception():
    r = traffic.send("127.0.0.1", 1, "/", 1)
    assert not r.ok and r.status == 0 and "Connection" in r.error


@pytest.mark.parametrize("url, rate", [("https://x/", 1), ("x:80", 1), ("http://x/", 0)])
def test_bad_stream_input_is_refused_naming_the_flag(url, rate):
    with pytest.raises(ValueError, match="--url|--rate"):
        traffic.stream(url, rate, io.StringIO(), threading.Event())


def test_p99_is_the_nearest_rank():
    assert traffic.p99([]) is None
    assert traffic.p99(list(range(1, 101))) == 99
    assert traffic.p99([5.0]) == 5.0


def _req(t, ok=True, node="main-system", ms=10.0):
    return Request(t, ms, ok, 200 if ok else 0, node if ok else "", "" if ok else "TimeoutError")


def test_figures_split_steady_state_from_the_flip_and_in_cluster_from_outside():
    reqs = [_req(100.0, ms=10), _req(100.5, ms=12), _req(103.0, ms=50, node="other-system"), _req(104.0, ok=False),
            _req(120.0, ms=90)]
    got = serving.summarize(reqs, wall_t0=100.0, flip_from=2.0, flip_to=10.0, in_cluster_nodes={"main-system"})
    assert got == {"requests_total": 5, "requests_failed": 1, "latency_p99_ms_steady": 12.0,
                   "latency_p99_ms_flip": 50.0, "requests_served_in_cluster": 3, "requests_served_outside": 1}
    rps = serving.per_second(reqs, wall_t0=100.0, in_cluster_nodes={"main-system"})
    assert rps["t"][0] == 0 and len(rps["t"]) == 21
    assert (rps["in_cluster"][0], rps["outside"][3], rps["failed"][4], rps["in_cluster"][20]) == (2, 1, 1, 1)


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_req(2.0).__dict__) + "\n" + json.dumps(_req(1.0).__dict__) + "\n{\"t\": 3")
    assert [r.t for r in traffic.read(path)] == [1.0, 2.0]


@pytest.mark.parametrize("url, rate, timeout", [("http://x:port/", 1, 2), ("http://x/", float("nan"), 2),
                                                ("http://x/", float("inf"), 2), ("http://x/", 1, 0)])
def test_a_bad_port_rate_or_timeout_is_refused_naming_the_flag(url, rate, timeout):
    with pytest.raises(ValueError, match="--url|--rate|--timeout"):
        traffic.stream(url, rate, io.StringIO(), threading.Event(), timeout=timeout)


@pytest.mark.parametrize("body", [b"[1, 2]", b'{"node": 7}', b"not json"])
def test_any_200_body_is_recorded_with_no_node(body):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Other(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        r = traffic.send("127.0.0.1", server.server_address[1], "/", 2)
    finally:
        server.shutdown()
        server.server_close()
    assert r.ok and r.status == 200 and r.node == ""


@pytest.mark.parametrize("argv, flag", [(["--latency-ms", "-5"], "--latency-ms"), (["--latency-ms", "nan"], "--latency-ms"),
                                        (["--drain-seconds", "-1"], "--drain-seconds"), (["--port", "70000"], "--port")])
def test_the_stand_in_refuses_a_bad_flag_before_serving(argv, flag, capsys):
    parser = argparse.ArgumentParser()
    inference_server.add_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2 and flag in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--rate", "-1"], ["--rate", "inf"], ["--timeout", "0"]])
def test_the_stream_refuses_a_bad_flag(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        traffic.main(["--url", "http://127.0.0.1:1/", "--out", str(tmp_path / "r.jsonl"), *argv])
    assert exc.value.code == 2 and argv[0] in capsys.readouterr().err
