"""``gpufleet exporter``: serve ``/metrics`` (or print one exposition with ``--once``).

Flags mirror node_exporter where they overlap (``--sysfs-root`` is
``--path.sysfs``); ``--metrics-port`` (``--port``: deprecated alias),
``--log-level``, logging, signals and the HTTP endpoint are the runtime every
gpufleet process shares (:mod:`gpufleet.controllers`). ``--nvml-fake FILE``
replaces the NVML library by a node description (:mod:`gpufleet_workshop.fixtures.node`)
for fixture nodes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.controllers import flags, runtime
from gpufleet.controllers.exposition import render_text
from gpufleet.exporter.collector import GpuCollector, InfiniBandCollector
from gpufleet.exporter.nvml import NvmlBackend, NvmlSampler, PynvmlBackend

log = logging.getLogger("gpufleet.exporter")

#: Default port: unassigned in the Prometheus default port allocations wiki at the time of writing.
DEFAULT_PORT = 9838


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the exporter's flags to ``parser`` (the ``exporter`` subcommand of ``gpufleet``)."""
    parser.add_argument("--listen-address", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    flags.add_metrics_port(parser, default=DEFAULT_PORT, allow_off=False, port_alias=True)
    parser.add_argument("--sysfs-root", default="/sys", help="sysfs mount point, like node_exporter --path.sysfs (default: %(default)s)")
    parser.add_argument("--nvml-fake", metavar="FILE", help="read GPUs from a node description JSON instead of NVML (fixtures)")
    parser.add_argument("--no-nvml", action="store_true", help="do not collect GPU metrics at all")
    parser.add_argument("--once", action="store_true", help="print one exposition to stdout and exit")
    flags.add_log_level(parser)


class ExporterSelfCollector(Collector):
    """The exporter's own health, per collector (``infiniband``, ``nvml``), after node_exporter's
    ``node_scrape_collector_{duration_seconds,success}``:

    * ``gpufleet_exporter_collector_duration_seconds{collector}``: seconds the
      collector's latest collect took;
    * ``gpufleet_exporter_collector_success{collector}``: 1 when its latest
      collect read its source, 0 when not (see :class:`InfiniBandCollector`
      and :class:`GpuCollector` for what counts);
    * ``gpufleet_exporter_collector_last_success_timestamp_seconds{collector}``:
      Unix seconds of its latest successful collect; absent before the first.

    Registered after the collectors, so a scrape reports the collects it just ran.
    """

    def __init__(self, collectors: dict[str, InfiniBandCollector | GpuCollector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        """Yield the three gauges, one sample per collector that has collected (last one only after a success)."""
        duration = GaugeMetricFamily(
            "gpufleet_exporter_collector_duration_seconds",
            "Seconds the collector's latest collect() took (sysfs reads or NVML calls).",
            labels=["collector"],
        )
        success = GaugeMetricFamily(
            "gpufleet_exporter_collector_success",
            "1 when the collector's latest collect read its source, 0 when not: infiniband 1 when "
            "class/infiniband was listed or is absent, 0 when listing it failed; nvml 1 when NVML initialised and "
            "answered the device count, 0 without NVML or when every GPU errored; 0 when the collect raised.",
            labels=["collector"],
        )
        last = GaugeMetricFamily(
            "gpufleet_exporter_collector_last_success_timestamp_seconds",
            "Unix time in seconds of the collector's latest successful collect; absent before the first.",
            labels=["collector"],
        )
        for name, collector in self.collectors.items():
            duration.add_metric([name], collector.last_duration_seconds)
            if collector.last_success is not None:
                success.add_metric([name], 1 if collector.last_success else 0)
            if collector.last_success_timestamp is not None:
                last.add_metric([name], collector.last_success_timestamp)
        yield duration
        if success.samples:
            yield success
        if last.samples:
            yield last


def build_registry(
    sysfs_root: str = "/sys",
    nvml_backend: NvmlBackend | None = None,
    self_metrics: bool = False,
) -> CollectorRegistry:
    """A registry with the InfiniBand collector and, given a backend, the GPU collector.

    Args:
        sysfs_root: sysfs mount point.
        nvml_backend: NVML backend; ``None`` leaves GPUs out entirely.
        self_metrics: add process metrics and the collectors' duration,
            success and last-success gauges (:class:`ExporterSelfCollector`;
            not deterministic, so off for ``--once`` fixtures).
    """
    registry = CollectorRegistry(auto_describe=False)
    collectors: dict[str, InfiniBandCollector | GpuCollector] = {"infiniband": InfiniBandCollector(sysfs_root)}
    if nvml_backend is not None:
        from gpufleet.exporter.sysfs import nvidia_gpu_bus_ids

        sampler = NvmlSampler(nvml_backend, pci_bus_ids=lambda: nvidia_gpu_bus_ids(sysfs_root))
        collectors["nvml"] = GpuCollector(sampler)
    for collector in collectors.values():
        registry.register(collector)
    if self_metrics:
        from prometheus_client import ProcessCollector

        ProcessCollector(registry=registry)
        registry.register(ExporterSelfCollector(collectors))
    return registry


def backend_from_args(args: argparse.Namespace) -> NvmlBackend | None:
    """The NVML backend the flags ask for: fake, none, or the real pynvml one."""
    if args.no_nvml:
        return None
    if args.nvml_fake:
        from gpufleet.exporter.nvml_fake import FakeNvmlBackend

        return FakeNvmlBackend(args.nvml_fake)
    return PynvmlBackend()


def run(args: argparse.Namespace) -> int:
    """Run the exporter with parsed ``args``; returns the process exit code.

    With ``--once`` prints one exposition (text format 0.0.4) and returns 0.
    Otherwise serves ``http://LISTEN:PORT/metrics`` (and ``/healthz``) until SIGTERM/SIGINT.
    """
    runtime.setup_logging(args.log_level)
    if not Path(args.sysfs_root).is_dir():
        print(f"gpufleet exporter: --sysfs-root {args.sysfs_root}: expected a folder (the sysfs mount)", file=sys.stderr)
        return 2
    try:
        backend = backend_from_args(args)
    except (OSError, ValueError) as exc:  # the fake node description: unreadable or not JSON
        print(f"gpufleet exporter: --nvml-fake {args.nvml_fake}: {exc}", file=sys.stderr)
        return 2
    if args.once:
        registry = build_registry(args.sysfs_root, backend)
        sys.stdout.write(render_text(registry).decode())
        sys.stdout.flush()
        return 0
    if runtime.port_in_use("exporter", args.metrics_port, args.listen_address):
        return 1
    registry = build_registry(args.sysfs_root, backend, self_metrics=True)
    log.info("serving /metrics on %s:%d (sysfs %s)", args.listen_address, args.metrics_port, args.sysfs_root)
    return runtime.run("exporter", lambda stop: stop.wait(), metrics_port=args.metrics_port, host=args.listen_address,
                       registry=registry)
