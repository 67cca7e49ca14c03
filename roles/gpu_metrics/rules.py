"""Prometheus alert rules for GPUs and the fabric, as a rule-file dict.

:func:`build_rules` returns ``{"groups": [...]}``: the same dict is written as
a plain Prometheus rule file and used as a PrometheusRule ``spec``. Alerts
read the gpufleet fabric exporter (``gpufleet_*``) and, for temperatures,
dcgm-exporter too (``DCGM_FI_DEV_GPU_TEMP``, ``DCGM_FI_DEV_MEMORY_TEMP``):
both run on every GPU node and either may be down, so the temperature alerts
have one rule per source under the same alert name, told apart by ``source``.

Every alert carries ``severity`` (``critical``: the node_health controller
takes the node out; ``warning``: a person looks), ``fault`` (a short stable
name the remediation controller maps to a taint reason) and ``component``.
Behaviour is pinned by ``promtool test rules`` in ``tests/roles/gpu_metrics/``.

The ``gpufleet-telemetry`` group judges only nodes that should have GPUs:
node health exports ``gpufleet_node_health_expected_gpus{node}`` (label
``nvidia.com/gpu.count``, else the Node's ``nvidia.com/gpu`` capacity, for
the Ready GPU nodes it judges) and the role's ``gpufleet-node-health``
scrape job brings it in, keeping that metric's own ``node`` label. The
exporter runs on CPU nodes too, where NVML has nothing to find; without
the join every CPU node would page.
"""

from __future__ import annotations

from typing import Any

#: Where an alert's node name comes from: the scrape config's ``node`` label
#: (``__meta_kubernetes_pod_node_name``), dcgm-exporter's ``Hostname``, else the target.
NODE = "{{ with $labels.node }}{{ . }}{{ else }}{{ with $labels.Hostname }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}{{ end }}"

#: Window over which counters must grow for the "rising" alerts.
ERROR_WINDOW = "5m"
#: Window for events that must not have happened at all recently (XID, uncorrectable ECC, read errors).
EVENT_WINDOW = "10m"

#: Port selectors by link layer (every port series carries ``link_layer``). InfiniBand
#: matches '' too: kernels without a ``link_layer`` file only had InfiniBand.
IB_PORTS = 'link_layer!="Ethernet"'
ROCE_PORTS = 'link_layer="Ethernet"'

#: mlx5 ``hw_counters`` of a RoCE port that count lost or retransmitted packets: on a
#: lossless (PFC/ECN) Ethernet fabric they stay flat; rising, the fabric drops packets
#: (Linux kernel ``mlx5_ib`` counters, NVIDIA "Understanding mlx5 Linux counters").
#: The IBA link-error counters of ``counters/`` mean nothing on Ethernet ports.
ROCE_LOSS_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "implied_nak_seq_err")

#: IB error counters with an alert each: metric, alert name, fault, what it means.
IB_ERROR_ALERTS: list[tuple[str, str, str, str]] = [
    (
        "gpufleet_infiniband_port_symbol_errors_total",
        "GpufleetInfiniBandSymbolErrorsRising",
        "ib-symbol-errors",
        "symbol errors (bit errors on the physical lanes: cable, transceiver or dirty connector)",
    ),
    (
        "gpufleet_infiniband_port_link_downed_total",
        "GpufleetInfiniBandLinkDownedRising",
        "ib-link-downed",
        "link-downed events (link error recovery failed and the link went down)",
    ),
    (
        "gpufleet_infiniband_port_link_error_recovery_total",
        "GpufleetInfiniBandLinkErrorRecoveryRising",
        "ib-link-error-recovery",
        "link error recoveries (the link retrained; traffic stalled meanwhile)",
    ),
    (
        "gpufleet_infiniband_port_receive_errors_total",
        "GpufleetInfiniBandReceiveErrorsRising",
        "ib-receive-errors",
        "receive errors (malformed packets received: CRC, length, VL mapping)",
    ),
]


def _number(value: float) -> str:
    """``78.0`` -> ``"78"``, ``77.5`` -> ``"77.5"`` (PromQL literal)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _alert(
    name: str,
    expr: str,
    *,
    severity: str,
    fault: str,
    summary: str,
    description: str,
    for_seconds: int = 0,
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_seconds:
        rule["for"] = f"{int(for_seconds)}s"
    rule["labels"] = {"severity": severity, "fault": fault, "component": "gpu_metrics", **(extra_labels or {})}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def _new_or_increased(metric: str, window: str) -> str:
    """Counter grew within ``window``, or appeared within it (``increase`` misses a series born at 1)."""
    return f"(increase({metric}[{window}]) > 0) or ({metric} unless {metric} offset {window})"


def build_rules(
    *,
    gpu_temp_threshold_celsius: float,
    memory_temp_threshold_celsius: float,
    for_seconds: int,
    telemetry_stale_seconds: float,
) -> dict[str, Any]:
    """The gpu_metrics Prometheus rule file.

    The values come from the inventory, checked there (the gpu_metrics
    variables, of the kinds node health's rules take: the alerts fire on the
    numbers the controller acts on; defaults in :class:`gpufleet.node_health.config.Rules`).

    Args:
        gpu_temp_threshold_celsius: GPU die temperature above which a GPU is
            pulled (Celsius). 78 C is the operating rule of large training
            fleets: H100 SXM throttles its clocks towards 85-87 C, and one slow
            GPU stalls the whole gang; the margin catches failing cooling early.
        memory_temp_threshold_celsius: HBM temperature threshold (Celsius);
            HBM3 is specified to 95 C and throttles before, 85 leaves margin.
        for_seconds: how long a state condition (temperature, port state,
            NVLink down) must hold before firing, seconds (60 = "for 1 minute").
        telemetry_stale_seconds: the exporter's nvml collector last succeeding
            longer ago than this is stale telemetry (``gpu_metrics_telemetry_stale_seconds``).

    Returns:
        ``{"groups": [{"name": ..., "rules": [...]}, ...]}`` (Prometheus rule
        file format, also a valid PrometheusRule ``spec``).
    """
    return {
        "groups": [
            {"name": "gpufleet-gpu",
             "rules": _temperature_rules(gpu_temp_threshold_celsius, memory_temp_threshold_celsius, for_seconds)
             + _gpu_fault_rules(for_seconds)},
            {"name": "gpufleet-nvlink", "rules": _nvlink_rules(for_seconds)},
            {"name": "gpufleet-fabric", "rules": _fabric_rules(for_seconds)},
            {"name": "gpufleet-telemetry", "rules": _telemetry_rules(for_seconds, telemetry_stale_seconds)},
        ]
    }


def _temperature_rules(gpu_temp_threshold_celsius: float, memory_temp_threshold_celsius: float,
                       for_seconds: int) -> list[dict[str, Any]]:
    """GPU die and HBM temperature alerts (Celsius), one rule per source (gpufleet exporter, dcgm-exporter)."""
    gpu_t = _number(gpu_temp_threshold_celsius)
    mem_t = _number(memory_temp_threshold_celsius)
    hold = f"{int(for_seconds)}s"
    gpu_rules: list[dict[str, Any]] = []
    for source, metric in (
        ("gpufleet-exporter", "gpufleet_gpu_temperature_celsius"),
        ("dcgm-exporter", "DCGM_FI_DEV_GPU_TEMP"),
    ):
        gpu_rules.append(
            _alert(
                "GpufleetGPUTemperatureHigh",
                f"{metric} > {gpu_t}",
                severity="critical",
                fault="gpu-temperature",
                for_seconds=for_seconds,
                extra_labels={"source": source},
                summary=f"GPU {{{{ $labels.gpu }}}} on {NODE} above {gpu_t} C",
                description=(
                    f"GPU {{{{ $labels.gpu }}}} on {NODE} has been at {{{{ $value }}}} C for more than {hold} "
                    f"(threshold {gpu_t} C, source {source}). A hot GPU throttles and stalls its whole job: "
                    "the node is taken out for repair."
                ),
            )
        )
    for source, metric in (
        ("gpufleet-exporter", "gpufleet_gpu_memory_temperature_celsius"),
        ("dcgm-exporter", "DCGM_FI_DEV_MEMORY_TEMP"),
    ):
        gpu_rules.append(
            _alert(
                "GpufleetGPUMemoryTemperatureHigh",
                f"{metric} > {mem_t}",
                severity="critical",
                fault="gpu-memory-temperature",
                for_seconds=for_seconds,
                extra_labels={"source": source},
                summary=f"GPU {{{{ $labels.gpu }}}} memory on {NODE} above {mem_t} C",
                description=(
                    f"HBM of GPU {{{{ $labels.gpu }}}} on {NODE} has been at {{{{ $value }}}} C for more than {hold} "
                    f"(threshold {mem_t} C, source {source})."
                ),
            )
        )
    return gpu_rules


def _gpu_fault_rules(for_seconds: int) -> list[dict[str, Any]]:
    """GPU faults NVML reports: lost or erroring GPUs, uncorrectable ECC, row remap failure, XID, NVML down."""
    return [
        _alert(
            "GpufleetGPULost",
            "gpufleet_gpu_lost == 1",
            severity="critical",
            fault="gpu-lost",
            summary=f"GPU {{{{ $labels.gpu }}}} on {NODE} has fallen off the bus",
            description=f"NVML reports GPU_IS_LOST for GPU {{{{ $labels.gpu }}}} on {NODE} (XID 79 class): it needs a reset or the node a reboot/repair.",
        ),
        _alert(
            "GpufleetGPUErroring",
            "gpufleet_gpu_erroring == 1",
            severity="critical",
            fault="gpu-erroring",
            summary=f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.pci_bus_id }}}}) on {NODE} answers NVML with errors",
            description=(
                f"NVML returns errors for GPU {{{{ $labels.gpu }}}} ({{{{ $labels.pci_bus_id }}}}) on {NODE}: its device "
                "handle fails (nvidia-smi: 'Unknown Error') or every value read fails; the error names are in "
                "gpufleet_gpu_nvml_errors_total. Treated as a missing GPU: the node is taken out for repair."
            ),
        ),
        _alert(
            "GpufleetGPUUncorrectableECC",
            # increase() only: the counter is lifetime (InfoROM), so a series "born"
            # non-zero at exporter start holds old errors, not new ones.
            f'increase(gpufleet_gpu_ecc_errors_total{{type="uncorrected"}}[{EVENT_WINDOW}]) > 0',
            severity="critical",
            fault="gpu-ecc",
            summary=f"Uncorrectable ECC errors on GPU {{{{ $labels.gpu }}}} on {NODE}",
            description=f"GPU {{{{ $labels.gpu }}}} on {NODE} counted new uncorrectable (double-bit) ECC errors in the last {EVENT_WINDOW}.",
        ),
        _alert(
            "GpufleetGPURowRemapFailure",
            "gpufleet_gpu_remapped_rows_failure == 1",
            severity="critical",
            fault="gpu-row-remap-failure",
            summary=f"GPU {{{{ $labels.gpu }}}} on {NODE} failed to remap a memory row",
            description=f"GPU {{{{ $labels.gpu }}}} on {NODE} has no spare memory rows left: replace the GPU.",
        ),
        _alert(
            "GpufleetGPUXidError",
            _new_or_increased("gpufleet_gpu_xid_events_total", EVENT_WINDOW),
            severity="warning",
            fault="gpu-xid",
            summary=f"XID {{{{ $labels.xid }}}} on GPU {{{{ $labels.gpu }}}} on {NODE}",
            description=f"NVML delivered critical XID {{{{ $labels.xid }}}} for GPU {{{{ $labels.gpu }}}} on {NODE} in the last {EVENT_WINDOW}.",
        ),
        _alert(
            "GpufleetNVMLUnavailable",
            "gpufleet_gpu_nvml_available == 0",
            severity="warning",
            fault="nvml-unavailable",
            for_seconds=max(for_seconds, 300),
            summary=f"NVML unavailable on {NODE}",
            description=f"The fabric exporter on {NODE} cannot initialise NVML (driver not loaded or library missing): GPU health is blind there.",
        ),
    ]


def _nvlink_rules(for_seconds: int) -> list[dict[str, Any]]:
    """The ``gpufleet-nvlink`` group: NVLink errors rising, a link down for ``for_seconds``."""
    hold = f"{int(for_seconds)}s"
    return [
        _alert(
            "GpufleetNVLinkErrorsRising",
            f"increase(gpufleet_gpu_nvlink_errors_total[{ERROR_WINDOW}]) > 0",
            severity="warning",
            fault="nvlink-errors",
            summary=f"NVLink {{{{ $labels.link }}}} of GPU {{{{ $labels.gpu }}}} on {NODE}: {{{{ $labels.type }}}} errors rising",
            description=(
                f"NVLink {{{{ $labels.link }}}} of GPU {{{{ $labels.gpu }}}} on {NODE} counted {{{{ $value }}}} new "
                f"{{{{ $labels.type }}}} errors in {ERROR_WINDOW}."
            ),
        ),
        _alert(
            "GpufleetNVLinkDown",
            "gpufleet_gpu_nvlink_up == 0",
            severity="critical",
            fault="nvlink-down",
            for_seconds=for_seconds,
            summary=f"NVLink {{{{ $labels.link }}}} of GPU {{{{ $labels.gpu }}}} on {NODE} is down",
            description=f"NVLink {{{{ $labels.link }}}} of GPU {{{{ $labels.gpu }}}} on {NODE} has been inactive for more than {hold}.",
        ),
    ]


def _fabric_rules(for_seconds: int) -> list[dict[str, Any]]:
    """The ``gpufleet-fabric`` group: InfiniBand error counters, port states, RoCE loss, saturation, read errors."""
    hold = f"{int(for_seconds)}s"
    fabric_rules = [
        _alert(
            alert,
            f"increase({metric}{{{IB_PORTS}}}[{ERROR_WINDOW}]) > 0",
            severity="warning",
            fault=fault,
            summary=f"InfiniBand {{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE}: {meaning.split(' (')[0]} rising",
            description=(
                f"{{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE} counted {{{{ $value }}}} new {meaning} in "
                f"{ERROR_WINDOW}. Counters clamp when full: see GpufleetInfiniBandCounterSaturated."
            ),
        )
        for metric, alert, fault, meaning in IB_ERROR_ALERTS
    ]
    fabric_rules += [
        _alert(
            "GpufleetInfiniBandPortNotActive",
            f"gpufleet_infiniband_port_state_id{{{IB_PORTS}}} != 4",
            severity="critical",
            fault="ib-port-down",
            for_seconds=for_seconds,
            summary=f"InfiniBand {{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE} is not ACTIVE",
            description=(
                f"{{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE} has been in state {{{{ $value }}}} "
                f"(1=DOWN, 2=INIT, 3=ARMED; 4=ACTIVE expected) for more than {hold}."
            ),
        ),
        _alert(
            "GpufleetRoCEPortNotActive",
            f"gpufleet_infiniband_port_state_id{{{ROCE_PORTS}}} != 4",
            severity="critical",
            fault="roce-port-down",
            for_seconds=for_seconds,
            summary=f"RoCE {{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE} is not ACTIVE",
            description=(
                f"RoCE (Ethernet link layer) {{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE} has been in state "
                f"{{{{ $value }}}} (1=DOWN: the Ethernet link is down; 4=ACTIVE expected) for more than {hold}."
            ),
        ),
        _alert(
            "GpufleetRoCEPacketLossRising",
            f'increase(gpufleet_infiniband_port_hw_stat_total{{{ROCE_PORTS},counter=~"{"|".join(ROCE_LOSS_COUNTERS)}"}}'
            f"[{ERROR_WINDOW}]) > 0",
            severity="warning",
            fault="roce-packet-loss",
            summary=f"RoCE {{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE}: {{{{ $labels.counter }}}} rising",
            description=(
                f"RoCE {{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE} counted {{{{ $value }}}} new "
                f"{{{{ $labels.counter }}}} in {ERROR_WINDOW}: packets were lost and retransmitted. A lossless RoCE "
                "fabric (PFC/ECN) keeps these flat; check the switch's PFC and buffer settings and the cable."
            ),
        ),
        _alert(
            "GpufleetInfiniBandCounterSaturated",
            "gpufleet_infiniband_counter_saturated == 1",
            severity="warning",
            fault="ib-counter-saturated",
            summary=f"InfiniBand {{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE}: {{{{ $labels.counter }}}} saturated",
            description=(
                f"Counter {{{{ $labels.counter }}}} of {{{{ $labels.hca }}}} port {{{{ $labels.port }}}} on {NODE} sits at its "
                "maximum and no longer counts: its rate reads flat whatever happens. Reset the port counters (perfquery -x -R)."
            ),
        ),
        _alert(
            "GpufleetFabricExporterReadErrors",
            _new_or_increased("gpufleet_infiniband_read_errors_total", EVENT_WINDOW),
            severity="warning",
            fault="exporter-read-errors",
            summary=f"Fabric exporter on {NODE} cannot read {{{{ $labels.file }}}}",
            description=(
                f"The fabric exporter on {NODE} failed to read {{{{ $labels.file }}}} ({{{{ $labels.reason }}}}) in the last "
                f"{EVENT_WINDOW}; the series it feeds is absent, so alerts on it stay silent."
            ),
        ),
    ]
    return fabric_rules


#: Nodes that should have GPUs, one series each (``node`` label only; node health's metric).
EXPECTED_GPUS = "max by (node) (gpufleet_node_health_expected_gpus) > 0"
#: GPUs with series, per node: the exporter writes ``gpufleet_gpu_lost`` (0 or 1) for every GPU NVML
#: enumerates, ``gpufleet_gpu_erroring`` for every one it has a handle or an error for.
GPUS_SEEN = "count by (node) (count by (node, gpu) (gpufleet_gpu_lost or gpufleet_gpu_erroring))"


def _telemetry_rules(for_seconds: int, stale_seconds: float) -> list[dict[str, Any]]:
    """The ``gpufleet-telemetry`` group: GPU telemetry failing, stale, absent or short of GPUs; node health's breaker."""
    hold = f"{int(for_seconds)}s"
    stale = _number(stale_seconds)
    nvml = 'collector="nvml"'
    return [
        _alert(
            "GpufleetGPUTelemetryFailing",
            f"gpufleet_exporter_collector_success{{{nvml}}} == 0 and on (node) ({EXPECTED_GPUS})",
            severity="critical",
            fault="gpu-telemetry-failing",
            for_seconds=for_seconds,
            summary=f"GPU telemetry failing on {NODE}",
            description=(
                f"The exporter's nvml collector on {NODE} has failed to read NVML for more than {hold}: its GPUs' "
                "temperatures, XIDs and ECC errors are unknown. Node health takes the node out of training (telemetry fault)."
            ),
        ),
        _alert(
            "GpufleetGPUTelemetryStale",
            f"(time() - gpufleet_exporter_collector_last_success_timestamp_seconds{{{nvml}}}) > {stale} "
            f"and on (node) ({EXPECTED_GPUS})",
            severity="critical",
            fault="gpu-telemetry-stale",
            summary=f"GPU telemetry on {NODE} is stale",
            description=(
                f"The exporter's nvml collector on {NODE} last read NVML {{{{ $value | humanizeDuration }}}} ago "
                f"(bound {stale}s, gpu_metrics_telemetry_stale_seconds): NVML hangs or the collector is stuck."
            ),
        ),
        _alert(
            "GpufleetGPUTelemetryAbsent",
            f"({EXPECTED_GPUS}) unless on (node) gpufleet_gpu_nvml_available",
            severity="critical",
            fault="gpu-telemetry-absent",
            for_seconds=for_seconds,
            summary=f"No GPU telemetry from {NODE}",
            description=(
                f"{NODE} should have {{{{ $value }}}} GPUs but Prometheus has had no gpufleet_gpu_* series from it for more "
                f"than {hold}: the exporter is not running or not scraped there."
            ),
        ),
        _alert(
            "GpufleetGPUTelemetryIncomplete",
            f"({EXPECTED_GPUS}) > on (node) ({GPUS_SEEN} or on (node) (0 * max by (node) (gpufleet_gpu_nvml_available)))",
            severity="critical",
            fault="gpu-telemetry-incomplete",
            for_seconds=for_seconds,
            summary=f"Fewer GPUs in telemetry than {NODE} should have",
            description=(
                f"{NODE} should have {{{{ $value }}}} GPUs but fewer have gpufleet_gpu_* series, for more than {hold}: "
                "a GPU fell off the bus before NVML enumerated it, or NVML is unavailable."
            ),
        ),
        _alert(
            "GpufleetNodeHealthBreakerOpen",
            "max(gpufleet_node_health_breaker_open) == 1",
            severity="warning",
            fault="node-health-breaker-open",
            summary="Node health's circuit breaker holds remediation",
            description=(
                "Taking more nodes out would put more than node_health_max_unhealthy_share of the GPU fleet out of "
                "service, so node health holds its actions (Events RemediationHeldByBreaker on the nodes). Check whether "
                "the faults are real (a bad exporter rollout or a Prometheus problem reads like many faulty nodes); "
                "if they are, `invoke health.breaker-resume --env ENV` lets it act. It resumes by itself when the share falls."
            ),
        ),
    ]


def alert_names(rules: dict[str, Any]) -> list[str]:
    """Distinct alert names in a rule-file dict, in order of appearance."""
    names: list[str] = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule and rule["alert"] not in names:
                names.append(rule["alert"])
    return names
