"""Grafana dashboards as code, built with the official grafana-foundation-sdk.

:func:`build_dashboards` returns ``{name: dashboard JSON dict}``; the role
ships each as a ConfigMap for the Grafana sidecar. Three dashboards:

* ``gpufleet-gpus``: tensor-core activity (``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``,
  the utilisation that matters) beside plain GPU utilisation
  (``DCGM_FI_DEV_GPU_UTIL``, which only says a kernel ran), temperatures
  against the thresholds, GPU health (lost, XID, ECC, throttling). The
  thresholds drawn and the rule each panel states are node health's
  configuration for the inventory (:class:`gpufleet.node_health.config.Configuration`,
  built by the node_health role from ``gpu_metrics_*_threshold_celsius``,
  ``node_health_hot_samples``...): the panels say what the controller does.
* ``gpufleet-fabric``: InfiniBand throughput (rate of the exporter's byte
  counters) and link utilisation, IB error counters, port state and
  saturated counters, NVLink errors and down links.
* ``gpufleet-queues``: Kueue queue state (pending and admitted workloads,
  GPU usage against nominal quota per ClusterQueue and flavor), the
  goodput of training jobs (``gpufleet goodput``: ETTR, lost time by cause)
  and what the flip's outside capacity costs by pool (the virtual kubelets'
  ``gpufleet_flip_external_gpu_{seconds,cost}_total``: GPUs outside, cost
  per hour, cost over the dashboard's time range).

All panels query the ``${datasource}`` Prometheus variable; GPU and fabric
panels filter on the ``node`` label the role's scrape config sets.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import GraphTresholdsStyleMode, LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import DataSourceRef, Threshold, ThresholdsMode, VariableRefresh
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from gpufleet.node_health.config import Configuration as NodeHealth

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NODE = 'node=~"$node"'
RATE = "$__rate_interval"
#: Legend of a per-port series (fabric dashboard).
PORT = "{{node}} {{hca}}/{{port}}"
#: ``counters/`` files of the IB error counters plotted in "Link errors" and a few more (the ``counter`` label
#: of ``gpufleet_infiniband_counter_saturated``): IBA PortCounters, 4 to 16 bits wide, so they saturate.
SATURABLE_ERRORS = ("symbol_error|link_error_recovery|link_downed|port_rcv_errors|port_rcv_remote_physical_errors|"
                    "local_link_integrity_errors")
#: Selectors of the queues dashboard: GPU resource series, the chosen ClusterQueues.
GPU = 'resource="nvidia.com/gpu"'
CQ = 'cluster_queue=~"$cluster_queue"'


@dataclass(frozen=True)
class Rules:
    """What the GPU panels draw and say: node health's rules, the alerts' hold, whether node health runs.

    Attributes:
        health: node health's configuration (thresholds in Celsius, samples, seconds, the degraded faults).
        alert_for_seconds: how long the temperature alerts wait (``gpu_metrics_alert_for_seconds``).
        acting: node health is deployed (``node_health_enabled``); otherwise only the alerts act.
    """

    health: NodeHealth
    alert_for_seconds: int
    acting: bool = True

    def temperature(self, kind: str, threshold: float, alert: str) -> str:
        """The rule a temperature panel states: node health's action on ``kind`` faults, and the alert."""
        r = self.health.rules
        if not self.acting:
            return (f"The {alert} alert fires after {self.alert_for_seconds} s above {threshold:g} C; node health is "
                    "not deployed here.")
        if kind in self.health.degraded_faults:
            action = ("takes the node out of training: degraded tier (inference only) until it has been cool for "
                      f"{self.health.degraded_clear_seconds:g} s and passed its node checks")
        else:
            action = "takes the node out for swap: cordon, drain, replacement request"
        return (f"Once {r.hot_samples} samples in a row of one GPU ({r.scrape_interval_seconds:g} s apart) are above "
                f"{threshold:g} C, node health {action}. The {alert} alert fires after {self.alert_for_seconds} s above it.")

    def telemetry(self) -> str:
        """What node health does with failing or stale GPU telemetry."""
        if not self.acting:
            return "node health is not deployed here: only the GpufleetGPUTelemetryStale alert"
        if "telemetry" in self.health.degraded_faults:
            return "node health takes them out of training (degraded tier: inference only)"
        return "node health takes them out for swap"


class _Ids:
    """Sequential panel ids (Grafana needs them unique within a dashboard)."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self) -> int:
        self.next += 1
        return self.next


def _row(ids: _Ids, title: str) -> dashboard.Row:
    return dashboard.Row(title).id(ids())


def _query(expr: str, legend: str, ref: str = "A", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    return q.instant() if instant else q


def _timeseries(
    ids: _Ids,
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    unit: str,
    span: int = 12,
    threshold: float | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(span)
        .height(8)
        .legend(common_builders.VizLegendOptions().display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM).show_legend(True))
    )
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, ref=chr(ord("A") + i)))
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if threshold is not None:
        panel = panel.thresholds(
            dashboard.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=None, color="green"), Threshold(value=threshold, color="red")])
        ).thresholds_style(common_builders.GraphThresholdsStyleConfig().mode(GraphTresholdsStyleMode.DASHED))
    return panel


def _stat(ids: _Ids, title: str, description: str, expr: str, red_from: float = 1, span: int = 6) -> stat.Panel:
    return (
        stat.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(_query(expr, "", instant=True))
        .span(span)
        .height(4)
        .no_value("0")
        .thresholds(
            dashboard.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=None, color="green"), Threshold(value=red_from, color="red")])
        )
    )


def _table(ids: _Ids, title: str, description: str, expr: str, span: int = 12) -> table.Panel:
    return (
        table.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(_query(expr, "", instant=True).format(PromQueryFormat.TABLE))
        .span(span)
        .height(8)
    )


def _base(uid: str, title: str, description: str, tags: list[str], node_variable: str | None) -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["gpufleet", *tags])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .editable()
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    if node_variable:
        board = board.with_variable(
            dashboard.QueryVariable("node")
            .label("Node")
            .datasource(DATASOURCE)
            .query(f"label_values({node_variable}, node)")
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
    return board


def _with_rows(board: dashboard.Dashboard,
               *rows: Callable[[dashboard.Dashboard, _Ids], dashboard.Dashboard]) -> dashboard.Dashboard:
    """``board`` with each row added in order, panel ids numbered from 1 across them."""
    ids = _Ids()
    for row in rows:
        board = row(board, ids)
    return board


def gpus_dashboard(rules: Rules) -> dashboard.Dashboard:
    """``gpufleet-gpus``: activity, temperatures and health of every GPU, against node health's ``rules``."""
    board = _base(
        "gpufleet-gpus",
        "gpufleet / GPUs",
        "Tensor-core activity next to GPU utilisation, temperatures against node health's thresholds, GPU health.",
        ["gpu", "dcgm"],
        "gpufleet_gpu_devices",
    )
    return _with_rows(board, _gpu_activity_row, functools.partial(_gpu_temperature_row, rules=rules),
                      functools.partial(_gpu_health_row, rules=rules))


def _gpu_activity_row(board: dashboard.Dashboard, ids: _Ids) -> dashboard.Dashboard:
    """Row "Activity": Tensor-core activity next to GPU utilisation, per GPU and over the fleet."""
    return (
        board.with_row(_row(ids, "Activity"))
        .with_panel(
            _timeseries(
                ids,
                "Tensor-core activity",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: fraction of cycles the tensor (HMMA) pipes are busy. "
                "This is the utilisation that matters for training.",
                [(f"avg by (node, gpu) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{NODE}}})", "{{node}} GPU {{gpu}}")],
                "percentunit",
                min_value=0,
                max_value=1,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "GPU utilisation",
                "DCGM_FI_DEV_GPU_UTIL: percent of time a kernel was running. 100% with low tensor activity means "
                "the GPU waits on memory, input or communication.",
                [(f"avg by (node, gpu) (DCGM_FI_DEV_GPU_UTIL{{{NODE}}})", "{{node}} GPU {{gpu}}")],
                "percent",
                min_value=0,
                max_value=100,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Fleet tensor-core activity vs GPU utilisation",
                "Averages over the selected nodes: the gap between the two is work that is not tensor math.",
                [
                    (f"avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{NODE}}})", "tensor-core activity"),
                    (f"avg(DCGM_FI_DEV_GPU_UTIL{{{NODE}}}) / 100", "GPU utilisation"),
                ],
                "percentunit",
                span=24,
                min_value=0,
                max_value=1,
            )
        )
    )


def _gpu_temperature_row(board: dashboard.Dashboard, ids: _Ids, *, rules: Rules) -> dashboard.Dashboard:
    """Row "Temperatures": GPU and HBM temperatures (Celsius) against node health's thresholds, thermal throttling."""
    gpu_t, mem_t = rules.health.rules.gpu_temp_celsius, rules.health.rules.memory_temp_celsius
    return (
        board.with_row(_row(ids, "Temperatures"))
        .with_panel(
            _timeseries(
                ids,
                "GPU temperature",
                "gpufleet_gpu_temperature_celsius (NVML). "
                + rules.temperature("gpu_temp", gpu_t, "GpufleetGPUTemperatureHigh"),
                [(f"max by (node, gpu) (gpufleet_gpu_temperature_celsius{{{NODE}}})", "{{node}} GPU {{gpu}}")],
                "celsius",
                threshold=gpu_t,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "HBM temperature",
                "gpufleet_gpu_memory_temperature_celsius (NVML). "
                + rules.temperature("memory_temp", mem_t, "GpufleetGPUMemoryTemperatureHigh"),
                [(f"max by (node, gpu) (gpufleet_gpu_memory_temperature_celsius{{{NODE}}})", "{{node}} GPU {{gpu}}")],
                "celsius",
                threshold=mem_t,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "GPU temperature (dcgm-exporter)",
                "DCGM_FI_DEV_GPU_TEMP: the same reading from dcgm-exporter; the alerts use either source, node health "
                "the gpufleet exporter's.",
                [(f"max by (node, gpu) (DCGM_FI_DEV_GPU_TEMP{{{NODE}}})", "{{node}} GPU {{gpu}}")],
                "celsius",
                threshold=gpu_t,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Thermal throttling",
                "GPUs whose clocks are held down by software or hardware thermal slowdown.",
                [
                    (
                        f'sum by (node) (gpufleet_gpu_clocks_event_reason{{{NODE},reason=~"sw_thermal_slowdown|hw_thermal_slowdown"}})',
                        "{{node}}",
                    )
                ],
                "short",
                min_value=0,
            )
        )
    )


def _gpu_health_row(board: dashboard.Dashboard, ids: _Ids, *, rules: Rules) -> dashboard.Dashboard:
    """Row "Health": Lost GPUs, NVML reachability, XID and uncorrectable ECC counts, GPU telemetry, power draw (watts)."""
    stale = f"{rules.health.rules.telemetry_stale_seconds:g}"
    return (
        board.with_row(_row(ids, "Health"))
        .with_panel(_stat(ids, "GPUs lost", "GPUs NVML reports fallen off the bus.", f"sum(gpufleet_gpu_lost{{{NODE}}})"))
        .with_panel(
            _stat(
                ids,
                "NVML unavailable",
                "Nodes whose exporter cannot reach NVML (driver not loaded).",
                f"count(gpufleet_gpu_nvml_available{{{NODE}}} == 0)",
            )
        )
        .with_panel(
            _stat(ids, "XID events (1h)", "Critical XID events in the last hour.", f"sum(increase(gpufleet_gpu_xid_events_total{{{NODE}}}[1h]))")
        )
        .with_panel(
            _stat(
                ids,
                "Uncorrectable ECC (1h)",
                "New uncorrectable ECC errors in the last hour.",
                f'sum(increase(gpufleet_gpu_ecc_errors_total{{{NODE},type="uncorrected"}}[1h]))',
            )
        )
        .with_panel(
            _stat(
                ids,
                "GPU telemetry failing or stale",
                "Nodes whose exporter's nvml collector failed its last read, or last succeeded more than "
                f"{stale} s ago (gpu_metrics_telemetry_stale_seconds): {rules.telemetry()}.",
                f'count((gpufleet_exporter_collector_success{{{NODE},collector="nvml"}} == 0) or ((time() - '
                f'gpufleet_exporter_collector_last_success_timestamp_seconds{{{NODE},collector="nvml"}}) > '
                f"{stale}))",
                span=12,
            )
        )
        .with_panel(
            _table(
                ids,
                "GPU nodes without GPU telemetry",
                "Nodes node health expects GPUs on (gpufleet_node_health_expected_gpus) that send no gpufleet_gpu_* "
                "series: the exporter is not running or not scraped there.",
                f"max by (node) (gpufleet_node_health_expected_gpus{{{NODE}}}) unless on (node) gpufleet_gpu_nvml_available",
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Power draw",
                "gpufleet_gpu_power_watts per GPU.",
                [(f"gpufleet_gpu_power_watts{{{NODE}}}", "{{node}} GPU {{gpu}}")],
                "watt",
                span=24,
            )
        )
    )


def fabric_dashboard() -> dashboard.Dashboard:
    """``gpufleet-fabric``: InfiniBand throughput and errors, NVLink errors."""
    board = _base(
        "gpufleet-fabric",
        "gpufleet / Fabric",
        "InfiniBand/RoCE throughput and errors from sysfs, NVLink errors from NVML (gpufleet fabric exporter).",
        ["infiniband", "nvlink"],
        "gpufleet_infiniband_port_state_id",
    )
    return _with_rows(board, _fabric_throughput_row, _fabric_errors_row, _nvlink_row)


def _fabric_throughput_row(board: dashboard.Dashboard, ids: _Ids) -> dashboard.Dashboard:
    """Row "InfiniBand throughput": Transmit and receive bytes per second, link utilisation, transmit wait per port."""
    return (
        board.with_row(_row(ids, "InfiniBand throughput"))
        .with_panel(
            _timeseries(
                ids,
                "Transmit",
                "rate(gpufleet_infiniband_port_transmit_bytes_total): bytes per second (sysfs port_xmit_data x 4).",
                [(f"rate(gpufleet_infiniband_port_transmit_bytes_total{{{NODE}}}[{RATE}])", PORT)],
                "Bps",
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Receive",
                "rate(gpufleet_infiniband_port_receive_bytes_total): bytes per second (sysfs port_rcv_data x 4).",
                [(f"rate(gpufleet_infiniband_port_receive_bytes_total{{{NODE}}}[{RATE}])", PORT)],
                "Bps",
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Link utilisation (transmit)",
                "Transmit rate over the port's data rate (sysfs 'rate').",
                [
                    (
                        f"rate(gpufleet_infiniband_port_transmit_bytes_total{{{NODE}}}[{RATE}])"
                        f" / gpufleet_infiniband_port_rate_bytes_per_second{{{NODE}}}",
                        PORT,
                    )
                ],
                "percentunit",
                min_value=0,
                max_value=1,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Transmit wait",
                "rate(gpufleet_infiniband_port_transmit_wait_total): ticks per second with data queued but not sent (congestion).",
                [(f"rate(gpufleet_infiniband_port_transmit_wait_total{{{NODE}}}[{RATE}])", PORT)],
                "short",
            )
        )
    )


def _fabric_errors_row(board: dashboard.Dashboard, ids: _Ids) -> dashboard.Dashboard:
    """Row "InfiniBand errors": IB link errors per 5m, ports not ACTIVE, saturated counters, exporter read errors."""
    return (
        board.with_row(_row(ids, "InfiniBand errors"))
        .with_panel(
            _timeseries(
                ids,
                "Link errors (per 5m)",
                "New symbol errors, link-downed events, link error recoveries and receive errors per port. A saturated "
                "counter stops counting, so it shows no new errors here whatever happens: see Saturated error counters.",
                [
                    (f"increase(gpufleet_infiniband_port_symbol_errors_total{{{NODE}}}[5m]) > 0", f"symbol_error {PORT}"),
                    (f"increase(gpufleet_infiniband_port_link_downed_total{{{NODE}}}[5m]) > 0", f"link_downed {PORT}"),
                    (f"increase(gpufleet_infiniband_port_link_error_recovery_total{{{NODE}}}[5m]) > 0", f"link_error_recovery {PORT}"),
                    (f"increase(gpufleet_infiniband_port_receive_errors_total{{{NODE}}}[5m]) > 0", f"port_rcv_errors {PORT}"),
                ],
                "short",
                span=16,
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Saturated error counters",
                "1 while an InfiniBand error counter sits at its maximum (symbol_error 65535, link_downed 255...): it "
                "no longer counts, so at least that many errors happened and new ones are unseen. Node health keeps "
                "the node degraded until the port's counters are reset (perfquery -x -R).",
                [(f'max by (node, hca, port, counter) (gpufleet_infiniband_counter_saturated{{{NODE},'
                  f'counter=~"{SATURABLE_ERRORS}"}})', f"{{{{counter}}}} {PORT}")],
                "short",
                span=8,
                min_value=0,
                max_value=1,
            )
        )
        .with_panel(
            _stat(ids, "Ports not ACTIVE", "Ports whose logical state is not 4 (ACTIVE).", f"count(gpufleet_infiniband_port_state_id{{{NODE}}} != 4)")
        )
        .with_panel(
            _stat(
                ids,
                "Saturated counters",
                "IB counters stuck at their maximum: their rates read flat. Reset with perfquery -x -R.",
                f"count(gpufleet_infiniband_counter_saturated{{{NODE}}} == 1)",
            )
        )
        .with_panel(
            _stat(
                ids,
                "Exporter read errors (1h)",
                "sysfs files the exporter failed to read or parse in the last hour.",
                f"sum(increase(gpufleet_infiniband_read_errors_total{{{NODE}}}[1h]))",
            )
        )
        .with_panel(
            _table(
                ids,
                "Saturated counters (which)",
                "Each saturated counter: node, HCA, port, counter.",
                f"gpufleet_infiniband_counter_saturated{{{NODE}}} == 1",
                span=6,
            )
        )
    )


def _nvlink_row(board: dashboard.Dashboard, ids: _Ids) -> dashboard.Dashboard:
    """Row "NVLink": NVLink errors per 5m and NVLinks down per node."""
    return (
        board.with_row(_row(ids, "NVLink"))
        .with_panel(
            _timeseries(
                ids,
                "NVLink errors (per 5m)",
                "New NVLink replay/recovery/CRC/ECC errors per GPU link (gpufleet_gpu_nvlink_errors_total).",
                [
                    (
                        f"sum by (node, gpu, link, type) (increase(gpufleet_gpu_nvlink_errors_total{{{NODE}}}[5m])) > 0",
                        "{{node}} GPU {{gpu}} link {{link}} {{type}}",
                    )
                ],
                "short",
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "NVLinks down",
                "NVLinks reported inactive, per node.",
                [(f"count by (node) (gpufleet_gpu_nvlink_up{{{NODE}}} == 0)", "{{node}}")],
                "short",
                min_value=0,
            )
        )
    )


def queues_dashboard() -> dashboard.Dashboard:
    """``gpufleet-queues``: Kueue ClusterQueue state (pending, admitted, GPU usage against quota)."""
    board = _base(
        "gpufleet-queues",
        "gpufleet / Queues",
        "Kueue: pending and admitted workloads and GPU usage against nominal quota per ClusterQueue.",
        ["kueue"],
        None,
    ).with_variable(
        dashboard.QueryVariable("cluster_queue")
        .label("ClusterQueue")
        .datasource(DATASOURCE)
        .query("label_values(kueue_pending_workloads, cluster_queue)")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )
    return _with_rows(board, _queue_workloads_row, _queue_gpu_quota_row, _goodput_row, _flip_cost_row)


def _queue_workloads_row(board: dashboard.Dashboard, ids: _Ids) -> dashboard.Dashboard:
    """Row "Workloads": Pending and admitted Kueue workloads per ClusterQueue."""
    return (
        board.with_row(_row(ids, "Workloads"))
        .with_panel(
            _timeseries(
                ids,
                "Pending workloads",
                "kueue_pending_workloads by ClusterQueue and status (active: waiting for quota; inadmissible: cannot be admitted as is).",
                [(f"sum by (cluster_queue, status) (kueue_pending_workloads{{{CQ}}})", "{{cluster_queue}} {{status}}")],
                "short",
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Admitted active workloads",
                "kueue_admitted_active_workloads by ClusterQueue.",
                [(f"sum by (cluster_queue) (kueue_admitted_active_workloads{{{CQ}}})", "{{cluster_queue}}")],
                "short",
                min_value=0,
            )
        )
    )


def _queue_gpu_quota_row(board: dashboard.Dashboard, ids: _Ids) -> dashboard.Dashboard:
    """Row "GPU quota": GPU usage against nominalQuota per ClusterQueue and flavor."""
    return (
        board.with_row(_row(ids, "GPU quota"))
        .with_panel(
            _timeseries(
                ids,
                "GPU usage / nominal quota",
                "kueue_cluster_queue_resource_usage over kueue_cluster_queue_nominal_quota for nvidia.com/gpu, per "
                "ClusterQueue and flavor. Above 1 means borrowing from the cohort.",
                [
                    (
                        f"sum by (cluster_queue, flavor) (kueue_cluster_queue_resource_usage{{{CQ},{GPU}}})"
                        f" / sum by (cluster_queue, flavor) (kueue_cluster_queue_nominal_quota{{{CQ},{GPU}}})",
                        "{{cluster_queue}} {{flavor}}",
                    )
                ],
                "percentunit",
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "GPUs used and nominal quota",
                "Absolute GPU usage and nominal quota per ClusterQueue and flavor.",
                [
                    (f"sum by (cluster_queue, flavor) (kueue_cluster_queue_resource_usage{{{CQ},{GPU}}})", "used {{cluster_queue}} {{flavor}}"),
                    (f"sum by (cluster_queue, flavor) (kueue_cluster_queue_nominal_quota{{{CQ},{GPU}}})", "quota {{cluster_queue}} {{flavor}}"),
                ],
                "short",
                min_value=0,
            )
        )
    )


def _goodput_row(board: dashboard.Dashboard, ids: _Ids) -> dashboard.Dashboard:
    """Row "Goodput": Training goodput: ETTR per job, lost time by cause, interruptions."""
    return (
        board.with_row(_row(ids, "Goodput"))
        .with_panel(
            _timeseries(
                ids,
                "Effective training time ratio",
                "gpufleet_job_ettr_ratio: share of each training job's wall-clock time since submission that turned "
                "into kept training progress (gpufleet goodput). The dashed line is 95%.",
                [("gpufleet_job_ettr_ratio", "{{namespace}}/{{job}}")],
                "percentunit",
                threshold=0.95,
                min_value=0,
                max_value=1,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "Lost time by cause",
                "gpufleet_job_badput_seconds summed over jobs, by bucket: queued, starting (admission or gang restart "
                "to training again), checkpoint_saving, progress_lost (work since the last checkpoint at each "
                "interruption), waiting_for_hardware (no healthy node for a pod), other.",
                [("sum by (bucket) (gpufleet_job_badput_seconds)", "{{bucket}}")],
                "s",
                min_value=0,
            )
        )
        .with_panel(
            _table(
                ids,
                "Jobs by ETTR",
                "Every training job's ETTR (gpufleet_job_ettr_ratio), lowest first.",
                "sort(gpufleet_job_ettr_ratio)",
                span=12,
            )
        )
        .with_panel(
            _table(
                ids,
                "Interruptions per job",
                "gpufleet_job_interruptions: runs of each job that ended before the job did.",
                "sort_desc(gpufleet_job_interruptions)",
                span=12,
            )
        )
    )


def _flip_cost_row(board: dashboard.Dashboard, ids: _Ids) -> dashboard.Dashboard:
    """Row "Outside capacity cost": GPUs outside and cost per hour by pool, and the cost over the time range.

    From the virtual kubelets' counters (:mod:`gpufleet.virtual_kubelet.ledger`): the rate of GPU-seconds is the GPUs held
    outside; the rate of cost x 3600 the cost per hour; ``increase`` over ``$__range`` the total, across restarts.
    """
    return (
        board.with_row(_row(ids, "Outside capacity cost"))
        .with_panel(
            _timeseries(
                ids,
                "Cost per hour outside, by pool",
                "What inference moved off the cluster costs now: rate of gpufleet_flip_external_gpu_cost_total "
                "x 3600 (GPUs running at the pool's provider x its price per GPU-hour), per pool and currency.",
                [(f"sum by (pool, currency) (rate(gpufleet_flip_external_gpu_cost_total[{RATE}])) * 3600",
                  "{{pool}} ({{currency}}/h)")],
                "short",
                span=8,
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                ids,
                "GPUs outside, by pool",
                "GPUs held at each pool's provider: rate of gpufleet_flip_external_gpu_seconds_total (GPU-seconds "
                "per second).",
                [(f"sum by (pool) (rate(gpufleet_flip_external_gpu_seconds_total[{RATE}]))", "{{pool}}")],
                "short",
                span=8,
                min_value=0,
            )
        )
        .with_panel(
            _table(
                ids,
                "Cost over the time range, by pool",
                "What outside capacity cost over the dashboard's time range, per pool and currency: increase of "
                "gpufleet_flip_external_gpu_cost_total (a virtual kubelet's restart resets its counters; increase "
                "counts across it).",
                "sum by (pool, currency) (increase(gpufleet_flip_external_gpu_cost_total[$__range]))",
                span=8,
            )
        )
    )


def to_json(board: dashboard.Dashboard) -> dict[str, Any]:
    """Serialise a built SDK dashboard to plain JSON-able dicts (the SDK's own encoder)."""
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def build_dashboards(rules: Rules) -> dict[str, dict[str, Any]]:
    """All gpufleet dashboards: ``{name: Grafana dashboard JSON}``; the GPU panels against node health's ``rules``.

    Names are the dashboard uids (``gpufleet-gpus``, ``gpufleet-fabric``,
    ``gpufleet-queues``); values are the JSON model Grafana imports
    (schemaVersion from the SDK, panels with unique ids, a ``datasource``
    variable of type prometheus).
    """
    return {name: to_json(builder()) for name, builder in (
        ("gpufleet-gpus", functools.partial(gpus_dashboard, rules)),
        ("gpufleet-fabric", fabric_dashboard),
        ("gpufleet-queues", queues_dashboard),
    )}
