"""Collector behaviour that the expositions alone do not show: across scrapes, absence, degradation."""

from __future__ import annotations

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from gpufleet.exporter.collector import GpuCollector, InfiniBandCollector
from gpufleet.exporter.nvml_fake import FakeNvmlBackend
from gpufleet_workshop.fixtures.node import build_sysfs, hca, healthy_node, ib_counters, ib_port, node
from gpufleet.exporter.main import build_registry
from gpufleet.exporter.nvml import NvmlSampler


def registry_of(*collectors) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def value(reg, name: str, labels: dict[str, str]) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels`` (None: no such sample).

    ``reg`` is a registry (scraped now) or a list of families (one scrape kept).
    """
    families = list(reg.collect()) if isinstance(reg, CollectorRegistry) else reg
    found = [s.value for f in families for s in f.samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
    return found[0] if found else None


def test_data_counters_are_exported_in_bytes(tmp_path):
    build_sysfs(node("n", [], [hca("mlx5_0", [ib_port(counters=ib_counters(port_xmit_data=1000, port_rcv_data=7))])]), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    labels = {"hca": "mlx5_0", "port": "1"}
    assert value(reg, "gpufleet_infiniband_port_transmit_bytes_total", labels) == 4000
    assert value(reg, "gpufleet_infiniband_port_receive_bytes_total", labels) == 28


def test_missing_file_means_absent_series_not_zero(tmp_path):
    port = ib_port(hw_counters=None)
    del port["counters"]["symbol_error"]
    build_sysfs(node("n", [], [hca("mlx5_0", [port])]), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    labels = {"hca": "mlx5_0", "port": "1"}
    assert value(reg, "gpufleet_infiniband_port_symbol_errors_total", labels) is None
    assert value(reg, "gpufleet_infiniband_counter_saturated", {**labels, "counter": "symbol_error"}) is None
    assert value(reg, "gpufleet_infiniband_port_link_downed_total", labels) == 0


def test_read_errors_accumulate_per_file_and_scrape_goes_on(tmp_path):
    build_sysfs(node("n", [], [hca("mlx5_0", [ib_port(counters=ib_counters(symbol_error="bogus"))])]), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    err = {"file": "class/infiniband/mlx5_0/ports/1/counters/symbol_error", "reason": "malformed"}
    for scrape in (1, 2, 3):
        assert value(reg, "gpufleet_infiniband_read_errors_total", err) == scrape
    assert value(reg, "gpufleet_infiniband_port_state_id", {"hca": "mlx5_0", "port": "1"}) == 4  # scrape 4
    # The file heals: the series comes back, the error count stays.
    (tmp_path / err["file"]).write_text("5\n")
    assert value(reg, "gpufleet_infiniband_port_symbol_errors_total", {"hca": "mlx5_0", "port": "1"}) == 5
    assert value(reg, "gpufleet_infiniband_read_errors_total", err) == 4


def test_counter_values_are_fresh_each_scrape(tmp_path):
    build_sysfs(healthy_node(gpus=0, hcas=1, roce=False), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    labels = {"hca": "mlx5_0", "port": "1"}
    f = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/link_downed"
    for count in (0, 3, 255):
        f.write_text(f"{count}\n")
        assert value(reg, "gpufleet_infiniband_port_link_downed_total", labels) == count
    assert value(reg, "gpufleet_infiniband_counter_saturated", {**labels, "counter": "link_downed"}) == 1


def test_without_nvml_gpu_part_says_unavailable_and_infiniband_still_works(tmp_path):
    desc = healthy_node(gpus=2, hcas=1, roce=False)
    desc["nvml"] = "driver_not_loaded"
    build_sysfs(desc, tmp_path)
    sampler = NvmlSampler(FakeNvmlBackend(desc))
    reg = registry_of(InfiniBandCollector(tmp_path), GpuCollector(sampler))
    assert value(reg, "gpufleet_gpu_nvml_available", {}) == 0
    assert value(reg, "gpufleet_gpu_devices", {}) is None
    assert value(reg, "gpufleet_infiniband_port_state_id", {"hca": "mlx5_0", "port": "1"}) == 4
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
    assert value(reg, "gpufleet_gpu_nvml_available", {}) == 0


def test_nvml_initialises_once_the_driver_appears():
    desc = healthy_node(gpus=1, hcas=0, roce=False)
    desc["nvml"] = "driver_not_loaded"
    backend = FakeNvmlBackend(desc)
    reg = registry_of(GpuCollector(NvmlSampler(backend)))
    assert value(reg, "gpufleet_gpu_nvml_available", {}) == 0
    desc["nvml"] = "ok"
    assert value(reg, "gpufleet_gpu_nvml_available", {}) == 1
    assert value(reg, "gpufleet_gpu_devices", {}) == 1


def test_lost_gpu_is_reported_not_skipped():
    desc = healthy_node(gpus=3, hcas=0, roce=False)
    desc["gpus"][1]["lost"] = True
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    assert [value(reg, "gpufleet_gpu_lost", {"gpu": g}) for g in "012"] == [0, 1, 0]
    assert value(reg, "gpufleet_gpu_temperature_celsius", {"gpu": "1"}) is None
    assert value(reg, "gpufleet_gpu_temperature_celsius", {"gpu": "2"}) == 41


class LosesGpuMidScrape(FakeNvmlBackend):
    """A GPU that answers its handle but falls off the bus on the power query."""

    def power_milliwatts(self, handle):
        if handle == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super().power_milliwatts(handle)


def test_gpu_lost_during_a_scrape_is_reported_lost():
    reg = registry_of(GpuCollector(NvmlSampler(LosesGpuMidScrape(healthy_node(gpus=2, hcas=0, roce=False)))))
    assert value(reg, "gpufleet_gpu_lost", {"gpu": "0"}) == 1
    assert value(reg, "gpufleet_gpu_temperature_celsius", {"gpu": "0"}) is None
    assert value(reg, "gpufleet_gpu_lost", {"gpu": "1"}) == 0


def test_xid_events_are_counted_once_each_and_kept():
    desc = healthy_node(gpus=2, hcas=0, roce=False)
    desc["gpus"][1]["xids"] = [79, 48, 48]
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    for _ in range(3):
        assert value(reg, "gpufleet_gpu_xid_events_total", {"gpu": "1", "xid": "48"}) == 2
        assert value(reg, "gpufleet_gpu_xid_events_total", {"gpu": "1", "xid": "79"}) == 1
    assert value(reg, "gpufleet_gpu_xid_events_total", {"gpu": "0", "xid": "48"}) is None


def test_not_supported_values_are_absent_and_not_counted_as_errors():
    desc = healthy_node(gpus=1, hcas=0, roce=False)
    desc["gpus"][0].update(memory_temperature="[Not Supported]", power_watts="[N/A]", nvlinks=[])
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    assert value(reg, "gpufleet_gpu_memory_temperature_celsius", {"gpu": "0"}) is None
    assert value(reg, "gpufleet_gpu_power_watts", {"gpu": "0"}) is None
    assert value(reg, "gpufleet_gpu_retired_pages", {"gpu": "0", "cause": "double_bit_ecc"}) is None
    assert value(reg, "gpufleet_gpu_nvlink_up", {"gpu": "0", "link": "0"}) is None
    assert value(reg, "gpufleet_gpu_temperature_celsius", {"gpu": "0"}) == 41
    families = {f.name for f in reg.collect()}
    assert "gpufleet_gpu_nvml_errors" not in families


def test_nvlink_state_and_counters_per_link():
    desc = healthy_node(gpus=1, hcas=0, nvlinks=18, roce=False)
    desc["gpus"][0]["nvlinks"][17].update(up=False, replay=9, crc_data=2)
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    for _ in range(2):  # second scrape uses the cached link count
        assert value(reg, "gpufleet_gpu_nvlink_up", {"gpu": "0", "link": "17"}) == 0
        assert value(reg, "gpufleet_gpu_nvlink_up", {"gpu": "0", "link": "16"}) == 1
        assert value(reg, "gpufleet_gpu_nvlink_errors_total", {"gpu": "0", "link": "17", "type": "replay"}) == 9
        assert value(reg, "gpufleet_gpu_nvlink_errors_total", {"gpu": "0", "link": "17", "type": "crc_data"}) == 2
        assert value(reg, "gpufleet_gpu_nvlink_up", {"gpu": "0", "link": "18"}) is None


# --------------------------------------------------------------------------- GPU identity and NVML errors


def gpu_families(reg: CollectorRegistry) -> list:
    return [f for f in reg.collect() if f.name.startswith("gpufleet_gpu_") and any("gpu" in s.labels for s in f.samples)]


def test_every_gpu_series_carries_its_bus_id_and_uuid():
    desc = healthy_node(gpus=2, hcas=0, nvlinks=2, roce=False)
    desc["gpus"][1]["xids"] = [48]
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    families = gpu_families(reg)
    assert {f.name for f in families} >= {"gpufleet_gpu_temperature_celsius", "gpufleet_gpu_nvlink_errors",
                                          "gpufleet_gpu_xid_events", "gpufleet_gpu_lost", "gpufleet_gpu_erroring"}
    identity = {str(g["index"]): (g["uuid"], g["pci_bus_id"]) for g in desc["gpus"]}
    for family in families:
        for sample in family.samples:
            assert (sample.labels["uuid"], sample.labels["pci_bus_id"]) == identity[sample.labels["gpu"]], (family.name, sample)


def test_a_handle_error_other_than_lost_marks_the_gpu_erroring_named_by_its_bus_id(tmp_path):
    """nvidia-smi's "Unknown Error" on the handle: lost stays 0, erroring 1, the bus id from the PCI bus."""
    from gpufleet_workshop.fixtures.node import nvml_errors_node, write_node

    paths = write_node(nvml_errors_node(), tmp_path / "n")
    reg = list(build_registry(str(paths.sysfs_root), FakeNvmlBackend(paths.description)).collect())
    assert value(reg, "gpufleet_gpu_erroring", {"gpu": "1", "pci_bus_id": "00000000:2A:00.0"}) == 1
    assert value(reg, "gpufleet_gpu_lost", {"gpu": "1"}) == 0
    assert value(reg, "gpufleet_gpu_nvml_errors_total", {"gpu": "1", "call": "device_handle", "error": "unknown"}) == 1
    assert value(reg, "gpufleet_gpu_temperature_celsius", {"gpu": "1"}) is None
    # Every value read of GPU 2 fails: a fault, not silence; its identity still reads.
    assert value(reg, "gpufleet_gpu_erroring", {"gpu": "2", "uuid": nvml_errors_node()["gpus"][2]["uuid"]}) == 1
    assert value(reg, "gpufleet_gpu_nvml_errors_total", {"gpu": "2", "call": "temperature", "error": "unknown"}) == 1
    assert value(reg, "gpufleet_gpu_erroring", {"gpu": "0"}) == 0
    assert value(reg, "gpufleet_gpu_temperature_celsius", {"gpu": "0"}) == 78


class HandleFailsLater(FakeNvmlBackend):
    """GPU 0 answers the first scrape, then its handle fails with NVML_ERROR_UNKNOWN."""

    scrapes = 0

    def device_count(self):
        self.scrapes += 1
        return super().device_count()

    def device_handle(self, index):
        if index == 0 and self.scrapes > 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return super().device_handle(index)


def test_a_gpu_keeps_its_identity_after_its_handle_fails():
    desc = healthy_node(gpus=1, hcas=0, nvlinks=0, roce=False)
    reg = registry_of(GpuCollector(NvmlSampler(HandleFailsLater(desc))))
    ident = {"gpu": "0", "uuid": desc["gpus"][0]["uuid"], "pci_bus_id": desc["gpus"][0]["pci_bus_id"]}
    assert value(reg, "gpufleet_gpu_erroring", ident) == 0
    assert value(reg, "gpufleet_gpu_erroring", ident) == 1


class RaisesInOneCall(FakeNvmlBackend):
    """A binding bug: the power call raises a plain Python error, not an NVMLError."""

    def power_milliwatts(self, handle):
        raise ValueError("invalid literal for int() with base 10: b'\\xff'")


def test_one_failing_call_of_any_kind_never_fails_the_scrape():
    reg = list(registry_of(GpuCollector(NvmlSampler(RaisesInOneCall(healthy_node(gpus=2, hcas=0, nvlinks=1,
                                                                                  roce=False))))).collect())
    assert value(reg, "gpufleet_gpu_power_watts", {"gpu": "0"}) is None
    assert value(reg, "gpufleet_gpu_temperature_celsius", {"gpu": "1"}) == 41
    assert value(reg, "gpufleet_gpu_nvml_errors_total", {"gpu": "0", "call": "power_usage", "error": "exception_valueerror"}) == 1
    assert value(reg, "gpufleet_gpu_erroring", {"gpu": "0"}) == 0  # other reads answer


def test_a_gpu_whose_values_are_all_unsupported_is_not_erroring():
    desc = healthy_node(gpus=1, hcas=0, nvlinks=0, roce=False)
    gpu = desc["gpus"][0]
    gpu.update(temperature="[N/A]", memory_temperature="[N/A]", power_watts="[N/A]", clocks_event_reasons="[N/A]",
               ecc={}, remapped_rows="[N/A]")
    reg = registry_of(GpuCollector(NvmlSampler(FakeNvmlBackend(desc))))
    assert value(reg, "gpufleet_gpu_erroring", {"gpu": "0"}) == 0
    assert value(reg, "gpufleet_gpu_nvml_errors_total", {"gpu": "0"}) is None


# --------------------------------------------------------------------------- InfiniBand shapes


def test_every_port_series_carries_its_link_layer(tmp_path):
    from gpufleet_workshop.fixtures.node import ib_shapes_node

    build_sysfs(ib_shapes_node(), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))
    for family in reg.collect():
        for sample in family.samples:
            if "port" in sample.labels:
                want = "InfiniBand" if sample.labels["hca"] in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3") else "Ethernet"
                assert sample.labels["link_layer"] == want, (family.name, sample)


def test_infiniband_shapes_of_real_drivers(tmp_path):
    """Down port, counters_ext/, *_64 twins, no counters/, no PMA: values where there are some, no read errors."""
    from gpufleet_workshop.fixtures.node import ib_shapes_node

    build_sysfs(ib_shapes_node(), tmp_path)
    reg = registry_of(InfiniBandCollector(tmp_path))

    def port(hca):
        return {"hca": hca, "port": "1"}

    assert value(reg, "gpufleet_infiniband_read_errors_total", {}) is None
    # A down port reading "0 GB/sec": rate 0, no width.
    assert value(reg, "gpufleet_infiniband_port_rate_bytes_per_second", port("mlx5_3")) == 0
    assert value(reg, "gpufleet_infiniband_port_active_width_lanes", port("mlx5_3")) is None
    assert value(reg, "gpufleet_infiniband_port_active_width_lanes", port("mlx5_0")) == 4
    assert value(reg, "gpufleet_infiniband_port_active_width_lanes", port("rxe0")) == 1
    # 64-bit counters win, in bytes: counters_ext/ (old mlx OFED) and *_64 files beside the 32-bit ones.
    assert value(reg, "gpufleet_infiniband_port_transmit_bytes_total", port("mlx5_1")) == 2345678901234 * 4
    assert value(reg, "gpufleet_infiniband_port_receive_bytes_total", port("mlx5_1")) == 1234567890123 * 4
    assert value(reg, "gpufleet_infiniband_port_transmit_unicast_packets_total", port("mlx5_1")) == 8765432109
    assert value(reg, "gpufleet_infiniband_counter_saturated", {**port("mlx5_1"), "counter": "port_xmit_data"}) == 0
    assert value(reg, "gpufleet_infiniband_port_transmit_bytes_total", port("mlx5_2")) == 5000000000 * 4
    assert value(reg, "gpufleet_infiniband_port_receive_bytes_total", port("mlx5_2")) == 6000000000 * 4
    assert value(reg, "gpufleet_infiniband_port_pma_stat_total", {**port("mlx5_2"), "counter": "port_xmit_data_64"}) is None
    # irdma: no counters/ at all, its hw_counters still exported.
    assert value(reg, "gpufleet_infiniband_port_transmit_bytes_total", port("irdma0")) is None
    assert value(reg, "gpufleet_infiniband_port_hw_stat_total", {**port("irdma0"), "counter": "cnpHandled"}) == 7
    # rxe without a PMA: every counter "N/A (no PMA)": no series, counted as unsupported, not as errors.
    assert value(reg, "gpufleet_infiniband_port_symbol_errors_total", port("rxe0")) is None
    assert value(reg, "gpufleet_infiniband_port_unsupported_files", port("rxe0")) == 17
    assert value(reg, "gpufleet_infiniband_port_unsupported_files", port("mlx5_0")) == 0


@pytest.mark.parametrize(
    ("hca_name", "table", "data_source", "transmit_bytes"),
    [
        ("mlx4_0", "basic", "counters", 1073741000 * 4),
        ("mlx4_1", "extended", "counters", 2345678901234 * 4),
        ("mlx4_2", "basic", "counters_ext", 2345678901234 * 4),
        ("mlx5_0", "extended", "counters", 2345678901234 * 4),  # not the stale counters_ext/ 0
        ("mlx5_1", "basic", "counters", ((1 << 32) - 1) * 4),
        ("mlx5_2", "absent", "counters_ext", 2345678901234 * 4),
        ("mlx5_3", "absent", "", None),
    ],
)
def test_counter_tables_export_the_kernel_abis_choice_and_say_where_from(tmp_path, hca_name, table, data_source,
                                                                          transmit_bytes):
    from gpufleet_workshop.fixtures.node import ib_tables_node

    build_sysfs(ib_tables_node(), tmp_path)
    families = list(registry_of(InfiniBandCollector(tmp_path)).collect())
    port = {"hca": hca_name, "port": "1"}
    assert value(families, "gpufleet_infiniband_port_counters_info",
                 {**port, "table": table, "data_source": data_source}) == 1
    assert value(families, "gpufleet_infiniband_port_transmit_bytes_total", port) == transmit_bytes
    assert value(families, "gpufleet_infiniband_read_errors_total", {}) is None
    assert not [s for f in families for s in f.samples if s.labels.get("counter", "").startswith("counters_ext/")]


def test_a_stale_counters_ext_is_not_exported_beside_the_extended_table(tmp_path):
    from gpufleet_workshop.fixtures.node import ib_tables_node

    build_sysfs(ib_tables_node(), tmp_path)
    families = list(registry_of(InfiniBandCollector(tmp_path)).collect())
    port = {"hca": "mlx5_0", "port": "1"}
    assert value(families, "gpufleet_infiniband_port_transmit_packets_total", port) == 8765432109
    assert value(families, "gpufleet_infiniband_port_receive_multicast_packets_total", port) == 12
    assert value(families, "gpufleet_infiniband_counter_saturated", {**port, "counter": "port_xmit_data"}) == 0
    # PortCounters alone has no unicast counters: no series rather than a borrowed value.
    assert value(families, "gpufleet_infiniband_port_transmit_unicast_packets_total", {"hca": "mlx4_0"}) is None
    assert value(families, "gpufleet_infiniband_counter_saturated", {"hca": "mlx5_1", "counter": "port_xmit_data"}) == 1
