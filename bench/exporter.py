"""Benchmark the fabric exporter on a big node: scrape latency, CPU per scrape, RSS.

The node: 8 HCAs (one NDR port each, every IBA counter plus mlx5
hw_counters) and 8 GPUs x 18 NVLinks through the fake NVML backend
(:mod:`gpufleet_workshop.fixtures.node`). The exporter runs as its own process,
exactly as ``gpufleet exporter`` runs on a node, and is scraped over HTTP.

Targets (:data:`TARGETS`): 50 ms p95 scrape latency, 2 % of one core at a
5 s scrape interval, 10 ms CPU per scrape and 32 MiB RSS on this node. The fake NVML measures the
exporter's own cost; real NVML adds driver time per call (about
8 x (18 x 6 + 15) calls per scrape), to be measured on a GPU node.

``--vs-node-exporter`` compares gpufleet with node_exporter's infiniband
collector instead: node_exporter (:data:`NODE_EXPORTER_VERSION`, built from
its Go module into the component cache once) and ``gpufleet exporter
--no-nvml`` run side by side on the same fixture sysfs tree of 2, 8 and 32
HCAs (one NDR port each, every IBA counter plus mlx5 hw_counters), each
scraped as Prometheus scrapes (``Accept-Encoding: gzip``, text format),
interleaved in one run (the order alternating every round), and the figures
are printed with the ratio gpufleet / node_exporter: CPU per scrape
(``/proc/<pid>/stat`` utime+stime delta over the scrapes / scrapes),
latency, RSS and series (fabric series: ``gpufleet_infiniband_*`` against
``node_infiniband_*``; all series too). The load average of the run is
printed with them: the figures mean little on a busy machine.

Usage::

    .venv/bin/python bench/exporter.py [--scrapes 100] [--interval 5] [--json] [--check]
    .venv/bin/python bench/exporter.py --vs-node-exporter [--scrapes 200] [--hcas 2,8,32] [--json]
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
from gpufleet_workshop.fixtures.node import healthy_node, write_node
from gpufleet.prom.server import free_port
from gpufleet.wait import PollTimeout, poll_until

#: Upper bounds of the main benchmark's figures (a figure above its bound is a miss).
TARGETS = {"p95_scrape_ms": 50.0, "rss_mib": 32.0, "cpu_ms_per_scrape": 10.0, "cpu_percent_of_core": 2.0}

#: node_exporter compared against with ``--vs-node-exporter``: the newest release the Go
#: module proxy serves (``go list -m -versions github.com/prometheus/node_exporter``).
NODE_EXPORTER_MODULE = "github.com/prometheus/node_exporter"
NODE_EXPORTER_VERSION = "v1.12.1"


def node_exporter_binary(version: str = NODE_EXPORTER_VERSION) -> Path:
    """node_exporter ``version`` built from its Go module into the component cache, once.

    ``go install module@version`` with ``GOBIN`` at
    ``cache_dir()/components/node_exporter-<version>/bin`` (the layout of
    :class:`gpufleet_admin.build.gobuild.Cached`); a binary already there that
    ``go version -m`` shows was built from that module and version is reused.

    Raises:
        gpufleet_admin.build.gobuild.GoError: no Go toolchain, the module cannot be
            had, or the build failed (with the log tail).
    """
    from gpufleet_admin.build import gobuild

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
            def started() -> str | None:
                if proc.poll() is not None:
                    raise SystemExit("exporter did not start")
                return client.get(url).text

            try:
                body = poll_until(started, what="the exporter", timeout=30, interval=0.1, ignore=(httpx.TransportError,))
            except PollTimeout:
                raise SystemExit("exporter did not start") from None
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


#: Headers of a Prometheus scrape: gzip, the text format (node_exporter would answer protobuf or
#: OpenMetrics to Prometheus's full Accept header; both exporters are asked for the same format).
SCRAPE_HEADERS = {"Accept-Encoding": "gzip", "Accept": "text/plain;version=0.0.4"}


def _wait_ready(client: httpx.Client, url: str, proc: subprocess.Popen, what: str, timeout: float = 30) -> str:
    """The first successful body from ``url``; SystemExit when ``proc`` exits or ``timeout`` passes."""
    def body() -> str:
        if proc.poll() is not None:
            raise SystemExit(f"{what} did not start ({url})")
        response = client.get(url, headers=SCRAPE_HEADERS)
        response.raise_for_status()
        return response.text

    try:
        return poll_until(body, what=what, timeout=timeout, interval=0.1, ignore=(httpx.HTTPError,))
    except PollTimeout:
        raise SystemExit(f"{what} did not start ({url})") from None


def _series(body: str, prefix: str) -> tuple[int, int]:
    """``(series whose name starts with prefix, all series)`` of a text exposition."""
    lines = [line for line in body.splitlines() if line and not line.startswith("#")]
    return sum(1 for line in lines if line.startswith(prefix)), len(lines)


def compare_one(hcas: int, scrapes: int, node_exporter: Path, tmp: Path) -> dict[str, dict[str, float]]:
    """gpufleet and node_exporter on one ``hcas``-HCA fixture tree, scraped interleaved ``scrapes`` times each.

    Returns:
        ``{"gpufleet": figures, "node_exporter": figures, "ratio": gpufleet / node_exporter}``;
        figures: ``cpu_ms_per_scrape``, ``scrape_ms_p50``, ``scrape_ms_mean``, ``rss_mib``,
        ``fabric_series``, ``series``.
    """
    desc = healthy_node(f"vs-{hcas}", gpus=0, hcas=hcas, roce=False)
    paths = write_node(desc, tmp / f"node-{hcas}")
    ports = {"gpufleet": free_port(), "node_exporter": free_port()}
    argv = {
        "gpufleet": [sys.executable, "-m", "gpufleet.cli", "exporter", "--listen-address", "127.0.0.1",
                     "--metrics-port", str(ports["gpufleet"]), "--sysfs-root", str(paths.sysfs_root), "--no-nvml",
                     "--log-level", "WARNING"],
        "node_exporter": [str(node_exporter), f"--path.sysfs={paths.sysfs_root}", "--collector.disable-defaults",
                          "--collector.infiniband", f"--web.listen-address=127.0.0.1:{ports['node_exporter']}",
                          "--log.level=warn"],
    }
    prefix = {"gpufleet": "gpufleet_infiniband_", "node_exporter": "node_infiniband_"}
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, cmd in argv.items()}
    urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    try:
        client = httpx.Client(timeout=10)
        bodies = {name: _wait_ready(client, urls[name], procs[name], name) for name in procs}
        for _ in range(5):  # warm-up: imports, first reads, Go runtime
            for name in procs:
                client.get(urls[name], headers=SCRAPE_HEADERS).raise_for_status()
        cpu_before = {name: cpu_seconds(proc.pid) for name, proc in procs.items()}
        latencies: dict[str, list[float]] = {name: [] for name in procs}
        order = list(procs)
        for i in range(scrapes):
            for name in (order if i % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                response = client.get(urls[name], headers=SCRAPE_HEADERS)
                latencies[name].append((time.perf_counter() - start) * 1000)
                response.raise_for_status()
        cpu = {name: cpu_seconds(proc.pid) - cpu_before[name] for name, proc in procs.items()}
        rss = {name: memory_mib(proc.pid)["VmRSS"] for name, proc in procs.items()}
        bodies = {name: client.get(urls[name], headers=SCRAPE_HEADERS).text for name in procs}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(10)
    out: dict[str, dict[str, float]] = {}
    for name in procs:
        lat = sorted(latencies[name])
        fabric, total = _series(bodies[name], prefix[name])
        out[name] = {"cpu_ms_per_scrape": cpu[name] / scrapes * 1000, "scrape_ms_p50": lat[len(lat) // 2],
                     "scrape_ms_mean": statistics.fmean(lat), "rss_mib": rss[name], "fabric_series": fabric,
                     "series": total}
    out["ratio"] = {key: (out["gpufleet"][key] / out["node_exporter"][key]) if out["node_exporter"][key] else float("nan")
                    for key in out["gpufleet"]}
    return out


def compare(hca_counts: list[int], scrapes: int) -> dict[str, object]:
    """:func:`compare_one` at each HCA count, with node_exporter's version and the load average before and after."""
    node_exporter = node_exporter_binary()
    load_before = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-vs-") as tmp:
        for hcas in hca_counts:
            results[str(hcas)] = compare_one(hcas, scrapes, node_exporter, Path(tmp))
    return {"node_exporter": NODE_EXPORTER_VERSION, "scrapes": scrapes, "cpus": os.cpu_count(),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "hcas": results}


def _print_comparison(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for hcas, figures in result["hcas"].items():
        table = Table(title=f"{hcas} HCAs (IB only): gpufleet vs node_exporter {result['node_exporter']}, "
                            f"{result['scrapes']} interleaved scrapes each")
        for column in ("figure", "gpufleet", "node_exporter", "ratio"):
            table.add_column(column, justify="left" if column == "figure" else "right")
        for key in figures["gpufleet"]:
            g, n, r = figures["gpufleet"][key], figures["node_exporter"][key], figures["ratio"][key]
            shown = (lambda v: f"{v:.0f}") if key.endswith("series") else (lambda v: f"{v:.2f}")
            table.add_row(key, shown(g), shown(n), f"{r:.2f}x")
        console.print(table)
    before, after = result["loadavg_before"], result["loadavg_after"]
    print(f"load average: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f} before, "
          f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} after ({result['cpus']} CPUs)")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the figures against the targets; with ``--check`` exit 1 on a miss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=100, help="timed scrapes (default: %(default)s)")
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval for the CPU share, seconds (default: %(default)s)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measurement (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--vs-node-exporter", action="store_true",
                        help=f"compare with node_exporter {NODE_EXPORTER_VERSION}'s infiniband collector on the same trees")
    parser.add_argument("--hcas", default="2,8,32", help="HCA counts of --vs-node-exporter (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.vs_node_exporter:
        try:
            counts = [int(n) for n in args.hcas.split(",")]
        except ValueError:
            parser.error(f"--hcas {args.hcas!r}: expected comma-separated HCA counts, e.g. 2,8,32")
        if any(n < 1 for n in counts):
            parser.error(f"--hcas {args.hcas!r}: expected HCA counts of 1 or more")
        result = compare(counts, args.scrapes)
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            _print_comparison(result)
        return 0
    figures = run(args.scrapes, args.interval, args.idle)
    misses = [k for k, limit in TARGETS.items() if float(figures[k]) > limit]
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
            table.add_row(key, shown, f"<= {target:g}" if target else "")
        Console().print(table)
        print("all targets met" if not misses else f"missed: {', '.join(misses)}")
    return 1 if (args.check and misses) else 0


if __name__ == "__main__":
    sys.exit(main())
