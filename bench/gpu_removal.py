"""Benchmark removing one GPU, not the node: fault to taint, taint to quota, recovery to quota (DRA device taints).

On a local cluster of the ``local-dra`` environment (GPUs allocated through
DRA), a real Prometheus scrapes a simulated exporter (:mod:`gpufleet_workshop.sim.fleet`)
of one node every ``--scrape`` seconds; node health's service
(:class:`~gpufleet.node_health.remediate.Remediator` with the per-GPU path,
:mod:`gpufleet.node_health.devices`) steps every ``--interval`` seconds as
``gpufleet node-health`` does, and quota sync runs as ``gpufleet quota-sync``
does (watches, debounce ``--debounce``). Each run heats one GPU to 90 C, waits
for its DeviceTaintRule and for the ClusterQueues' quota to fall, cools it,
waits for the return (hold ``--hold`` seconds, the GPU's checks pass) and for
quota to come back. Per run it prints:

* evidence to taint: from the N-th hot sample (its timestamp in Prometheus) to the rule written;
* confirmation to taint: from node health's decision (the fault confirmed by its step) to the rule
  written (target: within 1 s); and the step itself (Prometheus queries, reads, decision);
* taint to quota: from the rule written to the lowered quota seen on the ClusterQueues;
* recovery to quota: from the rule deleted (GPU returned) to quota back.

Run: ``.venv/bin/python bench/gpu_removal.py [--cluster NAME] [--runs 5] [--scrape 1] [--interval 1]``.
Starts local cluster ``--name`` (default ``gpu-bench``; env local-dra, no real node; stopped at the end unless ``--keep``),
or ``--cluster`` an existing one of env local-dra (left running).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

from gpufleet.names import RESOURCE_API
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.devices import GpuRemediator
from gpufleet.node_health.faults import Rules
from gpufleet.node_health.remediate import Remediator
from gpufleet.ops import gpus as gpuops
from gpufleet.ops.reads import list_gpus
from gpufleet.prom.client import PromClient
from gpufleet.prom.server import running_prometheus
from gpufleet.quota_sync.controller import QuotaSync
from gpufleet.wait import poll_until
from gpufleet_workshop.local import cluster as local
from gpufleet_workshop.sim.fleet import scrape_config, start_node
from roles.kueue.config import configuration as quota_configuration
from roles.kueue.manifests import objects as kueue_objects
from roles.registry import load

ENV = "local-dra"


def total_quota(api, queues: list[str]) -> int:
    """Sum of the ClusterQueues' nvidia.com/gpu nominalQuota."""
    out = 0
    for q in queues:
        cq = api.get("kueue.x-k8s.io/v1beta2", "clusterqueues", q)
        out += sum(int(r["nominalQuota"]) for g in cq["spec"]["resourceGroups"] for f in g["flavors"]
                   for r in f["resources"] if r["name"] == "nvidia.com/gpu")
    return out


def until(what: str, check, timeout: float, interval: float = 0.02) -> float:
    """Poll ``check`` until truthy (:func:`gpufleet.wait.poll_until`); returns the wall time it became so.

    Raises:
        gpufleet.wait.PollTimeout: not within ``timeout`` seconds (names ``what``).
    """
    poll_until(check, what=what, timeout=timeout, interval=interval)
    return time.time()


def main() -> None:
    """Run the benchmark (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", help="an existing local cluster of env local-dra to use (left running)")
    ap.add_argument("--name", default="gpu-bench", help="name of the local cluster this run starts (default gpu-bench)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scrape", type=float, default=1.0, help="Prometheus scrape interval, s")
    ap.add_argument("--interval", type=float, default=1.0, help="node health step interval, s (node-health default 5)")
    ap.add_argument("--hot-samples", type=int, default=3)
    ap.add_argument("--hold", type=float, default=5.0, help="node_health_gpu_hold_seconds for the runs")
    ap.add_argument("--debounce", type=float, default=1.0, help="quota sync's debounce, s (its default 1)")
    args = ap.parse_args()
    name = args.cluster or args.name
    c = local.get(name) if args.cluster else local.up(name, env=ENV, real_node=False, timeout=300)
    api = c.kube(timeout=60, field_manager="gpufleet", user_agent="gpufleet-bench")
    inv = load(ENV)
    for obj in kueue_objects(inv):
        if obj["kind"] in ("Namespace", "ResourceFlavor", "ClusterQueue", "LocalQueue", "PriorityClass",
                           "WorkloadPriorityClass") and api.get_or_none(obj["apiVersion"], api.resource(
                               obj["apiVersion"], obj["kind"])[0], obj["metadata"]["name"],
                               obj["metadata"].get("namespace")) is None:
            api.create_object(obj)
    queues = [q.name for q in inv.role("kueue").kueue_cluster_queues]
    node = sorted(n for n in list_gpus(api) if n.startswith("gpu-"))[0]
    sim = start_node(node, workdir=tempfile.mkdtemp(prefix="gpu-bench-"))
    rows: list[dict[str, float]] = []
    stop = threading.Event()
    try:
        interval = f"{args.scrape:g}s"
        with running_prometheus([scrape_config([sim], interval=interval)],
                                global_config={"scrape_interval": interval, "evaluation_interval": interval}) as prom:
            prom.wait_for_targets_up(1, timeout=3 * args.scrape + 20)
            rules = Rules(hot_samples=args.hot_samples, scrape_interval_seconds=args.scrape)
            settings = Configuration(rules=rules, interval_seconds=args.interval, telemetry_node_selector={
                "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]},
                gpu_hold_seconds=args.hold, lemon_failures=args.runs + 10)
            gpu = GpuRemediator(api, settings, checks=lambda g: [])
            rem = Remediator(api, PromClient(prom.url), settings, gpus=gpu)
            steps: dict[str, float] = {}

            def loop() -> None:
                while not stop.is_set():
                    report = rem.step()
                    for d in report.gpu.decisions if report.gpu else []:
                        if d.action == "remove":
                            steps[d.gpu.device] = report.seconds
                    stop.wait(args.interval)

            qs = QuotaSync(api, quota_configuration(inv).model_copy(update={"debounce_seconds": args.debounce}))
            threading.Thread(target=qs.run, args=(stop,), daemon=True).start()
            until("quota sync's first resync", lambda: qs.history and qs.history[-1].error is None, 60)
            before = total_quota(api, queues)
            stepper = threading.Thread(target=loop, daemon=True)
            stepper.start()
            for run in range(args.runs):
                gpu_index = run % 8
                device, rule = f"gpu-{gpu_index}", gpuops.rule_name(node, f"gpu-{gpu_index}")
                sim.set_temperature(gpu_index, 90)
                tainted = until(f"{device} tainted", lambda: api.get_or_none(RESOURCE_API, "devicetaintrules", rule), 120)
                lowered = until("quota lowered", lambda: total_quota(api, queues) < before, 60)
                sim.set_temperature(gpu_index, 41)
                returned = until(f"{device} returned", lambda: api.get_or_none(
                    RESOURCE_API, "devicetaintrules", rule) is None, 120 + args.hold)
                back = until("quota back", lambda: total_quota(api, queues) == before, 60)
                row = {"evidence_to_taint": gpu.latencies.get((node, device), float("nan")),
                       "confirmation_to_taint": gpu.confirm_to_taint.get((node, device), float("nan")),
                       "step": steps.get(device, float("nan")),
                       "taint_to_quota": lowered - tainted, "recovery_to_quota": back - returned}
                rows.append(row)
                print(f"run {run + 1}: GPU {device} of {node}: evidence->taint {row['evidence_to_taint']:.2f}s, "
                      f"confirmation->taint {row['confirmation_to_taint']:.3f}s (step {row['step']:.2f}s), taint->quota "
                      f"{row['taint_to_quota']:.2f}s, recovery->quota {row['recovery_to_quota']:.2f}s", flush=True)
                time.sleep(args.hot_samples * args.scrape + 1)  # the next run starts from cool series
            stop.set()
            stepper.join(timeout=30)
            rem.close()
    finally:
        stop.set()
        sim.stop()
        api.close()
        if not args.cluster and not args.keep:
            local.down(name)
    for key in ("evidence_to_taint", "confirmation_to_taint", "step", "taint_to_quota", "recovery_to_quota"):
        vals = [r[key] for r in rows]
        print(f"{key}: median {statistics.median(vals):.2f}s, max {max(vals):.2f}s (n={len(vals)})")
    print(f"target: confirmation->taint within 1 s: {'met' if max(r['confirmation_to_taint'] for r in rows) <= 1.0 else 'MISSED'}")


if __name__ == "__main__":
    main()
