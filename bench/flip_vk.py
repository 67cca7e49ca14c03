"""Benchmark the virtual kubelet: create-to-Running latency beyond the provider's, throughput, RSS at 1,000 pods.

The virtual kubelet runs as its own process, exactly as deployed
(``gpufleet virtual-kubelet --env local --pool rental``: the simulated GPU
rental, start latency from the inventory, 2 s in ``local``), against a local
cluster. Pods are created already bound to its node (``spec.nodeName``),
so the scheduler and the ReplicaSet controller are not what is measured;
the bench creates them from ``--create-workers`` threads.

Figures:

* ``latency_idle``: create-to-Running (pod created -> the virtual kubelet
  writes phase Running), minus the provider's start latency, for pods
  created one at a time;
* ``burst``: ``--pods`` pods created as fast as the API takes them:
  pods per minute the virtual kubelet brought to Running (first create to
  last Running), and the same latency figures under load;
* ``rss``: the virtual kubelet's resident memory with all of them Running
  (VmRSS, and its peak VmHWM).

Targets (virtual-kubelet issue): >= 1,000 pods/min per virtual kubelet;
1,000 pods under 256 MiB RSS.

Usage::

    .venv/bin/python bench/flip_vk.py [--cluster gpufleet] [--pods 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpufleet.inventory import load
from gpufleet.local import cluster as local
from gpufleet.kube import Kube, NotFound, api_path
from gpufleet.kube.informer import Informer

POOL = "rental"
NODE = f"vk-{POOL}"


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def pod(name: str, ns: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"bench": "vk"}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "server", "image": "registry.invalid/inference:1",
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}


def stats(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    if not values:
        return {}
    return {"n": len(values), "p50": round(statistics.median(values), 3),
            "p95": round(values[min(len(values) - 1, int(0.95 * len(values)))], 3), "max": round(values[-1], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="gpufleet", help="local cluster (upped with 4 nodes if not running)")
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--idle", type=int, default=10, help="pods created one at a time for the idle latency")
    ap.add_argument("--create-workers", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    pool = next(p for p in load("local").role("virtual_kubelet").virtual_kubelet_pools if p.name == POOL)
    latency = pool.start_latency_seconds
    try:
        c = local.get(args.cluster)
        if not local.status(args.cluster).up:
            raise LookupError
    except LookupError:
        from gpufleet.inventory import node_specs

        c = local.up(args.cluster, specs=node_specs("local", 4))
    kube = Kube.from_kubeconfig(c.kubeconfig, max_connections=64)
    ns = f"bench-vk-{uuid.uuid4().hex[:5]}"
    kube.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    created: dict[str, float] = {}
    running: dict[str, float] = {}

    def on_pod(kind, new, old):
        name = new["metadata"]["name"]
        if (new.get("status") or {}).get("phase") == "Running" and name not in running:
            running[name] = time.monotonic()

    watch = Informer(kube, api_path("v1", "pods", ns), handlers=[on_pod], name="bench").start()
    watch.wait_synced()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "virtual-kubelet", "--env", "local", "--pool", POOL,
                             "--kubeconfig", str(c.kubeconfig), "--metrics-port", "0", "--log-level", "WARNING"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out: dict = {"provider_start_latency_seconds": latency, "pods": args.pods}
    try:
        deadline = time.monotonic() + 60
        while True:
            node = kube.get_or_none("v1", "nodes", NODE)
            if node and any(c_["type"] == "Ready" and c_["status"] == "True" for c_ in node["status"]["conditions"]):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"virtual kubelet did not come up: {proc.stderr.read() if proc.poll() is not None else ''}")
            time.sleep(0.2)
        out["rss_idle_mib"] = round(rss_kib(proc.pid)[0] / 1024, 1)

        # Idle latency: one at a time.
        for i in range(args.idle):
            name = f"idle-{i}"
            created[name] = time.monotonic()
            kube.create("v1", "pods", pod(name, ns), ns)
            while name not in running:
                time.sleep(0.01)
        out["latency_idle_beyond_provider_seconds"] = stats([running[n] - created[n] - latency for n in created
                                                             if n.startswith("idle-")])

        # Burst: the node's pod capacity (max_pods) is the burst's, so the idle pods go first.
        for i in range(args.idle):
            kube.delete("v1", "pods", f"idle-{i}", ns)
        while kube.list("v1", "pods", ns)["items"]:
            time.sleep(0.2)
        names = [f"burst-{i:04d}" for i in range(args.pods)]

        def make(name: str) -> None:
            created[name] = time.monotonic()
            kube.create("v1", "pods", pod(name, ns), ns)

        t0 = time.monotonic()
        with ThreadPoolExecutor(args.create_workers) as ex:
            list(ex.map(make, names))
        t_created = time.monotonic()
        deadline = time.monotonic() + 600
        while sum(1 for n in names if n in running) < len(names):
            if time.monotonic() > deadline or proc.poll() is not None:
                break
            time.sleep(0.2)
        done = [n for n in names if n in running]
        t_last = max(running[n] for n in done)
        out["burst_create_seconds"] = round(t_created - t0, 1)
        out["burst_running"] = len(done)
        out["burst_pods_per_minute"] = round(len(done) / ((t_last - t0) / 60), 0)
        out["burst_latency_beyond_provider_seconds"] = stats([running[n] - created[n] - latency for n in done])
        time.sleep(2)
        rss, hwm = rss_kib(proc.pid)
        out["rss_mib_with_pods"] = round(rss / 1024, 1)
        out["rss_peak_mib"] = round(hwm / 1024, 1)
        out["meets_1000_pods_per_minute"] = out["burst_pods_per_minute"] >= 1000
        out["meets_256_mib"] = hwm / 1024 < 256
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        watch.stop()
        try:
            kube.delete("v1", "namespaces", ns)
        except NotFound:
            pass
        # The pods are bound to a node no kubelet serves any more: remove them and the node at once.
        for p in kube.list("v1", "pods", ns)["items"]:
            try:
                kube.delete("v1", "pods", p["metadata"]["name"], ns, grace_seconds=0)
            except NotFound:
                pass
        try:
            kube.delete("v1", "nodes", NODE)
        except NotFound:
            pass
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:42} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
