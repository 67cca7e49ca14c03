"""Benchmark publishing pods outside into their Service: Ready-to-published latency, unpublish-before-stop, writes.

The virtual kubelet runs as its own process, exactly as deployed
(``gpufleet virtual-kubelet --config FILE``, pool ``rental`` of ``local``: the simulated GPU
rental, 2 s start latency in ``local``), against a local cluster. One
Service selects ``--pods`` pods created bound to its node (as
``bench/flip_vk.py`` does), created from ``--create-workers`` threads; a
watch on the Service's EndpointSlices records when each pod's endpoint
turns ready, and, after the pods are deleted, when it turns not ready and
when it goes.

Figures:

* ``ready_to_published_seconds``: the pod's Ready condition written ->
  its endpoint ready in gpufleet's slice (p50/p95/max);
* ``delete_to_not_ready_seconds``: the delete request -> its endpoint not
  ready (terminating), and ``not_ready_before_gone``: how many of the
  deleted pods' endpoints were seen not ready before the pod was gone;
* ``slice_writes``: slice versions the watch saw (each one an apply or a
  delete by the virtual kubelet), while publishing and in all;
* ``rss_mib_with_pods``: the virtual kubelet's resident memory with every pod published.

Usage::

    .venv/bin/python bench/vk_endpoints.py [--cluster gpufleet] [--pods 200] [--json]
"""

from __future__ import annotations

import contextlib
import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from flip_vk import NODE, POOL, config_file, pod, rss_kib, stats

from gpufleet_workshop.local import cluster as local
from gpufleet.kube import Kube, NotFound, api_path
from gpufleet.kube.informer import Informer
from gpufleet.names import ENDPOINTSLICE_MANAGED_BY, ENDPOINTSLICE_MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from gpufleet.wait import PollTimeout, poll_until


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="gpufleet", help="local cluster (upped with 4 nodes if not running)")
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--create-workers", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    try:
        c = local.get(args.cluster)
        if not local.status(args.cluster).up:
            raise LookupError
    except LookupError:
        from roles.registry import node_specs

        c = local.up(args.cluster, specs=node_specs("local", 4))
    kube = Kube.from_kubeconfig(c.kubeconfig, max_connections=64)
    ns = f"bench-ep-{uuid.uuid4().hex[:5]}"
    kube.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    kube.create("v1", "services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bench", "namespace": ns},
                                   "spec": {"selector": {"bench": "vk"}, "ports": [{"name": "http", "port": 80,
                                                                                    "targetPort": 8000}]}}, ns)
    ready_at: dict[str, float] = {}
    gone_at: dict[str, float] = {}
    published_at: dict[str, float] = {}
    unready_at: dict[str, float] = {}
    versions: set[str] = set()

    def on_pod(kind, new, old):
        name = new["metadata"]["name"]
        if kind == "DELETED":
            gone_at.setdefault(name, time.monotonic())
        elif any(x.get("type") == "Ready" and x.get("status") == "True" for x in (new.get("status") or {}).get("conditions") or []):
            ready_at.setdefault(name, time.monotonic())

    def on_slice(kind, new, old):
        now = time.monotonic()
        versions.add(f"{new['metadata']['name']}@{new['metadata'].get('resourceVersion')}")
        for e in new.get("endpoints") or []:
            name = (e.get("targetRef") or {}).get("name")
            if name and e["conditions"].get("ready"):
                published_at.setdefault(name, now)
            elif name and e["conditions"].get("terminating"):
                unready_at.setdefault(name, now)

    pods_watch = Informer(kube, api_path("v1", "pods", ns), handlers=[on_pod], name="bench-pods").start()
    selector = f"{SERVICE_NAME_LABEL}=bench,{ENDPOINTSLICE_MANAGED_BY_LABEL}={ENDPOINTSLICE_MANAGED_BY}"
    slices_watch = Informer(kube, api_path("discovery.k8s.io/v1", "endpointslices", ns),
                            params={"labelSelector": selector}, handlers=[on_slice], name="bench-slices").start()
    pods_watch.wait_synced()
    slices_watch.wait_synced()
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "virtual-kubelet", "--config", str(config_file()),
                             "--kubeconfig", str(c.kubeconfig), "--metrics-port", "0", "--log-level", "WARNING"],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    out: dict = {"pods": args.pods}
    names = [f"ep-{i:04d}" for i in range(args.pods)]
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"virtual kubelet did not come up: {proc.stderr.read()}")
            node = kube.get_or_none("v1", "nodes", NODE)
            return bool(node) and any(x["type"] == "Ready" and x["status"] == "True" for x in node["status"]["conditions"])

        try:
            poll_until(up, what=f"{NODE} Ready", timeout=60, interval=0.2)
        except PollTimeout:
            raise SystemExit("virtual kubelet did not come up: not Ready within 60 s") from None

        def make(name: str) -> None:
            body = pod(name, ns)
            body["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
            body["spec"]["terminationGracePeriodSeconds"] = 5  # a graceful delete, which the virtual kubelet finishes
            kube.create("v1", "pods", body, ns)

        with ThreadPoolExecutor(args.create_workers) as ex:
            list(ex.map(make, names))
        with contextlib.suppress(PollTimeout):  # what was published by then is reported
            poll_until(lambda: all(n in published_at for n in names), what="every pod published", timeout=600,
                       interval=0.2)
        done = [n for n in names if n in published_at and n in ready_at]
        out["published"] = len(done)
        out["ready_to_published_seconds"] = stats([max(0.0, published_at[n] - ready_at[n]) for n in done])
        time.sleep(3)
        out["rss_mib_with_pods"] = round(rss_kib(proc.pid)[0] / 1024, 1)
        writes_up = len(versions)

        deleted_at: dict[str, float] = {}

        def remove(name: str) -> None:
            deleted_at[name] = time.monotonic()
            kube.delete("v1", "pods", name, ns)

        with ThreadPoolExecutor(args.create_workers) as ex:
            list(ex.map(remove, names))
        with contextlib.suppress(PollTimeout):
            poll_until(lambda: len(gone_at) >= len(names), what="every endpoint gone", timeout=600, interval=0.2)
        seen = [n for n in names if n in unready_at]
        out["delete_to_not_ready_seconds"] = stats([max(0.0, unready_at[n] - deleted_at[n]) for n in seen])
        out["not_ready_before_gone"] = f"{sum(1 for n in seen if n in gone_at and unready_at[n] <= gone_at[n])}/{len(names)}"
        time.sleep(3)
        out["slice_writes"] = {"publish": writes_up, "total": len(versions)}
        out["slices_left"] = len(slices_watch.items())
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        pods_watch.stop()
        slices_watch.stop()
        for p in kube.list("v1", "pods", ns)["items"]:
            try:
                kube.delete("v1", "pods", p["metadata"]["name"], ns, grace_seconds=0)
            except NotFound:
                pass
        for what in (("v1", "namespaces", ns, None), ("v1", "nodes", NODE, None)):
            try:
                kube.delete(what[0], what[1], what[2])
            except NotFound:
                pass
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:32} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
