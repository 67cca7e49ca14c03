"""The gpu_metrics role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class GpuMetrics(RoleComponent):
    """dcgm-exporter, the fabric exporter, scrape config, alert rules and dashboards."""

    TOKEN = "gpufleet:monitoring:GpuMetrics"
    ROLE = "gpu_metrics"
