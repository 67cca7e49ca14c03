"""Benchmark quota resync and quota-sync convergence on a simulated fleet.

Prints:

* one-shot resync: read (nodes, ClusterQueues, Workloads, LocalQueues),
  compute and apply times, p50/p99 over ``--rounds`` rounds, each round
  after one node changed (so every apply writes);
* quota-sync convergence: the controller (:class:`gpufleet.quota_sync.controller.QuotaSync`,
  watch + debounce, in this process) runs while nodes leave and return one
  at a time (taint ``gpufleet.io/swap``); for each change, seconds until
  ClusterQueue ``training`` has the new nominalQuota (polled every 50 ms),
  p50/p99/max. Target: p99 within 10 s.

Run: ``.venv/bin/python bench/ops_quota.py [--nodes 4096] [--events 20] [--keep] [--static]``.
Uses its own local cluster (``ops-bench``), started with ``--nodes`` nodes
and stopped at the end unless ``--keep``.

``--static``: when kwok cannot keep every node Ready (4,096 kwok nodes on a
loaded 2-core machine flap NotReady, which would move the quota by itself),
stop this cluster's kwok and kube-controller-manager and mark every Node
Ready once through the status subresource: the Nodes stay Ready and only
the bench's own changes move the quota. The API server, etcd and Kueue
still hold and serve all the Nodes; what is lost is kwok's heartbeat churn.
"""

from __future__ import annotations

import argparse
import random
from concurrent.futures import ThreadPoolExecutor
import statistics
import threading
import time

from gpufleet.kube import Conflict
from gpufleet.kube.retry import update_with_retry
from gpufleet_workshop.local import cluster as local
from gpufleet.names import SWAP_TAINT
from gpufleet.ops.reads import list_nodes
from gpufleet.quota_sync import resync as rs
from gpufleet.quota_sync.controller import QuotaSync
from gpufleet.wait import PollTimeout, poll_until
from roles.kueue.config import configuration as quota_configuration
from roles.registry import load, node_specs

NAME = "ops-bench"
FLAVOR = "h100-sxm-80gb"


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))]


KUEUE_KINDS = {"Namespace", "ResourceFlavor", "ClusterQueue", "LocalQueue", "PriorityClass", "WorkloadPriorityClass"}


def ensure_kueue(api, inv) -> None:
    """Create the inventory's Kueue objects (namespaces, flavor, queues, priority classes) when absent."""
    from roles.kueue.manifests import objects

    for obj in objects(inv):
        if obj["kind"] not in KUEUE_KINDS:
            continue
        try:
            api.create_object(obj)
        except Conflict:
            pass


def toggle(api, node: str, out: bool) -> None:
    """Taint (``out``) or untaint ``node`` with gpufleet.io/swap."""
    def change(obj):
        taints = [t for t in obj["spec"].get("taints") or [] if t["key"] != SWAP_TAINT]
        if out:
            taints.append({"key": SWAP_TAINT, "value": "bench", "effect": "NoSchedule"})
        return {"spec": {"taints": taints or None}}

    update_with_retry(api, f"/api/v1/nodes/{node}", change)


def freeze_ready(c, api) -> None:
    """``--static``: stop kwok and kube-controller-manager, then set every Node Ready with no unhealthy taint."""
    from gpufleet_workshop.local import processes

    for comp in ("kwok", "kube-controller-manager"):
        processes.stop(c.layout.pid(comp))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cond = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench: frozen Ready",
             "lastHeartbeatTime": now, "lastTransitionTime": now}]

    def fix(n: dict) -> None:
        name = n["metadata"]["name"]
        api.patch("v1", "nodes", name, {"status": {"conditions": cond}}, subresource="status")
        taints = [t for t in n["spec"].get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")]
        if taints != (n["spec"].get("taints") or []):
            api.patch("v1", "nodes", name, {"spec": {"taints": taints or None}})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(fix, list_nodes(api, "gpufleet.io/simulated=true")))


def training_quota(api) -> int:
    """GPU nominalQuota of ClusterQueue training."""
    return int(rs.quota_of(api.request("GET", f"{rs.CQ_PATH}/training"), FLAVOR)["nominal"])


def main() -> None:
    """Run the benchmark (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=10, help="one-shot resync rounds")
    ap.add_argument("--events", type=int, default=20, help="node leave/return events for convergence")
    ap.add_argument("--timeout", type=float, default=900, help="seconds the cluster may take to come up")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--static", action="store_true", help="freeze every Node Ready (see the module docstring)")
    args = ap.parse_args()

    t = time.monotonic()
    try:
        c = local.up(NAME, specs=node_specs("local", args.nodes), timeout=args.timeout)
        print(f"cluster {NAME}: {args.nodes} nodes Ready in {time.monotonic() - t:.0f}s")
    except TimeoutError as exc:
        if not args.static:
            raise
        c = local.get(NAME)
        print(f"cluster {NAME}: {exc} (kwok on this machine); --static: freezing them Ready")
    api = c.kube(timeout=120, field_manager="gpufleet", user_agent="gpufleet-bench")
    if args.static:
        t = time.monotonic()
        freeze_ready(c, api)
        print(f"{args.nodes} Nodes frozen Ready in {time.monotonic() - t:.0f}s (kwok and kube-controller-manager stopped)")
    inv = load("local", nodes=args.nodes)
    ensure_kueue(api, inv)
    config = quota_configuration(inv)  # what the quota-sync controller is configured with (the kueue role's)
    names = sorted(n["metadata"]["name"] for n in list_nodes(api, "gpufleet.io/simulated=true"))
    rng = random.Random(7)
    try:
        rs.apply(api, rs.compute(api, config), events=False)
        read, compute, apply_ = [], [], []
        for i in range(args.rounds):
            node = rng.choice(names)
            for out in (True, False):  # the node leaves, then returns: each resync writes
                toggle(api, node, out)
                t0 = time.perf_counter()
                state = rs.read_state(api)
                t1 = time.perf_counter()
                plan = rs.plan_from(config, *state)
                t2 = time.perf_counter()
                result = rs.apply(api, plan, events=False)
                t3 = time.perf_counter()
                assert result.patched, f"{node} {'left' if out else 'returned'}: the quota should change"
                read.append(t1 - t0)
                compute.append(t2 - t1)
                apply_.append(t3 - t2)
        rs.apply(api, rs.compute(api, config), events=False)
        print(f"\none-shot resync at {args.nodes} nodes ({len(read)} resyncs, seconds):")
        for label, xs in (("read state", read), ("compute", compute), ("apply", apply_),
                          ("total", [a + b + c_ for a, b, c_ in zip(read, compute, apply_)])):
            print(f"  {label:11} p50 {statistics.median(xs):7.3f}  p99 {pct(xs, 99):7.3f}  max {max(xs):7.3f}")

        sync = QuotaSync(api, config)
        stop = threading.Event()
        runner = threading.Thread(target=sync.run, args=(stop,), daemon=True)
        runner.start()
        sync.cache.synced.wait(120)
        time.sleep(2)
        conv = []
        out: list[str] = []
        for i in range(args.events):
            leaving = not out or (len(out) < 8 and rng.random() < 0.6)
            before = training_quota(api)
            node = rng.choice([n for n in names if n not in out]) if leaving else out.pop(rng.randrange(len(out)))
            t0 = time.monotonic()
            toggle(api, node, leaving)
            if leaving:
                out.append(node)
            try:
                poll_until(lambda: training_quota(api) != before, what="quota convergence", timeout=60, interval=0.05)
            except PollTimeout:
                raise SystemExit(f"no convergence within 60 s after {node} {'left' if leaving else 'returned'}") from None
            conv.append(time.monotonic() - t0)
            time.sleep(0.5)
        for node in out:
            toggle(api, node, False)
        time.sleep(3)
        stop.set()
        runner.join(10)
        print(f"\nquota-sync convergence at {args.nodes} nodes ({len(conv)} node events, debounce "
              f"{sync.debounce_seconds:g}s, seconds from the node change to the new quota):")
        print(f"  p50 {statistics.median(conv):.2f}  p99 {pct(conv, 99):.2f}  max {max(conv):.2f}  "
              f"(target p99 <= 10 s: {'met' if pct(conv, 99) <= 10 else 'NOT met'})")
        ok = [h for h in sync.history if h.applied and h.applied.patched]
        if ok:
            print(f"  controller resync (cache -> applied): p50 {statistics.median(h.seconds for h in ok):.3f}s, "
                  f"max {max(h.seconds for h in ok):.3f}s over {len(ok)} resyncs; {sync.cache.events} node events seen")
    finally:
        api.close()
        if not args.keep:
            local.down(NAME, purge=True)


if __name__ == "__main__":
    main()
