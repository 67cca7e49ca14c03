"""Node health: the remediation controller (``gpufleet node-health``).

:mod:`~gpufleet.node_health.faults` turns the exporter's series in Prometheus
into faults per node; :mod:`~gpufleet.node_health.remediate` decides (rate
limit, degraded tier, lemons) and acts through the swap steps of
:mod:`gpufleet.ops.swap`; :mod:`~gpufleet.node_health.main` is the command.
"""
