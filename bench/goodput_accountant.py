"""Benchmark the goodput accountant's own cost: 1,000 Workloads, 20,000 pods, their checkpoints.

Feeds :class:`gpufleet.goodput.tracker.Tracker`, the service behind
``gpufleet goodput``, in a process of its own, with what the API server
sends it: the JSON list pages (500 items) of 1,000 JobSet Workloads and
20,000 pods shaped as the API returns them, then the watch events of a
quarter of the jobs restarting (old pods failed and deleted, new pods
added); each job has checkpoints (``step-<N>/COMPLETE``) in a temporary
folder. Prints:

* the first list: CPU seconds to decode and fold in every Workload and pod
  (what the watches' first list costs at start), and watch events per second;
* a pass: CPU seconds of one :meth:`Tracker.accounts` over every job
  (checkpoint directories read, accounts computed), p50 and max over
  ``--passes`` passes; the controller makes one pass every
  ``goodput_interval_seconds`` (15 s);
* memory: what the tracker holds (tracemalloc, after a collection) and the
  accountant process's peak RSS (to compare with ``goodput_memory``).

Run: ``.venv/bin/python bench/goodput_accountant.py [--workloads 1000] [--pods-per-workload 20]
[--checkpoints 10] [--passes 5]``. Needs no cluster: it measures the
accountant's part; the API server's cost of the watches is the API
server's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from gpufleet.goodput.tracker import Tracker

T0 = time.time() - 6 * 3600


def ts(offset: float) -> str:
    return datetime.fromtimestamp(T0 + offset, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def workload(i: int, pods: int) -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"jobset-job-{i:04d}-abcde", "namespace": "team-pretrain", "uid": f"wl-{i}",
                     "creationTimestamp": ts(i), "resourceVersion": str(1000 + i),
                     "labels": {"kueue.x-k8s.io/job-uid": f"js-{i}"},
                     "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                          "name": f"job-{i:04d}", "uid": f"js-{i}", "controller": True}]},
        "spec": {"queueName": "pretrain", "priority": 1000, "podSets": [{"name": "workers", "count": pods,
                                                                          "template": {"spec": {"containers": [{
                                                                              "name": "trainer", "image": "x"}]}}}]},
        "status": {"conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "lastTransitionTime": ts(i + 5),
             "message": "Quota reserved in ClusterQueue training"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": ts(i + 5),
             "message": "The workload is admitted"},
            {"type": "PodsReady", "status": "True", "reason": "PodsReady", "lastTransitionTime": ts(i + 40),
             "message": "All pods reached readiness"}],
            "admission": {"clusterQueue": "training", "podSetAssignments": [{"name": "workers", "count": pods,
                                                                             "flavors": {"nvidia.com/gpu": "h100"}}]}},
    }


def pod(i: int, k: int, gen: int, start: float, end: float | None, ckpt: str) -> dict:
    state = {"running": {"startedAt": ts(start)}} if end is None else {
        "terminated": {"startedAt": ts(start), "finishedAt": ts(end), "exitCode": 1, "reason": "Error"}}
    meta = {"name": f"job-{i:04d}-workers-0-{k}-{gen}", "namespace": "team-pretrain", "uid": f"p-{i}-{k}-{gen}",
            "creationTimestamp": ts(start - 10), "resourceVersion": str(5000 + i * 100 + k),
            "labels": {"gpufleet.io/job": f"job-{i:04d}", "jobset.sigs.k8s.io/jobset-name": f"job-{i:04d}",
                       "batch.kubernetes.io/job-completion-index": str(k), "kueue.x-k8s.io/podset": "workers"},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(k)}}
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": f"gpu-{(i * 20 + k) % 4096:04d}", "priorityClassName": "gpufleet-training",
                 "containers": [{"name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.12-py3",
                                 "command": ["bash", "-c"], "args": ["exec torchrun train.py"],
                                 "env": [{"name": "CHECKPOINT_DIR", "value": ckpt},
                                         {"name": "NCCL_IB_HCA", "value": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"},
                                         {"name": "CHECKPOINT_INTERVAL_SECONDS", "value": "1116"}],
                                 "resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "200", "memory": "1800Gi"}}}]},
        "status": {"phase": "Running" if end is None else "Failed", "podIP": "10.0.0.1",
                   "conditions": [{"type": t, "status": "True", "lastTransitionTime": ts(start)}
                                  for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                   "containerStatuses": [{"name": "trainer", "ready": end is None, "restartCount": 0,
                                          "image": "nvcr.io/nvidia/pytorch:24.12-py3", "state": state}]},
    }


def write_pages(root: Path, n: int, per: int, page: int = 500) -> tuple[Path, Path, int]:
    """Write the API's answers as the accountant reads them: list pages of Workloads and pods, then the
    watch events of the restarts (JSON lines). Returns ``(lists, events, live pods)``."""
    lists, events = root / "lists.jsonl", root / "events.jsonl"
    with lists.open("w") as f:
        f.write(json.dumps({"kind": "workloads", "items": [workload(i, per) for i in range(n)]}) + "\n")
        batch: list[dict] = []
        for i in range(n):
            for k in range(per):
                batch.append(pod(i, k, 0, i + 60, None, str(root / f"job-{i:04d}")))
                if len(batch) == page:
                    f.write(json.dumps({"kind": "pods", "items": batch}) + "\n")
                    batch = []
        if batch:
            f.write(json.dumps({"kind": "pods", "items": batch}) + "\n")
    with events.open("w") as f:  # a quarter of the jobs restart: old pods fail and go, new ones run
        for i in range(0, n, 4):
            ckpt = str(root / f"job-{i:04d}")
            for k in range(per):
                f.write(json.dumps(["MODIFIED", pod(i, k, 0, i + 60, i + 3000, ckpt)]) + "\n")
                f.write(json.dumps(["DELETED", pod(i, k, 0, i + 60, i + 3000, ckpt)]) + "\n")
                f.write(json.dumps(["ADDED", pod(i, k, 1, i + 3100, None, ckpt)]) + "\n")
    return lists, events, n * per


def accountant(lists: Path, events: Path, passes: int) -> dict:
    """The accountant's side, in its own process: decode and fold in the lists and events, then passes."""
    tracemalloc.start()
    tracker = Tracker()
    cpu0 = time.process_time()
    with lists.open() as f:
        for line in f:
            page = json.loads(line)
            if page["kind"] == "workloads":
                tracker.workloads_listed(page["items"])
            else:
                for o in page["items"]:  # the watch's first list, page by page
                    tracker.observe_pod(o)
    ingest = time.process_time() - cpu0
    cpu0, count = time.process_time(), 0
    with events.open() as f:
        for line in f:
            kind, obj = json.loads(line)
            tracker.pod_event(kind, obj, time.time())
            count += 1
    per_event = (time.process_time() - cpu0) / max(count, 1)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    durations, accounts = [], []
    for _ in range(passes):
        cpu0 = time.process_time()
        accounts = tracker.accounts(time.time())
        durations.append(time.process_time() - cpu0)
    return {"ingest": ingest, "events": count, "per_event": per_event, "held": held, "passes": durations,
            "accounts": len(accounts), "interrupted": sum(1 for a in accounts if a.interruptions),
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    """Run the benchmark (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=1000)
    ap.add_argument("--pods-per-workload", type=int, default=20)
    ap.add_argument("--checkpoints", type=int, default=10, help="checkpoints per job")
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    n, per = args.workloads, args.pods_per_workload
    root = Path(tempfile.mkdtemp(prefix="goodput-bench-"))
    written = 0
    try:
        for i in range(n):
            # every 1,200 s of the job's run, 20 s saves; a restarted job's gang is down 3000-3100 s
            done = [i + 620 + c * 1200 for c in range(args.checkpoints)]
            done = [t for t in done if not (i % 4 == 0 and i + 3000 <= t <= i + 3200)]
            written += len(done)
            for c, t in enumerate(done):
                d = root / f"job-{i:04d}" / f"step-{(c + 1) * 100}"
                d.mkdir(parents=True)
                (d / "model.pt").write_bytes(b"")
                (d / "COMPLETE").write_text(json.dumps({"started": T0 + t - 20}))
                os.utime(d / "COMPLETE", (T0 + t,) * 2)
        lists, events, live = write_pages(root, n, per)
        with ProcessPoolExecutor(max_workers=1) as pool:  # a fresh process: its peak RSS is the accountant's
            r = pool.submit(accountant, lists, events, args.passes).result()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{n:,} Workloads, {live:,} pods (then {n // 4:,} jobs restart: {r['events']:,} pod watch events), "
          f"{written:,} checkpoints")
    print(f"first list (decode JSON pages, fold in): {r['ingest']:.2f} s CPU; watch events: "
          f"{1 / r['per_event']:,.0f}/s")
    print(f"one pass over every account: p50 {statistics.median(r['passes']):.2f} s CPU, max {max(r['passes']):.2f} s "
          f"({r['accounts']:,} accounts, {r['interrupted']:,} with an interruption); one pass per "
          f"goodput_interval_seconds (15 s)")
    print(f"memory held by the tracker: {r['held'] / 2**20:.1f} MiB; accountant process peak RSS {r['rss_mib']:.0f} MiB "
          f"(the role's limit: goodput_memory 256Mi)")


if __name__ == "__main__":
    main()
