"""Pure reading of Node objects: ready, schedulable, why out, GPUs, flavor.

Nodes are plain dicts as the API server returns them (JSON, camelCase),
never client model objects: the same functions serve the tasks, the
controllers (watch events) and the tests, and listing 4,096 nodes as JSON
is several times faster than through the generated models.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from gpufleet.kube.quantity import whole_gpus
from gpufleet.kube.times import parse_time
from gpufleet.names import (
    ANN_HEALTH_HISTORY,
    DEGRADED_TAINT,
    FLAVOR_LABEL,
    FREE_GPUS_TAINT,
    GPU_COUNT_LABEL,
    GPU_RESOURCE,
    LEMON_LABEL,
    SWAP_TAINT,
    VIRTUAL_NODE_LABEL,
)

Node = dict[str, Any]

log = logging.getLogger(__name__)


def name(node: Node) -> str:
    """``metadata.name``."""
    return node["metadata"]["name"]


def labels(node: Node) -> dict[str, str]:
    """``metadata.labels`` (empty dict when absent)."""
    return node.get("metadata", {}).get("labels") or {}


def annotations(node: Node) -> dict[str, str]:
    """``metadata.annotations`` (empty dict when absent)."""
    return node.get("metadata", {}).get("annotations") or {}


def taints(node: Node) -> list[dict[str, str]]:
    """``spec.taints`` (empty list when absent)."""
    return list(node.get("spec", {}).get("taints") or [])


def taint(node: Node, key: str) -> dict[str, str] | None:
    """The first taint with ``key``, or None."""
    return next((t for t in taints(node) if t.get("key") == key), None)


def is_ready(node: Node) -> bool:
    """Condition ``Ready`` is ``True``."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions") or [])


def is_cordoned(node: Node) -> bool:
    """``spec.unschedulable`` is true."""
    return bool(node.get("spec", {}).get("unschedulable"))


def is_virtual(node: Node) -> bool:
    """A virtual-kubelet node (label ``type=virtual-kubelet``)."""
    return labels(node).get(VIRTUAL_NODE_LABEL[0]) == VIRTUAL_NODE_LABEL[1]


def flavor(node: Node) -> str | None:
    """The node's ResourceFlavor (label ``gpufleet.io/flavor``), None for a node without one."""
    return labels(node).get(FLAVOR_LABEL)


def gpus(node: Node, field: str = "allocatable") -> int:
    """GPUs (``nvidia.com/gpu``) in ``status.allocatable`` (or ``capacity``); 0 when absent.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional or malformed count (naming the node and value).
    """
    value = (node.get("status", {}).get(field) or {}).get(GPU_RESOURCE)
    if value is None:
        return 0
    return whole_gpus(value, f"node {node.get('metadata', {}).get('name', '?')} status.{field}")


def expected_gpus(node: Node) -> int | None:
    """GPUs the node should have: label ``nvidia.com/gpu.count``, else ``status.capacity[nvidia.com/gpu]``.

    The label is GPU feature discovery's (and the inventory's, for the nodes it
    declares); the capacity is what the device plugin registered. A label that
    is not a decimal integer is ignored. Virtual nodes have no host GPUs: None.

    Returns:
        GPUs (>= 0), or None when neither says (or the capacity is malformed).
    """
    if is_virtual(node):
        return None
    text = labels(node).get(GPU_COUNT_LABEL, "")
    if text.isdigit():
        return int(text)
    if GPU_RESOURCE not in ((node.get("status") or {}).get("capacity") or {}):
        return None
    try:
        return gpus(node, "capacity")
    except ValueError:
        return None


def is_fleet_node(node: Node) -> bool:
    """Part of the GPU fleet: not virtual, and GPUs in its capacity or a ResourceFlavor label (system nodes are not).

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional or malformed capacity.
    """
    return not is_virtual(node) and bool(gpus(node, "capacity") or flavor(node) is not None)


def out_reasons(node: Node) -> list[str]:
    """Why the node's GPUs do not count for training (Kueue's quota); empty when they do.

    The classifier's answer for the training class (:mod:`gpufleet.fleet.classify`,
    default classes): ``"NotReady"``, ``"cordoned"``, ``"swap: gpu_temp"``,
    ``"degraded: ib_errors"``, ``"taint dedicated=inference:NoSchedule"``,
    ``"nvidia.com/gpu allocatable 7 < capacity 8"``...
    """
    from gpufleet.fleet.classify import TRAINING, classify  # classify builds on this module

    return list(classify(node).reasons[TRAINING])


def schedulable(node: Node) -> bool:
    """The node's GPUs count for training (see :func:`out_reasons`)."""
    return not out_reasons(node)


def is_out(node: Node) -> bool:
    """Out for swap or degraded by gpufleet (what ``node_health_max_nodes_out`` counts)."""
    return taint(node, SWAP_TAINT) is not None or taint(node, DEGRADED_TAINT) is not None


def is_lemon(node: Node) -> bool:
    """Labelled ``gpufleet.io/lemon=true``."""
    return labels(node).get(LEMON_LABEL) == "true"


def has_free_gpus_taint(node: Node) -> bool:
    """Carries the taint controller's ``gpufleet.io/cluster-has-free-gpus`` taint."""
    return taint(node, FREE_GPUS_TAINT) is not None


def health_history(node: Node) -> list[dict[str, Any]]:
    """The node's failure history (annotation ``gpufleet.io/health-history``, JSON list); [] if absent or unreadable."""
    raw = annotations(node).get(ANN_HEALTH_HISTORY)
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def near_matches(wanted: str, names: list[str], n: int = 5) -> list[str]:
    """Up to ``n`` names close to ``wanted``: similar (difflib ratio >= 0.6) or containing it; longest shared prefix first."""
    def prefix(x: str) -> int:
        return len(os.path.commonprefix([wanted, x]))

    close = [x for x in names if wanted in x or x in wanted
             or difflib.SequenceMatcher(None, wanted, x).ratio() >= 0.6]
    close.sort(key=lambda x: (-prefix(x), -difflib.SequenceMatcher(None, wanted, x).ratio(), x))
    return close[:n]


def recorded_time(value: str | None, where: str) -> float | None:
    """A time gpufleet recorded where people may edit it (an annotation, a history entry, a ConfigMap key).

    :func:`gpufleet.kube.times.parse_time`'s seconds since the epoch; a value
    it refuses is logged (naming ``where``, the value and the expected form)
    and read as absent, so one hand-edited annotation never stops a controller.

    Returns:
        seconds since the epoch, or None when absent or malformed.
    """
    try:
        return parse_time(value)
    except ValueError as exc:
        log.warning("%s: %s; read as absent", where, exc)
        return None


@dataclass(frozen=True)
class NodeSummary:
    """One node as status and quota see it.

    Attributes:
        name: node name.
        flavor: ResourceFlavor label, None when absent.
        gpus: allocatable GPUs.
        virtual: a virtual-kubelet node.
        reasons: why it is out of schedulable capacity (empty: schedulable).
        lemon: labelled lemon.
    """

    name: str
    flavor: str | None
    gpus: int
    virtual: bool
    reasons: tuple[str, ...]
    lemon: bool

    @property
    def schedulable(self) -> bool:
        """No reason to be out."""
        return not self.reasons


def summarize(node: Node) -> NodeSummary:
    """A :class:`NodeSummary` of ``node``."""
    return NodeSummary(name(node), flavor(node), gpus(node), is_virtual(node), tuple(out_reasons(node)), is_lemon(node))
