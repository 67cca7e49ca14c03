"""Node health: the remediation controller (``gpufleet node-health``).

:mod:`~gpufleet.health.faults` turns the exporter's series in Prometheus
into faults per node; :mod:`~gpufleet.health.remediate` decides (rate
limit, degraded tier, lemons) and acts through the swap steps of
:mod:`gpufleet.ops.swap`; :mod:`~gpufleet.health.main` is the command.
"""
