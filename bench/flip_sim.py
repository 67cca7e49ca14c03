"""Benchmark the whole flip: ``invoke sim.flip`` at one or more fleet sizes, printing its summary figures.

Each size runs :func:`gpufleet_workshop.sim.flip.run` (every pool of the local
inventory: the second cluster ``other`` and the simulated rental) on the
local cluster ``--cluster``, resized to the node count, and prints the
summary plus the wall time. Targets: back in-cluster within 5 minutes
(``seconds_to_back_in_cluster`` < 300) with zero PDB violations
(``min_ready_replicas`` >= ``pdb_min_available``).

Usage::

    .venv/bin/python bench/flip_sim.py [--nodes 16,256] [--cluster gpufleet] [--duration 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from gpufleet_workshop.sim.flip import Options, SimError, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="16", help="comma-separated fleet sizes")
    ap.add_argument("--replicas", type=int, default=0, help="inference replicas (default: the inventory's)")
    ap.add_argument("--cluster", default="gpufleet")
    ap.add_argument("--other", default="other", help="cluster name of the kubernetes pool 'other'")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default="out/bench-flip")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = {}
    for n in (int(x) for x in args.nodes.split(",")):
        t0 = time.monotonic()
        try:
            summary = run(Options(env="local", nodes=n, replicas=args.replicas or None, duration=args.duration,
                                  cluster=args.cluster, out=Path(args.out) / f"{n}-nodes", timeout=args.timeout,
                                  other_clusters={"other": args.other}))
        except SimError as exc:
            summary = {"error": str(exc)[:500]}
        summary["wall_seconds"] = round(time.monotonic() - t0, 1)
        summary["pdb_violations"] = ("min_ready_replicas" in summary
                                     and summary["min_ready_replicas"] < summary["pdb_min_available"])
        results[n] = summary
    if args.json:
        print(json.dumps(results))
    else:
        for n, s in results.items():
            print(f"--- {n} nodes")
            for k, v in s.items():
                print(f"{k:40} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
