"""Schedulable GPU capacity per ResourceFlavor, from the Nodes the API server has (pure).

A node's GPUs count when it is Ready, not cordoned, and carries none of
the taints in :data:`gpufleet.names.UNSCHEDULABLE_TAINTS` (swap,
degraded, and Kubernetes' own not-ready/unreachable/pressure taints):
exactly the nodes a training gang could be placed on now. GPUs are the
node's ``status.allocatable["nvidia.com/gpu"]``; the flavor is its
``gpufleet.io/flavor`` label (the ResourceFlavor's nodeLabels). Virtual
nodes (``type=virtual-kubelet``) are capacity outside the cluster and never
count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet.nodes import Node


@dataclass
class FlavorNodes:
    """One flavor's nodes as the cluster has them now.

    Attributes:
        flavor: ResourceFlavor name.
        nodes: nodes carrying the flavor label.
        gpus: their allocatable GPUs.
        schedulable_nodes: nodes that count (see module docstring).
        schedulable_gpus: their GPUs: what quota may hand out.
        out: node name -> reasons it does not count.
    """

    flavor: str
    nodes: int = 0
    gpus: int = 0
    schedulable_nodes: int = 0
    schedulable_gpus: int = 0
    out: dict[str, list[str]] = field(default_factory=dict)


def flavor_capacity(nodes: Iterable[Node], flavors: Iterable[str] = ()) -> dict[str, FlavorNodes]:
    """Capacity per flavor: every flavor found on a node, plus ``flavors`` (zero when no node carries them).

    Args:
        nodes: Node dicts.
        flavors: flavor names to report even without nodes (the inventory's).

    Returns:
        flavor -> :class:`FlavorNodes`, sorted by flavor name.
    """
    out: dict[str, FlavorNodes] = {f: FlavorNodes(f) for f in flavors}
    for node in nodes:
        flavor = nodeutil.flavor(node)
        if flavor is None or nodeutil.is_virtual(node):
            continue
        fc = out.setdefault(flavor, FlavorNodes(flavor))
        gpus = nodeutil.gpus(node)
        fc.nodes += 1
        fc.gpus += gpus
        reasons = nodeutil.out_reasons(node)
        if reasons:
            fc.out[nodeutil.name(node)] = reasons
        else:
            fc.schedulable_nodes += 1
            fc.schedulable_gpus += gpus
    return dict(sorted(out.items()))


def gpu_map(capacity: dict[str, FlavorNodes]) -> dict[str, int]:
    """flavor -> schedulable GPUs (the ``capacity`` argument of ``roles.kueue.manifests.quotas``)."""
    return {f: c.schedulable_gpus for f, c in capacity.items()}
