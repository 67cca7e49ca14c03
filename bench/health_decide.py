"""Benchmark node health's pure step at fleet scale: the breaker's share and the decisions.

Builds ``--nodes`` Node dicts (GPU nodes, as the API returns them) and
``--faulty`` faults, then times :func:`gpufleet.node_health.breaker.fleet_share`
(the node classifier over every node, once a step) and
:func:`gpufleet.node_health.remediate.decide` with that share, best of
``--repeat``. No cluster, no Prometheus. Target: well under the 5 s step
(``node_health_interval_seconds``) at 4,096 nodes.

Run: ``.venv/bin/python bench/health_decide.py [--nodes 4096] [--faulty 100] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import time

from gpufleet.node_health import breaker
from gpufleet.node_health.faults import Fault
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.remediate import decide


def gpu_node(name: str) -> dict:
    """A Ready GPU node with 8 GPUs and the GPU taint."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpufleet.io/flavor": "h100",
                                                  "nvidia.com/gpu.count": "8"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def main() -> None:
    """Run the benchmark (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--faulty", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    nodes = {f"gpu-{i:05d}": gpu_node(f"gpu-{i:05d}") for i in range(args.nodes)}
    faults = {n: [Fault(n, "xid", "GPU 0: fatal XID 79", 0.0)] for n in list(nodes)[:args.faulty]}
    settings = Configuration(max_nodes_out=4)
    share_s = decide_s = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        fleet = breaker.fleet_share(nodes)
        t1 = time.perf_counter()
        decide(faults, nodes, settings, 1.0, fleet=fleet)
        t2 = time.perf_counter()
        share_s, decide_s = min(share_s, t1 - t0), min(decide_s, t2 - t1)
    print(f"{args.nodes} nodes, {args.faulty} faulty: fleet_share {share_s * 1000:.1f} ms, "
          f"decide {decide_s * 1000:.1f} ms (best of {args.repeat})")


if __name__ == "__main__":
    main()
