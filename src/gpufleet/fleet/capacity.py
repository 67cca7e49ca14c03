"""Schedulable GPU capacity per ResourceFlavor, from the Nodes (and Pods) the API server has (pure).

A node's GPUs count when the node classifier (:mod:`gpufleet.fleet.classify`)
says they count for training, the class Kueue admits: Ready, not cordoned,
every NoSchedule/NoExecute taint tolerated by training pods, and not degraded
(GPU allocatable below capacity) unless the inventory lets such nodes count.
GPUs are the node's ``status.allocatable["nvidia.com/gpu"]``; the flavor is its
``gpufleet.io/flavor`` label (the ResourceFlavor's nodeLabels). Virtual nodes
(``type=virtual-kubelet``) are capacity outside the cluster and never count.

**GPUs Kueue does not manage.** A pod bound to a counted node that holds GPUs
and that Kueue does not manage (no ``kueue.x-k8s.io/queue-name`` or
``kueue.x-k8s.io/podset`` label, no ``kueue.x-k8s.io/managed=true``) keeps
them from every gang Kueue admits there: they are subtracted from the
flavor's capacity. Pods the flip-out takes GPUs back from are the exception:
those with a priority below the training PriorityClass (inference), which the
taint controller evicts for a pending gang; subtracting them would keep the
very gangs that make room from ever being admitted. Pass ``reclaim_below=None``
to subtract every unmanaged holder.

**CPU and memory** follow the same nodes and the same rule: a flavor's CPU
(cores) and memory (bytes) are the counted nodes' ``status.allocatable``
``cpu`` and ``memory``, minus what the pods Kueue does not manage bound
there request (DaemonSets, system and mirror pods, unmanaged GPU holders),
as kube-scheduler's NodeResourcesFit counts them: a node's free resources
are its allocatable minus the requests of every pod bound to it, whoever
created it. The one exception is again the pods the flip-out reclaims
(unmanaged, holding GPUs, priority below ``reclaim_below``): their CPU and
memory come back with their GPUs. A pod's requests are
:func:`pod_spec_request`'s, the one definition used everywhere here; a pod
moving off a node therefore moves its own requests, never a GPU's share
of the node.

**What a pod requests** is defined here once for all of gpufleet (quota,
status, the flip controllers, the virtual kubelet): :func:`pod_spec_request`
(one resource), :func:`pod_spec_requests` / :func:`pod_resource_requests`
(every resource), :func:`pod_gpus` (GPUs, whole or refused), by
kube-scheduler's rule (``k8s.io/component-helpers/resource.PodRequests``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet.classify import TRAINING, PodClass, classify
from gpufleet.fleet.nodes import Node
from gpufleet.names import GPU_RESOURCE, KUEUE_MANAGED_LABEL, KUEUE_PODSET_LABEL, KUEUE_QUEUE_LABEL
from gpufleet.kube.quantity import parse_quantity, whole_gpus



@dataclass
class FlavorNodes:
    """One flavor's nodes as the cluster has them now.

    Attributes:
        flavor: ResourceFlavor name.
        nodes: nodes carrying the flavor label.
        gpus: their allocatable GPUs.
        schedulable_nodes: nodes that count (see module docstring).
        schedulable_gpus: GPUs quota may hand out: those of the counted nodes,
            minus the GPUs unmanaged pods hold there.
        out: node name -> reasons it does not count.
        unmanaged_gpus: GPUs held on counted nodes by pods Kueue does not manage
            (already subtracted from ``schedulable_gpus``).
        unmanaged: ``namespace/name`` -> GPUs, those pods.
        cpu: cores allocatable on the counted nodes (``status.allocatable.cpu``; Decimal, ``7900m`` is 7.9).
        memory_bytes: bytes allocatable on the counted nodes.
        unmanaged_cpu: cores requested there by pods Kueue does not manage (not the reclaimed).
        unmanaged_memory_bytes: bytes requested there by those pods.
    """

    flavor: str
    nodes: int = 0
    gpus: int = 0
    schedulable_nodes: int = 0
    schedulable_gpus: int = 0
    out: dict[str, list[str]] = field(default_factory=dict)
    unmanaged_gpus: int = 0
    unmanaged: dict[str, int] = field(default_factory=dict)
    cpu: Decimal = Decimal(0)
    memory_bytes: int = 0
    unmanaged_cpu: Decimal = Decimal(0)
    unmanaged_memory_bytes: int = 0

    @property
    def schedulable_cpu(self) -> int:
        """Whole cores quota may hand out: allocatable minus unmanaged requests, rounded down."""
        return int((self.cpu - self.unmanaged_cpu).to_integral_value(rounding=ROUND_FLOOR))

    @property
    def schedulable_memory_bytes(self) -> int:
        """Bytes quota may hand out: allocatable minus unmanaged requests."""
        return self.memory_bytes - self.unmanaged_memory_bytes


@dataclass(frozen=True)
class Requests:
    """What one pod requests, as the scheduler counts it: GPUs, cores (Decimal: ``500m`` is 0.5), bytes."""

    gpus: int = 0
    cpu: Decimal = Decimal(0)
    memory_bytes: int = 0

    def __add__(self, other: Requests) -> Requests:
        return Requests(self.gpus + other.gpus, self.cpu + other.cpu, self.memory_bytes + other.memory_bytes)


def container_request(container: Mapping[str, Any], resource: str) -> Decimal:
    """What one container requests of ``resource``: ``requests`` else ``limits`` (the API server defaults one
    to the other), 0 when neither names it.

    Raises:
        ValueError: not a Kubernetes quantity.
    """
    res = container.get("resources") or {}
    value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
    return Decimal(0) if value is None else parse_quantity(value)


def _sidecar(container: Mapping[str, Any]) -> bool:
    """An init container that keeps running beside the main ones (``restartPolicy: Always``, Kubernetes 1.29+)."""
    return container.get("restartPolicy") == "Always"


def pod_spec_request(spec: Mapping[str, Any], resource: str) -> Decimal:
    """What a pod spec requests of ``resource``, the way the scheduler adds it up.

    Kubernetes' rule (``k8s.io/component-helpers/resource.PodRequests``,
    as NodeResourcesFit uses it): the main containers summed with the
    sidecars (init containers with ``restartPolicy: Always``); each plain
    init container runs alone beside the sidecars started before it, so
    the pod needs the larger of that sum and every such init step; plus
    ``spec.overhead`` (the RuntimeClass's).

    Raises:
        ValueError: a value that is not a Kubernetes quantity.
    """
    sidecars = Decimal(0)
    init_peak = Decimal(0)
    for c in spec.get("initContainers") or []:
        if _sidecar(c):
            sidecars += container_request(c, resource)
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + container_request(c, resource))
    main = sum((container_request(c, resource) for c in spec.get("containers") or []), Decimal(0)) + sidecars
    overhead = (spec.get("overhead") or {}).get(resource)
    return max(main, init_peak) + (parse_quantity(overhead) if overhead is not None else Decimal(0))


def pod_spec_requests(spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """Every resource a pod spec requests, by :func:`pod_spec_request`'s rule: ``{"cpu": Decimal("4.25"), ...}``.

    The resources are those any container (``requests`` or ``limits``), init
    container or ``spec.overhead`` names; one named with 0 is kept as 0.

    Raises:
        ValueError: a value that is not a Kubernetes quantity.
    """
    names: dict[str, None] = {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        names.update(dict.fromkeys([*(res.get("requests") or {}), *(res.get("limits") or {})]))
    names.update(dict.fromkeys(spec.get("overhead") or {}))
    return {r: pod_spec_request(spec, r) for r in names}


def pod_name(pod: Mapping[str, Any]) -> str:
    """``pod <namespace>/<name>``, as the errors here name a pod."""
    meta = pod.get("metadata") or {}
    return f"pod {meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def pod_resource_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Every resource a Pod requests (:func:`pod_spec_requests`), GPUs checked whole (:func:`pod_gpus`).

    Shape: ``{"nvidia.com/gpu": Decimal(8), "cpu": Decimal("4.25"), "memory": Decimal(34359738368)}``.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional GPU count, naming the pod (and container) and value.
        ValueError: a value that is not a quantity, naming the pod.
    """
    try:
        out = pod_spec_requests(pod.get("spec") or {})
    except ValueError as exc:
        raise ValueError(f"{pod_name(pod)}: {exc}") from None
    if GPU_RESOURCE in out:
        out[GPU_RESOURCE] = Decimal(pod_gpus(pod))
    return out


def container_gpus(container: Mapping[str, Any], where: str) -> int:
    """GPUs one container asks for (:func:`container_request` of ``nvidia.com/gpu``).

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional count, naming ``where`` and the container.
    """
    res = container.get("resources") or {}
    value = (res.get("requests") or {}).get(GPU_RESOURCE, (res.get("limits") or {}).get(GPU_RESOURCE))
    return 0 if value is None else whole_gpus(value, f"{where} container {container.get('name', '?')}")


def pod_spec_gpus(spec: Mapping[str, Any], where: str) -> int:
    """GPUs a pod spec holds (:func:`pod_spec_request` of ``nvidia.com/gpu``), each container a whole count.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional count, naming ``where`` (and the container).
    """
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        container_gpus(c, where)
    return whole_gpus(pod_spec_request(spec, GPU_RESOURCE), where)


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a Pod requests (:func:`pod_spec_gpus`): the one count fleet, quota, flip and the virtual kubelet use.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional count; the message names
            ``pod <namespace>/<name>`` (and the container) and the value.
    """
    return pod_spec_gpus(pod.get("spec") or {}, pod_name(pod))


def pod_requests(pod: Mapping[str, Any]) -> Requests:
    """GPUs, cores and bytes a Pod requests (:func:`pod_spec_request` of each; GPUs by :func:`pod_gpus`).

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional GPU count, naming the pod.
        ValueError: a cpu or memory value that is not a quantity, naming the pod.
    """
    spec = pod.get("spec") or {}
    try:
        cpu, memory = pod_spec_request(spec, "cpu"), pod_spec_request(spec, "memory")
    except ValueError as exc:
        raise ValueError(f"{pod_name(pod)}: {exc}") from None
    return Requests(pod_gpus(pod), cpu, int(memory.to_integral_value(rounding=ROUND_FLOOR)))


def kueue_managed(pod: Mapping[str, Any]) -> bool:
    """Kueue manages the pod: it carries a queue or podset label, or Kueue's ``managed`` label."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (KUEUE_QUEUE_LABEL in labels or KUEUE_PODSET_LABEL in labels
            or labels.get(KUEUE_MANAGED_LABEL[0]) == KUEUE_MANAGED_LABEL[1])


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """Bound to a node and not finished (phase Succeeded/Failed hold nothing)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def unmanaged_requests(pods: Iterable[Mapping[str, Any]], reclaim_below: int | None) -> dict[str, dict[str, Requests]]:
    """``{node: {"namespace/name": Requests}}`` of bound, unfinished pods Kueue does not manage, less the reclaimed.

    Reclaimed (not listed): pods holding GPUs with ``spec.priority`` below
    ``reclaim_below``, which the flip-out evicts for a pending gang (module
    docstring). Pods that request nothing are left out.

    Args:
        pods: Pod dicts.
        reclaim_below: the priority below which GPU holders are reclaimed; None: none are.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a pod with a fractional GPU count.
        ValueError: a pod whose cpu or memory is not a quantity.
    """
    out: dict[str, dict[str, Requests]] = {}
    for pod in pods:
        if not holds_gpus(pod) or kueue_managed(pod):
            continue
        req = pod_requests(pod)
        if req.gpus and reclaim_below is not None and int((pod.get("spec") or {}).get("priority") or 0) < reclaim_below:
            continue
        if req != Requests():
            meta = pod.get("metadata") or {}
            out.setdefault(pod["spec"]["nodeName"], {})[f"{meta.get('namespace', 'default')}/{meta.get('name')}"] = req
    return out


def flavor_capacity(nodes: Iterable[Node], flavors: Iterable[str] = (), *, pods: Iterable[Mapping[str, Any]] | None = None,
                    classes: Sequence[PodClass] | None = None, reclaim_below: int | None = None,
                    devices: Mapping[str, Sequence[Any]] | None = None) -> dict[str, FlavorNodes]:
    """Capacity per flavor: every flavor found on a node, plus ``flavors`` (zero when no node carries them).

    Args:
        nodes: Node dicts.
        flavors: flavor names to report even without nodes (the inventory's).
        pods: Pod dicts; when given, GPUs unmanaged pods hold on counted nodes are
            subtracted (module docstring). None: nothing is subtracted.
        classes: the classifier's pod classes (default
            :func:`gpufleet.fleet.classify.default_classes`); the ``training`` one decides.
        reclaim_below: priority below which an unmanaged pod is reclaimed by the
            flip-out, not subtracted (the training PriorityClass value); None: subtract all.
        devices: node -> its GPUs allocated through DRA (:func:`gpufleet.fleet.devices.gpus_by_node`);
            such a node's GPUs are its devices, counted per device by the classifier
            (a tainted one is out, and the node is partial).

    Returns:
        flavor -> :class:`FlavorNodes`, sorted by flavor name.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a pod with a fractional GPU count (nodes with
            one are left out with the refusal as their reason instead).
    """
    out: dict[str, FlavorNodes] = {f: FlavorNodes(f) for f in flavors}
    holders = unmanaged_requests(pods, reclaim_below) if pods is not None else {}
    for node in nodes:
        flavor = nodeutil.flavor(node)
        if flavor is None or nodeutil.is_virtual(node):
            continue
        fc = out.setdefault(flavor, FlavorNodes(flavor))
        nc = classify(node, classes, (devices or {}).get(nodeutil.name(node)))
        fc.nodes += 1
        fc.gpus += nc.facts.allocatable or 0
        if not nc.counts(TRAINING):
            fc.out[nc.name] = list(nc.reasons[TRAINING])
            continue
        gpus = nc.gpus_for(TRAINING)
        held = holders.get(nc.name, {})
        used = sum(held.values(), Requests())
        taken = min(used.gpus, gpus)
        fc.schedulable_nodes += 1
        fc.schedulable_gpus += gpus - taken
        fc.unmanaged_gpus += taken
        fc.unmanaged.update({p: r.gpus for p, r in held.items() if r.gpus})
        cpu, memory = allocatable(node, "cpu"), int(allocatable(node, "memory"))
        fc.cpu += cpu
        fc.memory_bytes += memory
        fc.unmanaged_cpu += min(used.cpu, cpu)
        fc.unmanaged_memory_bytes += min(used.memory_bytes, memory)
    return dict(sorted(out.items()))


def allocatable(node: Node, resource: str) -> Decimal:
    """``status.allocatable[resource]`` of a Node; 0 when absent or not a quantity (the node offers none)."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    try:
        return Decimal(0) if value is None else parse_quantity(value)
    except ValueError:
        return Decimal(0)


def gpu_map(capacity: dict[str, FlavorNodes]) -> dict[str, int]:
    """flavor -> schedulable GPUs."""
    return {f: c.schedulable_gpus for f, c in capacity.items()}


def quota_capacity(capacity: dict[str, FlavorNodes]) -> dict[str, dict[str, int]]:
    """flavor -> ``{"gpu": GPUs, "cpu": whole cores, "memory": bytes}`` schedulable (the ``capacity``
    argument of ``roles.kueue.manifests.quotas``)."""
    return {f: {"gpu": c.schedulable_gpus, "cpu": c.schedulable_cpu, "memory": c.schedulable_memory_bytes}
            for f, c in capacity.items()}
