"""Typed variables of the node_health role (documentation: defaults.yaml).

The variables the controller's configuration takes have the kinds of its
fields (:mod:`gpufleet.node_health.config`: one rule per value, and the
defaults written there; ``defaults.yaml`` documents them and
``tests/roles/test_component_config.py`` keeps the two equal). The node
checks' limits (``node_health_max_retired_pages``,
``node_health_nvlink_window_seconds``, ``node_health_xid_lookback_minutes``)
are read by ``tests/nodes`` from the inventory, not by the controller.
"""

from __future__ import annotations

from pydantic import BaseModel

from gpufleet import componentconfig as cc
from gpufleet.node_health.config import FaultKind, LabelSelector
from gpufleet_admin.inventory.types import STRICT, NonNegativeInt, PositiveInt


class Vars(BaseModel):
    """Variables of the node_health role."""

    model_config = STRICT

    node_health_enabled: bool
    node_health_namespace: cc.DnsLabel
    node_health_prometheus_url: cc.HttpUrl
    node_health_hot_samples: cc.PositiveCount
    node_health_interval_seconds: cc.PositiveSeconds
    node_health_drain_timeout_seconds: cc.PositiveSeconds
    node_health_degraded_clear_seconds: cc.PositiveSeconds
    node_health_error_window_seconds: cc.PositiveSeconds
    node_health_nvlink_error_threshold: cc.Count
    node_health_ib_error_threshold: cc.Count
    node_health_roce_error_threshold: cc.Count
    node_health_event_window_seconds: cc.PositiveSeconds
    node_health_max_nodes_out: cc.Count
    node_health_dry_run: bool
    node_health_fatal_xids: cc.set_of(cc.PositiveInt)
    node_health_degraded_faults: cc.set_of(FaultKind)
    node_health_lemon_failures: cc.PositiveCount
    node_health_lemon_window_hours: cc.PositiveCount
    node_health_gpu_hold_seconds: cc.PositiveSeconds
    node_health_gpu_noexecute_faults: cc.set_of(FaultKind)
    node_health_max_retired_pages: NonNegativeInt
    node_health_nvlink_window_seconds: PositiveInt
    node_health_xid_lookback_minutes: PositiveInt
    node_health_max_unhealthy_share: cc.Share
    node_health_telemetry_node_selector: LabelSelector
