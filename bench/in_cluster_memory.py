"""Memory of gpufleet's pods on the local cluster's real node, from the kubelet's own figures.

Reads ``/api/v1/nodes/<cluster>-system/proxy/stats/summary`` (the kubelet's
Summary API, through the apiserver) once per ``--interval`` seconds for
``--seconds`` and prints, per pod in gpufleet's namespaces, the container's
working set (bytes the kernel would not reclaim: what the memory limit is
held against) at the first sample and its peak. Run it with the cluster at
rest, and beside ``invoke sim.flip`` for the figures during a flip.

Usage::

    .venv/bin/python bench/in_cluster_memory.py [--cluster gpufleet] [--seconds 60] [--interval 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from gpufleet.kube import Kube
from gpufleet_workshop.local import cluster as local
from gpufleet_workshop.local import node as realnode

NAMESPACES = ("gpufleet-system", "gpu-metrics", "team-pretrain", "team-research")


def sample(kube: Kube, node: str) -> dict[str, int]:
    """``namespace/pod`` -> working set bytes of its containers, for the pods in :data:`NAMESPACES`."""
    summary = kube.request("GET", f"/api/v1/nodes/{node}/proxy/stats/summary")
    out = {}
    for pod in summary.get("pods") or []:
        ref = pod["podRef"]
        if ref["namespace"] in NAMESPACES:
            out[f"{ref['namespace']}/{ref['name']}"] = sum(
                (c.get("memory") or {}).get("workingSetBytes", 0) for c in pod.get("containers") or [])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default=local.DEFAULT_NAME)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    c = local.get(args.cluster)
    node = realnode.node_name(c.name)
    first: dict[str, int] = {}
    peak: dict[str, int] = {}
    with Kube.from_kubeconfig(c.kubeconfig, user_agent="gpufleet-bench") as kube:
        deadline = time.monotonic() + args.seconds
        while True:
            for pod, ws in sample(kube, node).items():
                first.setdefault(pod, ws)
                peak[pod] = max(peak.get(pod, 0), ws)
            if time.monotonic() >= deadline:
                break
            time.sleep(args.interval)
    mib = {pod: {"first_mib": round(first[pod] / 2**20, 1), "peak_mib": round(peak[pod] / 2**20, 1)} for pod in sorted(peak)}
    if args.json:
        print(json.dumps(mib, indent=1))
        return
    for pod, v in mib.items():
        print(f"{pod:70s} {v['first_mib']:8.1f} MiB  peak {v['peak_mib']:8.1f} MiB")


if __name__ == "__main__":
    main()
