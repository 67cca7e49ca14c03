"""Fault rules against a real Prometheus scraping the project's exporter on simulated nodes (no Kubernetes)."""

from __future__ import annotations

import time

import pytest

from gpufleet.node_health.faults import Queries, Rules, evaluate
from gpufleet.prom.client import PromClient, PromError
from gpufleet_workshop.sim.fleet import scrape_config, start_node
from gpufleet.prom.server import PrometheusNotFound, running_prometheus
from gpufleet.wait import poll_until

RULES = Rules(hot_samples=3, scrape_interval_seconds=1)
NODES = ("healthy", "hot", "xid", "links", "nics", "erroring", "blind")


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """Four simulated nodes and a Prometheus scraping them every second."""
    nodes = {n: start_node(n, workdir=tmp_path_factory.mktemp(n), roce=n == "nics")
             for n in NODES}
    try:
        with running_prometheus([scrape_config(list(nodes.values()))]) as prom:
            prom.wait_for_targets_up(len(nodes))
            yield nodes, prom
    except PrometheusNotFound as exc:
        pytest.skip(str(exc))
    finally:
        for n in nodes.values():
            n.stop()


def faults_now(prom) -> dict:
    client = PromClient(prom.url)
    now = time.time()
    results = {k: client.query(q, at=now) for k, q in Queries(RULES).all().items()}
    return evaluate(results, RULES, now, expected_gpus={n: 8 for n in NODES})


def wait_faults(prom, want: set[str], timeout: float = 20.0) -> dict:
    def found():
        got = faults_now(prom)
        return got if want <= set(got) else None

    return poll_until(found, what=f"faults {sorted(want)}", timeout=timeout, interval=0.5,
                      detail=lambda: f"found: {faults_now(prom)}")


def test_faults_from_real_series(sim):
    nodes, prom = sim
    time.sleep(2)
    assert faults_now(prom) == {}
    t0 = time.time()
    nodes["hot"].set_temperature(5, 84)
    nodes["xid"].raise_xid(2, 79)
    nodes["links"].add_nvlink_errors(0, 1, "crc_flit", 7)
    got = wait_faults(prom, {"hot", "xid", "links"})
    assert "healthy" not in got
    hot = got["hot"][0]
    assert hot.kind == "gpu_temp" and "GPU 5: 84, 84, 84 C > 78 C" in hot.detail
    # three samples at one second: the third is at least ~2 s after the change
    assert hot.since - t0 >= 1.5
    assert got["xid"][0].kind == "xid" and "XID 79" in got["xid"][0].detail
    assert got["links"][0].kind == "nvlink_errors" and "+7" in got["links"][0].detail


def test_lost_gpu_is_missing(sim):
    nodes, prom = sim
    nodes["healthy"].lose_gpu(7)
    got = wait_faults(prom, {"healthy"})
    assert got["healthy"][0].kind == "gpu_missing" and "GPU 7 (00000000:DB:00.0) lost" in got["healthy"][0].detail


def test_a_gpu_answering_nvml_with_errors_is_missing_named_by_its_bus_id(sim):
    nodes, prom = sim
    nodes["erroring"].fail_gpu_handle(2, "unknown")
    got = wait_faults(prom, {"erroring"})
    assert got["erroring"][0].kind == "gpu_missing"
    assert "GPU 2 (00000000:3A:00.0) answers NVML with errors" in got["erroring"][0].detail


def test_infiniband_and_roce_ports_each_have_their_rules(sim):
    """IBA link counters of a RoCE port are no InfiniBand fault; RoCE packet loss is a roce_errors fault."""
    nodes, prom = sim
    nics = nodes["nics"]
    nics.add_port_counter("mlx5_1", "symbol_error", 40)  # the RoCE HCA: IBA link counters mean nothing there
    time.sleep(3)
    assert "nics" not in faults_now(prom)
    nics.add_port_counter("mlx5_1", "out_of_sequence", 5, group="hw_counters")
    got = wait_faults(prom, {"nics"})
    assert [f.kind for f in got["nics"]] == ["roce_errors"]
    assert "counter=out_of_sequence" in got["nics"][0].detail and "hca=mlx5_1" in got["nics"][0].detail
    nics.add_port_counter("mlx5_0", "symbol_error", 2)  # the InfiniBand HCA
    poll_until(lambda: {f.kind for f in faults_now(prom).get("nics", [])} == {"roce_errors", "ib_errors"},
               what="roce and ib faults on nics", timeout=20, interval=0.5, detail=lambda: str(faults_now(prom)))


def test_prometheus_errors_are_clear():
    with pytest.raises(PromError, match="127.0.0.1:9"):
        PromClient("http://127.0.0.1:9", timeout=1).query("up")


def test_a_counter_saturated_before_the_first_scrape_is_an_infiniband_fault(tmp_path):
    """symbol_error at 65535 (16 bits) from the start never grows, yet counts as at least 65535 errors."""
    sat = start_node("saturated", workdir=tmp_path)
    sat.set_port_counter("mlx5_0", "symbol_error", 65535)
    try:
        with running_prometheus([scrape_config([sat])], workdir=tmp_path / "prometheus") as prom:
            prom.wait_for_targets_up(1)
            got = wait_faults(prom, {"saturated"})
            (fault,) = got["saturated"]
            assert fault.kind == "ib_errors"
            assert "symbol_error{hca=mlx5_0,port=1}=65535: at least 65535 errors" in fault.detail
            assert "InfiniBand errors in 300s" not in fault.detail  # no growth: the saturation rule found it
    except PrometheusNotFound as exc:
        pytest.skip(str(exc))
    finally:
        sat.stop()


def test_a_node_whose_exporter_stops_answering_has_absent_gpu_telemetry(sim):
    """No scrape, no GPU series (Prometheus marks them stale): the node cannot be seen, which is a fault."""
    nodes, prom = sim
    assert "blind" not in faults_now(prom)
    nodes["blind"].stop()
    got = wait_faults(prom, {"blind"})
    assert [(f.kind, f.detail) for f in got["blind"]] == [
        ("telemetry", "GPU telemetry absent: no gpufleet_gpu_* series in Prometheus, 8 GPUs expected")]
