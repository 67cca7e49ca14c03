"""Prometheus collectors: fresh metric families from sysfs and NVML on every scrape.

Two custom collectors (prometheus/client_python "custom collectors"): each
``collect()`` reads its source now and yields new metric families, so there
is no shared mutable metric state besides the cumulative error counters.

Naming follows ``gpufleet_<subsystem>_<name>`` with the unit in the name and
``_total`` on counters; enums are ``*_id`` gauges whose help lists the codes;
each metric has one fixed label set. A value the source does not offer
(missing file, NVML "not supported") gives no series, never a zero.

Each collector also keeps whether its last collect read its source and when
it last did (:attr:`InfiniBandCollector.last_success`,
:attr:`~InfiniBandCollector.last_success_timestamp`), which the exporter
serves as ``gpufleet_exporter_collector_success`` and
``gpufleet_exporter_collector_last_success_timestamp_seconds``.

Building ~1,500 samples per scrape is the exporter's main cost, so samples
are appended as ready ``Sample`` tuples whose label sets
(:class:`gpufleet.controllers.exposition.Labels`) are made once per port,
GPU and counter and reused from scrape to scrape.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gpufleet.controllers.exposition import LabelSets
from gpufleet.exporter import sysfs
from gpufleet.exporter.nvml import CLOCKS_EVENT_REASONS, GpuSample, NvmlSampler

NAMESPACE = "gpufleet"

log = logging.getLogger(__name__)

#: ``Sample(name, labels, value)`` without the keyword-default machinery of a NamedTuple call.
_new = tuple.__new__

#: ``counters/`` files exported as named metrics: file -> (metric name without
#: namespace, help, multiplier to the metric's unit). Help texts paraphrase the
#: kernel ABI (Documentation/ABI/stable/sysfs-class-infiniband) and IBA vol. 1.
PORT_COUNTERS: dict[str, tuple[str, str, int]] = {
    "port_xmit_data": (
        "infiniband_port_transmit_bytes_total",
        "Data octets transmitted on all VLs (IBA PortXmitData; sysfs counts 4-octet units, multiplied by 4 here; "
        "64-bit where the port has a 64-bit counter: the kernel's extended counters/ table, else "
        "counters/port_xmit_data_64 or the deprecated counters_ext/; see gpufleet_infiniband_port_counters_info).",
        sysfs.DATA_OCTETS_PER_UNIT,
    ),
    "port_rcv_data": (
        "infiniband_port_receive_bytes_total",
        "Data octets received on all VLs (IBA PortRcvData; sysfs counts 4-octet units, multiplied by 4 here; "
        "64-bit where the port has a 64-bit counter: the kernel's extended counters/ table, else "
        "counters/port_rcv_data_64 or the deprecated counters_ext/; see gpufleet_infiniband_port_counters_info).",
        sysfs.DATA_OCTETS_PER_UNIT,
    ),
    "port_xmit_packets": ("infiniband_port_transmit_packets_total", "Packets transmitted on all VLs (IBA PortXmitPkts).", 1),
    "port_rcv_packets": ("infiniband_port_receive_packets_total", "Packets received on all VLs (IBA PortRcvPkts).", 1),
    "unicast_xmit_packets": ("infiniband_port_transmit_unicast_packets_total", "Unicast packets transmitted (IBA PortUnicastXmitPkts).", 1),
    "unicast_rcv_packets": ("infiniband_port_receive_unicast_packets_total", "Unicast packets received (IBA PortUnicastRcvPkts).", 1),
    "multicast_xmit_packets": ("infiniband_port_transmit_multicast_packets_total", "Multicast packets transmitted (IBA PortMulticastXmitPkts).", 1),
    "multicast_rcv_packets": ("infiniband_port_receive_multicast_packets_total", "Multicast packets received (IBA PortMulticastRcvPkts).", 1),
    "port_xmit_wait": (
        "infiniband_port_transmit_wait_total",
        "Ticks during which the port had data to transmit but sent none (IBA PortXmitWait; congestion/back-pressure).",
        1,
    ),
    "symbol_error": ("infiniband_port_symbol_errors_total", "Minor link errors detected on one or more physical lanes (IBA SymbolErrorCounter, 16-bit).", 1),
    "link_error_recovery": (
        "infiniband_port_link_error_recovery_total",
        "Successful link error recovery processes (IBA LinkErrorRecoveryCounter, 8-bit).",
        1,
    ),
    "link_downed": (
        "infiniband_port_link_downed_total",
        "Failed link error recoveries that took the link down (IBA LinkDownedCounter, 8-bit).",
        1,
    ),
    "port_rcv_errors": ("infiniband_port_receive_errors_total", "Received packets containing an error (IBA PortRcvErrors, 16-bit).", 1),
    "port_rcv_remote_physical_errors": (
        "infiniband_port_receive_remote_physical_errors_total",
        "Received packets marked with the EBP delimiter (IBA PortRcvRemotePhysicalErrors, 16-bit).",
        1,
    ),
    "port_rcv_switch_relay_errors": (
        "infiniband_port_receive_switch_relay_errors_total",
        "Received packets discarded because they could not be forwarded (IBA PortRcvSwitchRelayErrors, 16-bit).",
        1,
    ),
    "port_xmit_discards": (
        "infiniband_port_transmit_discards_total",
        "Outbound packets discarded because the port was down or congested (IBA PortXmitDiscards, 16-bit).",
        1,
    ),
    "port_xmit_constraint_errors": (
        "infiniband_port_transmit_constraint_errors_total",
        "Packets not transmitted due to outbound raw filtering or partition enforcement (IBA, 8-bit).",
        1,
    ),
    "port_rcv_constraint_errors": (
        "infiniband_port_receive_constraint_errors_total",
        "Packets received and discarded due to inbound raw filtering or partition enforcement (IBA, 8-bit).",
        1,
    ),
    "local_link_integrity_errors": (
        "infiniband_port_local_link_integrity_errors_total",
        "Times the local physical error count exceeded its threshold (IBA LocalLinkIntegrityErrors, 4-bit).",
        1,
    ),
    "excessive_buffer_overrun_errors": (
        "infiniband_port_excessive_buffer_overrun_errors_total",
        "Consecutive flow-control update periods with buffer overrun (IBA ExcessiveBufferOverrunErrors, 4-bit).",
        1,
    ),
    "VL15_dropped": ("infiniband_port_vl15_dropped_total", "Incoming VL15 (subnet management) packets dropped (IBA VL15Dropped, 16-bit).", 1),
}

PORT_STATE_HELP = (
    "Logical port state from sysfs 'state' (IBA PortState): "
    "1=DOWN, 2=INIT, 3=ARMED, 4=ACTIVE, 5=ACTIVE_DEFER. Healthy is 4."
)
PHYS_STATE_HELP = (
    "Physical port state from sysfs 'phys_state' (IBA PortPhysicalState): "
    "1=Sleep, 2=Polling, 3=Disabled, 4=PortConfigurationTraining, 5=LinkUp, "
    "6=LinkErrorRecovery, 7=PhyTest. Healthy is 5."
)

#: Every port series carries the port's link layer (``InfiniBand``, ``Ethernet`` for RoCE,
#: '' when the kernel has no ``link_layer`` file), so alerts and node health keep the two apart.
_PORT_LABELS = ["hca", "port", "link_layer"]
#: Every GPU series carries the NVML index and the GPU's stable identity, as
#: dcgm-exporter's ``gpu``/``UUID``/``pci_bus_id`` labels do: an index moves when
#: a GPU drops off the bus, the UUID and bus id do not. Empty when never read.
_GPU_LABELS = ["gpu", "uuid", "pci_bus_id"]


def _name(suffix: str) -> str:
    return f"{NAMESPACE}_{suffix}"


def _nonempty(families: list[Metric]) -> Iterator[Metric]:
    """Yield only families that have samples: a source that offers nothing gives no family."""
    for family in families:
        if family.samples:
            yield family


class _SourceHealth:
    """Whether a collector's last collect read its source, and when it last did (Unix seconds)."""

    last_success: bool | None
    last_success_timestamp: float | None
    last_duration_seconds: float
    clock: Callable[[], float]

    def _init_health(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        #: True/False after each collect (None before the first).
        self.last_success = None
        #: ``clock()`` at the end of the last successful collect (None before the first).
        self.last_success_timestamp = None
        self.last_duration_seconds = 0.0

    def _record(self, ok: bool, start: float) -> None:
        self.last_success = ok
        if ok:
            self.last_success_timestamp = self.clock()
        self.last_duration_seconds = time.perf_counter() - start


class InfiniBandCollector(_SourceHealth, Collector):
    """Collects ``gpufleet_infiniband_*`` from ``<sysfs_root>/class/infiniband``.

    Args:
        sysfs_root: sysfs mount point (``/sys``; a fixture tree in tests).
        clock: Unix time in seconds, for :attr:`last_success_timestamp`.

    One bad file never fails the scrape: its series is absent and
    ``gpufleet_infiniband_read_errors_total{file}`` counts the failure. A file
    the device cannot answer (``N/A (no PMA)``, EINVAL...) is no error: its
    series is absent and ``gpufleet_infiniband_port_unsupported_files`` counts it.
    A collect succeeds (:attr:`last_success`) when ``class/infiniband`` could be
    listed or does not exist (a node without HCAs); it fails when the listing
    fails or the collect raised (logged; the scrape goes on without these families).
    """

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys", clock: Callable[[], float] = time.time) -> None:
        self.sysfs_root = sysfs_root
        self._read_errors: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._labels = _InfiniBandLabels()
        self._init_health(clock)

    def collect(self) -> Iterator[Metric]:
        """Read sysfs now and yield the families (see module docs for naming)."""
        start = time.perf_counter()
        try:
            data = sysfs.read_infiniband(self.sysfs_root)
            with self._lock:
                for error in data.errors:
                    self._read_errors[(error.path, error.reason)] += 1
                read_errors = sorted(self._read_errors.items())
            families = _InfiniBandFamilies(self._labels)
            for device in data.devices:
                families.add_device(device)
            self._labels.rotate()
            out = list(_nonempty([*families.in_order(), _read_errors_family(read_errors)]))
        except Exception:  # noqa: BLE001 - one collector's bug must not fail the whole scrape
            log.exception("infiniband collector failed")
            self._record(False, start)
            return
        self._record(data.listed, start)
        yield from out


class _InfiniBandLabels:
    """The label sets of the InfiniBand families, kept across scrapes (:class:`LabelSets`)."""

    def __init__(self) -> None:
        self.hca_info = LabelSets(["hca", "board_id", "fw_ver", "hca_type", "node_guid"])
        self.port = LabelSets(_PORT_LABELS)
        self.port_info = LabelSets([*_PORT_LABELS, "rate", "speed"])
        self.counters_info = LabelSets([*_PORT_LABELS, "table", "data_source"])
        self.counter = LabelSets([*_PORT_LABELS, "counter"])

    def rotate(self) -> None:
        """End of a scrape (:meth:`LabelSets.rotate`)."""
        for sets in (self.hca_info, self.port, self.port_info, self.counters_info, self.counter):
            sets.rotate()


class _InfiniBandFamilies:
    """The ``gpufleet_infiniband_*`` families of one scrape, filled one HCA at a time."""

    def __init__(self, labels: _InfiniBandLabels) -> None:
        self.labels = labels
        self.info = InfoMetricFamily(_name("infiniband_hca"), "HCA identification from sysfs (board_id, fw_ver, hca_type, node_guid); value 1.", labels=["hca"])
        self.port_info = InfoMetricFamily(
            _name("infiniband_port"),
            "Port rate text as the kernel prints it and the per-lane speed name (NDR, HDR...; '' when not printed); value 1.",
            labels=_PORT_LABELS,
        )
        self.counters_info = InfoMetricFamily(
            _name("infiniband_port_counters"),
            "Where the port's counters come from; value 1. 'table' is what the kernel's counters/ is "
            "(get_counter_table, drivers/infiniband/core/sysfs.c): 'extended' = PortCountersExtended (unicast_* "
            "present, data and packet counters 64-bit), 'basic' = PortCounters (32-bit data and packet counters, "
            "or the 64-bit no-IETF variant), 'absent' = no counters/. 'data_source' lists the directories the data "
            "and packet counters were read from: 'counters', 'counters_64' (counters/*_64 twins), 'counters_ext' "
            "(deprecated 64-bit directory of old out-of-tree drivers, used only beside a basic or absent table); "
            "'' when none.",
            labels=_PORT_LABELS,
        )
        self.width = GaugeMetricFamily(
            _name("infiniband_port_active_width_lanes"),
            "Active link width in lanes from sysfs 'rate' (the 4 of '(4X NDR)'); absent when the kernel prints none "
            "(a down port). A port trained at fewer lanes than cabled runs at a fraction of its rate.",
            labels=_PORT_LABELS,
        )
        self.unsupported = GaugeMetricFamily(
            _name("infiniband_port_unsupported_files"),
            "Files of the port that exist but offer no value this scrape ('N/A (no PMA)' of devices without a "
            "performance-management agent, reads refused with EINVAL/EOPNOTSUPP/ENOSYS/ENODATA, e.g. the rate of a "
            "down port). Their series are absent; not read errors.",
            labels=_PORT_LABELS,
        )
        self.state = GaugeMetricFamily(_name("infiniband_port_state_id"), PORT_STATE_HELP, labels=_PORT_LABELS)
        self.phys = GaugeMetricFamily(_name("infiniband_port_physical_state_id"), PHYS_STATE_HELP, labels=_PORT_LABELS)
        self.rate = GaugeMetricFamily(
            _name("infiniband_port_rate_bytes_per_second"),
            "Port data rate from sysfs 'rate' (e.g. '400 Gb/sec (4X NDR)'), in bytes per second (Gb/s * 1e9 / 8); "
            "0 for a port reading '0 GB/sec' (no link).",
            labels=_PORT_LABELS,
        )
        self.named = {
            file: CounterMetricFamily(_name(metric), help_text, labels=_PORT_LABELS)
            for file, (metric, help_text, _) in PORT_COUNTERS.items()
        }
        self.other = CounterMetricFamily(
            _name("infiniband_port_pma_stat_total"),
            "Files under ports/<port>/counters/ (IBA PMA) without a named metric here (raw value, unit as the file counts).",
            labels=[*_PORT_LABELS, "counter"],
        )
        self.hw = CounterMetricFamily(
            _name("infiniband_port_hw_stat_total"),
            "Driver statistics under ports/<port>/hw_counters/ (kernel rdma_hw_stats, e.g. mlx5 out_of_buffer, np_cnp_sent), raw values.",
            labels=[*_PORT_LABELS, "counter"],
        )
        self.saturated = GaugeMetricFamily(
            _name("infiniband_counter_saturated"),
            "1 when an IBA PMA counter sits at its width's maximum (all-ones; IB counters stop there instead "
            "of wrapping: 4/8/16-bit error counters, 32-bit data counters without extended counters), so its rate "
            "reads flat while errors may continue; reset the counters (perfquery -x -R). 0 otherwise.",
            labels=[*_PORT_LABELS, "counter"],
        )

    def add_device(self, device: sysfs.InfiniBandDevice) -> None:
        """Add one HCA's identification and each of its ports' state, rate, counters and saturation."""
        labels = self.labels
        info = self.info
        info.samples.append(_new(Sample, (info.name + "_info", labels.hca_info[
            (device.name, device.board_id or "", device.fw_ver or "", device.hca_type or "", device.node_guid or "")],
            1, None, None, None)))
        named = {file: (family.samples.append, family.name + "_total", PORT_COUNTERS[file][2])
                 for file, family in self.named.items()}
        other, other_name = self.other.samples.append, self.other.name + "_total"
        hw, hw_name = self.hw.samples.append, self.hw.name + "_total"
        saturated, saturated_name = self.saturated.samples.append, self.saturated.name
        counter_labels = labels.counter.__getitem__
        is_saturated = sysfs.is_saturated
        for port in device.ports:
            key = (device.name, str(port.port), port.link_layer or "")
            plabels = labels.port[key]
            if port.link_layer is not None or port.rate_text is not None:
                self.port_info.samples.append(_new(Sample, (self.port_info.name + "_info", labels.port_info[
                    (*key, port.rate_text or "", port.speed or "")], 1, None, None, None)))
            if port.table is not None:
                self.counters_info.samples.append(_new(Sample, (self.counters_info.name + "_info", labels.counters_info[
                    (*key, port.table, _data_source(port))], 1, None, None, None)))
            if port.width is not None:
                self.width.samples.append(_new(Sample, (self.width.name, plabels, port.width, None, None, None)))
            self.unsupported.samples.append(_new(Sample, (self.unsupported.name, plabels, len(port.unsupported),
                                                          None, None, None)))
            if port.state is not None:
                self.state.samples.append(_new(Sample, (self.state.name, plabels, port.state.code, None, None, None)))
            if port.phys_state is not None:
                self.phys.samples.append(_new(Sample, (self.phys.name, plabels, port.phys_state.code, None, None, None)))
            if port.rate_bytes_per_second is not None:
                self.rate.samples.append(_new(Sample, (self.rate.name, plabels, port.rate_bytes_per_second,
                                                       None, None, None)))
            for file, value in port.counters.items():
                clabels = counter_labels((*key, file))
                target = named.get(file)
                if target is not None:
                    target[0](_new(Sample, (target[1], plabels, value * target[2], None, None, None)))
                else:
                    other(_new(Sample, (other_name, clabels, value, None, None, None)))
                flag = is_saturated(file, value, port)
                if flag is not None:
                    saturated(_new(Sample, (saturated_name, clabels, 1 if flag else 0, None, None, None)))
            if port.hw_counters:
                for file, value in port.hw_counters.items():
                    hw(_new(Sample, (hw_name, counter_labels((*key, file)), value, None, None, None)))

    def in_order(self) -> list[Metric]:
        """The families in exposition order."""
        return [self.info, self.port_info, self.counters_info, self.state, self.phys, self.rate, self.width,
                *self.named.values(), self.other, self.hw, self.saturated, self.unsupported]


#: Counters whose source depends on the port's counter table (data and packet counters).
_TABLE_DEPENDENT = sysfs.EXTENDABLE_COUNTERS | sysfs.EXTENDED_ONLY_COUNTERS


def _data_source(port: sysfs.InfiniBandPort) -> str:
    """The directories the port's data and packet counters came from, sorted and comma-joined
    (``counters``, ``counters_64``, ``counters_ext``); '' when it has none."""
    found = set()
    for name in _TABLE_DEPENDENT:
        source = port.sources.get(name)
        if source is not None:
            found.add("counters_ext" if source.startswith("counters_ext/") else
                      "counters_64" if source.endswith("_64") else "counters")
    return ",".join(sorted(found))


def _read_errors_family(read_errors: list[tuple[tuple[str, str], int]]) -> CounterMetricFamily:
    """``gpufleet_infiniband_read_errors_total`` from the cumulative ``((file, reason), count)`` pairs."""
    errors = CounterMetricFamily(
        _name("infiniband_read_errors_total"),
        "Scrapes in which a sysfs file existed but could not be read or parsed; 'file' is relative to the "
        "sysfs root, 'reason' the OS error or 'malformed'. The file's own series is absent meanwhile.",
        labels=["file", "reason"],
    )
    for (path, reason), count in read_errors:
        errors.add_metric([path, reason], count)
    return errors


class GpuCollector(_SourceHealth, Collector):
    """Collects ``gpufleet_gpu_*`` through an :class:`~gpufleet.exporter.nvml.NvmlSampler`.

    Args:
        sampler: the NVML sampler.
        clock: Unix time in seconds, for :attr:`last_success_timestamp`.

    ``gpufleet_gpu_nvml_available`` is always present (0 without library or
    driver); a GPU NVML reports lost has ``gpufleet_gpu_lost 1`` and no
    other series; a GPU whose handle fails, or whose every read fails, has
    ``gpufleet_gpu_erroring 1``. Every GPU series is labelled ``gpu`` (index),
    ``uuid`` and ``pci_bus_id``. XID events and NVML errors accumulate
    across scrapes. A collect succeeds (:attr:`last_success`) when NVML
    initialised and answered the device count, unless every GPU it lists
    errored (erroring or lost); it fails without NVML or when the collect
    raised (logged; the scrape goes on without these families).
    """

    def __init__(self, sampler: NvmlSampler, clock: Callable[[], float] = time.time) -> None:
        self.sampler = sampler
        self._xids: Counter[tuple[str, str]] = Counter()
        self._errors: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()
        self._labels = _GpuLabels()
        self._init_health(clock)

    def _ids(self, gpu_label: str) -> tuple[str, str, str]:
        """``(gpu, uuid, pci_bus_id)`` label values of a GPU index label ('' for node-wide)."""
        if not gpu_label:
            return ("", "", "")
        uuid, bus = self.sampler.identity(int(gpu_label))
        return (gpu_label, uuid or "", bus or "")

    def collect(self) -> Iterator[Metric]:
        """Sample NVML now and yield the families."""
        start = time.perf_counter()
        try:
            sample = self.sampler.sample()
            with self._lock:
                for gpu_index, xid in sample.xid_events:
                    self._xids[(*self._ids(str(gpu_index)), str(xid))] += 1
                for gpu_label, call, err in sample.errors:
                    self._errors[(*self._ids(gpu_label), call, err)] += 1
                xids = sorted(self._xids.items(), key=lambda kv: (int(kv[0][0]), kv[0][1:]))
                errors = sorted(self._errors.items())

            families = _GpuFamilies(sample.available, sample.device_count, self._labels)
            for gpu in sample.gpus:
                families.add_gpu(gpu)
            self._labels.rotate()
            xid, nvml_errors = _event_families(xids, errors)
            out = list(_nonempty([*families.in_order(), xid, nvml_errors]))
        except Exception:  # noqa: BLE001 - one collector's bug must not fail the whole scrape
            log.exception("nvml collector failed")
            self._record(False, start)
            return
        answered = sample.available and sample.device_count is not None
        all_errored = bool(sample.gpus) and all(gpu.lost or gpu.erroring for gpu in sample.gpus)
        self._record(answered and not all_errored, start)
        yield from out


class _GpuLabels:
    """The label sets of the GPU families, kept across scrapes (:class:`LabelSets`)."""

    def __init__(self) -> None:
        self.gpu = LabelSets(_GPU_LABELS)
        self.info = LabelSets([*_GPU_LABELS, "name"])
        self.reason = LabelSets([*_GPU_LABELS, "reason"])
        self.type = LabelSets([*_GPU_LABELS, "type"])
        self.cause = LabelSets([*_GPU_LABELS, "cause"])
        self.link = LabelSets([*_GPU_LABELS, "link"])
        self.link_type = LabelSets([*_GPU_LABELS, "link", "type"])

    def rotate(self) -> None:
        """End of a scrape (:meth:`LabelSets.rotate`)."""
        for sets in (self.gpu, self.info, self.reason, self.type, self.cause, self.link, self.link_type):
            sets.rotate()


class _GpuFamilies:
    """The ``gpufleet_gpu_*`` families of one NVML sample, filled one GPU at a time.

    Args:
        available: whether NVML initialised.
        device_count: GPUs the driver enumerates (None: not read).
        labels: the collector's label sets.
    """

    def __init__(self, available: bool, device_count: int | None, labels: _GpuLabels) -> None:
        self.labels = labels
        self.available = GaugeMetricFamily(
            _name("gpu_nvml_available"),
            "1 when NVML initialised (driver and libnvidia-ml present), 0 otherwise; without it no other gpufleet_gpu_* series exist.",
        )
        self.available.add_metric([], 1 if available else 0)
        self.devices = GaugeMetricFamily(_name("gpu_devices"), "GPUs the driver enumerates (nvmlDeviceGetCount), lost ones included.")
        if device_count is not None:
            self.devices.add_metric([], device_count)
        self.lost = GaugeMetricFamily(
            _name("gpu_lost"),
            "1 when NVML returns GPU_IS_LOST for the GPU (fallen off the bus, XID 79; needs a reset or reboot), 0 otherwise.",
            labels=_GPU_LABELS,
        )
        self.erroring = GaugeMetricFamily(
            _name("gpu_erroring"),
            "1 when NVML answers the GPU with errors: its device handle fails (nvidia-smi: 'Unable to determine the "
            "device handle ... Unknown Error') or every value read fails; 0 otherwise. Which errors: "
            "gpufleet_gpu_nvml_errors_total.",
            labels=_GPU_LABELS,
        )
        self.info = InfoMetricFamily(_name("gpu"), "GPU identification from NVML (name; uuid and pci_bus_id as on every GPU series); value 1.",
                                labels=_GPU_LABELS)
        self.temp = GaugeMetricFamily(_name("gpu_temperature_celsius"), "GPU die temperature in Celsius (NVML_TEMPERATURE_GPU).", labels=_GPU_LABELS)
        self.mem_temp = GaugeMetricFamily(
            _name("gpu_memory_temperature_celsius"), "GPU memory (HBM) temperature in Celsius (NVML field NVML_FI_DEV_MEMORY_TEMP).", labels=_GPU_LABELS
        )
        self.power = GaugeMetricFamily(_name("gpu_power_watts"), "Board power draw in watts (nvmlDeviceGetPowerUsage milliwatts / 1000).", labels=_GPU_LABELS)
        self.reasons = GaugeMetricFamily(
            _name("gpu_clocks_event_reason"),
            "1 when the clocks-event (throttle) reason is active (nvmlDeviceGetCurrentClocksEventReasons): "
            + "; ".join(f"{name}: {meaning}" for name, (_, meaning) in CLOCKS_EVENT_REASONS.items())
            + ".",
            labels=[*_GPU_LABELS, "reason"],
        )
        self.ecc = CounterMetricFamily(
            _name("gpu_ecc_errors_total"),
            "Aggregate (lifetime, survives reboots) ECC error count by type corrected/uncorrected (nvmlDeviceGetTotalEccErrors).",
            labels=[*_GPU_LABELS, "type"],
        )
        self.retired = GaugeMetricFamily(
            _name("gpu_retired_pages"),
            "Retired framebuffer pages by cause single_bit_ecc/double_bit_ecc (nvmlDeviceGetRetiredPages; pre-Ampere).",
            labels=[*_GPU_LABELS, "cause"],
        )
        self.retired_pending = GaugeMetricFamily(
            _name("gpu_retired_pages_pending"), "1 when a page retirement waits for the next GPU reset.", labels=_GPU_LABELS
        )
        self.remapped = GaugeMetricFamily(
            _name("gpu_remapped_rows"),
            "Memory rows remapped by type correctable/uncorrectable (nvmlDeviceGetRemappedRows; Ampere and later).",
            labels=[*_GPU_LABELS, "type"],
        )
        self.remap_pending = GaugeMetricFamily(_name("gpu_remapped_rows_pending"), "1 when a row remap waits for the next GPU reset.", labels=_GPU_LABELS)
        self.remap_failure = GaugeMetricFamily(
            _name("gpu_remapped_rows_failure"), "1 when a row remap failed (no spare rows left: replace the GPU).", labels=_GPU_LABELS
        )
        self.nvlink_up = GaugeMetricFamily(
            _name("gpu_nvlink_up"), "1 when the NVLink is active (nvmlDeviceGetNvLinkState enabled), 0 when inactive.", labels=[*_GPU_LABELS, "link"]
        )
        self.nvlink_errors = CounterMetricFamily(
            _name("gpu_nvlink_errors_total"),
            "NVLink data-link error counters (nvmlDeviceGetNvLinkErrorCounter) by type: replay, recovery, "
            "crc_flit, crc_data, ecc_data.",
            labels=[*_GPU_LABELS, "link", "type"],
        )

    def add_gpu(self, gpu: GpuSample) -> None:
        """Add one GPU's series; a lost GPU gets ``gpufleet_gpu_lost 1`` and nothing else."""
        labels = self.labels
        ids = (str(gpu.index), gpu.uuid or "", gpu.pci_bus_id or "")
        g = labels.gpu[ids]

        def add(family: Metric, value: float, label_set: object = g, suffix: str = "") -> None:
            family.samples.append(_new(Sample, (family.name + suffix, label_set, value, None, None, None)))

        add(self.lost, 1 if gpu.lost else 0)
        if gpu.lost:
            return
        add(self.erroring, 1 if gpu.erroring else 0)
        if gpu.name is not None:
            add(self.info, 1, labels.info[(*ids, gpu.name)], "_info")
        if gpu.temperature_celsius is not None:
            add(self.temp, gpu.temperature_celsius)
        if gpu.memory_temperature_celsius is not None:
            add(self.mem_temp, gpu.memory_temperature_celsius)
        if gpu.power_watts is not None:
            add(self.power, gpu.power_watts)
        if gpu.clocks_event_reasons is not None:
            for reason, (bit, _) in CLOCKS_EVENT_REASONS.items():
                add(self.reasons, 1 if gpu.clocks_event_reasons & bit else 0, labels.reason[(*ids, reason)])
        for type_name, count in gpu.ecc_errors.items():
            add(self.ecc, count, labels.type[(*ids, type_name)], "_total")
        for cause, count in gpu.retired_pages.items():
            add(self.retired, count, labels.cause[(*ids, cause)])
        if gpu.retired_pages_pending is not None:
            add(self.retired_pending, 1 if gpu.retired_pages_pending else 0)
        for type_name, count in gpu.remapped_rows.items():
            add(self.remapped, count, labels.type[(*ids, type_name)])
        if gpu.remapped_rows_pending is not None:
            add(self.remap_pending, 1 if gpu.remapped_rows_pending else 0)
        if gpu.remapped_rows_failure is not None:
            add(self.remap_failure, 1 if gpu.remapped_rows_failure else 0)
        up, up_name = self.nvlink_up.samples.append, self.nvlink_up.name
        errors, errors_name = self.nvlink_errors.samples.append, self.nvlink_errors.name + "_total"
        link_labels, link_type_labels = labels.link.__getitem__, labels.link_type.__getitem__
        for link in gpu.nvlinks:
            number = str(link.link)
            if link.up is not None:
                up(_new(Sample, (up_name, link_labels((*ids, number)), 1 if link.up else 0, None, None, None)))
            for type_name, count in link.errors.items():
                errors(_new(Sample, (errors_name, link_type_labels((*ids, number, type_name)), count, None, None, None)))

    def in_order(self) -> list[Metric]:
        """The families in exposition order."""
        return [self.available, self.devices, self.lost, self.erroring, self.info, self.temp, self.mem_temp,
                self.power, self.reasons, self.ecc, self.retired, self.retired_pending, self.remapped,
                self.remap_pending, self.remap_failure, self.nvlink_up, self.nvlink_errors]


def _event_families(xids: list[tuple[tuple[str, ...], int]],
                    errors: list[tuple[tuple[str, ...], int]]) -> tuple[CounterMetricFamily, CounterMetricFamily]:
    """``gpufleet_gpu_xid_events_total`` and ``gpufleet_gpu_nvml_errors_total`` from their cumulative counts."""
    xid = CounterMetricFamily(
        _name("gpu_xid_events_total"),
        "Critical XID events NVML delivered (nvmlEventTypeXidCriticalError) since the exporter started, by XID code "
        "(see NVIDIA's XID catalogue: e.g. 48 double-bit ECC, 79 fallen off the bus, 94/95 contained/uncontained ECC).",
        labels=[*_GPU_LABELS, "xid"],
    )
    for key, count in xids:
        xid.add_metric(list(key), count)
    nvml_errors = CounterMetricFamily(
        _name("gpu_nvml_errors_total"),
        "Unexpected NVML errors by GPU ('' for node-wide calls), call and error name ('exception_<type>' when the "
        "binding itself raised); 'not supported' is not counted.",
        labels=[*_GPU_LABELS, "call", "error"],
    )
    for key, count in errors:
        nvml_errors.add_metric(list(key), count)
    return xid, nvml_errors
