"""``invoke status``: the fleet on one screen.

What it shows, and where each figure comes from (all from the API server,
read once):

* GPUs: total (``status.allocatable`` of in-cluster nodes, virtual nodes
  excluded), schedulable for training and for inference (the one node
  classifier, :mod:`gpufleet.fleet.classify`, as quota sync and the taint
  controller count them), held by pods Kueue does not manage (subtracted
  from quota, :mod:`gpufleet.fleet.capacity`), held by training, held by
  inference in the cluster and outside (pods on virtual nodes, label
  ``type=virtual-kubelet``), held by other pods, and free. A pod holds
  the GPUs it requests while bound and not finished.
* Per ClusterQueue and flavor: the nominal quota in the cluster, its
  share of the real schedulable capacity (what a resync would set), GPUs
  reserved by admitted workloads; a quota above its share is flagged stale.
* Nodes out (of training capacity) and why (swap/degraded taints, any
  taint training pods do not tolerate, cordon, NotReady, GPU allocatable
  below capacity, lemon), and whether inference may still use them.
* Virtual nodes and whether they carry ``gpufleet.io/cluster-has-free-gpus``.
* What outside capacity costs, per virtual node (pool): GPUs of its pods
  Running (mirrored from the provider), its price per GPU-hour (the node's
  ``gpufleet.io/price-per-gpu-hour``, which its virtual kubelet writes
  from the inventory; USD), and the burn rate, GPUs x price per hour. With
  a Prometheus URL, also the GPU-seconds and cost the virtual kubelets
  counted (``gpufleet_flip_external_gpu_{seconds,cost}_total``,
  :mod:`gpufleet.virtual_kubelet.ledger`): since each of them started, as their
  counters restart with the process; without one, no totals are shown.
* Node health's circuit breaker (:mod:`gpufleet.node_health.breaker`): GPU nodes
  out of service (the same classifier) against
  ``node_health_max_unhealthy_share``, whether node health may take one
  more out, and the state node health last wrote to its ConfigMap (open
  since when, the nodes it holds, a person's resume).
* Per topology domain (each level of the inventory's fabric but the
  hostname: block, rack): nodes, schedulable GPUs, GPUs held by training,
  free (:mod:`gpufleet.fleet.topology`); and every training gang whose pods
  run in more than one domain of a level. A gang is the pods of one job
  (label ``gpufleet.io/job``, else the Kueue Workload annotation).

Pod classification: training = the highest Kubernetes PriorityClass of the
kueue role, or a Kueue podset/queue label; inference = the lowest
PriorityClass, or label ``gpufleet.io/workload=inference``; other = the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet import topology
from gpufleet.fleet.capacity import pod_gpus as capacity_pod_gpus
from gpufleet.fleet.classify import INFERENCE, TRAINING, default_classes
from gpufleet.fleet.classify import classify as classify_node
from gpufleet.fleet.quota_policy import quotas
from gpufleet_admin.inventory import Inventory
from gpufleet.kube import Kube, KubeError, api_path
from gpufleet.ops.reads import list_nodes
from gpufleet.names import (JOB_LABEL, POOL_LABEL, KUEUE_API, KUEUE_PODSET_LABEL, KUEUE_QUEUE_LABEL,
                            KUEUE_WORKLOAD_ANNOTATION, WORKLOAD_INFERENCE, WORKLOAD_LABEL)

Obj = dict[str, Any]


@dataclass(frozen=True)
class QueueRow:
    """One ClusterQueue x flavor: nominal in the cluster (None: no such queue), share of real capacity, reserved."""

    cluster_queue: str
    flavor: str
    nominal: int | None
    share_of_real: int
    reserved: int

    @property
    def stale(self) -> bool:
        """The quota differs from its share of the real capacity (a resync would change it)."""
        return self.nominal is not None and self.nominal != self.share_of_real


@dataclass(frozen=True)
class VirtualNodeRow:
    """A virtual node: pool label, whether it carries the free-GPUs taint, GPU capacity and GPUs held by pods on it."""

    name: str
    pool: str
    free_gpus_taint: bool
    gpus: int
    used: int


@dataclass(frozen=True)
class OutsideCostRow:
    """What one virtual node's pool costs now, and (from Prometheus) what it has cost.

    Attributes:
        node / pool: the virtual node and its ``gpufleet.io/pool`` label.
        gpus_running: GPUs requested by its pods in phase Running (running at the provider).
        price_per_gpu_hour: the node's price annotation (``currency`` per GPU-hour); None when absent or not a number.
        gpu_seconds / cost: the virtual kubelets' counters for the pool (:func:`gpufleet.virtual_kubelet.ledger.read_totals`);
            None without Prometheus, or when it has no series for the pool.
    """

    node: str
    pool: str
    gpus_running: int
    price_per_gpu_hour: float | None
    currency: str = "USD"
    gpu_seconds: float | None = None
    cost: float | None = None

    @property
    def burn_per_hour(self) -> float | None:
        """Cost per hour at the present rate: ``gpus_running x price_per_gpu_hour``; None without a price."""
        return None if self.price_per_gpu_hour is None else self.gpus_running * self.price_per_gpu_hour


@dataclass(frozen=True)
class BreakerRow:
    """Node health's circuit breaker as ``invoke status`` shows it.

    Attributes:
        out: GPU nodes out of service (not counting for training).
        total: GPU nodes.
        limit: ``node_health_max_unhealthy_share``.
        state: ``open``/``closed`` as node health last wrote it, ``-`` when it never wrote one.
        since: when that state began (RFC 3339), ``""`` if unknown.
        held: nodes it holds.
        resume_until: a person's resume, RFC 3339, ``""`` if none.
    """

    out: int
    total: int
    limit: float
    state: str = "-"
    since: str = ""
    held: tuple[str, ...] = ()
    resume_until: str = ""

    @property
    def room(self) -> int:
        """Nodes node health may still take out before the breaker holds (never below 0)."""
        from gpufleet.node_health.breaker import max_out

        return max(max_out(self.total, self.limit) - self.out, 0)


@dataclass(frozen=True)
class GpuOutRow:
    """One GPU out of service on a DRA node: its device, index, UUID, the taint and who put it there."""

    node: str
    device: str
    index: int | None
    uuid: str | None
    taint: str
    by: str
    lemon: bool


@dataclass
class FleetStatus:
    """The figures :func:`render` shows (see the module docstring). GPUs are counts of ``nvidia.com/gpu``."""

    env: str
    #: how the flip-out moves inference off a node training needs (``taint_controller_flip_mode``).
    flip_mode: str = ""
    gpus_total: int = 0
    gpus_schedulable: int = 0
    gpus_schedulable_inference: int = 0
    unmanaged: int = 0
    training: int = 0
    inference_in_cluster: int = 0
    inference_outside: int = 0
    other: int = 0
    nodes_total: int = 0
    queues: list[QueueRow] = field(default_factory=list)
    nodes_out: list[nodeutil.NodeSummary] = field(default_factory=list)
    #: names of nodes out of training capacity whose GPUs still count for inference (degraded tier).
    inference_ok: set[str] = field(default_factory=set)
    virtual_nodes: list[VirtualNodeRow] = field(default_factory=list)
    #: per virtual node: the outside capacity's burn rate and, with Prometheus, what it cost.
    outside_cost: list[OutsideCostRow] = field(default_factory=list)
    #: where the cost totals came from ("": no Prometheus URL given: none shown).
    prometheus_url: str = ""
    #: why the totals are missing although a URL was given (Prometheus unreachable or in error); "" otherwise.
    prometheus_error: str = ""
    domains: list[topology.DomainRow] = field(default_factory=list)
    gangs: list[topology.GangSpan] = field(default_factory=list)
    #: node health's circuit breaker; None when the node_health role is off.
    breaker: BreakerRow | None = None
    #: GPUs out of service one by one on DRA nodes (device taints), by node then device.
    gpus_out: list[GpuOutRow] = field(default_factory=list)

    @property
    def spanning(self) -> list[topology.GangSpan]:
        """Training gangs whose pods are in more than one domain of some level."""
        levels = {r.level for r in self.domains}
        return [g for g in self.gangs if any(g.spans(lv) for lv in levels)]

    @property
    def free(self) -> int:
        """Schedulable GPUs no in-cluster pod holds (never below 0)."""
        return max(self.gpus_schedulable - self.training - self.inference_in_cluster - self.other, 0)


#: GPUs a pod requests (containers summed; an init container may need more), requests else limits;
#: a fractional count is refused naming the pod (:func:`gpufleet.fleet.capacity.pod_gpus`).
pod_gpus = capacity_pod_gpus


def classify(pod: Obj, training_pc: str, inference_pc: str) -> str:
    """``training``, ``inference`` or ``other`` (module docstring)."""
    labels = pod.get("metadata", {}).get("labels") or {}
    pc = (pod.get("spec") or {}).get("priorityClassName")
    if labels.get(WORKLOAD_LABEL) == WORKLOAD_INFERENCE or pc == inference_pc:
        return "inference"
    if pc == training_pc or KUEUE_PODSET_LABEL in labels or KUEUE_QUEUE_LABEL in labels:
        return "training"
    return "other"


def build(inv: Inventory, nodes: list[Obj], pods: list[Obj], cluster_queues: list[Obj],
          breaker_cm: Obj | None = None, ledger: dict[str, Any] | None = None,
          gpus: dict[str, list[Any]] | None = None, device_rules: list[Obj] | None = None) -> FleetStatus:
    """The :class:`FleetStatus` from objects already read (pure); ``breaker_cm``: node health's breaker ConfigMap;
    ``ledger``: ``{pool: gpufleet.virtual_kubelet.ledger.PoolTotals}`` read from Prometheus (None: not read);
    ``gpus``: node -> its DRA GPUs (:func:`gpufleet.ops.reads.list_gpus`), counted per device;
    ``device_rules``: the DeviceTaintRules (who took a GPU out)."""
    from gpufleet.fleet.capacity import quota_capacity
    from gpufleet.quota_sync.resync import capacity_of, quota_of, reserved_gpus
    from roles.kueue.config import configuration as quota_configuration

    v = inv.role("kueue")
    policy = quota_configuration(inv)  # what quota sync is configured with: the same quotas, the same classifier
    pcs = sorted(v.kueue_priority_classes, key=lambda p: p.value)
    training_pc, inference_pc = pcs[-1].name, pcs[0].name
    classes = default_classes(partial_nodes_train=policy.partial_gpu_nodes_count)
    st = FleetStatus(env=inv.env, flip_mode=inv.role("taint_controller").taint_controller_flip_mode)
    by_name = {nodeutil.name(n): n for n in nodes}
    virtual = {n for n, obj in by_name.items() if nodeutil.is_virtual(obj)}
    used_on: dict[str, int] = {}
    running_on: dict[str, int] = {}
    held: dict[str, tuple[int, int]] = {}
    placements: list[tuple[str, str]] = []
    training_gpus: dict[str, int] = {}
    for n, obj in by_name.items():
        if n in virtual:
            continue
        if not nodeutil.is_fleet_node(obj):
            continue  # a system node (no GPUs, no ResourceFlavor): not part of the GPU fleet
        nc = classify_node(obj, classes, (gpus or {}).get(n))
        if nc.facts.allocatable and not nc.facts.problem:
            training_gpus[n] = nc.gpus_for(TRAINING)
        s = nodeutil.NodeSummary(n, nodeutil.flavor(obj), nc.facts.allocatable or 0, False, nc.reasons[TRAINING],
                                 nodeutil.is_lemon(obj))
        st.nodes_total += 1
        st.gpus_total += s.gpus
        st.gpus_schedulable += nc.gpus_for(TRAINING)
        st.gpus_schedulable_inference += nc.gpus_for(INFERENCE)
        if not s.schedulable and (s.gpus or nodeutil.is_out(obj) or nc.facts.problem):
            st.nodes_out.append(s)
            if nc.counts(INFERENCE):
                st.inference_ok.add(n)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        g = pod_gpus(pod)
        if not g:
            continue
        used_on[node] = used_on.get(node, 0) + g
        kind = classify(pod, training_pc, inference_pc)
        if node in virtual:
            if (pod.get("status") or {}).get("phase") == "Running":
                running_on[node] = running_on.get(node, 0) + g
            if kind == "inference":
                st.inference_outside += g
            continue
        t, o = held.get(node, (0, 0))
        held[node] = (t + g, o) if kind == "training" else (t, o + g)
        if kind == "training":
            st.training += g
            if (gang := gang_of(pod)) is not None:
                placements.append((gang, node))
        elif kind == "inference":
            st.inference_in_cluster += g
        else:
            st.other += g
    for n in sorted(virtual):
        obj = by_name[n]
        st.virtual_nodes.append(VirtualNodeRow(n, nodeutil.labels(obj).get(POOL_LABEL, "-"),
                                               nodeutil.has_free_gpus_taint(obj), nodeutil.gpus(obj), used_on.get(n, 0)))
    st.outside_cost = outside_cost_rows({n: by_name[n] for n in sorted(virtual)}, running_on, ledger)
    capacity = capacity_of(policy, nodes, pods, gpus)
    st.gpus_out = gpus_out_rows(gpus or {}, device_rules or [])
    st.unmanaged = sum(c.unmanaged_gpus for c in capacity.values())
    real = quotas(policy, quota_capacity(capacity))
    cqs = {cq["metadata"]["name"]: cq for cq in cluster_queues}
    for q, flavors in real.items():
        cq = cqs.get(q)
        reserved = reserved_gpus(cq) if cq else {}
        for f, r in flavors.items():
            nominal = quota_of(cq, f)["nominal"] if cq else None
            st.queues.append(QueueRow(q, f, int(nominal) if nominal is not None else None, r["gpu"], reserved.get(f, 0)))
    st.nodes_out.sort(key=lambda s: s.name)
    levels = [(lv.name, lv.label) for lv in inv.topology_levels() if lv.name != "hostname"]
    st.domains = topology.domain_rows((by_name[n] for n in sorted(by_name)), held, levels, training_gpus)
    st.gangs = topology.gang_spans(placements, {n: nodeutil.labels(o) for n, o in by_name.items()}, levels)
    st.breaker = breaker_row(inv, by_name, classes, breaker_cm)
    return st


def gpus_out_rows(gpus: dict[str, list[Any]], device_rules: list[Obj]) -> list[GpuOutRow]:
    """One row per DRA GPU with a NoSchedule or NoExecute taint (pure), by node then index."""
    from gpufleet.names import ANN_GPU_LEMON, ANN_GPU_REMOVED_BY

    by_name = {(r.get("metadata") or {}).get("name", ""): r for r in device_rules}
    rows = []
    for node in sorted(gpus):
        for g in gpus[node]:
            blocking = g.blocking()
            if not blocking:
                continue
            taints, by, lemon = [], [], False
            for t_, src in blocking:
                taints.append(f"{t_.get('key')}={t_.get('value', '')}:{t_.get('effect')}")
                if src.startswith("rule:"):
                    ann = ((by_name.get(src[5:]) or {}).get("metadata") or {}).get("annotations") or {}
                    by.append(ann.get(ANN_GPU_REMOVED_BY) or src)
                    lemon = lemon or bool(ann.get(ANN_GPU_LEMON))
                else:
                    by.append("driver")
            rows.append(GpuOutRow(node, g.device, g.index, g.uuid, ", ".join(taints), ", ".join(dict.fromkeys(by)), lemon))
    return rows


def outside_cost_rows(virtual: dict[str, Obj], running_on: dict[str, int],
                      ledger: dict[str, Any] | None) -> list[OutsideCostRow]:
    """One :class:`OutsideCostRow` per virtual node (pure): ``running_on`` ``{node: GPUs of Running pods}``,
    ``ledger`` ``{pool: PoolTotals}`` (None: no totals)."""
    from gpufleet.names import POOL_LABEL, PRICE_ANNOTATION
    from gpufleet.virtual_kubelet.ledger import CURRENCY

    rows = []
    for n, obj in virtual.items():
        pool = nodeutil.labels(obj).get(POOL_LABEL, "-")
        try:
            price: float | None = float(((obj.get("metadata") or {}).get("annotations") or {})[PRICE_ANNOTATION])
        except (KeyError, TypeError, ValueError):
            price = None
        totals = (ledger or {}).get(pool)
        rows.append(OutsideCostRow(n, pool, running_on.get(n, 0), price, totals.currency if totals else CURRENCY,
                                   totals.gpu_seconds if totals else None, totals.cost if totals else None))
    return rows


def breaker_row(inv: Inventory, nodes: dict[str, Obj], classes: Any, cm: Obj | None) -> BreakerRow | None:
    """Node health's circuit breaker from the nodes and its ConfigMap (pure); None when node_health is off."""
    from gpufleet.node_health import breaker

    if not inv.enabled("node_health"):
        return None
    share = breaker.fleet_share(nodes, classes)
    data = (cm or {}).get("data") or {}
    until = data.get(breaker.RESUME_UNTIL, "")
    return BreakerRow(len(share.out), share.total, inv.role("node_health").node_health_max_unhealthy_share,
                      data.get(breaker.STATE, "-"), data.get(breaker.SINCE, ""),
                      tuple(n for n in data.get(breaker.HELD, "").split(",") if n), until)


def gang_of(pod: Obj) -> str | None:
    """``namespace/job`` of a training pod: label ``gpufleet.io/job``, else its Kueue Workload; None if neither."""
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(JOB_LABEL) or (meta.get("annotations") or {}).get(KUEUE_WORKLOAD_ANNOTATION)
    return f"{meta.get('namespace', '')}/{name}" if name else None


def gather(kube: Kube, inv: Inventory, prometheus_url: str | None = None) -> FleetStatus:
    """Read nodes, pods and ClusterQueues once and :func:`build` the status; with ``prometheus_url``, also the
    virtual kubelets' cost counters (Prometheus unreachable: the screen says so and shows no totals)."""
    nodes = list_nodes(kube)
    pods = kube.list_all(api_path("v1", "pods"), field_selector="status.phase!=Succeeded,status.phase!=Failed")[0]
    try:
        cqs = kube.list_all(api_path(KUEUE_API, "clusterqueues"))[0]
    except KubeError:  # Kueue not installed: the screen still shows nodes and pods
        cqs = []
    cm = None
    if inv.enabled("node_health"):
        from gpufleet.node_health import breaker

        try:
            cm = breaker.read(kube, inv.role("node_health").node_health_namespace)
        except KubeError:  # not allowed to read it: the screen still shows the share
            cm = None
    ledger, error = None, ""
    if prometheus_url:
        from gpufleet.prom.client import PromClient, PromError
        from gpufleet.virtual_kubelet.ledger import read_totals

        prom = PromClient(prometheus_url)
        try:
            ledger = read_totals(prom)
        except PromError as exc:
            error = str(exc)
        finally:
            prom.close()
    from gpufleet.ops.gpus import rules as device_rules
    from gpufleet.ops.reads import list_gpus

    gpus = list_gpus(kube)
    st = build(inv, nodes, pods, cqs, cm, ledger, gpus, device_rules(kube) if gpus else [])
    st.prometheus_url, st.prometheus_error = prometheus_url or "", error
    return st


def render(st: FleetStatus) -> Group:
    """The status screen as rich renderables (one Group)."""
    gpus = Table(title=f"GPUs — env {st.env}, {st.nodes_total} nodes", show_header=True)
    for col in ("total", "schedulable", "schedulable (inference)", "held outside Kueue", "training",
                "inference (cluster)", "inference (outside)", "other", "free"):
        gpus.add_column(col, justify="right")
    gpus.add_row(*(str(x) for x in (st.gpus_total, st.gpus_schedulable, st.gpus_schedulable_inference, st.unmanaged,
                                    st.training, st.inference_in_cluster, st.inference_outside, st.other, st.free)))
    queues = Table(title="ClusterQueue quota vs real capacity (GPUs)")
    for col, j in (("queue", "left"), ("flavor", "left"), ("nominal quota", "right"), ("share of real", "right"),
                   ("admitted", "right"), ("", "left")):
        queues.add_column(col, justify=j)
    for r in st.queues:
        flag = Text("missing in cluster", style="red") if r.nominal is None else (
            Text("stale: run quota.resync", style="yellow") if r.stale else Text("ok", style="green"))
        over = Text(str(r.reserved), style="red") if r.nominal is not None and r.reserved > r.share_of_real else Text(str(r.reserved))
        queues.add_row(r.cluster_queue, r.flavor, "-" if r.nominal is None else str(r.nominal), str(r.share_of_real), over, flag)
    out = Table(title=f"Nodes out ({len(st.nodes_out)})")
    for col in ("node", "flavor", "GPUs", "why", "inference", "lemon"):
        out.add_column(col)
    for s in st.nodes_out:
        out.add_row(s.name, s.flavor or "-", str(s.gpus), "; ".join(s.reasons),
                    "still used" if s.name in st.inference_ok else "out", "LEMON" if s.lemon else "")
    if not st.nodes_out:
        out.add_row("(none)", "", "", "", "", "")
    virt = Table(title=f"Virtual nodes (outside capacity) — flip-out mode: {st.flip_mode or '-'}")
    for col in ("node", "pool", "GPUs", "in use", "free-GPUs taint"):
        virt.add_column(col)
    for r in st.virtual_nodes:
        virt.add_row(r.name, r.pool, str(r.gpus), str(r.used),
                     Text("tainted: inference stays in", style="cyan") if r.free_gpus_taint else Text("untainted: inference may flip out", style="magenta"))
    if not st.virtual_nodes:
        virt.add_row("(none)", "", "", "", "")
    return Group(gpus, queues, out, *_gpus_out_tables(st), virt, _cost_table(st), *_breaker_tables(st),
                 *_topology_tables(st))


def _gpus_out_tables(st: FleetStatus) -> list[Table]:
    """GPUs out one by one (DRA nodes), per node; no table on a fleet without any."""
    if not st.gpus_out:
        return []
    per_node: dict[str, int] = {}
    for r in st.gpus_out:
        per_node[r.node] = per_node.get(r.node, 0) + 1
    t = Table(title=f"GPUs out ({len(st.gpus_out)} on {len(per_node)} nodes; the nodes and their other GPUs in service)")
    for col in ("node", "out", "GPU", "index", "uuid", "taint", "by", "lemon"):
        t.add_column(col)
    for r in st.gpus_out:
        t.add_row(r.node, str(per_node[r.node]), r.device, "-" if r.index is None else str(r.index), r.uuid or "-",
                  r.taint, r.by, "LEMON" if r.lemon else "")
    return [t]


def _cost_table(st: FleetStatus) -> Table:
    """Outside capacity: GPUs running, price, burn rate per virtual node; totals only from Prometheus."""
    if not st.prometheus_url:
        since = "totals: give --prometheus-url (the virtual kubelets' counters)"
    elif st.prometheus_error:
        since = f"totals unavailable: {st.prometheus_error}"
    else:
        since = f"totals since each virtual kubelet started, from {st.prometheus_url}"
    t = Table(title="Outside capacity cost", caption=since)
    for col, j in (("node", "left"), ("pool", "left"), ("GPUs running", "right"), ("price / GPU-hour", "right"),
                   ("burn / hour", "right"), ("GPU-seconds", "right"), ("cost", "right")):
        t.add_column(col, justify=j)
    for r in st.outside_cost:
        t.add_row(r.node, r.pool, str(r.gpus_running), _money(r.price_per_gpu_hour, r.currency),
                  _money(r.burn_per_hour, r.currency), "-" if r.gpu_seconds is None else f"{r.gpu_seconds:,.0f}",
                  _money(r.cost, r.currency))
    if not st.outside_cost:
        t.add_row("(none)", "", "", "", "", "", "")
    return t


def _money(amount: float | None, currency: str) -> str:
    """``1,234.56 USD``, or ``-`` for no figure."""
    return "-" if amount is None else f"{amount:,.2f} {currency}"


def _breaker_tables(st: FleetStatus) -> list[Table]:
    """Node health's circuit breaker (none when node_health is off)."""
    b = st.breaker
    if b is None:
        return []
    t = Table(title="Node health circuit breaker")
    for col in ("state", "out of service", "limit", "room", "held", "resume"):
        t.add_column(col)
    share = f"{b.out} of {b.total} GPU nodes" + (f" ({b.out / b.total:.0%})" if b.total else "")
    state = Text(f"OPEN since {b.since}" if b.since else "OPEN", style="red") if b.state == "open" else Text(b.state)
    room = Text(f"{b.room} more node(s)") if b.room else Text("none: new faults are held", style="yellow")
    t.add_row(state, share, f"{b.limit:g}", room, ", ".join(b.held) or "-",
              f"until {b.resume_until} (invoke health.breaker-resume --minutes 0 withdraws it)" if b.resume_until else "-")
    return [t]


def _topology_tables(st: FleetStatus) -> list[Table]:
    """GPUs per topology domain, and gangs across domains (none when the inventory has no levels)."""
    if not st.domains:
        return []
    doms = Table(title="GPUs per topology domain")
    for col, j in (("level", "left"), ("domain", "left"), ("nodes", "right"), ("schedulable", "right"),
                   ("training", "right"), ("free", "right")):
        doms.add_column(col, justify=j)
    for r in st.domains:
        name = Text(r.domain, style="red") if r.domain == topology.UNLABELLED else r.domain
        doms.add_row(r.level, name, str(r.nodes), str(r.schedulable), str(r.training), str(r.free))
    levels = list(dict.fromkeys(r.level for r in st.domains))
    spans = Table(title=f"Training gangs across domains ({len(st.spanning)} of {len(st.gangs)})")
    for col in ("gang", "pods", *levels):
        spans.add_column(col)
    for g in st.spanning:
        cells = [", ".join(f"{d} ({n})" for d, n in sorted(g.domains.get(lv, {}).items())) for lv in levels]
        spans.add_row(g.gang, str(g.pods), *(Text(c, style="yellow") if g.spans(lv) else c
                                             for c, lv in zip(cells, levels)))
    if not st.spanning:
        spans.add_row("(none)", "", *([""] * len(levels)))
    return [doms, spans]
