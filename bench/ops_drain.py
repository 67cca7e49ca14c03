"""Benchmark draining a node with 50 pods under PodDisruptionBudgets (Eviction API, kwok pods).

Scenarios (each on a fresh node of the local cluster, pods preferring it):

* ``5x10 maxUnavailable=1``: five Deployments of 10 pods, each with a PDB
  allowing one disruption at a time (the budgets drain in parallel);
* ``1x50 maxUnavailable=1``: one Deployment of 50 pods, one at a time
  (the worst case: every eviction waits for the previous replacement
  to become Ready and the disruption controller to notice);
* ``1x50 maxUnavailable=10%``: one Deployment, five at a time.

Prints, per scenario, the drain time (first eviction to last pod gone),
the evictions refused by a PDB on the way (429), and the lowest number of
ready pods seen (sampled every 100 ms) against the budget's minimum.

Run: ``.venv/bin/python bench/ops_drain.py [--cluster NAME]``. Uses local
cluster ``ops-bench-drain`` (16 nodes, started if needed, stopped at the
end unless ``--keep``), or ``--cluster`` an existing one (left running).
"""

from __future__ import annotations

import contextlib
import argparse
import threading
import uuid

from gpufleet_workshop.local import cluster as local
from gpufleet.ops import drain as drainer
from gpufleet.ops import swap as swapper
from gpufleet.ops.reads import list_nodes
from gpufleet.wait import PollTimeout, poll_until
from roles.registry import node_specs

SCENARIOS = (("5x10 maxUnavailable=1", 5, 10, 1), ("1x50 maxUnavailable=1", 1, 50, 1), ("1x50 maxUnavailable=10%", 1, 50, "10%"))


def ready(api, ns: str) -> int:
    """Ready pods of ``ns`` not being deleted."""
    return sum(1 for p in api.list("v1", "pods", ns)["items"] if not p["metadata"].get("deletionTimestamp")
               and any(c["type"] == "Ready" and c["status"] == "True" for c in (p["status"].get("conditions") or [])))


def setup(api, ns: str, node: str, deployments: int, replicas: int, max_unavailable) -> None:
    """Deployments and PDBs in ``ns`` with every pod Running on ``node``."""
    api.create("v1", "namespaces", {"metadata": {"name": ns}})
    for i in range(deployments):
        labels = {"app": f"app{i}"}
        api.create("apps/v1", "deployments", {"metadata": {"name": f"app{i}"}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
                    "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}}]}},
                "containers": [{"name": "c", "image": "registry.invalid/serve:1",
                                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}}, ns)
        api.create("policy/v1", "poddisruptionbudgets", {"metadata": {"name": f"app{i}"}, "spec": {
            "maxUnavailable": max_unavailable, "selector": {"matchLabels": labels}}}, ns)
    total = deployments * replicas
    on: list = []

    def settled() -> bool:
        on[:] = [p for p in api.list("v1", "pods", ns)["items"]
                 if p["spec"].get("nodeName") == node and p["status"].get("phase") == "Running"]
        return len(on) == total and all((api.get("policy/v1", "poddisruptionbudgets", f"app{i}", ns).get("status")
                                         or {}).get("currentHealthy", 0) == replicas for i in range(deployments))

    try:
        poll_until(settled, what=f"{total} pods running on {node}", timeout=180, interval=1)
    except PollTimeout:
        raise SystemExit(f"only {len(on)}/{total} pods running on {node} after 180 s") from None


def main() -> None:
    """Run the benchmark (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", help="use this running local cluster instead of starting ops-bench-drain")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    name = args.cluster or "ops-bench-drain"
    c = local.get(name) if args.cluster else local.up(name, specs=node_specs("local", 16), timeout=300)
    api = c.kube(timeout=120, field_manager="gpufleet", user_agent="gpufleet-bench")
    nodes = sorted(n["metadata"]["name"] for n in list_nodes(api, "gpufleet.io/simulated=true"))
    print(f"{'scenario':26} {'pods':>5} {'drain s':>8} {'429s':>6} {'min ready':>10} {'budget min':>10}")
    try:
        for (label, deps, reps, mu), node in zip(SCENARIOS, nodes[-len(SCENARIOS):]):
            ns = f"drain-{uuid.uuid4().hex[:5]}"
            setup(api, ns, node, deps, reps, mu)
            budget_min = deps * reps - (deps * 1 if mu == 1 else int(reps * 0.1))
            lowest = [deps * reps]
            stop = threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    lowest[0] = min(lowest[0], ready(api, ns))
                    stop.wait(0.1)

            refusals = [0]
            orig = drainer.evict

            def counting(api_, pod, **kw):
                ok, msg = orig(api_, pod, **kw)
                refusals[0] += 0 if ok else 1
                return ok, msg

            drainer.evict = counting
            w = threading.Thread(target=watch, daemon=True)
            w.start()
            try:
                result = swapper.swap(api, node, f"bench {label}", timeout=600)
            finally:
                drainer.evict = orig
                stop.set()
                w.join()
            d = result.drain
            print(f"{label:26} {len(d.evicted):5d} {d.seconds:8.1f} {refusals[0]:6d} {lowest[0]:10d} {budget_min:10d}"
                  + ("" if d.complete else f"  INCOMPLETE: {len(d.blocked)} left"))
            swapper.return_node(api, node, checks=None)  # simulated node: nothing to check
            api.delete("v1", "configmaps", swapper.request_name(node), "gpufleet-system")
            api.delete("v1", "namespaces", ns, grace_seconds=0)
            with contextlib.suppress(PollTimeout):  # its pods must not show up in the next scenario's drain
                poll_until(lambda: api.get_or_none("v1", "namespaces", ns) is None, what=f"namespace {ns} gone",
                           timeout=120, interval=1)
    finally:
        api.close()
        if not args.cluster and not args.keep:
            local.down(name, purge=True)


if __name__ == "__main__":
    main()
