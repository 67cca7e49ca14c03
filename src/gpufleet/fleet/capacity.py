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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet.classify import TRAINING, PodClass, classify
from gpufleet.fleet.nodes import Node
from gpufleet.names import GPU_RESOURCE, KUEUE_PODSET_LABEL, KUEUE_QUEUE_LABEL
from gpufleet.kube.quantity import whole_gpus

#: Label Kueue's pod integration puts on the plain pods it manages.
KUEUE_MANAGED_LABEL = ("kueue.x-k8s.io/managed", "true")


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
    """

    flavor: str
    nodes: int = 0
    gpus: int = 0
    schedulable_nodes: int = 0
    schedulable_gpus: int = 0
    out: dict[str, list[str]] = field(default_factory=dict)
    unmanaged_gpus: int = 0
    unmanaged: dict[str, int] = field(default_factory=dict)


def container_gpus(container: Mapping[str, Any], where: str) -> int:
    """GPUs one container asks for: ``requests`` else ``limits`` (the API server defaults one to the other).

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional count, naming ``where`` and the container.
    """
    res = container.get("resources") or {}
    value = (res.get("requests") or {}).get(GPU_RESOURCE, (res.get("limits") or {}).get(GPU_RESOURCE))
    return 0 if value is None else whole_gpus(value, f"{where} container {container.get('name', '?')}")


def pod_spec_gpus(spec: Mapping[str, Any], where: str) -> int:
    """GPUs a pod spec holds: containers summed, or the largest init container if more.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional count, naming ``where``.
    """
    main = sum(container_gpus(c, where) for c in spec.get("containers") or [])
    return max([main] + [container_gpus(c, where) for c in spec.get("initContainers") or []])


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a Pod requests (:func:`pod_spec_gpus`); the error names ``pod <namespace>/<name>``."""
    meta = pod.get("metadata") or {}
    return pod_spec_gpus(pod.get("spec") or {}, f"pod {meta.get('namespace', 'default')}/{meta.get('name', '?')}")


def kueue_managed(pod: Mapping[str, Any]) -> bool:
    """Kueue manages the pod: it carries a queue or podset label, or Kueue's ``managed`` label."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (KUEUE_QUEUE_LABEL in labels or KUEUE_PODSET_LABEL in labels
            or labels.get(KUEUE_MANAGED_LABEL[0]) == KUEUE_MANAGED_LABEL[1])


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """Bound to a node and not finished (phase Succeeded/Failed hold nothing)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def unmanaged_holders(pods: Iterable[Mapping[str, Any]], reclaim_below: int | None) -> dict[str, dict[str, int]]:
    """``{node: {"namespace/name": gpus}}`` of GPU-holding pods Kueue does not manage and the flip-out does not reclaim.

    Args:
        pods: Pod dicts.
        reclaim_below: pods with ``spec.priority`` below this are reclaimed (not listed); None: none are.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a pod with a fractional GPU count.
    """
    out: dict[str, dict[str, int]] = {}
    for pod in pods:
        if not holds_gpus(pod) or kueue_managed(pod):
            continue
        if reclaim_below is not None and int((pod.get("spec") or {}).get("priority") or 0) < reclaim_below:
            continue
        gpus = pod_gpus(pod)
        if gpus:
            meta = pod.get("metadata") or {}
            out.setdefault(pod["spec"]["nodeName"], {})[f"{meta.get('namespace', 'default')}/{meta.get('name')}"] = gpus
    return out


def flavor_capacity(nodes: Iterable[Node], flavors: Iterable[str] = (), *, pods: Iterable[Mapping[str, Any]] | None = None,
                    classes: Sequence[PodClass] | None = None, reclaim_below: int | None = None) -> dict[str, FlavorNodes]:
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

    Returns:
        flavor -> :class:`FlavorNodes`, sorted by flavor name.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a pod with a fractional GPU count (nodes with
            one are left out with the refusal as their reason instead).
    """
    out: dict[str, FlavorNodes] = {f: FlavorNodes(f) for f in flavors}
    holders = unmanaged_holders(pods, reclaim_below) if pods is not None else {}
    for node in nodes:
        flavor = nodeutil.flavor(node)
        if flavor is None or nodeutil.is_virtual(node):
            continue
        fc = out.setdefault(flavor, FlavorNodes(flavor))
        nc = classify(node, classes)
        fc.nodes += 1
        fc.gpus += nc.facts.allocatable or 0
        if not nc.counts(TRAINING):
            fc.out[nc.name] = list(nc.reasons[TRAINING])
            continue
        gpus = nc.gpus_for(TRAINING)
        held = holders.get(nc.name, {})
        taken = min(sum(held.values()), gpus)
        fc.schedulable_nodes += 1
        fc.schedulable_gpus += gpus - taken
        fc.unmanaged_gpus += taken
        fc.unmanaged.update(held)
    return dict(sorted(out.items()))


def gpu_map(capacity: dict[str, FlavorNodes]) -> dict[str, int]:
    """flavor -> schedulable GPUs (the ``capacity`` argument of ``roles.kueue.manifests.quotas``)."""
    return {f: c.schedulable_gpus for f, c in capacity.items()}
