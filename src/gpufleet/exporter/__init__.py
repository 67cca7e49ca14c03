"""The gpufleet fabric exporter: InfiniBand/RoCE port counters from sysfs and GPU health from NVML.

Modules: :mod:`.sysfs` (pure sysfs reader), :mod:`.nvml` (NVML backend protocol,
pynvml backend, sampler), :mod:`.collector` (Prometheus collectors),
:mod:`.main` (the ``gpufleet exporter`` command), :mod:`.nvml_fake` (the NVML
backend of simulated nodes; fixture nodes themselves live in :mod:`gpufleet_workshop.fixtures.node`).
"""
