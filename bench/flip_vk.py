"""Benchmark the virtual kubelet: create-to-Running latency beyond the provider's, throughput, RSS at 1,000 pods.

The virtual kubelet runs as its own process, exactly as deployed
(``gpufleet virtual-kubelet --config FILE``, the file the virtual_kubelet role
renders for pool ``rental`` of ``local``: the simulated GPU rental, start
latency 2 s; registered open, as pods are bound to it directly), against a local
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

``--in-cluster`` measures the roles' virtual kubelet as the cluster runs it
instead: the pool's Deployment (``vk-rental``, from gpufleet's image, its
ServiceAccount and RBAC) on the local cluster's real node, applied as
``invoke sim.flip`` applies it (kept as it is when a stack deployed it,
removed afterwards otherwise). Memory then comes from the kubelet's Summary
API (``bench/in_cluster_memory.py``): the pod's working set (what its
memory limit is held against), sampled every 2 s, idle, with the pods
Running, and its peak over the burst (the kubelet refreshes these figures
every 10-15 s, so the peak is a lower bound).

Targets (virtual-kubelet issue): >= 1,000 pods/min per virtual kubelet;
1,000 pods under 256 MiB RSS.

Usage::

    .venv/bin/python bench/flip_vk.py [--cluster gpufleet] [--pods 1000] [--in-cluster] [--json]
"""

from __future__ import annotations

import contextlib
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpufleet_workshop.local import cluster as local
from gpufleet_workshop.local import node as realnode
from gpufleet.kube import Kube, NotFound, api_path
from gpufleet.kube.informer import Informer
from gpufleet_workshop.sim import incluster
from gpufleet.wait import PollTimeout, poll_until
from in_cluster_memory import sample
from roles.registry import load

POOL = "rental"


def config_file() -> Path:
    """The virtual kubelet's configuration file for :data:`POOL`, as the virtual_kubelet role renders it for
    ``local`` (the node registered open: the bench binds its pods to it directly), in a temporary folder."""
    import tempfile

    from roles.registry import component

    comp = component("virtual-kubelet")
    config = comp.build(load("local"), POOL).model_copy(update={"register_with_taints": ()})
    path = Path(tempfile.mkdtemp(prefix="gpufleet-bench-vk-")) / "config.yaml"
    path.write_text(comp.dump(config))
    return path
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


class HostProcess:
    """The virtual kubelet as a host process (``gpufleet virtual-kubelet``); memory from /proc (KiB)."""

    def __init__(self, kubeconfig: Path):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "virtual-kubelet", "--config",
                                      str(config_file()), "--kubeconfig", str(kubeconfig), "--metrics-port", "0",
                                      "--log-level", "WARNING"],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.removed = True

    def failed(self) -> str | None:
        """Why it is gone (its stderr), or None while it runs."""
        return self.proc.stderr.read() if self.proc.poll() is not None else None

    def memory(self, out: dict, when: str) -> None:
        rss, hwm = rss_kib(self.proc.pid)
        if when == "idle":
            out["rss_idle_mib"] = round(rss / 1024, 1)
            return
        out["rss_mib_with_pods"] = round(rss / 1024, 1)
        out["rss_peak_mib"] = round(hwm / 1024, 1)
        out["meets_256_mib"] = hwm / 1024 < 256

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class InCluster:
    """The roles' virtual-kubelet Deployment of the pool on the real node; memory from the kubelet's Summary API.

    A background thread samples the pod's working set every 2 s for the peak.
    """

    def __init__(self, kube: Kube, cluster, timeout: float = 300.0):
        from roles.virtual_kubelet.manifests import objects as virtual_kubelet

        inv = load("local", overrides=incluster.overrides(incluster.stack_config(cluster)))
        vk = inv.role("virtual_kubelet")
        inv.roles["virtual_kubelet"] = vk.model_copy(update={
            "virtual_kubelet_pools": [p for p in vk.virtual_kubelet_pools if p.name == POOL]})
        objs = virtual_kubelet(inv)
        self.kube, self.node = kube, realnode.node_name(cluster.name)
        self.deployment = next(d for d in incluster.deployments(objs) if d[1] == f"vk-{POOL}")
        self.created = incluster.deploy(kube, objs)
        self.removed = bool(self.created)
        self.limit = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0] \
            .get("resources", {}).get("limits", {}).get("memory")
        incluster.wait_available(kube, [self.deployment], timeout)
        self.peak = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, daemon=True)
        self._sampler.start()

    def failed(self) -> str | None:
        return None if incluster.available(self.kube, *self.deployment) else incluster.pod_states(self.kube, *self.deployment)

    def working_set(self) -> int:
        """Bytes: the working set of the Deployment's pod(s) in the kubelet's latest figures (0 before the first)."""
        names = {f"{self.deployment[0]}/{p['metadata']['name']}" for p in incluster.pods(self.kube, *self.deployment)}
        return sum(ws for pod, ws in sample(self.kube, self.node).items() if pod in names)

    def _sample_loop(self) -> None:
        while not self._stop.wait(2.0):
            try:
                self.peak = max(self.peak, self.working_set())
            except Exception:  # a missed sample only lowers the peak's resolution
                pass

    def memory(self, out: dict, when: str) -> None:
        ws = self.working_set()
        self.peak = max(self.peak, ws)
        if when == "idle":
            out["working_set_idle_mib"] = round(ws / 2**20, 1)
            return
        out["working_set_mib_with_pods"] = round(ws / 2**20, 1)
        out["working_set_peak_mib"] = round(self.peak / 2**20, 1)
        out["memory_limit"] = self.limit
        out["meets_256_mib"] = self.peak / 2**20 < 256

    def stop(self) -> None:
        self._stop.set()
        self._sampler.join(5)
        incluster.remove(self.kube, self.created)


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
    ap.add_argument("--in-cluster", action="store_true",
                    help="the roles' virtual-kubelet Deployment on the real node instead of a host process")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    pool = next(p for p in load("local").role("virtual_kubelet").virtual_kubelet_pools if p.name == POOL)
    latency = pool.start_latency_seconds
    try:
        c = local.get(args.cluster)
        if not local.status(args.cluster).up:
            raise LookupError
    except LookupError:
        from roles.registry import node_specs

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
    out: dict = {"provider_start_latency_seconds": latency, "pods": args.pods,
                 "virtual_kubelet": "in-cluster" if args.in_cluster else "host process"}
    vk = InCluster(kube, c) if args.in_cluster else HostProcess(c.kubeconfig)
    try:
        def up() -> bool:
            node = kube.get_or_none("v1", "nodes", NODE)
            if node and any(c_["type"] == "Ready" and c_["status"] == "True" for c_ in node["status"]["conditions"]):
                return True
            if (why := vk.failed()) is not None:
                raise SystemExit(f"virtual kubelet did not come up: {why}")
            return False

        try:
            poll_until(up, what=f"{NODE} Ready", timeout=60, interval=0.2)
        except PollTimeout:
            raise SystemExit("virtual kubelet did not come up: not Ready within 60 s") from None
        vk.memory(out, "idle")

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
        with contextlib.suppress(PollTimeout):  # what ran by then is reported
            poll_until(lambda: sum(1 for n in names if n in running) == len(names) or vk.failed() is not None,
                       what="every pod running", timeout=600, interval=0.2)
        done = [n for n in names if n in running]
        t_last = max(running[n] for n in done)
        out["burst_create_seconds"] = round(t_created - t0, 1)
        out["burst_running"] = len(done)
        out["burst_pods_per_minute"] = round(len(done) / ((t_last - t0) / 60), 0)
        out["burst_latency_beyond_provider_seconds"] = stats([running[n] - created[n] - latency for n in done])
        # The kubelet's figures lag (cAdvisor's housekeeping); a host process's are current.
        time.sleep(20 if args.in_cluster else 2)
        out["meets_1000_pods_per_minute"] = out["burst_pods_per_minute"] >= 1000
        vk.memory(out, "with pods")
    finally:
        vk.stop()
        watch.stop()
        try:
            kube.delete("v1", "namespaces", ns)
        except NotFound:
            pass
        # The pods are bound to a node no kubelet serves any more: remove them and the node at once
        # (a stack's virtual kubelet stays, and deletes its pods itself).
        for p in kube.list("v1", "pods", ns)["items"] if vk.removed else []:
            try:
                kube.delete("v1", "pods", p["metadata"]["name"], ns, grace_seconds=0)
            except NotFound:
                pass
        try:
            if vk.removed:
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
