"""Typed variables of the node_health role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from gpufleet.inventory.types import STRICT, DnsLabel, NonNegativeInt, PositiveInt

FaultKind = Literal["gpu_temp", "memory_temp", "ib_errors", "roce_errors", "nvlink_errors", "ecc_uncorrectable", "xid",
                    "gpu_missing", "gpu_partial"]


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
