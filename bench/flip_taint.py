"""Benchmark the taint controller's reaction beyond its hold time, on a local cluster.

The controller runs with the apiserver signal (watch caches) and the local
inventory's marks and hold time, managing one virtual node of its own. Each
cycle fills every free GPU of the cluster with pods bound straight to the
nodes (free GPUs -> 0: the taint must go after the hold time), then deletes
them (free GPUs -> all: the taint must come back). Reaction = from the API
server acknowledging the last pod change to the node's taint change being
seen through a watch; the figure is the reaction minus the hold time: watch
delays + tick quantisation (1 s ticks) + the node patch.

Usage::

    .venv/bin/python bench/flip_taint.py [--cluster gpufleet] [--cycles 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid

from gpufleet.taint_controller.controller import TaintController
from gpufleet.taint_controller.decision import Hysteresis
from gpufleet.names import FREE_GPUS_TAINT
from gpufleet.taint_controller.signal import ApiServerSignal, gpus_used, schedulable
from gpufleet_workshop.local import cluster as local
from gpufleet.kube import Kube, NotFound, api_path
from gpufleet.kube.informer import Informer
from gpufleet.wait import PollTimeout, poll_until
from roles.registry import load

NODE = "vk-bench-taint"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="gpufleet")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tc = load("local").role("taint_controller")
    hold = tc.taint_controller_hold_seconds
    c = local.get(args.cluster)
    kube = Kube.from_kubeconfig(c.kubeconfig, max_connections=32)
    try:
        kube.delete("v1", "nodes", NODE)
    except NotFound:
        pass
    kube.create("v1", "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {
        "type": "virtual-kubelet", "gpufleet.io/pool": "bench-taint"}}, "spec": {"taints": [
            {"key": "virtual-kubelet.io/provider", "value": "simulated", "effect": "NoSchedule"}]}})
    seen: list[tuple[float, bool]] = []

    def on_node(kind, new, old):
        if new["metadata"]["name"] == NODE:
            has = any(t.get("key") == FREE_GPUS_TAINT for t in (new.get("spec") or {}).get("taints") or [])
            if not seen or seen[-1][1] != has:
                seen.append((time.monotonic(), has))

    watch = Informer(kube, api_path("v1", "nodes"), handlers=[on_node], name="bench-nodes").start()
    watch.wait_synced()
    caches = ApiServerSignal(kube).start()
    ctl = TaintController(kube, caches, caches, Hysteresis(tc.taint_controller_high_water_gpus,
                                                           tc.taint_controller_low_water_gpus, hold),
                          pools=("bench-taint",))
    threading.Thread(target=ctl.run, daemon=True).start()
    ns = f"bench-taint-{uuid.uuid4().hex[:5]}"
    kube.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def wait_state(state: bool, timeout: float = 60) -> float:
        try:
            poll_until(lambda: seen and seen[-1][1] is state, what=f"taint {state}", timeout=timeout, interval=0.01)
        except PollTimeout:
            raise SystemExit(f"taint never became {state}") from None
        return seen[-1][0]

    untaint, taint = [], []
    try:
        wait_state(True)
        for cycle in range(args.cycles):
            used = gpus_used(caches.pods.items())
            fill = {n["name"]: n["gpus"] - used.get(n["name"], 0) for n in caches.nodes.items() if schedulable(n)}
            names = []
            for node, free in fill.items():
                if free <= 0:
                    continue
                name = f"fill-{cycle}-{node}"
                kube.create("v1", "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                                           "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                                                    "terminationGracePeriodSeconds": 0,
                                                    "containers": [{"name": "c", "image": "x", "resources": {
                                                        "limits": {"nvidia.com/gpu": str(free)}}}]}}, ns)
                names.append(name)
            t_fill = time.monotonic()
            untaint.append(wait_state(False) - t_fill - hold)
            for name in names:
                kube.delete("v1", "pods", name, ns, grace_seconds=0)
            t_free = time.monotonic()
            taint.append(wait_state(True) - t_free - hold)
    finally:
        ctl.stop()
        caches.stop()
        watch.stop()
        for name in (NODE,):
            try:
                kube.delete("v1", "nodes", name)
            except NotFound:
                pass
        try:
            kube.delete("v1", "namespaces", ns)
        except NotFound:
            pass
    out = {
        "hold_seconds": hold,
        "untaint_beyond_hold_seconds": {"mean": round(statistics.mean(untaint), 3), "max": round(max(untaint), 3)},
        "taint_beyond_hold_seconds": {"mean": round(statistics.mean(taint), 3), "max": round(max(taint), 3)},
        "patch_latency_ms": {"max": round(1000 * max(t.latency_seconds for t in ctl.transitions), 1)},
        "transitions": len(ctl.transitions),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:32} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
