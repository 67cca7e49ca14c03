"""The offload cost ledger: GPU-seconds and cost outside by pool, on a fake clock, and the counters it serves."""

from __future__ import annotations

import copy

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import REGISTRY

from gpufleet.controllers.serve import serve
from gpufleet.prom.server import free_port
from gpufleet.virtual_kubelet.ledger import CURRENCY, Ledger, LedgerCollector, cost_of
from gpufleet.virtual_kubelet.pods import PodController
from gpufleet_workshop.rental.provider import SimulatedProvider

from .test_reflect import H100, Clock, FakeKube, pod


def rental(name="rental", price=3.6, clock=None, **kw) -> SimulatedProvider:
    return SimulatedProvider(name, gpus=16, gpu_product=H100, price_per_gpu_hour=price, node_name=f"vk-{name}",
                             clock=clock or Clock(), wall=lambda: 1_700_000_000.0, **kw)


def gpu_pod(name: str, uid: str, gpus: int) -> dict:
    p = pod(name, uid)
    p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = str(gpus)
    return p


def test_gpu_seconds_are_gpus_times_seconds_running_and_cost_is_that_over_3600_times_the_price():
    clock = Clock()
    a, b = rental("a", price=3.6), rental("b", price=1.8)
    ledger = Ledger(["a", "b"], clock=clock, register=False)
    assert set(ledger.totals()) == {"a", "b"}  # every pool's series from the start, at 0
    assert ledger.totals()["a"].gpu_seconds == 0 and ledger.totals()["a"].currency == CURRENCY
    clock.t = 10
    ledger.observe("u1", a, gpu_pod("p1", "u1", 2), "Pending")  # not running yet: nothing counts
    clock.t = 20
    ledger.observe("u1", a, gpu_pod("p1", "u1", 2), "Running")
    clock.t = 50
    ledger.observe("u1", a, gpu_pod("p1", "u1", 2), "Running")  # seen again: the interval is not restarted
    ledger.observe("u2", b, gpu_pod("p2", "u2", 4), "Running")
    clock.t = 80
    ledger.observe("u1", a, gpu_pod("p1", "u1", 2), "Succeeded")  # 2 GPUs x 60 s
    clock.t = 110  # u2 still open: 4 GPUs x 60 s so far
    t = ledger.totals()
    assert t["a"].gpu_seconds == pytest.approx(120) and t["a"].cost == pytest.approx(120 / 3600 * 3.6)
    assert t["b"].gpu_seconds == pytest.approx(240) and t["b"].cost == pytest.approx(240 / 3600 * 1.8)
    assert ledger.gpus_running() == {"b": 4}
    ledger.stopped("u2")
    ledger.stopped("u2")  # twice, or never opened: nothing
    ledger.stopped("never")
    clock.t = 500
    assert ledger.totals()["b"].gpu_seconds == pytest.approx(240)
    assert cost_of(3600, 2.5) == pytest.approx(2.5)


def test_close_freezes_the_open_intervals_and_opens_none_after():
    clock = Clock()
    prov = rental(clock=clock)
    ledger = Ledger(["rental"], clock=clock, register=False)
    ledger.running("u1", prov, gpu_pod("p1", "u1", 8))
    clock.t = 30
    ledger.close()
    ledger.running("u2", prov, gpu_pod("p2", "u2", 8))  # a reconcile still in flight at the stop
    clock.t = 90
    assert ledger.totals()["rental"].gpu_seconds == pytest.approx(240) and ledger.gpus_running() == {}


def test_a_fractional_gpu_request_is_left_out_not_raised(caplog):
    prov = rental()
    ledger = Ledger(["rental"], clock=Clock(), register=False)
    bad = gpu_pod("p1", "u1", 1)
    bad["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "500m"
    ledger.observe("u1", prov, bad, "Running")
    assert ledger.gpus_running() == {} and "inference/p1" in caplog.text


def test_the_collector_sums_ledgers_by_pool_as_two_counters():
    clock = Clock()
    registry = CollectorRegistry()
    collector = LedgerCollector()
    registry.register(collector)
    one, two = (Ledger(["rental"], clock=clock, register=False) for _ in range(2))
    collector.add(one)
    collector.add(two)
    prov = rental(clock=clock)
    one.running("u1", prov, gpu_pod("p1", "u1", 1))
    two.running("u2", prov, gpu_pod("p2", "u2", 2))
    clock.t = 100
    text = generate_latest(registry).decode()
    assert 'gpufleet_flip_external_gpu_seconds_total{pool="rental"} 300.0' in text
    assert 'gpufleet_flip_external_gpu_cost_total{currency="USD",pool="rental"} 0.3' in text
    assert "# TYPE gpufleet_flip_external_gpu_seconds_total counter" in text
    assert "# TYPE gpufleet_flip_external_gpu_cost_total counter" in text


def run(ctl: PodController, clock: Clock, until: float, step: float = 0.5) -> None:
    """Advance ``clock`` to ``until``, resyncing every second (the rental's notifier thread is not started here)
    and working every ready key, as the resync loop and the workers do."""
    while clock.t < until - 1e-9:
        clock.t = round(clock.t + step, 6)
        if clock.t == int(clock.t):
            ctl.resync()
        while (key := ctl.queue.get(timeout=0)) is not None:
            ctl.process(key)


def test_the_pod_side_counts_from_running_at_the_provider_to_the_remote_pods_end_and_serves_it():
    clock = Clock()
    prov = rental("ledger-pool", price=7.2, clock=clock, start_latency_seconds=5)
    ctl = PodController(FakeKube(), "vk-ledger-pool", {"ledger-pool": prov}, publish_endpoints=False, clock=clock)
    p = gpu_pod("p", "u1", 2)
    ctl.pods.apply("ADDED", p)
    ctl.pods.synced.set()
    run(ctl, clock, 4)
    assert ctl.ledger.gpus_running() == {}  # created there, still starting: not billed
    run(ctl, clock, 6)  # Running from t=5 (the rental's latency); seen at the next look
    assert ctl.ledger.gpus_running() == {"ledger-pool": 2}
    run(ctl, clock, 66)
    gone = copy.deepcopy(p)
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    ctl.pods.apply("MODIFIED", gone)
    run(ctl, clock, 67)
    assert ctl.ledger.gpus_running() == {}
    seconds = ctl.ledger.totals()["ledger-pool"].gpu_seconds
    assert 2 * 60 <= seconds <= 2 * 62  # 2 GPUs from Running (5 s to 6 s) to the remote pod's end (66 s to 67 s)
    run(ctl, clock, 100)
    assert ctl.ledger.totals()["ledger-pool"].gpu_seconds == seconds
    # Served on /metrics from the process' registry, as the virtual kubelet's runtime serves it.
    port = free_port()
    server = serve(REGISTRY, port=port, host="127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.shutdown()
        server.server_close()
    line = next(x for x in text.splitlines() if x.startswith('gpufleet_flip_external_gpu_seconds_total{pool="ledger-pool"}'))
    assert float(line.split()[-1]) == pytest.approx(seconds)
    cost = next(x for x in text.splitlines()
                if x.startswith('gpufleet_flip_external_gpu_cost_total{currency="USD",pool="ledger-pool"}'))
    assert float(cost.split()[-1]) == pytest.approx(seconds / 3600 * 7.2)


def test_read_totals_sums_the_counters_by_pool_from_a_real_prometheus(tmp_path):
    from gpufleet.prom.server import PrometheusNotFound, running_prometheus
    from gpufleet.virtual_kubelet.ledger import read_totals

    registry = CollectorRegistry()
    collector = LedgerCollector()
    registry.register(collector)
    clock = Clock()
    ledger = Ledger(["a", "b"], clock=clock, register=False)
    collector.add(ledger)
    ledger.running("u1", rental("a", price=3.6, clock=clock), gpu_pod("p1", "u1", 2))
    clock.t = 1800
    ledger.close()  # frozen: the scraped values do not move
    port = free_port()
    server = serve(registry, port=port, host="127.0.0.1")
    scrape = [{"job_name": "vk", "scrape_interval": "500ms", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
    try:
        with running_prometheus(scrape, workdir=tmp_path / "prometheus") as prom:
            prom.wait_for_targets_up(1)
            prom.wait_for('gpufleet_flip_external_gpu_cost_total{pool="b"}', timeout=20)
            totals = read_totals(prom)
    except PrometheusNotFound as exc:
        pytest.skip(str(exc))
    finally:
        server.shutdown()
        server.server_close()
    assert totals["a"].gpu_seconds == pytest.approx(3600) and totals["a"].cost == pytest.approx(3.6)
    assert totals["a"].currency == "USD" and totals["b"].gpu_seconds == 0


def test_read_windows_sums_each_windows_increase_at_its_end():
    from gpufleet.prom.client import PromError
    from gpufleet.virtual_kubelet.ledger import read_windows
    from gpufleet_workshop.testing.fakeprom import FakeProm

    prom = FakeProm()
    for span, seconds, cost in (("[600s]", "1200", "2.4"), ("[30s]", "60", "0.12")):
        prom.set(f"sum by (pool) (increase(gpufleet_flip_external_gpu_seconds_total{span}))",
                 [{"metric": {"pool": "rental"}, "value": [0, seconds]}])
        prom.set(f"sum by (pool, currency) (increase(gpufleet_flip_external_gpu_cost_total{span}))",
                 [{"metric": {"pool": "rental", "currency": "USD"}, "value": [0, cost]}])
    totals = read_windows(prom, [(1000.0, 1600.0), (2000.0, 2000.0), (3000.0, 3030.0)])
    assert totals["rental"].gpu_seconds == pytest.approx(1260) and totals["rental"].cost == pytest.approx(2.52)
    assert [at for _, at in prom.queries] == [1600.0, 1600.0, 3030.0, 3030.0], "each at its window's end; empty ones skipped"
    prom.fail()
    with pytest.raises(PromError):
        read_windows(prom, [(1000.0, 1600.0)])
