"""Benchmark remediation latency: from a hot GPU series in Prometheus to the node tainted.

A real Prometheus scrapes simulated exporters (:mod:`gpufleet_workshop.sim.fleet`,
the project's collectors) for ``--hot`` nodes of the local cluster every
``--scrape`` seconds. The controller's service (:class:`~gpufleet.node_health.remediate.Remediator`)
steps every ``--interval`` seconds as ``gpufleet node-health`` does. One GPU
per node is heated at a random moment; for each node the script prints the
seconds from the N-th hot sample (its timestamp in Prometheus, N =
``--hot-samples``) to the swap taint on the Node (the controller's own
measurement, and the time this script saw the taint). Target: within 15 s.

Run: ``.venv/bin/python bench/ops_remediation.py [--cluster NAME] [--scrape 5] [--interval 5]``.
Uses local cluster ``ops-bench-health`` (16 nodes, stopped at the end unless
``--keep``), or ``--cluster`` an existing one (left running; its nodes are
returned afterwards).
"""

from __future__ import annotations

import contextlib
import argparse
import random
import statistics
import tempfile
import threading
import time

from gpufleet.node_health.faults import Rules
from gpufleet.prom.client import PromClient
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.remediate import Remediator
from gpufleet_workshop.sim.fleet import scrape_config, start_node
from gpufleet_workshop.local import cluster as local
from gpufleet.kube import KubeError
from gpufleet.ops.reads import list_nodes
from gpufleet.fleet import nodes as nodeutil
from gpufleet.ops import swap as swapper
from gpufleet.names import SWAP_TAINT
from gpufleet.prom.server import running_prometheus
from gpufleet.wait import PollTimeout, poll_until
from roles.registry import node_specs


def main() -> None:
    """Run the benchmark (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--hot", type=int, default=8, help="nodes to heat, one after the other")
    ap.add_argument("--scrape", type=float, default=5.0, help="Prometheus scrape interval, s")
    ap.add_argument("--interval", type=float, default=5.0, help="controller step interval, s (node-health default 5)")
    ap.add_argument("--hot-samples", type=int, default=3)
    args = ap.parse_args()
    name = args.cluster or "ops-bench-health"
    c = local.get(name) if args.cluster else local.up(name, specs=node_specs("local", 16), timeout=300)
    api = c.kube(timeout=120, field_manager="gpufleet", user_agent="gpufleet-bench")
    names = sorted(n["metadata"]["name"] for n in list_nodes(api, "gpufleet.io/simulated=true"))[-args.hot:]
    work = tempfile.mkdtemp(prefix="ops-bench-health-")
    sims = {n: start_node(n, workdir=f"{work}/{n}") for n in names}
    interval = f"{args.scrape:g}s"
    rng = random.Random(3)
    seen_taint: dict[str, float] = {}
    try:
        with running_prometheus([scrape_config(list(sims.values()), interval=interval)],
                                global_config={"scrape_interval": interval, "evaluation_interval": interval}) as prom:
            prom.wait_for_targets_up(len(sims), timeout=3 * args.scrape + 20)
            rules = Rules(hot_samples=args.hot_samples, scrape_interval_seconds=args.scrape)
            rem = Remediator(api, PromClient(prom.url), Configuration(rules=rules, max_nodes_out=len(names) + 1,
                                                                   degraded_faults=frozenset(), drain_timeout_seconds=30,
                                                                   interval_seconds=args.interval,
                                                                   # only these nodes have exporters
                                                                   telemetry_node_selector={"matchExpressions": [{
                                                                       "key": "kubernetes.io/hostname", "operator": "In",
                                                                       "values": names}]}))
            stop = threading.Event()

            def loop() -> None:
                while not stop.is_set():
                    rem.step()
                    stop.wait(args.interval)

            def watch() -> None:
                while not stop.is_set():
                    for n in list_nodes(api, "gpufleet.io/simulated=true"):
                        nm = nodeutil.name(n)
                        if nm in sims and nm not in seen_taint and nodeutil.taint(n, SWAP_TAINT) is not None:
                            seen_taint[nm] = time.time()
                    stop.wait(0.2)

            threads = [threading.Thread(target=loop, daemon=True), threading.Thread(target=watch, daemon=True)]
            for t in threads:
                t.start()
            time.sleep(2 * args.scrape)
            heated: dict[str, float] = {}
            for n in names:
                time.sleep(rng.uniform(0, args.scrape + args.interval))
                sims[n].set_temperature(rng.randrange(8), 88)
                heated[n] = time.time()
            with contextlib.suppress(PollTimeout):  # the nodes not tainted by then are reported as such
                poll_until(lambda: len(rem.latencies) >= len(names), what="every hot node tainted",
                           timeout=60 + args.hot_samples * args.scrape, interval=0.5)
            time.sleep(1)
            stop.set()
            for t in threads:
                t.join(10)
            rem.wait()
            rem.close()
            print(f"scrape {args.scrape:g}s, controller step {args.interval:g}s, {args.hot_samples} hot samples; "
                  f"seconds from hot sample number {args.hot_samples} to the node tainted:")
            print(f"{'node':18} {'heat->taint':>11} {'Nth sample->taint':>18}")
            lat = []
            for n in names:
                if n not in rem.latencies:
                    print(f"{n:18} not tainted")
                    continue
                lat.append(rem.latencies[n])
                print(f"{n:18} {seen_taint.get(n, float('nan')) - heated[n]:11.1f} {rem.latencies[n]:18.1f}")
            if lat:
                print(f"p50 {statistics.median(lat):.1f}s  max {max(lat):.1f}s  (target <= 15 s: "
                      f"{'met' if max(lat) <= 15 else 'NOT met'})")
    finally:
        for s in sims.values():
            s.stop()
        for n in names:
            try:
                swapper.return_node(api, n, checks=None, clear_lemon=True)  # simulated; repeated bench runs make lemons
            except Exception:  # noqa: BLE001 - not out
                pass
            try:  # the bench's swap requests are not records anyone needs
                api.delete("v1", "configmaps", swapper.request_name(n), "gpufleet-system")
            except KubeError:
                pass
        api.close()
        if not args.cluster and not args.keep:
            local.down(name, purge=True)


if __name__ == "__main__":
    main()
