"""Per-collector health on the served /metrics: success and last-success time (node_exporter's
``node_scrape_collector_success`` convention), what node health and alerts read to tell a node whose
telemetry stopped from a healthy one."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.controllers.serve import serve
from gpufleet.exporter import sysfs
from gpufleet.exporter.collector import GpuCollector, InfiniBandCollector
from gpufleet.exporter.main import ExporterSelfCollector, build_registry
from gpufleet.exporter.nvml import NvmlSampler
from gpufleet.exporter.nvml_fake import FakeNvmlBackend
from gpufleet.prom.server import free_port
from gpufleet_workshop.fixtures.node import build_sysfs, h100_gpu, hca, healthy_node, node, no_nvml_node, write_node

SUCCESS = "gpufleet_exporter_collector_success"
LAST = "gpufleet_exporter_collector_last_success_timestamp_seconds"


def health(text: str) -> dict[tuple[str, str], float]:
    """``{(metric, collector): value}`` of the two health gauges in an exposition."""
    return {(s.name, s.labels["collector"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name in (SUCCESS, LAST)}


def scrape_served(desc, tmp_path) -> dict[tuple[str, str], float]:
    paths = write_node(desc, tmp_path / "n")
    registry = build_registry(str(paths.sysfs_root), FakeNvmlBackend(paths.description), self_metrics=True)
    port = free_port()
    httpd = serve(registry, port=port, host="127.0.0.1")
    try:
        return health(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_healthy_node_serves_success_and_the_time_of_it_for_each_collector(tmp_path):
    import time

    before = time.time()
    got = scrape_served(healthy_node(gpus=2, hcas=1, nvlinks=2, roce=False), tmp_path)
    assert got[(SUCCESS, "infiniband")] == 1 and got[(SUCCESS, "nvml")] == 1
    assert before <= got[(LAST, "infiniband")] <= time.time()
    assert before <= got[(LAST, "nvml")] <= time.time()


def test_without_nvml_the_gpu_collector_fails_and_has_no_last_success(tmp_path):
    got = scrape_served(no_nvml_node(), tmp_path)
    assert got[(SUCCESS, "nvml")] == 0 and (LAST, "nvml") not in got
    assert got[(SUCCESS, "infiniband")] == 1


def test_every_gpu_erroring_is_a_failed_collect_one_is_not(tmp_path):
    all_bad = node("bad", [h100_gpu(0, nvlinks=2, handle_error="unknown"), h100_gpu(1, nvlinks=2, read_error="unknown")],
                   [hca("mlx5_0")])
    assert scrape_served(all_bad, tmp_path / "all")[(SUCCESS, "nvml")] == 0
    one_bad = node("one", [h100_gpu(0, nvlinks=2, handle_error="unknown"), h100_gpu(1, nvlinks=2)], [hca("mlx5_0")])
    assert scrape_served(one_bad, tmp_path / "one")[(SUCCESS, "nvml")] == 1


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def self_scrape(collectors: dict) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors.values():
        registry.register(collector)
    registry.register(ExporterSelfCollector(collectors))
    from gpufleet.controllers.exposition import render_text

    return health(render_text(registry).decode())


def test_infiniband_fails_when_the_class_cannot_be_listed_and_succeeds_when_it_is_absent(tmp_path):
    clock = Clock()
    ib = InfiniBandCollector(tmp_path, clock=clock)
    assert self_scrape({"infiniband": ib}) == {(SUCCESS, "infiniband"): 1, (LAST, "infiniband"): 1_000.0}  # no HCAs
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "infiniband").write_text("not a folder\n")
    clock.now = 1_060.0
    assert self_scrape({"infiniband": ib}) == {(SUCCESS, "infiniband"): 0, (LAST, "infiniband"): 1_000.0}


def test_a_collect_that_raises_is_a_failure_and_the_scrape_goes_on(tmp_path, monkeypatch):
    build_sysfs(healthy_node(gpus=1, hcas=1, nvlinks=2, roce=False), tmp_path)
    clock = Clock()
    ib = InfiniBandCollector(tmp_path, clock=clock)
    desc = healthy_node(gpus=1, hcas=0, nvlinks=2, roce=False)
    gpu = GpuCollector(NvmlSampler(FakeNvmlBackend(desc)), clock=clock)
    assert self_scrape({"infiniband": ib, "nvml": gpu})[(SUCCESS, "infiniband")] == 1

    def broken(root):
        raise RuntimeError("bug")

    monkeypatch.setattr(sysfs, "read_infiniband", broken)
    clock.now = 1_030.0
    got = self_scrape({"infiniband": ib, "nvml": gpu})
    assert got[(SUCCESS, "infiniband")] == 0 and got[(LAST, "infiniband")] == 1_000.0
    assert got[(SUCCESS, "nvml")] == 1 and got[(LAST, "nvml")] == 1_030.0


@pytest.mark.parametrize("name", [SUCCESS, LAST])
def test_the_health_gauges_are_documented_where_the_exporter_metrics_are(name):
    from gpufleet import paths

    assert name in (paths.REPO_ROOT / "roles" / "gpu_metrics" / "README.md").read_text()
