"""Benchmark the fabric exporter on a big node: scrape latency, CPU per scrape, RSS.

The node: 8 HCAs (one NDR port each, every IBA counter plus mlx5
hw_counters) and 8 GPUs x 18 NVLinks through the fake NVML backend
(:mod:`gpufleet.sim.node`). The exporter runs as its own process,
exactly as ``gpufleet exporter`` runs on a node, and is scraped over HTTP.

Targets (gpu_metrics issue): < 50 ms per scrape, < 64 MiB RSS, < 2 % of one
core at a 5 s scrape interval. The fake NVML measures the exporter's own
cost; real NVML adds driver time per call (about 8 x (18 x 6 + 15) calls per
scrape), to be measured on a GPU node.

Usage::

    .venv/bin/python bench/exporter.py [--scrapes 100] [--interval 5] [--json] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gpufleet import paths
from gpufleet.sim.node import healthy_node, write_node
from gpufleet.prom.server import free_port

TARGETS = {"p95_scrape_ms": 50.0, "rss_mib": 64.0, "cpu_percent_of_core": 2.0}

#: node_exporter compared against with ``--vs-node-exporter``: the newest release the Go
#: module proxy serves (``go list -m -versions github.com/prometheus/node_exporter``).
NODE_EXPORTER_MODULE = "github.com/prometheus/node_exporter"
NODE_EXPORTER_VERSION = "v1.12.1"


def node_exporter_binary(version: str = NODE_EXPORTER_VERSION) -> Path:
    """node_exporter ``version`` built from its Go module into the component cache, once.

    ``go install module@version`` with ``GOBIN`` at
    ``cache_dir()/components/node_exporter-<version>/bin`` (the layout of
    :class:`gpufleet.build.gobuild.Cached`); a binary already there that
    ``go version -m`` shows was built from that module and version is reused.

    Raises:
        gpufleet.build.gobuild.GoError: no Go toolchain, the module cannot be
            had, or the build failed (with the log tail).
    """
    from gpufleet.build import gobuild

    folder = paths.cache_dir() / "components" / f"node_exporter-{version}"
    binary = folder / "bin" / "node_exporter"
    if binary.exists() and gobuild.built_from(binary, NODE_EXPORTER_MODULE, version):
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    argv = [gobuild.go_binary(), "install", "-v", "-trimpath", f"-ldflags={gobuild.ldflags(())}",
            f"{NODE_EXPORTER_MODULE}@{version}"]
    print(f"building node_exporter {version} into {binary.parent} (once; log {folder / 'build.log'})", file=sys.stderr)
    gobuild.run_logged(argv, folder, folder / "build.log", env=gobuild.go_env(GOBIN=str(binary.parent)))
    return binary


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (``/proc/<pid>/stat`` fields 14, 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of ``pid`` in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def run(scrapes: int, interval: float, idle_seconds: float) -> dict[str, float | int | str]:
    """Start the exporter on the big fixture node, scrape it ``scrapes`` times, measure.

    Returns:
        Figures: scrape latency (ms: mean, p50, p95, max), CPU ms per scrape,
        idle CPU, CPU share of one core at ``interval``, RSS and peak RSS (MiB),
        exposition size (bytes, series).
    """
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        desc = healthy_node("bench", gpus=8, hcas=8, nvlinks=18, roce=False)
        paths = write_node(desc, Path(tmp) / "node")
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli", "exporter", "--listen-address", "127.0.0.1", "--metrics-port", str(port),
             "--sysfs-root", str(paths.sysfs_root), "--nvml-fake", str(paths.description), "--log-level", "WARNING"],
            stdout=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            client = httpx.Client(timeout=10)
            deadline = time.monotonic() + 30
            while True:
                try:
                    body = client.get(url).text
                    break
                except httpx.TransportError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("exporter did not start")
                    time.sleep(0.1)
            for _ in range(3):  # warm-up: NVLink probing, XID registration, imports
                client.get(url)
            cpu_before = cpu_seconds(proc.pid)
            latencies = []
            for _ in range(scrapes):
                start = time.perf_counter()
                response = client.get(url)
                latencies.append((time.perf_counter() - start) * 1000)
                response.raise_for_status()
            cpu_scrapes = cpu_seconds(proc.pid) - cpu_before
            idle_before = cpu_seconds(proc.pid)
            time.sleep(idle_seconds)
            idle_cpu_per_second = (cpu_seconds(proc.pid) - idle_before) / idle_seconds
            mem = memory_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    cpu_ms = cpu_scrapes / scrapes * 1000
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    latencies.sort()
    return {
        "node": "8 HCAs x 1 port (all counters + mlx5 hw_counters), 8 GPUs x 18 NVLinks (fake NVML)",
        "scrapes": scrapes,
        "series": series,
        "exposition_bytes": len(body.encode()),
        "scrape_ms_mean": statistics.fmean(latencies),
        "scrape_ms_p50": latencies[len(latencies) // 2],
        "p95_scrape_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))],
        "scrape_ms_max": latencies[-1],
        "cpu_ms_per_scrape": cpu_ms,
        "idle_cpu_percent_of_core": idle_cpu_per_second * 100,
        "cpu_percent_of_core": (cpu_ms / 1000 / interval + idle_cpu_per_second) * 100,
        "interval_seconds": interval,
        "rss_mib": mem["VmRSS"],
        "peak_rss_mib": mem["VmHWM"],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the figures against the targets; with ``--check`` exit 1 on a miss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=100, help="timed scrapes (default: %(default)s)")
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval for the CPU share, seconds (default: %(default)s)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measurement (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    figures = run(args.scrapes, args.interval, args.idle)
    misses = [k for k, limit in TARGETS.items() if float(figures[k]) >= limit]
    if args.json:
        print(json.dumps({**figures, "targets": TARGETS, "missed": misses}, indent=1))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"gpufleet exporter: {figures['node']}")
        table.add_column("figure")
        table.add_column("value", justify="right")
        table.add_column("target", justify="right")
        for key, value in figures.items():
            if key == "node":
                continue
            target = TARGETS.get(key)
            shown = f"{value:.2f}" if isinstance(value, float) else str(value)
            table.add_row(key, shown, f"< {target:g}" if target else "")
        Console().print(table)
        print("all targets met" if not misses else f"missed: {', '.join(misses)}")
    return 1 if (args.check and misses) else 0


if __name__ == "__main__":
    sys.exit(main())
