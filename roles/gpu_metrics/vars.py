"""Typed variables of the gpu_metrics role (documentation: defaults.yaml).

The temperature thresholds, the scrape interval and the stale bound are also
node health's rules (:class:`gpufleet.node_health.config.Rules`: the alerts,
the dashboards and the controller judge by the same numbers): they take the
kinds of its fields, whose defaults ``defaults.yaml`` documents
(``tests/roles/test_component_config.py`` keeps the two equal).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from gpufleet import componentconfig as cc
from gpufleet_admin.inventory.types import STRICT, Celsius, DnsLabel, PositiveInt


class Vars(BaseModel):
    """Variables of the gpu_metrics role."""

    model_config = STRICT

    gpu_metrics_enabled: bool
    gpu_metrics_namespace: DnsLabel
    gpu_metrics_dcgm_exporter_install: bool
    gpu_metrics_gpu_temp_threshold_celsius: Celsius
    gpu_metrics_memory_temp_threshold_celsius: Celsius
    gpu_metrics_alert_for_seconds: PositiveInt
    gpu_metrics_exporter_port: int = Field(ge=1, le=65535)
    gpu_metrics_exporter_fixture_node: Annotated[str, Field(pattern=r"^/")] | None = None
    gpu_metrics_scrape_interval_seconds: cc.PositiveSeconds
    gpu_metrics_telemetry_stale_seconds: cc.PositiveSeconds
    gpu_metrics_prometheus_operator: bool
    gpu_metrics_grafana_dashboards: bool
