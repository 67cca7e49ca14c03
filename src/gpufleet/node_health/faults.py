"""From the exporter's series in Prometheus to faults per node (pure, given the query results).

Series come from the gpufleet exporter (:mod:`gpufleet.exporter.collector`);
the node a series belongs to is its ``node`` label, which the scrape
config adds from ``__meta_kubernetes_pod_node_name``
(``roles/gpu_metrics/manifests.py``). Every rule reads raw samples (an
instant query of a range selector, ``metric[window]``), so it sees exactly
the samples Prometheus stored, and ignores samples older than the node's
last return (annotation ``gpufleet.io/returned-at``): evidence from before a
repair never pulls the node again.

Fault kinds (``node_health_degraded_faults`` uses the same names):

=================== ============================================================== ==========================================
kind                rule                                                           series
=================== ============================================================== ==========================================
gpu_temp            the last N samples (``node_health_hot_samples``) of one GPU    ``gpufleet_gpu_temperature_celsius``
                    all above ``gpu_metrics_gpu_temp_threshold_celsius``
memory_temp         same, HBM, ``gpu_metrics_memory_temp_threshold_celsius``       ``gpufleet_gpu_memory_temperature_celsius``
xid                 a fatal XID (``node_health_fatal_xids``) counted within the    ``gpufleet_gpu_xid_events_total{xid}``
                    event window
ecc_uncorrectable   uncorrected ECC errors grew within the event window, or a      ``gpufleet_gpu_ecc_errors_total{type="uncorrected"}``,
                    row remap failed                                               ``gpufleet_gpu_remapped_rows_failure``
nvlink_errors       NVLink error counters grew more than the threshold within the  ``gpufleet_gpu_nvlink_errors_total``,
                    error window, or a link is down                                ``gpufleet_gpu_nvlink_up``
ib_errors           InfiniBand error counters grew more than the threshold within  ``gpufleet_infiniband_port_*_total`` (errors),
                    the error window, or a port is not ACTIVE (InfiniBand link     ``gpufleet_infiniband_port_state_id``
                    layer only)
roce_errors         packet-loss counters of a RoCE port (``out_of_sequence``,      ``gpufleet_infiniband_port_hw_stat_total``,
                    ``packet_seq_err``, ``local_ack_timeout_err``,                 ``gpufleet_infiniband_port_state_id``
                    ``implied_nak_seq_err``) grew more than the threshold within   (``link_layer="Ethernet"``)
                    the error window, or the port is not ACTIVE
gpu_missing         NVML reports a GPU lost, or erroring (any other error on its   ``gpufleet_gpu_lost``, ``gpufleet_gpu_erroring``,
                    handle, or every read failing), or fewer GPUs than the node's  ``gpufleet_gpu_devices``
                    ``nvidia.com/gpu.count`` label (else its GPU capacity)
gpu_partial         the Node's ``nvidia.com/gpu`` allocatable is below its         the Node object (not Prometheus), through the
                    capacity (the device plugin withdrew GPUs) and the inventory   node classifier (:mod:`gpufleet.fleet.classify`)
                    does not let such nodes count for training
telemetry           a node that should have GPUs (:func:`gpufleet.fleet.nodes.     ``gpufleet_exporter_collector_success``,
                    expected_gpus` > 0) whose GPU telemetry is failing (the        ``gpufleet_exporter_collector_last_success_``
                    exporter's ``nvml`` collector reports failure, or NVML is      ``timestamp_seconds`` (``collector="nvml"``),
                    unavailable), stale (its last success older than               ``gpufleet_gpu_nvml_available``,
                    ``gpu_metrics_telemetry_stale_seconds``), absent (no           ``gpufleet_gpu_lost``/``_erroring`` (GPUs seen)
                    ``gpufleet_gpu_*`` series at all), or that shows fewer GPUs
                    in Prometheus than expected (GPUs with ``gpufleet_gpu_lost``
                    or ``gpufleet_gpu_erroring``)
ib_errors           also: an InfiniBand error counter saturated (stuck at its      ``gpufleet_infiniband_counter_saturated``
(saturated)         width's maximum, e.g. symbol_error 65535, link_downed 255)
                    counts as at least that many errors, until it is reset
=================== ============================================================== ==========================================

Telemetry is judged only for the nodes the caller names (``telemetry_nodes``
of :func:`evaluate`; the remediation controller passes the Ready GPU nodes
its ``node_health_telemetry_node_selector`` selects, older than the stale
bound), and absence only while some other node does report GPU series: when
no node reports any, Prometheus or its scrape configuration is what failed,
and no node is blamed for it (the ``GpufleetGPUTelemetryAbsent`` alert of
gpu_metrics still fires, per node). A failed query leaves its rule out, so a
Prometheus outage never reads as absent telemetry.

A saturated counter is a fault whatever its history, unlike counter growth:
while it sits at its maximum new errors are not counted, so the node's
fabric health is unknown and at least that many errors happened. It stays
a fault after a return until the port's counters are reset
(``perfquery -x -R``).

InfiniBand and RoCE are kept apart by the ``link_layer`` label every port
series carries: the IBA link-error counters (symbol errors, link
recoveries...) are meaningful on InfiniBand links only, and a RoCE port's
trouble shows as packet loss on a lossless Ethernet fabric instead.

Counter growth sums the positive steps between consecutive samples (a
reset counts from zero). For XIDs only, a series that first appears inside
the window (after its start, by more than two scrape intervals) also counts
its first value: the exporter creates that counter at its first event. The
hardware counters (lifetime ECC, NVLink, InfiniBand) are never counted from
their first value: a node joining, or its exporter restarting, must not
look like errors that just happened.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Any

from gpufleet.exporter import sysfs
from gpufleet.exporter.collector import PORT_COUNTERS

from .config import FAULT_KINDS, Rules  # noqa: F401 (FAULT_KINDS: part of this module's interface)

#: ``(metric, fault)`` of InfiniBand error counters (the ones gpu_metrics alerts on, and two more).
IB_ERROR_COUNTERS = (
    "gpufleet_infiniband_port_symbol_errors_total",
    "gpufleet_infiniband_port_link_downed_total",
    "gpufleet_infiniband_port_link_error_recovery_total",
    "gpufleet_infiniband_port_receive_errors_total",
    "gpufleet_infiniband_port_receive_remote_physical_errors_total",
    "gpufleet_infiniband_port_local_link_integrity_errors_total",
)
TEMP_METRIC = "gpufleet_gpu_temperature_celsius"
MEM_TEMP_METRIC = "gpufleet_gpu_memory_temperature_celsius"
XID_METRIC = "gpufleet_gpu_xid_events_total"
ECC_METRIC = "gpufleet_gpu_ecc_errors_total"
REMAP_FAILURE_METRIC = "gpufleet_gpu_remapped_rows_failure"
NVLINK_ERRORS_METRIC = "gpufleet_gpu_nvlink_errors_total"
NVLINK_UP_METRIC = "gpufleet_gpu_nvlink_up"
IB_STATE_METRIC = "gpufleet_infiniband_port_state_id"
GPU_LOST_METRIC = "gpufleet_gpu_lost"
GPU_ERRORING_METRIC = "gpufleet_gpu_erroring"
GPU_DEVICES_METRIC = "gpufleet_gpu_devices"
HW_STAT_METRIC = "gpufleet_infiniband_port_hw_stat_total"
#: IBA PortState ACTIVE.
IB_ACTIVE = 4
#: Port selectors by link layer ('' counts as InfiniBand: kernels without ``link_layer`` had no RoCE).
IB_PORTS = 'link_layer!="Ethernet"'
ROCE_PORTS = 'link_layer="Ethernet"'
#: RoCE packet-loss counters (mlx5 ``hw_counters``), as the gpu_metrics RoCE alert reads them.
ROCE_LOSS_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "implied_nak_seq_err")

IB_SATURATED_METRIC = "gpufleet_infiniband_counter_saturated"
COLLECTOR_SUCCESS_METRIC = "gpufleet_exporter_collector_success"
COLLECTOR_LAST_SUCCESS_METRIC = "gpufleet_exporter_collector_last_success_timestamp_seconds"
NVML_AVAILABLE_METRIC = "gpufleet_gpu_nvml_available"
#: The exporter's collector of GPU telemetry (``collector`` label of the collector series).
GPU_COLLECTOR = "nvml"
#: sysfs ``counters/`` files of :data:`IB_ERROR_COUNTERS` (the ``counter`` label of the saturation gauge) -> width in bits.
IB_ERROR_FILES: dict[str, int] = {
    file: sysfs.PMA_COUNTER_WIDTH_BITS[file] for file, (metric, _, _) in PORT_COUNTERS.items()
    if f"gpufleet_{metric}" in IB_ERROR_COUNTERS and file in sysfs.PMA_COUNTER_WIDTH_BITS
}

Series = dict[str, Any]  # {"metric": {labels}, "values": [[ts, "v"], ...]} (matrix) or "value": [ts, "v"] (vector)


@dataclass(frozen=True)
class Fault:
    """One fault on one node.

    Attributes:
        node: node name.
        kind: one of :data:`FAULT_KINDS`.
        detail: what was seen, for Events and the history (e.g. ``GPU 3: 81, 82, 84 C > 78 C``).
        since: Unix time of the sample that completed the evidence (the N-th hot
            sample, the first sample showing growth): latency is measured from it.
    """

    node: str
    kind: str
    detail: str
    since: float


@dataclass
class Queries:
    """The PromQL of each rule (instant queries; range selectors return raw samples)."""

    rules: Rules
    selectors: dict[str, str] = field(default_factory=dict)

    def all(self) -> dict[str, str]:
        """name -> PromQL."""
        r = self.rules
        hot = f"{int(math.ceil(r.hot_window_seconds))}s"
        ev = f"{int(r.event_window_seconds)}s"
        er = f"{int(r.error_window_seconds)}s"
        ib = "|".join(IB_ERROR_COUNTERS)
        return {
            "gpu_temp": f"{TEMP_METRIC}[{hot}]",
            "memory_temp": f"{MEM_TEMP_METRIC}[{hot}]",
            "xid": f"{XID_METRIC}[{ev}]",
            "ecc": f'{ECC_METRIC}{{type="uncorrected"}}[{ev}]',
            "remap_failure": f"{REMAP_FAILURE_METRIC} == 1",
            "nvlink_errors": f"{NVLINK_ERRORS_METRIC}[{er}]",
            "nvlink_down": f"{NVLINK_UP_METRIC} == 0",
            "ib_errors": f'{{__name__=~"{ib}",{IB_PORTS}}}[{er}]',
            "ib_down": f"{IB_STATE_METRIC}{{{IB_PORTS}}} != {IB_ACTIVE}",
            "roce_errors": f'{HW_STAT_METRIC}{{{ROCE_PORTS},counter=~"{"|".join(ROCE_LOSS_COUNTERS)}"}}[{er}]',
            "roce_down": f"{IB_STATE_METRIC}{{{ROCE_PORTS}}} != {IB_ACTIVE}",
            "gpu_lost": f"{GPU_LOST_METRIC} == 1",
            "gpu_erroring": f"{GPU_ERRORING_METRIC} == 1",
            "gpu_devices": GPU_DEVICES_METRIC,
            "ib_saturated": f'{IB_SATURATED_METRIC}{{{IB_PORTS},counter=~"{"|".join(IB_ERROR_FILES)}"}} == 1',
            # one row per node and GPU index ('' for the node-wide series): which GPUs Prometheus sees. The
            # exporter writes gpufleet_gpu_lost (0/1) for every GPU NVML enumerates, gpufleet_gpu_erroring for
            # every one it has a handle or an error for, gpufleet_gpu_nvml_available always: three series a GPU
            # at most, where a regex over every gpufleet_gpu_* name would read dozens.
            "telemetry_gpus": f"count by ({r.node_label}, gpu) ({GPU_LOST_METRIC} or {GPU_ERRORING_METRIC} or "
                              f"{NVML_AVAILABLE_METRIC})",
            "telemetry_failing": f'{COLLECTOR_SUCCESS_METRIC}{{collector="{GPU_COLLECTOR}"}} == 0',
            "telemetry_last_success": f'{COLLECTOR_LAST_SUCCESS_METRIC}{{collector="{GPU_COLLECTOR}"}}',
            "nvml_unavailable": f"{NVML_AVAILABLE_METRIC} == 0",
        }


def _samples(series: Series, since: float) -> list[tuple[float, float]]:
    """``(time, value)`` samples of a matrix or vector series at or after ``since``."""
    values = series.get("values")
    if values is None and "value" in series:
        values = [series["value"]]
    out = []
    for ts, v in values or []:
        t = float(ts)
        if t >= since:
            out.append((t, float(v)))
    return out


def hot_streak(samples: list[tuple[float, float]], threshold: float, n: int) -> tuple[float, list[float]] | None:
    """``(time of the N-th sample, the N values)`` when the last ``n`` samples are all above ``threshold``, else None."""
    if len(samples) < n:
        return None
    last = samples[-n:]
    if all(v > threshold for _, v in last):
        return last[-1][0], [v for _, v in last]
    return None


def growth(samples: list[tuple[float, float]], window_start: float, scrape_interval: float, *,
           count_new_series: bool = False) -> tuple[float, float | None]:
    """``(growth, time of the first sample that grew)`` of a counter's samples (module docstring).

    ``count_new_series``: a series born inside the window counts its first value.
    """
    if not samples:
        return 0.0, None
    total, first_t = 0.0, None
    if count_new_series and samples[0][0] > window_start + 2 * scrape_interval and samples[0][1] > 0:
        total, first_t = samples[0][1], samples[0][0]
    for (_, a), (t, b) in zip(samples, samples[1:]):
        step = b - a if b >= a else b
        if step > 0:
            total += step
            first_t = first_t if first_t is not None else t
    return total, first_t


def _gpu_name(series: Series) -> str:
    """``3 (00000000:5D:00.0)``: a GPU's index and, when the series has it, its PCI bus id."""
    m = series.get("metric") or {}
    bus = m.get("pci_bus_id")
    return f"{m.get('gpu', '?')} ({bus})" if bus else str(m.get("gpu", "?"))


def _node(series: Series, rules: Rules) -> str | None:
    """The node a series belongs to (its ``rules.node_label`` label), None without one."""
    return (series.get("metric") or {}).get(rules.node_label)


def evaluate(results: dict[str, list[Series]], rules: Rules, now: float, *, returned_at: dict[str, float] | None = None,
             expected_gpus: dict[str, int] | None = None,
             telemetry_nodes: Iterable[str] | None = None) -> dict[str, list[Fault]]:
    """Faults per node from the query results (pure).

    Args:
        results: name (as in :meth:`Queries.all`) -> the query's result list; a query
            missing here (it failed) leaves its rule out.
        rules: thresholds.
        now: evaluation time (Unix seconds); windows end here.
        returned_at: node -> Unix time of its last return; earlier samples are ignored.
        expected_gpus: node -> GPUs it should have (:func:`gpufleet.fleet.nodes.expected_gpus`),
            for gpu_missing and telemetry.
        telemetry_nodes: nodes whose GPU telemetry is judged (``telemetry``); default every
            node of ``expected_gpus`` expecting at least one GPU.

    Returns:
        node -> faults (at most one per kind: the first found, GPUs/ports in label order).
    """
    expected = expected_gpus or {}
    judged = [n for n in (expected if telemetry_nodes is None else telemetry_nodes) if expected.get(n, 0) > 0]
    ev = _Evaluation(results, rules, now, returned_at or {})
    ev.temperatures()
    ev.gpu_events()
    ev.error_counters()
    ev.saturated_counters()
    ev.links_down()
    ev.missing_gpus(expected)
    ev.telemetry(expected, sorted(judged))
    return {n: list(f.values()) for n, f in sorted(ev.faults.items())}


class _Evaluation:
    """One :func:`evaluate` run: the query results and the faults found so far, one per node and kind.

    The steps run in :func:`evaluate`'s order; a kind keeps the first fault found (``add``).
    """

    def __init__(self, results: dict[str, list[Series]], rules: Rules, now: float, returned_at: dict[str, float]):
        self.results, self.rules, self.now, self.returned_at = results, rules, now, returned_at
        self.faults: dict[str, dict[str, Fault]] = {}

    def add(self, node: str, kind: str, detail: str, since: float) -> None:
        self.faults.setdefault(node, {}).setdefault(kind, Fault(node, kind, detail, since))

    def cutoff(self, node: str, window: float) -> float:
        """Start of a window ending now (seconds), never before the node's last return."""
        return max(self.now - window, self.returned_at.get(node, 0.0))

    def by_label(self, name: str) -> list[tuple[str, Series]]:
        """``(node, series)`` of query ``name``, in node then label order; series without a node left out."""
        rows = [(n, s) for s in self.results.get(name, []) if (n := _node(s, self.rules))]
        return sorted(rows, key=lambda r: (r[0], sorted((r[1].get("metric") or {}).items())))

    def since_return(self, node: str, s: Series) -> list[tuple[float, float]]:
        """The series' samples since the node's last return."""
        return _samples(s, self.returned_at.get(node, 0.0))

    def temperatures(self) -> None:
        """GPU die and HBM temperatures above their thresholds for ``hot_samples`` samples in a row (Celsius)."""
        rules = self.rules
        for name, kind, threshold in (("gpu_temp", "gpu_temp", rules.gpu_temp_celsius),
                                      ("memory_temp", "memory_temp", rules.memory_temp_celsius)):
            for node, s in self.by_label(name):
                streak = hot_streak(_samples(s, self.cutoff(node, rules.hot_window_seconds)), threshold,
                                    rules.hot_samples)
                if streak:
                    t, vals = streak
                    gpu = s["metric"].get("gpu", "?")
                    self.add(node, kind, f"GPU {gpu}: {', '.join(f'{v:g}' for v in vals)} C > {threshold:g} C "
                                         f"({rules.hot_samples} samples)", t)

    def gpu_events(self) -> None:
        """Fatal XIDs and uncorrectable ECC errors within the event window; a failed row remap since return."""
        rules = self.rules
        for node, s in self.by_label("xid"):
            xid = s["metric"].get("xid", "")
            if not xid.isdigit() or int(xid) not in rules.fatal_xids:
                continue
            start = self.cutoff(node, rules.event_window_seconds)
            g, t = growth(_samples(s, start), start, rules.scrape_interval_seconds, count_new_series=True)
            if g > 0 and t is not None:
                self.add(node, "xid", f"GPU {s['metric'].get('gpu', '?')}: fatal XID {xid} ({g:g} events)", t)
        for node, s in self.by_label("ecc"):
            start = self.cutoff(node, rules.event_window_seconds)
            g, t = growth(_samples(s, start), start, rules.scrape_interval_seconds)
            if g > 0 and t is not None:
                self.add(node, "ecc_uncorrectable", f"GPU {s['metric'].get('gpu', '?')}: {g:g} uncorrectable ECC errors", t)
        for node, s in self.by_label("remap_failure"):
            pts = self.since_return(node, s)
            if pts:
                self.add(node, "ecc_uncorrectable", f"GPU {s['metric'].get('gpu', '?')}: row remapping failed (no spare rows)", pts[-1][0])

    def error_counters(self) -> None:
        """NVLink, InfiniBand and RoCE packet-loss counters that grew past their thresholds in the error window."""
        rules = self.rules
        self.counter_growth("nvlink_errors", "nvlink_errors", rules.nvlink_error_threshold, "NVLink")
        self.counter_growth("ib_errors", "ib_errors", rules.ib_error_threshold, "InfiniBand")
        self.counter_growth("roce_errors", "roce_errors", rules.roce_error_threshold, "RoCE packet-loss")

    def counter_growth(self, name: str, kind: str, threshold: int, what: str) -> None:
        """A ``kind`` fault where query ``name``'s counters of a node grew by more than ``threshold`` in total."""
        rules = self.rules
        per: dict[str, tuple[float, float, list[str]]] = {}
        for node, s in self.by_label(name):
            start = self.cutoff(node, rules.error_window_seconds)
            g, t = growth(_samples(s, start), start, rules.scrape_interval_seconds)
            if g > 0 and t is not None:
                total, first, where = per.get(node, (0.0, t, []))
                m = s["metric"]
                where.append(f"{m.get('__name__', name).removeprefix('gpufleet_')}"
                             f"{{{','.join(f'{k}={v}' for k, v in sorted(m.items()) if k in ('gpu', 'link', 'type', 'hca', 'port', 'counter'))}}}+{g:g}")
                per[node] = (total + g, min(first, t), where)
        for node, (total, first, where) in per.items():
            if total > threshold:
                self.add(node, kind, f"{total:g} {what} errors in {int(rules.error_window_seconds)}s "
                                     f"(threshold {threshold}): {'; '.join(where[:4])}", first)

    def links_down(self) -> None:
        """NVLinks down, InfiniBand and RoCE ports not ACTIVE, since the node's last return."""
        for node, s in self.by_label("nvlink_down"):
            pts = self.since_return(node, s)
            if pts:
                self.add(node, "nvlink_errors", f"GPU {s['metric'].get('gpu', '?')} NVLink {s['metric'].get('link', '?')} down", pts[-1][0])
        for node, s in self.by_label("ib_down"):
            pts = self.since_return(node, s)
            if pts:
                self.add(node, "ib_errors", f"{s['metric'].get('hca', '?')} port {s['metric'].get('port', '?')} state "
                                            f"{pts[-1][1]:g} (not ACTIVE)", pts[-1][0])
        for node, s in self.by_label("roce_down"):
            pts = self.since_return(node, s)
            if pts:
                self.add(node, "roce_errors", f"{s['metric'].get('hca', '?')} port {s['metric'].get('port', '?')} (RoCE) state "
                                              f"{pts[-1][1]:g} (not ACTIVE)", pts[-1][0])

    def missing_gpus(self, expected_gpus: dict[str, int]) -> None:
        """GPUs lost or erroring, and fewer GPUs visible to NVML than the node's ``expected_gpus``."""
        for name, what in (("gpu_lost", "lost (NVML GPU_IS_LOST)"),
                           ("gpu_erroring", "answers NVML with errors (device handle or every read)")):
            for node, s in self.by_label(name):
                pts = self.since_return(node, s)
                if pts:
                    self.add(node, "gpu_missing", f"GPU {_gpu_name(s)} {what}", pts[-1][0])
        for node, s in self.by_label("gpu_devices"):
            pts = self.since_return(node, s)
            want = expected_gpus.get(node)
            if pts and want is not None and pts[-1][1] < want:
                self.add(node, "gpu_missing", f"{pts[-1][1]:g} GPUs visible to NVML, {want} expected", pts[-1][0])

    def saturated_counters(self) -> None:
        """InfiniBand error counters stuck at their maximum: at least that many errors (module docstring)."""
        rules = self.rules
        per: dict[str, tuple[int, float, list[str]]] = {}
        for node, s in self.by_label("ib_saturated"):
            pts = self.since_return(node, s)
            m = s["metric"]
            width = IB_ERROR_FILES.get(m.get("counter", ""))
            if not pts or width is None:
                continue
            top = (1 << width) - 1
            total, first, where = per.get(node, (0, pts[-1][0], []))
            where.append(f"{m.get('counter')}{{hca={m.get('hca', '?')},port={m.get('port', '?')}}}={top}")
            per[node] = (total + top, min(first, pts[-1][0]), where)
        for node, (total, first, where) in per.items():
            if total > rules.ib_error_threshold:
                self.add(node, "ib_errors", f"saturated InfiniBand error counters: {'; '.join(where[:4])}: at least {total} "
                                            f"errors, new ones uncounted until the counters are reset (perfquery -x -R)",
                         first)

    def telemetry(self, expected: dict[str, int], judged: list[str]) -> None:
        """GPU telemetry failing, stale, absent or short of GPUs, for the ``judged`` nodes (module docstring)."""
        rules, now = self.rules, self.now
        if "telemetry_failing" in self.results:
            for node, s in self.by_label("telemetry_failing"):
                pts = self.since_return(node, s)
                if pts and node in judged:
                    self.add(node, "telemetry", f"GPU telemetry failing: the exporter's {GPU_COLLECTOR} collector "
                                                f"could not read NVML ({COLLECTOR_SUCCESS_METRIC} 0)", pts[-1][0])
        if "telemetry_last_success" in self.results:
            for node, s in self.by_label("telemetry_last_success"):
                pts = _samples(s, 0.0)
                if pts and node in judged and now - pts[-1][1] > rules.telemetry_stale_seconds:
                    self.add(node, "telemetry", f"GPU telemetry stale: the exporter's {GPU_COLLECTOR} collector last read "
                                                f"NVML {now - pts[-1][1]:.0f}s ago (bound {rules.telemetry_stale_seconds:g}s)",
                             now)
        if "nvml_unavailable" in self.results:
            for node, s in self.by_label("nvml_unavailable"):
                pts = self.since_return(node, s)
                if pts and node in judged:
                    self.add(node, "telemetry", f"GPU telemetry failing: NVML unavailable ({NVML_AVAILABLE_METRIC} 0), "
                                                f"{expected[node]} GPUs expected", pts[-1][0])
        if "telemetry_gpus" not in self.results:
            return
        seen: dict[str, set[str]] = {}
        for node, s in self.by_label("telemetry_gpus"):
            seen.setdefault(node, set()).add((s.get("metric") or {}).get("gpu", ""))
        for node in judged:
            want = expected[node]
            if node not in seen:
                if seen:  # others report: this node's exporter is what is missing, not Prometheus
                    self.add(node, "telemetry", f"GPU telemetry absent: no gpufleet_gpu_* series in Prometheus, "
                                                f"{want} GPUs expected", now)
                continue
            gpus = {g for g in seen[node] if g}
            if len(gpus) < want:
                self.add(node, "telemetry", f"GPU telemetry incomplete: {len(gpus)} of {want} expected GPUs have series "
                                            f"in Prometheus", now)
