"""Node health's configuration: one typed, frozen model (the fault rules nested in it), defaults and checks.

``gpufleet node-health --config FILE`` reads it (:func:`load`); the
node_health role builds it from the inventory and stack config
(``roles/node_health/config.py`` says which variable feeds each field:
node_health_*, the gpu_metrics thresholds and scrape interval the rules
judge series by, kueue_partial_gpu_nodes_count) and renders it into the
controller's ConfigMap. Flags set a field by hand and win over the file.
The defaults are written here only (the roles' ``defaults.yaml`` document
them, ``tests/roles/test_component_config.py`` keeps the two equal), and so
are the checks: flags and inventory variables take the same kinds
(:mod:`gpufleet.componentconfig`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet import componentconfig as cc
from gpufleet.names import SYSTEM_NAMESPACE

#: ``kind`` of the file.
KIND = "NodeHealthConfiguration"

#: Fault kinds (:mod:`gpufleet.node_health.faults` says what each rule is).
FAULT_KINDS = ("gpu_temp", "memory_temp", "ib_errors", "roce_errors", "nvlink_errors", "ecc_uncorrectable", "xid",
               "gpu_missing", "gpu_partial", "telemetry")
FaultKind = Literal[FAULT_KINDS]


class SelectorRequirement(BaseModel):
    """One ``matchExpressions`` entry of a Kubernetes LabelSelector (metav1.LabelSelectorRequirement)."""

    model_config = cc.STRICT

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(BaseModel):
    """A Kubernetes LabelSelector (``matchLabels``, ``matchExpressions``, the API's spelling); empty selects all."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[SelectorRequirement] = Field(default_factory=list, alias="matchExpressions")

    def api(self) -> dict[str, Any]:
        """The selector as the API writes it (what :func:`gpufleet.kube.selectors.selector_matches` takes)."""
        return self.model_dump(by_alias=True)


class Rules(BaseModel):
    """Thresholds and windows of the fault rules (:mod:`gpufleet.node_health.faults`).

    Attributes:
        hot_samples: consecutive samples above a temperature threshold before a fault.
        gpu_temp_celsius: GPU threshold, degrees Celsius (``gpu_metrics_gpu_temp_threshold_celsius``: the
            alerts and dashboards of gpu_metrics say the same number).
        memory_temp_celsius: HBM threshold, degrees Celsius.
        fatal_xids: XIDs that are faults (NVIDIA's XID catalog: 48 double-bit ECC, 63/64 row remapping,
            74 NVLink, 79 fallen off the bus, 94/95 contained/uncontained ECC, 119/120 GSP).
        scrape_interval_seconds: the exporters' scrape interval.
        event_window_seconds: how far back an XID or ECC event counts.
        error_window_seconds: window of NVLink/IB/RoCE error growth.
        nvlink_error_threshold, ib_error_threshold, roce_error_threshold: errors per node within the
            window tolerated (growth above it is a fault).
        node_label: label naming the node on every series.
        telemetry_stale_seconds: a GPU collector whose last success is older than this is stale
            (four scrape intervals at the default 15 s: one slow or missed read is no fault).
    """

    model_config = cc.STRICT

    hot_samples: cc.PositiveCount = 3
    gpu_temp_celsius: cc.Celsius = 78.0
    memory_temp_celsius: cc.Celsius = 85.0
    fatal_xids: cc.set_of(cc.PositiveInt) = frozenset({48, 63, 64, 74, 79, 94, 95, 119, 120})
    scrape_interval_seconds: cc.PositiveSeconds = 15.0
    event_window_seconds: cc.PositiveSeconds = 600.0
    error_window_seconds: cc.PositiveSeconds = 300.0
    nvlink_error_threshold: cc.Count = 0
    ib_error_threshold: cc.Count = 0
    roce_error_threshold: cc.Count = 0
    node_label: str = Field(default="node", min_length=1)
    telemetry_stale_seconds: cc.PositiveSeconds = 60.0

    @property
    def hot_window_seconds(self) -> float:
        """Range that holds the last ``hot_samples`` samples with margin: (N + 1) scrape intervals, at least 30 s."""
        return max((self.hot_samples + 1) * self.scrape_interval_seconds, 30.0)


class Configuration(BaseModel):
    """Everything ``gpufleet node-health`` is configured with.

    Attributes:
        rules: fault thresholds and windows.
        max_nodes_out: never more than this many nodes out (swap or degraded) at once.
        dry_run: decide and record Events, change no node.
        degraded_faults: fault kinds that send a node to the degraded tier (inference only) instead of out
            of service.
        lemon_failures: attributable failures within the window that make a node a lemon.
        lemon_window_hours: the lemon window (:attr:`lemon_window_seconds`).
        namespace: swap requests, the circuit breaker's ConfigMap and the Lease live here.
        prometheus_url: where the exporters' series are read.
        drain_timeout_seconds: how long a swap's drain may take before it is reported stuck.
        degraded_clear_seconds: fault-free time before a degraded node returns by itself.
        interval_seconds: seconds between evaluations.
        partial_nodes_train: the remaining GPUs of a node whose allocatable fell below its capacity count for
            training (no ``gpu_partial`` fault; ``kueue_partial_gpu_nodes_count``).
        max_unhealthy_share: most of the GPU fleet (0..1) out of service at once before the circuit breaker
            holds new actions (NVSentinel's 50%).
        telemetry_node_selector: the GPU nodes whose GPU telemetry is judged (the ``telemetry`` fault);
            empty: every one.
        gpu_noexecute_faults: on a node whose GPUs are allocated through DRA, fault kinds of one GPU that
            kill what runs on it: its DeviceTaintRule's effect is ``NoExecute`` (the pods using it are
            evicted); the other kinds ``NoSchedule`` (:mod:`gpufleet.node_health.devices`). XID, uncorrectable
            ECC and a GPU lost are the faults after which NVIDIA's XID catalog says the GPU's work is lost
            (its application must restart).
        gpu_hold_seconds: fault-free time before a GPU node health took out returns (its node checks
            passing too); the GPU counterpart of ``degraded_clear_seconds``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    rules: Rules = Rules()
    max_nodes_out: cc.Count = 4
    dry_run: bool = False
    degraded_faults: cc.set_of(FaultKind) = frozenset({"gpu_temp", "memory_temp", "ib_errors", "roce_errors",
                                                       "gpu_partial", "telemetry"})
    lemon_failures: cc.PositiveCount = 3
    lemon_window_hours: cc.PositiveCount = 168
    namespace: cc.DnsLabel = SYSTEM_NAMESPACE
    prometheus_url: cc.HttpUrl = "http://prometheus.monitoring:9090"
    drain_timeout_seconds: cc.PositiveSeconds = 600.0
    degraded_clear_seconds: cc.PositiveSeconds = 600.0
    interval_seconds: cc.PositiveSeconds = 5.0
    partial_nodes_train: bool = False
    max_unhealthy_share: cc.Share = 0.5
    telemetry_node_selector: LabelSelector = LabelSelector()
    gpu_noexecute_faults: cc.set_of(FaultKind) = frozenset({"xid", "ecc_uncorrectable", "gpu_missing"})
    gpu_hold_seconds: cc.PositiveSeconds = 600.0

    @property
    def lemon_window_seconds(self) -> float:
        """The lemon window in seconds."""
        return self.lemon_window_hours * 3600.0

    def replace(self, **changes: Any) -> "Configuration":
        """A copy with ``changes`` applied, checked again (nested ``rules`` given whole)."""
        return type(self).model_validate({**dict(self), **changes})


#: The defaults: what a controller started without ``--config`` runs with.
DEFAULTS = Configuration()


#: The file: ``load(path)`` reads and checks one, ``dump(config)`` writes one.
FILE = cc.ConfigFile(Configuration, KIND)
load = FILE.load
dump = FILE.dump
