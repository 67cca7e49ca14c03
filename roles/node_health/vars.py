"""Typed variables of the node_health role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet_admin.inventory.types import STRICT, DnsLabel, NonNegativeInt, PositiveInt

FaultKind = Literal["gpu_temp", "memory_temp", "ib_errors", "roce_errors", "nvlink_errors", "ecc_uncorrectable", "xid",
                    "gpu_missing", "gpu_partial", "telemetry"]


class SelectorRequirement(BaseModel):
    """One ``matchExpressions`` entry of a Kubernetes LabelSelector (metav1.LabelSelectorRequirement)."""

    model_config = STRICT

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(BaseModel):
    """A Kubernetes LabelSelector (``matchLabels``, ``matchExpressions``); empty selects every node."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[SelectorRequirement] = Field(default_factory=list, alias="matchExpressions")


class Vars(BaseModel):
    """Variables of the node_health role."""

    model_config = STRICT

    node_health_enabled: bool
    node_health_namespace: DnsLabel
    node_health_prometheus_url: str
    node_health_hot_samples: PositiveInt
    node_health_interval_seconds: PositiveInt
    node_health_drain_timeout_seconds: PositiveInt
    node_health_degraded_clear_seconds: PositiveInt
    node_health_error_window_seconds: PositiveInt
    node_health_nvlink_error_threshold: NonNegativeInt
    node_health_ib_error_threshold: NonNegativeInt
    node_health_roce_error_threshold: NonNegativeInt
    node_health_event_window_seconds: PositiveInt
    node_health_max_nodes_out: NonNegativeInt
    node_health_dry_run: bool
    node_health_fatal_xids: list[PositiveInt]
    node_health_degraded_faults: list[FaultKind]
    node_health_lemon_failures: PositiveInt
    node_health_lemon_window_hours: PositiveInt
    node_health_max_retired_pages: NonNegativeInt
    node_health_nvlink_window_seconds: PositiveInt
    node_health_xid_lookback_minutes: PositiveInt
    node_health_max_unhealthy_share: float = Field(ge=0.0, le=1.0)
    node_health_telemetry_node_selector: LabelSelector
