"""The runtime every gpufleet process shares: /healthz and /metrics on one port, the loop, the stop."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
from prometheus_client import CollectorRegistry, Counter

from gpufleet.controllers import runtime
from gpufleet.controllers.serve import Liveness, serve
from gpufleet.prom.server import free_port
from gpufleet.wait import poll_until


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
        fence = None

        def __init__(self, kube, name, namespace, timings):
            self.name, self.namespace = name, namespace
            made.append((kube, name, namespace, timings))

        def is_leader(self):
            return True

        def run(self, lead, stop, on_wait=None):
            lead(threading.Event())
            return True  # the Lease was lost

    monkeypatch.setattr(leader, "LeaderElector", Elector)
    ran: list[bool] = []
    class Kube:
        def fence_writes(self, fence):
            pass

    kube = Kube()
    code = runtime.run("test", lambda stop: ran.append(True), metrics_port=0, kube=kube, lease=("l", "ns"),
                       stop=threading.Event())
    assert code == 1 and ran == [True]
    assert made == [(kube, "l", "ns", leader.Timings())]


def test_with_a_lease_the_client_is_fenced_and_is_leader_follows_the_deadline_then_exit_1():
    """The loop's writes go through while leading; once the API server stops answering, the process stops
    acting at the renew deadline (``gpufleet_leader_is_leader`` 0, writes refused) and ``run`` returns 1."""
    from gpufleet.kube import KubeError, LeadershipLost
    from gpufleet.kube.leader import Timings

    from ..kube.leases import FakeLeaseApi

    api = FakeLeaseApi()
    registry = CollectorRegistry()
    timings = Timings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.2)
    leading, done = threading.Event(), threading.Event()
    refused: list[str] = []
    gauge: list[float] = []

    def is_leader() -> float | None:
        return registry.get_sample_value("gpufleet_leader_is_leader", {"lease": "ns/test-lease"})

    def loop(stop: threading.Event) -> None:
        leading.set()
        while not stop.is_set():
            try:
                api.patch("v1", "nodes", "n", {"spec": {}})
            except LeadershipLost as exc:
                refused.append(str(exc))
            except KubeError:
                pass
            stop.wait(0.05)
        time.sleep(0.5)  # slow to return: run waits one retry period for it, the gauge says 0 meanwhile
        try:
            api.patch("v1", "nodes", "n", {"spec": {}})  # one more write after the stop: refused, not sent
        except LeadershipLost as exc:
            refused.append(str(exc))
        done.set()

    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(runtime.run(
        "test", loop, metrics_port=0, registry=registry, kube=api, lease=("test-lease", "ns"), timings=timings)))
    assert is_leader() is None
    t.start()
    assert leading.wait(5)
    gauge.append(is_leader())
    api.hang()
    hung_at = time.monotonic()
    with contextlib.suppress(TimeoutError):  # the gauge's value is asserted below
        poll_until(lambda: is_leader() != 1.0, what="leadership lost", timeout=5, interval=0.005)
    gauge.append(is_leader())
    t.join(5)
    assert result == [1] and gauge == [1.0, 0.0]
    deadline = hung_at + timings.renew_deadline
    assert all(at <= deadline for at, method, _ in api.writes if method == "PATCH")
    assert done.wait(5)
    assert refused and "was lost (not renewed within the renew deadline (1 s))" in refused[-1]
    assert is_leader() is None  # unregistered with the elector
