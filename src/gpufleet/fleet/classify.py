"""Which nodes' GPUs count, and for which pods: the one node classifier (pure).

Quota sync (training capacity per ResourceFlavor), the taint controller's
free-GPU signal (room for inference in the cluster), ``invoke status`` and
the remediation controller all ask this module, so they cannot disagree.

A node's GPUs count for a :class:`PodClass` only when

* it is not a virtual node (``type=virtual-kubelet``: capacity outside the cluster),
* its ``Ready`` condition is ``True``,
* it is schedulable (``spec.unschedulable`` not set: not cordoned),
* the class's pods tolerate **every** ``NoSchedule`` and ``NoExecute`` taint on
  it, whatever its key (``PreferNoSchedule`` never keeps a pod off), matched
  as kube-scheduler's TaintToleration filter matches them
  (``k8s.io/api/core/v1`` ``Toleration.ToleratesTaint``: an empty effect
  matches every effect, an empty key with ``Exists`` matches every key, an
  empty operator is ``Equal``, which compares values; ``Lt``/``Gt`` compare
  decimal integers only with the ``TaintTolerationComparisonOperators``
  feature gate, off by default in Kubernetes 1.35),
* its ``nvidia.com/gpu`` allocatable is a whole number (a fractional value is
  refused, never truncated: the node counts for nobody and says why), and
* when its allocatable GPUs fell below its capacity (the device plugin
  withdrew a GPU, typically after an XID), the class counts such *degraded*
  nodes (:attr:`PodClass.partial_nodes`): by default a gang (training)
  does not, inference does.

A node whose GPUs are allocated through DRA has no ``nvidia.com/gpu``
allocatable: its GPUs are the devices of its ResourceSlices
(:mod:`gpufleet.fleet.devices`), given to the classifier as
``NodeFacts.devices``. The same rules apply per device and per class: a
GPU counts for a class when a claim with the class's device tolerations
(:attr:`PodClass.device_tolerations`) may be given it (no untolerated
``NoSchedule``/``NoExecute`` device taint), and a node with fewer such GPUs
than devices is degraded *for that class*, counted only where the class
counts partial nodes. Training claims tolerate no device taint; inference
claims tolerate the degraded-GPU taint (``gpufleet.io/gpu-degraded``), so a
GPU node health degraded still serves inference.

The classes gpufleet runs (:func:`default_classes`) carry the tolerations
its own pods carry: training pods (``templates/training``) tolerate the GPU
node taint only; inference pods (``roles/inference``) also tolerate the
degraded-node taint and the virtual-kubelet taint.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.fleet import nodes as nodeutil
from gpufleet.names import (
    DEGRADED_TAINT,
    GPU_DEGRADED_TAINT,
    GPU_RESOURCE,
    RESERVED_TAINT,
    SWAP_TAINT,
    VIRTUAL_NODE_LABEL,
    VIRTUAL_NODE_TAINT,
)
from gpufleet.kube.quantity import GpuCountError

#: The pod classes gpufleet schedules.
TRAINING = "training"
INFERENCE = "inference"

#: Taint effects that keep a pod off a node (PreferNoSchedule only discourages).
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

_DECIMAL_INTEGER = re.compile(r"^(0|-?[1-9][0-9]*)$")
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int64(text: str) -> int | None:
    """A decimal integer as Kubernetes' ``content.IsDecimalInteger`` + ``ParseInt(.., 64)`` accept it, else None."""
    if not _DECIMAL_INTEGER.match(text):
        return None
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any], *, comparison_operators: bool = False) -> bool:
    """Whether one toleration tolerates one taint, exactly as ``Toleration.ToleratesTaint`` (Kubernetes 1.35).

    Args:
        toleration: ``{"key", "operator", "value", "effect"}`` (any may be absent).
        taint: ``{"key", "value", "effect"}``.
        comparison_operators: the ``TaintTolerationComparisonOperators`` feature gate
            (``Lt``/``Gt`` compare the values as int64; off: they match nothing).
    """
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != (taint.get("effect") or ""):
        return False
    if key and key != (taint.get("key") or ""):
        return False
    op = toleration.get("operator") or ""
    if op in ("", "Equal"):
        return (toleration.get("value") or "") == (taint.get("value") or "")
    if op == "Exists":
        return True
    if op in ("Lt", "Gt") and comparison_operators:
        want, have = _int64(str(toleration.get("value") or "")), _int64(str(taint.get("value") or ""))
        if want is None or have is None:
            return False
        return have < want if op == "Lt" else have > want
    return False


def tolerated(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any], *,
              comparison_operators: bool = False) -> bool:
    """Whether any of ``tolerations`` tolerates ``taint`` (:func:`tolerates`)."""
    return any(tolerates(t, taint, comparison_operators=comparison_operators) for t in tolerations)


def untolerated(taints: Iterable[Mapping[str, Any]], tolerations: Iterable[Mapping[str, Any]], *,
                comparison_operators: bool = False) -> list[Mapping[str, Any]]:
    """The ``NoSchedule``/``NoExecute`` taints none of ``tolerations`` tolerates, in order."""
    tols = list(tolerations)
    return [t for t in taints if t.get("effect") in BLOCKING_EFFECTS
            and not tolerated(tols, t, comparison_operators=comparison_operators)]


@dataclass(frozen=True)
class PodClass:
    """A class of pods whose GPUs capacity is counted for.

    Attributes:
        name: ``training``, ``inference`` or another name.
        tolerations: what the class's pods tolerate (Toleration dicts).
        partial_nodes: whether a node whose GPU allocatable fell below its
            capacity still counts (its remaining allocatable GPUs) for the class.
        comparison_operators: the ``TaintTolerationComparisonOperators`` feature gate.
        device_tolerations: what the class's ResourceClaims tolerate of device taints (DRA nodes).
    """

    name: str
    tolerations: tuple[Mapping[str, Any], ...] = ()
    partial_nodes: bool = False
    comparison_operators: bool = False
    device_tolerations: tuple[Mapping[str, Any], ...] = ()


GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
#: What training pods tolerate (templates/training/_pod.yaml.j2, and Kueue's ResourceFlavors add the same).
#: A node the flip-out reserved for a pending training pod (``gpufleet.io/reserved-for=<uid>``,
#: tolerated by that pod) is held *for* training: it stays training capacity.
TRAINING_TOLERATIONS: tuple[Mapping[str, Any], ...] = (
    GPU_TOLERATION,
    {"key": RESERVED_TAINT, "operator": "Exists", "effect": "NoSchedule"},
)
#: What inference pods tolerate (roles/inference): the GPU taint, the degraded tier, virtual nodes.
INFERENCE_TOLERATIONS: tuple[Mapping[str, Any], ...] = (
    GPU_TOLERATION,
    {"key": DEGRADED_TAINT, "operator": "Exists", "effect": "NoSchedule"},
    {"key": VIRTUAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
)


#: What inference claims tolerate of device taints (roles/inference): a GPU node health degraded.
INFERENCE_DEVICE_TOLERATIONS: tuple[Mapping[str, Any], ...] = (
    {"key": GPU_DEGRADED_TAINT, "operator": "Exists", "effect": "NoSchedule"},
)


def default_classes(*, partial_nodes_train: bool = False) -> tuple[PodClass, PodClass]:
    """``(training, inference)`` as gpufleet runs them.

    Args:
        partial_nodes_train: whether the remaining GPUs of a degraded node count
            for training (inventory ``kueue_partial_gpu_nodes_count``; default no:
            a gang placed there would wait for a GPU that is not coming back).
    """
    return (PodClass(TRAINING, TRAINING_TOLERATIONS, partial_nodes=partial_nodes_train),
            PodClass(INFERENCE, INFERENCE_TOLERATIONS, partial_nodes=True,
                     device_tolerations=INFERENCE_DEVICE_TOLERATIONS))


@dataclass(frozen=True)
class NodeFacts:
    """What the classifier reads of a Node.

    Attributes:
        name: node name.
        labels: its labels.
        ready: condition ``Ready`` is ``True``.
        unschedulable: ``spec.unschedulable`` (cordoned).
        taints: ``spec.taints``.
        allocatable: ``status.allocatable[nvidia.com/gpu]`` (GPUs), None when invalid.
        capacity: ``status.capacity[nvidia.com/gpu]`` (GPUs), None when invalid;
            absent is taken as equal to the allocatable.
        problem: why the GPU counts are invalid (a fractional value), else None.
        devices: the node's GPUs allocated through DRA (:func:`gpufleet.fleet.devices.gpus_by_node`),
            None for a device-plugin node; when set, ``allocatable`` and ``capacity`` are the
            number of devices.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False
    taints: tuple[Mapping[str, Any], ...] = ()
    allocatable: int | None = 0
    capacity: int | None = 0
    problem: str | None = None
    devices: tuple[Any, ...] | None = None

    @classmethod
    def of(cls, node: Mapping[str, Any], devices: Sequence[Any] | None = None) -> NodeFacts:
        """The facts of a Node dict (the API's JSON); ``devices``: its DRA GPUs (:class:`gpufleet.fleet.devices.Gpu`),
        for a node whose GPUs are allocated through DRA."""
        if devices is not None:
            return cls(nodeutil.name(node), dict(nodeutil.labels(node)), nodeutil.is_ready(node),
                       nodeutil.is_cordoned(node), tuple(nodeutil.taints(node)), len(devices), len(devices), None,
                       tuple(devices))
        problem = None
        try:
            allocatable = nodeutil.gpus(node)
            capacity = nodeutil.gpus(node, "capacity") if _has(node, "capacity") else allocatable
        except GpuCountError as exc:
            allocatable = capacity = None
            problem = str(exc)
        return cls(nodeutil.name(node), dict(nodeutil.labels(node)), nodeutil.is_ready(node), nodeutil.is_cordoned(node),
                   tuple(nodeutil.taints(node)), allocatable, capacity, problem)

    @property
    def virtual(self) -> bool:
        """A virtual-kubelet node."""
        return self.labels.get(VIRTUAL_NODE_LABEL[0]) == VIRTUAL_NODE_LABEL[1]

    @property
    def degraded(self) -> bool:
        """GPU allocatable below capacity: the device plugin withdrew GPUs; on a DRA node, a device tainted out
        of service (``NoSchedule``/``NoExecute``, whatever a class tolerates)."""
        if self.devices is not None:
            return any(not g.usable() for g in self.devices)
        return self.allocatable is not None and self.capacity is not None and self.allocatable < self.capacity

    def usable_gpus(self, cls: PodClass) -> int:
        """GPUs a pod of ``cls`` may be given: the allocatable ones; on a DRA node, the devices whose taints
        ``cls``'s claims tolerate."""
        if self.devices is not None:
            return sum(1 for g in self.devices if g.usable(cls.device_tolerations))
        return self.allocatable or 0


def _has(node: Mapping[str, Any], field_name: str) -> bool:
    return GPU_RESOURCE in ((node.get("status") or {}).get(field_name) or {})


def _taint_reason(t: Mapping[str, Any]) -> str:
    key, value = t.get("key") or "", t.get("value") or ""
    if key == SWAP_TAINT:
        return f"swap: {value}"
    if key == DEGRADED_TAINT:
        return f"degraded: {value}"
    return f"taint {key}" + (f"={value}" if value else "") + f":{t.get('effect', '')}"


@dataclass(frozen=True)
class NodeClass:
    """One node classified for every pod class.

    Attributes:
        facts: what was read.
        reasons: class name -> why its GPUs do not count for the class (empty: they count).
    """

    facts: NodeFacts
    reasons: Mapping[str, tuple[str, ...]]
    usable: Mapping[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Node name."""
        return self.facts.name

    @property
    def degraded(self) -> bool:
        """GPU allocatable below capacity."""
        return self.facts.degraded

    def counts(self, cls: str) -> bool:
        """Whether the node's GPUs count for class ``cls``."""
        return not self.reasons[cls]

    def gpus_for(self, cls: str) -> int:
        """GPUs that count for ``cls``: the allocatable ones (on a DRA node, those ``cls``'s claims may be given),
        0 when the node does not count."""
        if not self.counts(cls):
            return 0
        return self.usable.get(cls, self.facts.allocatable or 0)


def classify(node: Mapping[str, Any] | NodeFacts, classes: Sequence[PodClass] | None = None,
             devices: Sequence[Any] | None = None) -> NodeClass:
    """Classify one node for ``classes`` (default :func:`default_classes`); see the module docstring.

    ``devices``: the node's DRA GPUs (:func:`gpufleet.fleet.devices.gpus_by_node`), for a Node dict
    whose GPUs are allocated through DRA (None: a device-plugin node, or facts already given).

    Reasons are short strings for people: ``virtual node``, ``NotReady``,
    ``cordoned``, ``swap: <reason>``, ``degraded: <fault>``,
    ``taint <key>=<value>:<effect>``, ``nvidia.com/gpu allocatable 7 < capacity 8``,
    ``GPUs out 1 of 8: gpu-3 gpufleet.io/gpu-unhealthy=gpu_temp:NoSchedule``,
    or the refusal of a fractional GPU count.
    """
    facts = node if isinstance(node, NodeFacts) else NodeFacts.of(node, devices)
    classes = default_classes() if classes is None else classes
    common: list[str] = []
    if facts.virtual:
        common.append("virtual node")
    if facts.problem:
        common.append(facts.problem)
    if not facts.ready:
        common.append("NotReady")
    if facts.unschedulable:
        common.append("cordoned")
    reasons: dict[str, tuple[str, ...]] = {}
    usable: dict[str, int] = {}
    for cls in classes:
        out = list(common)
        for t in untolerated(facts.taints, cls.tolerations, comparison_operators=cls.comparison_operators):
            if t.get("key") == "node.kubernetes.io/unschedulable" and facts.unschedulable:
                continue  # the cordon already said it
            out.append(_taint_reason(t))
        if facts.devices is not None:
            usable[cls.name] = facts.usable_gpus(cls)
            if usable[cls.name] < len(facts.devices) and not cls.partial_nodes:
                out.append(_devices_reason(facts.devices, cls))
        elif facts.degraded and not cls.partial_nodes:
            out.append(f"{GPU_RESOURCE} allocatable {facts.allocatable} < capacity {facts.capacity}")
        reasons[cls.name] = tuple(out)
    return NodeClass(facts, reasons, usable)


def _devices_reason(devices: Sequence[Any], cls: PodClass) -> str:
    """``GPUs out 1 of 8: gpu-3 gpufleet.io/gpu-unhealthy=gpu_temp:NoSchedule``: the devices ``cls`` may not be given."""
    out = [(g, g.blocking(cls.device_tolerations)) for g in devices]
    out = [(g, b) for g, b in out if b]
    shown = "; ".join(f"{g.device} " + ", ".join(f"{t.get('key', '')}" + (f"={t['value']}" if t.get("value") else "")
                                                  + f":{t.get('effect', '')}" for t, _ in b) for g, b in out[:4])
    return f"GPUs out {len(out)} of {len(devices)}: {shown}"
