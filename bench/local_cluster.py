"""Benchmark the local cluster: install times, warm start, memory and scale.

Prints:

* cold install time per component (as recorded by the last real build in
  ``cache_dir()/components/*/install.json``) and their sum;
* warm ``up`` time (components cached) until every node is Ready, for the
  inventory's default fleet, from fresh state and from kept state;
* kube-apiserver and etcd RSS at 128, 1024 and 4096 simulated nodes (each
  from fresh state, however long it takes), with the time to all Ready;
* the largest fleet that comes up (fresh state, all nodes Ready) within the
  limit (default 120 s): the largest of those sizes within it, and beyond
  them doubling while it still fits, or bisecting (512-node steps) between
  the largest size that fits and the smallest that does not.

Every line shows the 1-minute load average: the machine may be shared.

Run: ``.venv/bin/python bench/local_cluster.py [--sizes 128,1024,4096] [--max 16384]``.
Uses its own cluster name (``bench``) and purges it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from gpufleet_workshop.local import cluster as local
from gpufleet_workshop.local.components import components
from gpufleet_workshop.local.install import install_record
from gpufleet_workshop.local.processes import rss_bytes
from roles.registry import node_specs

NAME = "bench"


def mib(n: int) -> str:
    """Bytes as a right-aligned MiB figure."""
    return f"{n / 2**20:7.0f} MiB"


def load() -> str:
    """The 1-minute load average, to judge how contended the machine was."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def fresh_up(specs, timeout: float) -> tuple[float, dict]:
    """Purge, then time ``up`` until every node is Ready; returns (seconds, phases)."""
    local.down(NAME, purge=True)
    t = time.monotonic()
    c = local.up(NAME, specs=specs, timeout=timeout)
    seconds = time.monotonic() - t
    return seconds, json.loads(c.layout.record.read_text())["phases"]


def rss(settle: float) -> tuple[int, int]:
    """RSS in bytes of the bench cluster's (kube-apiserver, etcd) after ``settle`` seconds."""
    time.sleep(settle)
    pids = local.main_pids(NAME)
    return rss_bytes(pids["kube-apiserver"]), rss_bytes(pids["etcd"])


def main() -> None:
    """Run every measurement and print it (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,1024,4096", help="fleet sizes for the RSS table")
    ap.add_argument("--max", type=int, default=16384, help="largest size to try for the 2-minute limit")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds a fleet may take to come up")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds to wait before reading RSS")
    ap.add_argument("--step", type=int, default=512, help="resolution (nodes) of the largest-size search")
    ap.add_argument("--size-timeout", type=float, default=900.0, help="seconds each phase may take for the RSS table")
    args = ap.parse_args()

    print("cold install (first real build of each component in this cache):")
    total = 0.0
    for comp in components().values():
        rec = install_record(comp)
        action = next((a for a in ("first_built", "built", "first_installed", "installed", "reused") if a in rec), None)
        if action:
            seconds = float(rec[action]["seconds"])
            total += seconds
            print(f"  {comp.key:28} {seconds:7.1f}s  ({action} {rec[action]['finished']})")
        else:
            print(f"  {comp.key:28}       -   (never built here)")
    print(f"  {'total':28} {total:7.1f}s")

    default = node_specs("local")
    secs, phases = fresh_up(default, args.limit)
    print(f"\nwarm up, fresh state, {len(default)} nodes: {secs:.1f}s  ({load()})  {phases}")
    local.down(NAME)
    t = time.monotonic()
    local.up(NAME, specs=default)
    print(f"warm up, kept state, {len(default)} nodes: {time.monotonic() - t:.1f}s  ({load()})")

    # RSS table: every size, however long it takes (up to --size-timeout).
    measured: dict[int, float] = {}
    for size in sorted({int(s) for s in args.sizes.split(",")}):
        specs = node_specs("local", size)
        try:
            secs, phases = fresh_up(specs, args.size_timeout)
        except (TimeoutError, local.ComponentFailed) as exc:
            print(f"{size:6} nodes: failed: {str(exc).splitlines()[0]}  ({load()})", flush=True)
            break
        api, etcd = rss(args.settle)
        measured[size] = secs
        split = f"create {phases.get(f'nodes (+{size} -0)', 0):.0f}s, Ready {phases.get(f'{size} nodes Ready', 0):.0f}s"
        print(f"{size:6} nodes: up in {secs:6.1f}s ({split})   kube-apiserver {mib(api)}   etcd {mib(etcd)}   ({load()})", flush=True)
    # Largest size up within the limit: beyond the table, keep doubling while it fits...
    size = max(measured) * 2 if measured and all(t <= args.limit for t in measured.values()) else 0
    while size and size <= args.max:
        try:
            secs, _ = fresh_up(node_specs("local", size), args.limit)
        except (TimeoutError, local.ComponentFailed):
            break
        measured[size] = secs
        print(f"{size:6} nodes: up in {secs:6.1f}s  ({load()})", flush=True)
        if secs > args.limit:
            break
        size *= 2
    # Between the largest size that fits and the smallest that does not: bisect to --step nodes.
    while True:
        fits = [s for s, t in measured.items() if t <= args.limit]
        over = [s for s, t in measured.items() if t > args.limit]
        if not fits or not over or min(over) - max(fits) <= args.step:
            break
        size = (max(fits) + min(over)) // 2 // args.step * args.step
        try:
            secs, _ = fresh_up(node_specs("local", size), args.limit * 2)
        except (TimeoutError, local.ComponentFailed):
            secs = float("inf")
        measured[size] = secs
        print(f"{size:6} nodes: up in {secs:6.1f}s  ({load()})", flush=True)
    ok = [s for s, t in measured.items() if t <= args.limit]
    print(f"\nlargest fleet up within {args.limit:.0f}s: {max(ok) if ok else 'none'} nodes (measured {measured})")
    local.down(NAME, purge=True)


if __name__ == "__main__":
    main()
