"""Benchmark the taint controller's per-tick work during a flip-out at fleet size, without a cluster.

A fleet of ``--nodes`` in-cluster nodes (8 GPUs each, ``--daemon-pods``
CPU-only pods on each: kube-proxy, the exporter, node health's agent and the
like) runs ``--replicas`` inference replicas of 8 GPUs (one node each) and
training on every other node; ``--replicas`` training pods are Pending, so the
flip-out reserves one node per preemptor and starts a make-before-break
surge for each victim; ``--unplaceable`` more training pods of the same
gang wait for nodes nothing can free (training runs there), which each
tick's plan looks at again. The surges' pods are Pending outside (the provider is
still starting them): the state in which every tick has to look up each
victim's surge, which is where a per-tick scan of the pod cache costs most.
The controller (signal, hysteresis, flip-out, flip-back, orphaned endpoints)
runs against gpufleet's in-memory API server
(:class:`gpufleet_workshop.testing.FakeKube`) through its real watch caches;
the figures are the CPU time (``time.process_time``) of the first
:meth:`~gpufleet.taint_controller.controller.TaintController.tick` (the
burst: every reservation planned and made, surges created) and of each
tick after it, the fake's own work on the writes included, and the
tracemalloc peak of the controller's caches.

Usage::

    .venv/bin/python bench/flip_tick.py [--nodes 1024] [--replicas 256] [--unplaceable 256] [--ticks 30] [--pinned] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc

from gpufleet.names import POOL_LABEL, VIRTUAL_NODE_TAINT
from gpufleet.taint_controller.budget import MigrationBudget
from gpufleet.taint_controller.controller import TaintController
from gpufleet.taint_controller.decision import Hysteresis
from gpufleet.taint_controller.flipback import FlipBack
from gpufleet.taint_controller.flipout import FlipOut
from gpufleet.taint_controller.published import ServiceEndpoints
from gpufleet.taint_controller.signal import ApiServerSignal
from gpufleet_workshop.testing import FakeKube

NS = "inference"
TRAINING = "gpufleet-training"
GPUS = 8


def _node(name: str, *, virtual: bool = False) -> dict:
    labels = {"kubernetes.io/hostname": name}
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    if virtual:
        labels.update({"type": "virtual-kubelet", POOL_LABEL: "rental"})
        taints = [{"key": VIRTUAL_NODE_TAINT, "value": "gpufleet", "effect": "NoSchedule"}]
    gpus = str(64 if virtual else GPUS)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "224", "memory": "2Ti"},
                       "capacity": {"nvidia.com/gpu": gpus}, "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(name: str, ns: str, node: str | None, *, gpus: int = 0, priority: int = 0, labels: dict | None = None,
         owner: dict | None = None, pending: bool = False, priority_class: str = "",
         pinned_to: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}],
                  "priority": priority,
                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    if node:
        spec["nodeName"] = node
    if pinned_to:  # as Kueue's topology-aware scheduling pins each pod of a gang
        spec["nodeSelector"] = {"kubernetes.io/hostname": pinned_to}
    if priority_class:
        spec["priorityClassName"] = priority_class
    status = ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
              if pending else {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
    meta: dict = {"name": name, "namespace": ns, "labels": dict(labels or {})}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _pin(i: int, replicas: int, nodes: int) -> str:
    """The node the ``i``-th pending training pod is pinned to: inference's first, then training's."""
    return f"gpu-{i:04d}" if i < replicas else f"gpu-{replicas + (i - replicas) % max(1, nodes - replicas):04d}"


def fleet(kube: FakeKube, nodes: int, replicas: int, daemon_pods: int, unplaceable: int, pinned: bool = False) -> None:
    """Nodes, daemon pods, the inference Deployment (ReplicaSet, Service, replicas), training running and pending;
    ``pinned``: each pending training pod has a hostname node selector (inference's nodes, then training's)."""
    if replicas > nodes:
        raise SystemExit(f"--replicas {replicas}: expected at most --nodes ({nodes})")
    kube.add(*(_node(f"gpu-{i:04d}") for i in range(nodes)), *(_node(f"vk-rental-{i}", virtual=True) for i in range(4)))
    dep = kube.add({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat", "namespace": NS},
                    "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "chat"}}},
                    "status": {"availableReplicas": replicas}})[0]
    labels = {"app": "chat", "pod-template-hash": "7d9f"}
    rs = kube.add({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {
        "name": "chat-7d9f", "namespace": NS, "labels": labels,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat",
                             "uid": dep["metadata"]["uid"], "controller": True}]},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "srv", "image": "srv",
                                     "resources": {"requests": {"nvidia.com/gpu": str(GPUS)}}}]}}}})[0]
    kube.add({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": NS},
              "spec": {"selector": {"app": "chat"}, "ports": [{"port": 80}]}})
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "chat-7d9f", "uid": rs["metadata"]["uid"],
             "controller": True}
    pods = [_pod(f"daemon-{i:04d}-{j}", "kube-system", f"gpu-{i:04d}") for i in range(nodes) for j in range(daemon_pods)]
    pods += [_pod(f"chat-{i:04d}", NS, f"gpu-{i:04d}", gpus=GPUS, labels=labels, owner=owner) for i in range(replicas)]
    pods += [_pod(f"train-run-{i:04d}", "team-pretrain", f"gpu-{i:04d}", gpus=GPUS, priority=1000,
                  priority_class=TRAINING) for i in range(replicas, nodes)]
    pods += [_pod(f"train-wait-{i:04d}", "team-pretrain", None, gpus=GPUS, priority=1000, priority_class=TRAINING,
                  pending=True, pinned_to=_pin(i, replicas, nodes) if pinned else None)
             for i in range(replicas + unplaceable)]
    kube.add(*pods)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--replicas", type=int, default=256)
    ap.add_argument("--daemon-pods", type=int, default=8, help="CPU-only pods per node (default 8)")
    ap.add_argument("--unplaceable", type=int, default=256, help="pending training pods no node can take")
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--pinned", action="store_true",
                    help="pin each pending training pod to a node by hostname, as Kueue's topology-aware scheduling does")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    kube = FakeKube(bookmark_seconds=0.5)
    fleet(kube, args.nodes, args.replicas, args.daemon_pods, args.unplaceable, args.pinned)
    tracemalloc.start()
    caches = ApiServerSignal(kube).start(timeout=120)
    endpoints = ServiceEndpoints(kube).start(timeout=120)
    _, cache_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out = FlipOut(kube, caches.nodes, caches.pods, [TRAINING], mode="make_before_break", surge_max_wait_seconds=1e9,
                  max_wait_seconds=1e9)
    back = FlipBack(kube, caches.nodes, caches.pods, MigrationBudget(60.0), mode="release", make_before_break=True,
                    endpoints=endpoints)
    ctl = TaintController(kube, caches, caches, Hysteresis(high=8, low=4, hold=30), pools=("rental",),
                          flip_out=out, flip_back=back).start()
    # The first tick plans every reservation at once and makes them (the flip-out's burst: one plan over the
    # fleet, then the writes); the ticks after it are the steady state.
    began = time.process_time()
    ctl.tick()
    first = (time.process_time() - began) * 1000
    kube.sync(caches.nodes, caches.pods, timeout=120)
    cpu = []
    for _ in range(args.ticks):
        began = time.process_time()
        ctl.tick()
        cpu.append((time.process_time() - began) * 1000)
    out.close()
    caches.stop()
    endpoints.stop()
    kube.close()
    cpu.sort()
    result = {"nodes": args.nodes, "replicas": args.replicas, "unplaceable": args.unplaceable, "pinned": args.pinned,
              "pods": len(caches.pods), "ticks": args.ticks,
              "surges": len(out.surges.live) if out.surges else 0,
              "cpu_ms_first_tick": round(first, 1),
              "cpu_ms_per_tick_p50": round(statistics.median(cpu), 1),
              "cpu_ms_per_tick_p99": round(cpu[min(len(cpu) - 1, int(len(cpu) * 0.99))], 1),
              "cache_peak_mib": round(cache_peak / 2**20, 1)}
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>24}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
