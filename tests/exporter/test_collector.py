"""Collector behaviour that the expositions alone do not show: across scrapes, absence, degradation."""

from __future__ import annotations

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from gpufleet.exporter.collector import GpuCollector, InfiniBandCollector
from gpufleet.exporter.nvml_fake import FakeNvmlBackend
from gpufleet.sim.node import build_sysfs, hca, healthy_node, ib_counters, ib_port, node
from gpufleet.exporter.main import build_registry
from gpufleet.exporter.nvml import NvmlSampler


def registry_of(*collectors) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def test_data_counters_are_exported_in_bytes(tmp_path):
    build_sysfs(node("n", [], [hca("mlx5_0", [ib_port(counters=ib_counters(port_xmit_data=1000, port_rcv_data=7))])]), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    labels = {"hca": "mlx5_0", "port": "1"}
    assert reg.get_sample_value("gpufleet_infiniband_port_transmit_bytes_total", labels) == 4000
    assert reg.get_sample_value("gpufleet_infiniband_port_receive_bytes_total", labels) == 28


def test_missing_file_means_absent_series_not_zero(tmp_path):
    port = ib_port(hw_counters=None)
    del port["counters"]["symbol_error"]
    build_sysfs(node("n", [], [hca("mlx5_0", [port])]), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    labels = {"hca": "mlx5_0", "port": "1"}
    assert reg.get_sample_value("gpufleet_infiniband_port_symbol_errors_total", labels) is None
    assert reg.get_sample_value("gpufleet_infiniband_counter_saturated", {**labels, "counter": "symbol_error"}) is None
    assert reg.get_sample_value("gpufleet_infiniband_port_link_downed_total", labels) == 0


def test_read_errors_accumulate_per_file_and_scrape_goes_on(tmp_path):
    build_sysfs(node("n", [], [hca("mlx5_0", [ib_port(counters=ib_counters(symbol_error="bogus"))])]), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    err = {"file": "class/infiniband/mlx5_0/ports/1/counters/symbol_error", "reason": "malformed"}
    for scrape in (1, 2, 3):
        assert reg.get_sample_value("gpufleet_infiniband_read_errors_total", err) == scrape
    assert reg.get_sample_value("gpufleet_infiniband_port_state_id", {"hca": "mlx5_0", "port": "1"}) == 4  # scrape 4
    # The file heals: the series comes back, the error count stays.
    (tmp_path / err["file"]).write_text("5\n")
    assert reg.get_sample_value("gpufleet_infiniband_port_symbol_errors_total", {"hca": "mlx5_0", "port": "1"}) == 5
    assert reg.get_sample_value("gpufleet_infiniband_read_errors_total", err) == 4


def test_counter_values_are_fresh_each_scrape(tmp_path):
    build_sysfs(healthy_node(gpus=0, hcas=1, roce=False), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    labels = {"hca": "mlx5_0", "port": "1"}
    f = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/link_downed"
    for value in (0, 3, 255):
        f.write_text(f"{value}\n")
        assert reg.get_sample_value("gpufleet_infiniband_port_link_downed_total", labels) == value
    assert reg.get_sample_value("gpufleet_infiniband_counter_saturated", {**labels, "counter": "link_downed"}) == 1


def test_without_nvml_gpu_part_says_unavailable_and_infiniband_still_works(tmp_path):
    desc = healthy_node(gpus=2, hcas=1, roce=False)
    desc["nvml"] = "driver_not_loaded"
    build_sysfs(desc, tmp_path)
    sampler = NvmlSampler(FakeNvmlBackend(desc))
    reg = registry_of(InfiniBandCollector(tmp_path), GpuCollector(sampler))
    assert reg.get_sample_value("gpufleet_gpu_nvml_available") == 0
    assert reg.get_sample_value("gpufleet_gpu_devices") is None
    assert reg.get_sample_value("gpufleet_infiniband_port_state_id", {"hca": "mlx5_0", "port": "1"}) == 4
    assert sampler.init_error == "driver_not_loaded"


def test_real_pynvml_backend_without_driver_reports_unavailable(tmp_path):
    """This CI machine has no NVIDIA driver: the real backend must degrade, not crash."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here; this test covers the driverless case")
    from gpufleet.exporter.nvml import PynvmlBackend

    reg = build_registry(str(tmp_path), PynvmlBackend())
    assert reg.get_sample_value("gpufleet_gpu_nvml_available") == 0


def test_nvml_initialises_once_the_driver_appears():
    desc = healthy_node(gpus=1, hcas=0, roce=False)
    desc["nvml"] = "driver_not_loaded"
    backend = FakeNvmlBackend(desc)
    reg = registry_of(GpuCollector(NvmlSampler(backend)))
    assert reg.get_sample_value("gpufleet_gpu_nvml_available") == 0
    desc["nvml"] = "ok"
    assert reg.get_sample_value("gpufleet_gpu_nvml_available") == 1
    assert reg.get_sample_value("gpufleet_gpu_devices") == 1


def test_lost_gpu_is_reported_not_skipped():
    desc = healthy_node(gpus=3, hcas=0, roce=False)
    desc["gpus"][1]["lost"] = True
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    assert [reg.get_sample_value("gpufleet_gpu_lost", {"gpu": g}) for g in "012"] == [0, 1, 0]
    assert reg.get_sample_value("gpufleet_gpu_temperature_celsius", {"gpu": "1"}) is None
    assert reg.get_sample_value("gpufleet_gpu_temperature_celsius", {"gpu": "2"}) == 41


class LosesGpuMidScrape(FakeNvmlBackend):
    """A GPU that answers its handle but falls off the bus on the power query."""

    def power_milliwatts(self, handle):
        if handle == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super().power_milliwatts(handle)


def test_gpu_lost_during_a_scrape_is_reported_lost():
    reg = registry_of(GpuCollector(NvmlSampler(LosesGpuMidScrape(healthy_node(gpus=2, hcas=0, roce=False)))))
    assert reg.get_sample_value("gpufleet_gpu_lost", {"gpu": "0"}) == 1
    assert reg.get_sample_value("gpufleet_gpu_temperature_celsius", {"gpu": "0"}) is None
    assert reg.get_sample_value("gpufleet_gpu_lost", {"gpu": "1"}) == 0


def test_xid_events_are_counted_once_each_and_kept():
    desc = healthy_node(gpus=2, hcas=0, roce=False)
    desc["gpus"][1]["xids"] = [79, 48, 48]
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    for _ in range(3):
        assert reg.get_sample_value("gpufleet_gpu_xid_events_total", {"gpu": "1", "xid": "48"}) == 2
        assert reg.get_sample_value("gpufleet_gpu_xid_events_total", {"gpu": "1", "xid": "79"}) == 1
    assert reg.get_sample_value("gpufleet_gpu_xid_events_total", {"gpu": "0", "xid": "48"}) is None


def test_not_supported_values_are_absent_and_not_counted_as_errors():
    desc = healthy_node(gpus=1, hcas=0, roce=False)
    desc["gpus"][0].update(memory_temperature="[Not Supported]", power_watts="[N/A]", nvlinks=[])
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    assert reg.get_sample_value("gpufleet_gpu_memory_temperature_celsius", {"gpu": "0"}) is None
    assert reg.get_sample_value("gpufleet_gpu_power_watts", {"gpu": "0"}) is None
    assert reg.get_sample_value("gpufleet_gpu_retired_pages", {"gpu": "0", "cause": "double_bit_ecc"}) is None
    assert reg.get_sample_value("gpufleet_gpu_nvlink_up", {"gpu": "0", "link": "0"}) is None
    assert reg.get_sample_value("gpufleet_gpu_temperature_celsius", {"gpu": "0"}) == 41
    families = {f.name for f in reg.collect()}
    assert "gpufleet_gpu_nvml_errors" not in families


def test_nvlink_state_and_counters_per_link():
    desc = healthy_node(gpus=1, hcas=0, nvlinks=18, roce=False)
    desc["gpus"][0]["nvlinks"][17].update(up=False, replay=9, crc_data=2)
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    for _ in range(2):  # second scrape uses the cached link count
        assert reg.get_sample_value("gpufleet_gpu_nvlink_up", {"gpu": "0", "link": "17"}) == 0
        assert reg.get_sample_value("gpufleet_gpu_nvlink_up", {"gpu": "0", "link": "16"}) == 1
        assert reg.get_sample_value("gpufleet_gpu_nvlink_errors_total", {"gpu": "0", "link": "17", "type": "replay"}) == 9
        assert reg.get_sample_value("gpufleet_gpu_nvlink_errors_total", {"gpu": "0", "link": "17", "type": "crc_data"}) == 2
        assert reg.get_sample_value("gpufleet_gpu_nvlink_up", {"gpu": "0", "link": "18"}) is None
