"""The runtime every gpufleet process shares: /healthz and /metrics on one port, the loop, the stop."""

from __future__ import annotations

import threading

import httpx
from prometheus_client import CollectorRegistry, Counter

from gpufleet.controllers import runtime
from gpufleet.controllers.serve import Liveness, serve
from gpufleet.prom.server import free_port


def test_healthz_follows_the_liveness_and_metrics_are_served():
    registry = CollectorRegistry()
    Counter("gpufleet_test_things", "Things.", registry=registry).inc(3)
    now = [0.0]
    liveness = Liveness(max_age=60.0, clock=lambda: now[0])
    port = free_port()
    server = serve(registry, port=port, host="127.0.0.1", liveness=liveness)
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/healthz").status_code == 200
        now[0] = 61.0
        stalled = httpx.get(f"{base}/healthz")
        assert stalled.status_code == 503 and stalled.text == "stalled\n"
        liveness.beat()
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert "gpufleet_test_things_total 3.0" in httpx.get(f"{base}/metrics").text
    finally:
        server.shutdown()
        server.server_close()


def test_run_serves_while_the_loop_runs_and_returns_0_on_stop():
    port = free_port()
    stop = threading.Event()
    seen: list[int] = []

    def loop(loop_stop: threading.Event) -> None:
        seen.append(httpx.get(f"http://127.0.0.1:{port}/healthz").status_code)
        stop.set()
        loop_stop.wait(5)

    assert runtime.run("test", loop, metrics_port=port, host="127.0.0.1", stop=stop) == 0
    assert seen == [200]
    assert runtime.port_in_use("test", port, "127.0.0.1") is False  # the endpoint is closed again


def test_run_with_a_lease_runs_the_loop_through_leader_election_loaded_on_demand(monkeypatch):
    """The elector is imported inside run (the exporter never loads it); default timings when none given."""
    from gpufleet.kube import leader

    made: list[tuple] = []

    class Elector:
        def __init__(self, kube, name, namespace, timings):
            made.append((kube, name, namespace, timings))

        def run(self, lead, stop, on_wait=None):
            lead(threading.Event())
            return True  # the Lease was lost

    monkeypatch.setattr(leader, "LeaderElector", Elector)
    ran: list[bool] = []
    kube = object()
    code = runtime.run("test", lambda stop: ran.append(True), metrics_port=0, kube=kube, lease=("l", "ns"),
                       stop=threading.Event())
    assert code == 1 and ran == [True]
    assert made == [(kube, "l", "ns", leader.Timings())]
