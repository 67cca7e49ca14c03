"""Keep every ClusterQueue's ``nominalQuota`` equal to its share of the real schedulable capacity.

**Which path, and why.** Kueue v0.17 (``kueue.x-k8s.io/v1beta2``, the
pinned version) has no API that feeds node capacity into quota. Checked in
the pinned module's ``apis/kueue/v1beta2`` and ``pkg/features``:
``nominalQuota`` is a fixed quantity in
``ClusterQueue.spec.resourceGroups[].flavors[].resources[]``; a
ResourceFlavor carries only ``nodeLabels``, ``nodeTaints``, ``tolerations``
and ``topologyName``; there is no "dynamic quota" or "flavor capacity"
feature gate. ProvisioningRequest admission checks ask a cluster
autoscaler to *add* nodes for one workload; they never lower quota when
nodes fail. Topology Aware Scheduling does look at nodes' free capacity at
admission, but only for flavors with a ``topologyName`` and a Topology
object, and it leaves the quota (what queues, borrowing and preemption
reason with) unchanged. So gpufleet rewrites ``nominalQuota``: capacity
per flavor from the Nodes (:mod:`gpufleet.fleet.capacity`: GPUs, and the
cores and bytes those nodes can schedule, allocatable minus what pods Kueue
does not manage request, DaemonSets and system pods included), shared over the
ClusterQueues by :func:`gpufleet.fleet.quota_policy.quotas` (the same function
the kueue role declares them with at ``pulumi up``: shares, pins, ``kueue_reserve_gpus``,
largest-remainder rounding), written back only where it differs.

**Applying.** Each ClusterQueue is read, its resource groups are rebuilt
with only the ``nominalQuota`` values changed (borrowing/lending limits,
other resources and flavors untouched), and written with a JSON merge
patch carrying the read ``metadata.resourceVersion``: a concurrent writer
(``pulumi up``, a person with kubectl, a second quota sync) makes it fail
with 409, and it is re-read, recomputed and retried.

**When quota drops below what is admitted.** A resync never evicts: Kueue
does not preempt or evict admitted workloads when ``nominalQuota`` shrinks.
The queue's usage above its new nominal counts as borrowed from the
cohort, so (1) its pending workloads wait until usage falls below quota,
and (2) with the role's ``reclaimWithinCohort: Any``, another queue of the
cohort that needs its own nominal quota back may have Kueue preempt the
over-quota queue's workloads: Kueue's fair sharing, not an action of the
resync. Each such queue and flavor is reported as :class:`Drift` (metric
``gpufleet_quota_drift_gpus``, a Warning Event ``QuotaBelowUsage`` on the
ClusterQueue), and every pending gang whose GPUs exceed what its queue can
ever get now (nominal plus what it may borrow from the cohort) as
:class:`GangReport` (Warning Event ``GangCannotFit`` on the Workload).
Admitted gangs whose pods sat on nodes that left are Kueue's and the job's
business (waitForPodsReady requeues them).

**Zero capacity.** A flavor with no schedulable GPU would get quota 0 in
every queue. That is either true (every node of the flavor out) or a
mistake (wrong cluster, nodes not labelled ``gpufleet.io/flavor``), so
:func:`apply` refuses unless ``allow_zero``; the message lists the flavor's
nodes and why they are out.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from decimal import Decimal
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.kube import Kube, NotFound, api_path
from gpufleet.kube.events import record_event
from gpufleet.kube.quantity import canonical, parse_quantity, whole_gpus
from gpufleet.kube.retry import update_with_retry
from gpufleet.ops.reads import OpsError, list_nodes
from gpufleet.names import GPU_RESOURCE, KUEUE_API
from gpufleet.fleet.capacity import FlavorNodes, flavor_capacity, pod_spec_gpus, quota_capacity
from gpufleet.fleet.classify import default_classes
from gpufleet.fleet.quota_policy import quotas
from gpufleet.quota_sync.config import Configuration

log = logging.getLogger(__name__)

Obj = dict[str, Any]
#: quota resource name in :func:`gpufleet.fleet.quota_policy.quotas` -> Kubernetes resource name.
RESOURCES = {"gpu": GPU_RESOURCE, "cpu": "cpu", "memory": "memory"}
CQ_PATH = f"/apis/{KUEUE_API}/clusterqueues"
WL_PATH = f"/apis/{KUEUE_API}/workloads"
LQ_PATH = f"/apis/{KUEUE_API}/localqueues"
EVENT_COMPONENT = "gpufleet-quota-sync"


@dataclass(frozen=True)
class QuotaChange:
    """One nominalQuota to rewrite: queue, flavor, Kubernetes resource, value before (None: absent) and after."""

    cluster_queue: str
    flavor: str
    resource: str
    before: Decimal | None
    after: int


@dataclass(frozen=True)
class Drift:
    """A queue holding more GPUs of a flavor than its (new) nominal quota.

    Attributes:
        cluster_queue, flavor: where.
        reserved: GPUs reserved by admitted workloads (``status.flavorsReservation``).
        nominal: the new nominal quota.
        workloads: admitted workloads holding that flavor (``namespace/name``).
    """

    cluster_queue: str
    flavor: str
    reserved: int
    nominal: int
    workloads: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        """GPUs above quota."""
        return self.reserved - self.nominal


@dataclass(frozen=True)
class GangReport:
    """A pending workload that can no longer be admitted: it wants more GPUs than its queue can get now."""

    workload: str
    cluster_queue: str
    gpus: int
    max_gpus: int


@dataclass
class ResyncPlan:
    """Everything a resync found and would change.

    Attributes:
        env: the inventory environment the configuration came from ("" when not known: the controller).
        capacity: flavor -> :class:`FlavorNodes` (cluster's nodes now).
        reserve: the configuration's ``reserve_gpus``.
        desired: ``{queue: {flavor: {"gpu", "cpu", "memory"}}}`` from the kueue role.
        current: queue -> the ClusterQueue object read (queues of the inventory only).
        changes: nominalQuota values that differ.
        missing_queues: inventory queues with no ClusterQueue in the cluster.
        missing_flavors: queue -> flavors the inventory gives it but its spec lacks (not added: ``pulumi up``).
        zero_flavors: flavors with no GPU to share (after the reserve).
        drift: queues over their new quota.
        cannot_fit: pending gangs that can no longer be admitted.
        seconds: time to compute.
    """

    env: str
    capacity: dict[str, FlavorNodes]
    reserve: int
    desired: dict[str, dict[str, dict[str, int]]]
    current: dict[str, Obj]
    changes: list[QuotaChange] = field(default_factory=list)
    missing_queues: list[str] = field(default_factory=list)
    missing_flavors: dict[str, list[str]] = field(default_factory=dict)
    zero_flavors: list[str] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    cannot_fit: list[GangReport] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class ApplyResult:
    """What :func:`apply` wrote: queues patched, 409 retries, seconds."""

    patched: list[str] = field(default_factory=list)
    conflicts: int = 0
    seconds: float = 0.0


# --------------------------------------------------------------------------- pure parts


def _q(value: Any) -> Decimal | None:
    """A quantity as a Decimal, None for None."""
    return None if value is None else parse_quantity(value)


def rebuild_resource_groups(cq: Obj, desired: dict[str, dict[str, int]]) -> tuple[list[Obj], list[QuotaChange], list[str]]:
    """A ClusterQueue's resource groups with nominalQuota set from ``desired`` (pure).

    Args:
        cq: the ClusterQueue object.
        desired: ``{flavor: {"gpu": n, "cpu": cores, "memory": bytes}}``.

    Returns:
        ``(new resourceGroups, changes, desired flavors missing from the spec)``.
        Only ``nominalQuota`` of resources present in the spec changes;
        everything else is copied as is.
    """
    name = cq["metadata"]["name"]
    groups = copy.deepcopy((cq.get("spec") or {}).get("resourceGroups") or [])
    changes: list[QuotaChange] = []
    seen: set[str] = set()
    for group in groups:
        for fq in group.get("flavors") or []:
            flavor = fq.get("name")
            if flavor not in desired:
                continue
            seen.add(flavor)
            for res in fq.get("resources") or []:
                key = next((k for k, v in RESOURCES.items() if v == res.get("name")), None)
                if key is None or key not in desired[flavor]:
                    continue
                want = int(desired[flavor][key])
                have = _q(res.get("nominalQuota"))
                if have is None or have != want:
                    changes.append(QuotaChange(name, flavor, res["name"], have, want))
                    res["nominalQuota"] = canonical(want, binary=res["name"] == "memory")
    return groups, changes, sorted(set(desired) - seen)


def quota_of(cq: Obj, flavor: str, resource: str = GPU_RESOURCE) -> dict[str, Decimal | None]:
    """nominal, borrowing and lending limits (Decimal or None) of ``resource`` for ``flavor`` in a ClusterQueue."""
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for fq in group.get("flavors") or []:
            if fq.get("name") == flavor:
                for res in fq.get("resources") or []:
                    if res.get("name") == resource:
                        return {"nominal": _q(res.get("nominalQuota")), "borrowing": _q(res.get("borrowingLimit")),
                                "lending": _q(res.get("lendingLimit"))}
    return {"nominal": None, "borrowing": None, "lending": None}


def reserved_gpus(cq: Obj) -> dict[str, int]:
    """flavor -> GPUs reserved by admitted workloads (``status.flavorsReservation``; 0 when absent).

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional total (naming the ClusterQueue and flavor).
    """
    out: dict[str, int] = {}
    name = (cq.get("metadata") or {}).get("name", "?")
    for fu in (cq.get("status") or {}).get("flavorsReservation") or []:
        for res in fu.get("resources") or []:
            if res.get("name") == GPU_RESOURCE:
                out[fu["name"]] = whole_gpus(res.get("total", 0),
                                             f"ClusterQueue {name} status.flavorsReservation[{fu['name']}]")
    return out


def workload_gpus(wl: Obj) -> int:
    """GPUs a Workload needs in total: sum over podSets of ``count`` x GPUs per pod (requests, else limits).

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional GPU count (naming the Workload and podSet).
    """
    total = 0
    meta = wl.get("metadata") or {}
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        spec = (ps.get("template") or {}).get("spec") or {}
        where = f"Workload {meta.get('namespace', '')}/{meta.get('name', '?')} podSet {ps.get('name', '?')}"
        total += int(ps.get("count", 1)) * pod_spec_gpus(spec, where)
    return total


def _conds(obj: Obj) -> dict[str, str]:
    """Condition type -> status of an object."""
    return {c.get("type"): c.get("status") for c in (obj.get("status") or {}).get("conditions") or []}


def is_admitted(wl: Obj) -> bool:
    """QuotaReserved (or Admitted) and not Finished."""
    c = _conds(wl)
    return (c.get("QuotaReserved") == "True" or c.get("Admitted") == "True") and c.get("Finished") != "True"


def is_pending(wl: Obj) -> bool:
    """Neither holding quota nor finished."""
    c = _conds(wl)
    return c.get("QuotaReserved") != "True" and c.get("Admitted") != "True" and c.get("Finished") != "True"


def max_admittable(cq_name: str, flavor: str, queues: dict[str, Obj], nominal: dict[str, dict[str, int]]) -> int:
    """The most GPUs of ``flavor`` queue ``cq_name`` can hold with the new quotas (pure).

    Its nominal quota plus what it may borrow: the other queues of its
    cohort's nominal quotas of the flavor (minus their lending limits'
    complement, when set), capped by its ``borrowingLimit``. Queues read
    from the cluster that the inventory does not manage count with their
    current nominal quota.
    """
    cq = queues[cq_name]
    own = nominal.get(cq_name, {}).get(flavor)
    limits = quota_of(cq, flavor)
    if own is None:
        own = int(limits["nominal"] or 0)
    cohort = (cq.get("spec") or {}).get("cohortName")
    if not cohort:
        return own
    lendable = 0
    for other, obj in queues.items():
        if other == cq_name or (obj.get("spec") or {}).get("cohortName") != cohort:
            continue
        q = quota_of(obj, flavor)
        n = nominal.get(other, {}).get(flavor, int(q["nominal"] or 0))
        lendable += min(n, int(q["lending"])) if q["lending"] is not None else n
    if limits["borrowing"] is not None:
        lendable = min(lendable, int(limits["borrowing"]))
    return own + lendable


def queue_flavors(cq: Obj) -> list[str]:
    """Flavors of the resource group covering GPUs, in order."""
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        if GPU_RESOURCE in (group.get("coveredResources") or []):
            return [f["name"] for f in group.get("flavors") or []]
    return []


def find_drift(queues: dict[str, Obj], nominal: dict[str, dict[str, int]], workloads: list[Obj]) -> list[Drift]:
    """Queues whose reserved GPUs exceed their new nominal quota, per flavor (pure)."""
    holders: dict[tuple[str, str], list[str]] = {}
    for wl in workloads:
        adm = (wl.get("status") or {}).get("admission") or {}
        if not is_admitted(wl) or not adm.get("clusterQueue"):
            continue
        for psa in adm.get("podSetAssignments") or []:
            flavor = (psa.get("flavors") or {}).get(GPU_RESOURCE)
            if flavor:
                key = (adm["clusterQueue"], flavor)
                name = f"{wl['metadata'].get('namespace')}/{wl['metadata']['name']}"
                if name not in holders.setdefault(key, []):
                    holders[key].append(name)
    out = []
    for cq_name, flavors in sorted(nominal.items()):
        if cq_name not in queues:
            continue
        for flavor, reserved in sorted(reserved_gpus(queues[cq_name]).items()):
            if flavor in flavors and reserved > flavors[flavor]:
                out.append(Drift(cq_name, flavor, reserved, flavors[flavor], tuple(holders.get((cq_name, flavor), []))))
    return out


def find_cannot_fit(queues: dict[str, Obj], nominal: dict[str, dict[str, int]], workloads: list[Obj],
                    local_queues: dict[tuple[str, str], str]) -> list[GangReport]:
    """Pending workloads wanting more GPUs than their queue can hold on any of its flavors (pure).

    Args:
        queues: ClusterQueue name -> object (all queues of the cluster, for the cohort).
        nominal: queue -> flavor -> new GPU nominal quota.
        workloads: Workload objects.
        local_queues: ``(namespace, LocalQueue)`` -> ClusterQueue.
    """
    out = []
    for wl in workloads:
        if not is_pending(wl):
            continue
        ns = wl["metadata"].get("namespace", "")
        cq = local_queues.get((ns, (wl.get("spec") or {}).get("queueName", "")))
        if cq is None or cq not in nominal or cq not in queues:
            continue
        need = workload_gpus(wl)
        if need == 0:
            continue
        best = max((max_admittable(cq, f, queues, nominal) for f in queue_flavors(queues[cq])), default=0)
        if need > best:
            out.append(GangReport(f"{ns}/{wl['metadata']['name']}", cq, need, best))
    return out


def gpu_nominal(desired: dict[str, dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """``{queue: {flavor: gpus}}`` from the kueue role's quota map."""
    return {q: {f: r["gpu"] for f, r in fl.items()} for q, fl in desired.items()}


def capacity_of(config: Configuration, nodes: list[Obj], pods: list[Obj] | None = None,
                devices: Mapping[str, Sequence[Any]] | None = None) -> dict[str, FlavorNodes]:
    """Training capacity per flavor as the configuration asks for it (pure).

    The node classifier with ``partial_gpu_nodes_count``; the counted nodes'
    allocatable GPUs, cores and bytes, less what pods Kueue does not manage hold
    and request there when ``subtract_unmanaged`` and ``pods`` are given (GPU
    holders below ``reclaim_below_priority`` are the flip-out's to take back, not
    subtracted: :mod:`gpufleet.fleet.capacity`). ``devices``: node -> its DRA
    GPUs, counted per device (:mod:`gpufleet.fleet.devices`). quota sync and
    ``invoke status`` both call this.
    """
    classes = default_classes(partial_nodes_train=config.partial_gpu_nodes_count)
    return flavor_capacity(nodes, config.flavors, pods=pods if config.subtract_unmanaged else None,
                           classes=classes, reclaim_below=config.reclaim_below_priority, devices=devices)


def plan_from(config: Configuration, nodes: list[Obj], cluster_queues: list[Obj], workloads: list[Obj],
              local_queues: list[Obj], pods: list[Obj] | None = None, *, env: str = "",
              devices: Mapping[str, Sequence[Any]] | None = None) -> ResyncPlan:
    """The resync plan from objects already read (pure: no API calls).

    Args:
        config: the quota policy and the capacity settings (:mod:`gpufleet.quota_sync.config`).
        pods: the cluster's bound, non-terminal pods (what unmanaged pods hold and
            request is subtracted, :func:`capacity_of`); None: nothing is subtracted.
        env: the inventory environment ``config`` was built from, for the report ("": not known).
        devices: node -> its GPUs allocated through DRA (:func:`gpufleet.fleet.devices.gpus_by_node`).

    Raises:
        OpsError: none of the configuration's ClusterQueues exists (wrong cluster or kueue role not applied).
        gpufleet.kube.quantity.GpuCountError: a pod or Workload with a fractional GPU count.
    """
    t0 = time.perf_counter()
    capacity = capacity_of(config, nodes, pods, devices)
    desired = quotas(config, quota_capacity(capacity))
    all_queues = {cq["metadata"]["name"]: cq for cq in cluster_queues}
    managed = {q: all_queues[q] for q in desired if q in all_queues}
    plan = ResyncPlan(env=env, capacity=capacity, reserve=config.reserve_gpus, desired=desired, current=managed)
    plan.missing_queues = [q for q in desired if q not in all_queues]
    if not managed:
        whose = f"inventory {env}'s" if env else "the configured"
        raise OpsError(f"none of {whose} ClusterQueues ({', '.join(desired)}) exists in this cluster "
                       f"(it has {', '.join(sorted(all_queues)) or 'none'}): wrong --kubeconfig/--env, or the kueue "
                       "role is not applied yet (pulumi up)")
    for q, cq in managed.items():
        _, changes, missing = rebuild_resource_groups(cq, desired[q])
        plan.changes += changes
        if missing:
            plan.missing_flavors[q] = missing
    plan.zero_flavors = [f for f in sorted(config.flavors) if capacity[f].schedulable_gpus - config.reserve_gpus <= 0]
    nominal = gpu_nominal(desired)
    lqs = {(lq["metadata"]["namespace"], lq["metadata"]["name"]): (lq.get("spec") or {}).get("clusterQueue", "")
           for lq in local_queues}
    plan.drift = find_drift(all_queues, nominal, workloads)
    plan.cannot_fit = find_cannot_fit(all_queues, nominal, workloads, lqs)
    plan.seconds = time.perf_counter() - t0
    return plan


def zero_message(plan: ResyncPlan) -> str:
    """Why applying is refused for zero-capacity flavors (lists each flavor's nodes and why they are out)."""
    lines = []
    for f in plan.zero_flavors:
        c = plan.capacity[f]
        if c.nodes == 0:
            lines.append(f"flavor {f}: no node carries label gpufleet.io/flavor={f} (wrong cluster or kubeconfig?)")
            continue
        out = "; ".join(f"{n}: {', '.join(r)}" for n, r in list(c.out.items())[:8])
        more = f" (+{len(c.out) - 8} more)" if len(c.out) > 8 else ""
        lines.append(f"flavor {f}: {c.schedulable_gpus} schedulable GPUs of {c.gpus} on {c.nodes} nodes, reserve "
                     f"{plan.reserve}; out: {out}{more}")
    return ("refusing to set every ClusterQueue's quota of a flavor to 0:\n  " + "\n  ".join(lines)
            + "\nIf that is really so, pass --allow-zero")


# --------------------------------------------------------------------------- API


#: Pods that may hold GPUs: bound and not finished (the API's field selectors).
HOLDING_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def list_holding_pods(kube: Kube) -> list[Obj]:
    """Bound, non-terminal pods of every namespace (:data:`HOLDING_PODS`)."""
    return kube.list_all(api_path("v1", "pods"), field_selector=HOLDING_PODS)[0]


def read_state(kube: Kube) -> tuple[list[Obj], list[Obj], list[Obj], list[Obj], list[Obj]]:
    """Nodes, ClusterQueues, Workloads, LocalQueues and the pods holding GPUs, as dicts.

    Raises:
        OpsError: Kueue's v1beta2 API is not served (Kueue missing or too old).
    """
    nodes = list_nodes(kube)
    try:
        cqs, wls, lqs = (kube.list_all(path)[0] for path in (CQ_PATH, WL_PATH, LQ_PATH))
    except NotFound:
        raise OpsError(f"the cluster does not serve {KUEUE_API} (Kueue v0.17 or later is needed; gpufleet pins v0.19)") from None
    return nodes, cqs, wls, lqs, list_holding_pods(kube)


def compute(kube: Kube, config: Configuration, *, env: str = "") -> ResyncPlan:
    """Read the cluster (its DRA GPUs too) and compute the plan (:func:`plan_from`)."""
    from gpufleet.ops.reads import list_gpus

    return plan_from(config, *read_state(kube), env=env, devices=list_gpus(kube))


def apply(kube: Kube, plan: ResyncPlan, *, allow_zero: bool = False, events: bool = True) -> ApplyResult:
    """Write the plan's quotas: one guarded merge patch per ClusterQueue that differs, retried on 409.

    On a conflict the queue is re-read and its resource groups rebuilt
    from the fresh object and the same desired quotas. Records a Warning
    Event per drift and per gang that cannot fit when ``events``.

    Raises:
        OpsError: zero-capacity flavors without ``allow_zero`` (:func:`zero_message`).
        Conflict: a queue kept changing.
    """
    if plan.zero_flavors and not allow_zero and any(c.flavor in plan.zero_flavors and c.resource == GPU_RESOURCE
                                                    for c in plan.changes):
        raise OpsError(zero_message(plan))
    t0 = time.perf_counter()
    result = ApplyResult()
    touched = sorted({c.cluster_queue for c in plan.changes})
    for q in touched:
        def change(obj: Obj, q: str = q) -> Obj | None:
            groups, changes, _ = rebuild_resource_groups(obj, plan.desired[q])
            return {"spec": {"resourceGroups": groups}} if changes else None

        def conflict(_attempt: int) -> None:
            result.conflicts += 1

        after, patch = update_with_retry(kube, f"{CQ_PATH}/{q}", change, on_conflict=conflict)
        plan.current[q] = after
        if patch is not None:
            result.patched.append(q)
    if events:
        record_findings(kube, plan)
    result.seconds = time.perf_counter() - t0
    return result


def record_findings(kube: Kube, plan: ResyncPlan, drift: list[Drift] | None = None,
                    cannot_fit: list[GangReport] | None = None) -> None:
    """Warning Events: ``QuotaBelowUsage`` on each drifting ClusterQueue, ``GangCannotFit`` on each Workload."""
    for d in plan.drift if drift is None else drift:
        cq = plan.current.get(d.cluster_queue) or {"apiVersion": KUEUE_API, "kind": "ClusterQueue",
                                                   "metadata": {"name": d.cluster_queue}}
        record_event(kube, cq, "QuotaBelowUsage",
                     f"flavor {d.flavor}: {d.reserved} GPUs admitted, nominal quota now {d.nominal} (real capacity "
                     f"fell); nothing is evicted, new workloads wait; admitted: {', '.join(d.workloads) or '?'}",
                     type_="Warning", component=EVENT_COMPONENT, action="Resync")
    for g in plan.cannot_fit if cannot_fit is None else cannot_fit:
        ns, name = g.workload.split("/", 1)
        wl = {"apiVersion": KUEUE_API, "kind": "Workload", "metadata": {"name": name, "namespace": ns}}
        record_event(kube, wl, "GangCannotFit",
                     f"needs {g.gpus} GPUs; ClusterQueue {g.cluster_queue} can hold at most {g.max_gpus} with the "
                     "capacity schedulable now: it stays pending until nodes return",
                     type_="Warning", component=EVENT_COMPONENT, action="Resync")
