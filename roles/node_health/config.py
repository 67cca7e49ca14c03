"""What ``gpufleet node-health`` is configured with, from the inventory: the variable behind each field.

The model, its defaults and its checks are the component's
(:mod:`gpufleet.node_health.config`); this declaration is the road from the
inventory (and stack config, which overrides it) to it: node_health_*, the
gpu_metrics thresholds and scrape interval its rules judge the series by
(the alerts and dashboards of gpu_metrics use the same variables), and the
kueue role's switch for partial GPU nodes (the one node classifier).
:func:`gpufleet_admin.configs.build` makes the configuration from it; the
role renders that into ConfigMap ``node-health-config``.
"""

from __future__ import annotations

from gpufleet.node_health.config import Configuration
from gpufleet_admin import configs
from gpufleet_admin.inventory import Inventory

#: Configuration field -> the inventory variable that feeds it (None: no variable, the model's default).
VARIABLES: configs.Variables = {
    "rules.hot_samples": "node_health_hot_samples",
    "rules.gpu_temp_celsius": "gpu_metrics_gpu_temp_threshold_celsius",
    "rules.memory_temp_celsius": "gpu_metrics_memory_temp_threshold_celsius",
    "rules.fatal_xids": "node_health_fatal_xids",
    "rules.scrape_interval_seconds": "gpu_metrics_scrape_interval_seconds",
    "rules.event_window_seconds": "node_health_event_window_seconds",
    "rules.error_window_seconds": "node_health_error_window_seconds",
    "rules.nvlink_error_threshold": "node_health_nvlink_error_threshold",
    "rules.ib_error_threshold": "node_health_ib_error_threshold",
    "rules.roce_error_threshold": "node_health_roce_error_threshold",
    "rules.node_label": None,
    "rules.telemetry_stale_seconds": "gpu_metrics_telemetry_stale_seconds",
    "max_nodes_out": "node_health_max_nodes_out",
    "dry_run": "node_health_dry_run",
    "degraded_faults": "node_health_degraded_faults",
    "lemon_failures": "node_health_lemon_failures",
    "lemon_window_hours": "node_health_lemon_window_hours",
    "namespace": "node_health_namespace",
    "prometheus_url": "node_health_prometheus_url",
    "drain_timeout_seconds": "node_health_drain_timeout_seconds",
    "degraded_clear_seconds": "node_health_degraded_clear_seconds",
    "interval_seconds": "node_health_interval_seconds",
    "partial_nodes_train": "kueue_partial_gpu_nodes_count",
    "max_unhealthy_share": "node_health_max_unhealthy_share",
    "telemetry_node_selector": "node_health_telemetry_node_selector",
    "gpu_noexecute_faults": "node_health_gpu_noexecute_faults",
    "gpu_hold_seconds": "node_health_gpu_hold_seconds",
}


def configuration(inv: Inventory) -> Configuration:
    """Node health's configuration for ``inv``.

    Raises:
        gpufleet_admin.inventory.InventoryError: a value the configuration refuses, named by variable.
    """
    return configs.build(inv, Configuration, VARIABLES)
