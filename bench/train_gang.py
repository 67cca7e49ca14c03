"""Benchmark training placement on the local cluster: gang start per gang mode, and node replacement.

1. **Gang start.** A 16-node gang (the whole local fleet, 16 x 8 GPUs) is
   submitted ``--runs`` times in each gang mode, one after the other in
   one run of this script: ``kueue`` (Kueue admits the gang by quota and
   topology, then unsuspends the Job), ``native`` (no Kueue: Kubernetes'
   own gang, the ``scheduling.k8s.io`` Workload version the cluster serves,
   binds all pods at once) and ``both``. Measured: seconds from the create
   call of the Job to the last of its pods bound to a node
   (``spec.nodeName``), polled every 50 ms. ``--topology none``: no
   placement constraint, so the modes differ only in who admits and binds.
2. **Node replacement.** A 3-node gang required in one rack (4 nodes per
   rack: one spare) runs; one of its nodes gets gpufleet's degraded taint
   as node health applies it (:func:`gpufleet.ops.swap.degrade`: taint, then
   the training pod there evicted). Measured: seconds from the taint to the
   gang running again, its new pod Running on the rack's spare node.

Run: ``.venv/bin/python bench/train_gang.py [--cluster NAME] [--runs 3]``.
Uses local cluster ``train-bench`` (16 nodes, stopped at the end unless
``--keep``), or ``--cluster`` an existing one (left running). The kueue
role's queues of the ``local`` inventory are applied first, as ``pulumi up``
would.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import yaml

from gpufleet.kube import Conflict, Kube, NotFound
from gpufleet_workshop.local import cluster as local
from gpufleet.ops import swap as swapper
from gpufleet_workshop.sim.flip import QUEUE_KINDS
from gpufleet_admin.training import gang as native
from gpufleet_admin.training.render import build_context, render_context
from gpufleet_admin.training.submit import create_objects
from gpufleet.wait import poll_until
from roles.kueue.manifests import objects as kueue_objects
from roles.registry import load, node_specs

NS = "team-pretrain"


def pods(api: Kube, name: str) -> list[dict]:
    return api.list("v1", "pods", NS, labelSelector=f"gpufleet.io/job={name}")["items"]


def until(what: str, check, timeout: float, poll: float = 0.05):
    return poll_until(check, what=what, timeout=timeout, interval=poll)


def delete(api: Kube, name: str) -> None:
    for api_version, plural, propagation in (("batch/v1", "jobs", "Background"), ("v1", "services", None)):
        try:
            api.delete(api_version, plural, name, NS, propagation=propagation)
        except NotFound:
            pass
    until(f"pods of {name} gone", lambda: not pods(api, name), 120, poll=0.5)


def objects(inv, name: str, nodes: int, gang_mode: str, gang_api, **placement) -> list[dict]:
    ctx = build_context(inv, "job", name, nodes, queue=f"{NS}/pretrain", gang=gang_mode,
                        gang_api=gang_api if gang_mode != "kueue" else None, **placement)
    return [d for d in yaml.safe_load_all(render_context(ctx)) if d]


def gang_start(api, inv, gang_mode: str, gang_api, nodes: int) -> float:
    """Seconds from creating a ``nodes``-node gang to its last pod bound."""
    name = f"bench-{gang_mode}-{uuid.uuid4().hex[:4]}"
    objs = objects(inv, name, nodes, gang_mode, gang_api, topology="none")
    start = time.monotonic()
    create_objects(api, objs)
    until(f"{name}: {nodes} pods bound",
          lambda: (ps := pods(api, name)) and len(ps) == nodes and all(p["spec"].get("nodeName") for p in ps), 300)
    took = time.monotonic() - start
    delete(api, name)
    return took


def replacement(api, inv) -> float:
    """Seconds from the degraded taint on a node of a running 3-node rack gang to the gang running again."""
    name = f"bench-replace-{uuid.uuid4().hex[:4]}"
    create_objects(api, objects(inv, name, 3, "kueue", None, topology="rack", topology_mode="required"))
    running = lambda: [p for p in pods(api, name) if p["status"].get("phase") == "Running"  # noqa: E731
                       and not p["metadata"].get("deletionTimestamp")]
    first = until(f"{name} running", lambda: len(ps := running()) == 3 and ps, 120, poll=0.2)
    hot = sorted(p["spec"]["nodeName"] for p in first)[0]
    try:
        start = time.monotonic()
        swapper.degrade(api, hot, "gpu_temp", "bench/train_gang.py: GPU 3 at 91 C")
        until(f"{name} running again off {hot}", lambda: len(ps := running()) == 3 and hot not in {
            p["spec"]["nodeName"] for p in ps}, 180)
        return time.monotonic() - start
    finally:
        delete(api, name)
        swapper.return_node(api, hot, checks=None)  # simulated node: nothing to check


def main() -> None:
    """Run the benchmark (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", help="an existing local cluster (left running)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster this script starts running")
    ap.add_argument("--runs", type=int, default=3, help="gang starts per mode, and replacements")
    args = ap.parse_args()
    name = args.cluster or "train-bench"
    inv = load("local")
    c = local.get(name) if args.cluster else local.up(name, specs=node_specs("local", 16), timeout=300,
                                                       fresh=not local.main_pids(name))
    api = Kube.from_kubeconfig(c.kubeconfig, user_agent="gpufleet-bench")
    try:
        for obj in kueue_objects(inv):  # created when absent, as the tests do; left as they are otherwise
            if obj["kind"] in QUEUE_KINDS:
                try:
                    api.create_object(obj)
                except Conflict:
                    pass
        until("ClusterQueues active", lambda: all(any(
            cond["type"] == "Active" and cond["status"] == "True"
            for cond in (api.get("kueue.x-k8s.io/v1beta2", "clusterqueues", q.name).get("status") or {})
            .get("conditions") or [])
            for q in inv.role("kueue").kueue_cluster_queues), 60, poll=0.5)
        shape = native.choose(native.discover(api))
        nodes = len(inv.hosts)
        print(f"{nodes}-node gang ({nodes * 8} GPUs), native gang API scheduling.k8s.io/{shape.version} "
              f"(Kubernetes {shape.kubernetes}); seconds from create to all pods bound, {args.runs} runs per mode:")
        times: dict[str, list[float]] = {m: [] for m in ("kueue", "native", "both")}
        for _ in range(args.runs):  # interleaved, so a slow moment of the machine hits every mode alike
            for mode in times:
                times[mode].append(gang_start(api, inv, mode, shape, nodes))
        print(f"{'mode':8} {'median':>8} {'min':>8} {'max':>8}   runs")
        for mode, ts in times.items():
            print(f"{mode:8} {statistics.median(ts):8.2f} {min(ts):8.2f} {max(ts):8.2f}   "
                  + " ".join(f"{t:.2f}" for t in ts))
        rep = [replacement(api, inv) for _ in range(args.runs)]
        print(f"health taint to the gang running again on a replacement node (3-node gang, rack required): "
              f"median {statistics.median(rep):.2f} s, max {max(rep):.2f} s ("
              + ", ".join(f"{t:.2f}" for t in rep) + ")")
    finally:
        api.close()
        if not args.cluster and not args.keep:
            local.down(name, purge=True)


if __name__ == "__main__":
    main()
