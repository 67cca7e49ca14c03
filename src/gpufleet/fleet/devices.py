"""GPUs allocated through DRA: the devices of a node and their taints (pure).

Where a node group's GPUs are allocated through Dynamic Resource
Allocation (inventory ``gpu_allocation: dra``), NVIDIA's DRA driver
publishes one device per GPU in ``ResourceSlice``s (driver
``gpu.nvidia.com``, pool = the node's name, device ``gpu-<minor>`` with
attributes ``uuid``, ``resource.kubernetes.io/pciBusID``, ``index``...),
and a GPU is taken out of service by a device taint: in the slice itself
(the driver's own health taints) or through a ``DeviceTaintRule`` (node
health's, a person's ``invoke gpu.remove``). This module reads both into
one :class:`Gpu` per device and answers which GPUs a claim with given
tolerations may still be given: the classifier
(:mod:`gpufleet.fleet.classify`) counts a DRA node's GPUs this way, per
pod class, as it counts a device-plugin node's allocatable GPUs.

Semantics follow ``k8s.io/api/resource/v1`` (Kubernetes 1.37, where device
taints are GA):

* a ``DeviceTaintRule``'s ``spec.deviceSelector`` matches a device when each
  of ``driver``, ``pool`` and ``device`` it sets is equal; without a
  selector it matches nothing. Its CEL ``selectors`` cannot be evaluated
  here: a rule that has them is taken to match every device its other
  fields match (over-counting GPUs out, never under-counting);
* taint effects ``NoSchedule`` and ``NoExecute`` keep a claim off a device
  unless one of its tolerations tolerates the taint (``None`` and unknown
  effects never do); tolerations match as node tolerations do
  (:func:`gpufleet.fleet.classify.tolerates`: empty effect matches every
  effect, ``Exists`` any value, empty key with ``Exists`` every key).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.names import GPU_ATTR_INDEX, GPU_ATTR_PCI_BUS_ID, GPU_ATTR_UUID, GPU_DRIVER

Obj = Mapping[str, Any]
#: Device taint effects that keep a claim off a device.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Gpu:
    """One GPU device of a node, with every taint on it.

    Attributes:
        node: the node it is attached to (the slice's ``spec.nodeName``).
        driver: the DRA driver (``gpu.nvidia.com``).
        pool: its pool (NVIDIA's driver: the node's name).
        device: its name in the pool (``gpu-3``).
        uuid: NVML's UUID (attribute ``uuid``), None when not published.
        pci_bus_id: PCI address (``resource.kubernetes.io/pciBusID``, ``0000:5d:00.0``), None when not published.
        index: NVML index (attribute ``index``, else ``minor``), None when not published.
        taints: ``(taint, source)`` pairs; ``source`` is ``"slice"`` or ``"rule:<name>"``.
    """

    node: str
    driver: str
    pool: str
    device: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    index: int | None = None
    taints: tuple[tuple[Mapping[str, Any], str], ...] = ()

    def blocking(self, tolerations: Iterable[Mapping[str, Any]] = ()) -> list[tuple[Mapping[str, Any], str]]:
        """The taints that keep a claim with ``tolerations`` off this device (NoSchedule, NoExecute), in order."""
        from gpufleet.fleet.classify import tolerated

        tols = list(tolerations)
        return [(t, src) for t, src in self.taints if t.get("effect") in BLOCKING_EFFECTS and not tolerated(tols, t)]

    def usable(self, tolerations: Iterable[Mapping[str, Any]] = ()) -> bool:
        """Whether a new claim with ``tolerations`` may be given this device."""
        return not self.blocking(tolerations)

    @property
    def label(self) -> str:
        """``gpu-3`` (index 3, 0000:5d:00.0): for people."""
        extra = ", ".join(str(x) for x in (f"index {self.index}" if self.index is not None else None, self.pci_bus_id)
                          if x)
        return f"{self.device} ({extra})" if extra else self.device


def _attr(device: Obj, name: str, driver: str) -> Any:
    """A device attribute's value (``string``/``int``/``bool``/``version``), by qualified or driver-local name."""
    attrs = device.get("attributes") or {}
    raw = attrs.get(name)
    if raw is None and "/" not in name:
        raw = attrs.get(f"{driver}/{name}")
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return raw[kind]
    return None


def normalize_bus_id(bus_id: str | None) -> str | None:
    """A PCI address in one form: ``00000000:5D:00.0`` (NVML) and ``0000:5d:00.0`` (sysfs) -> ``0000:5d:00.0``."""
    if not bus_id:
        return None
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return bus_id.strip().lower()
    domain, bus, rest = parts
    try:
        return f"{int(domain, 16):04x}:{bus}:{rest}"
    except ValueError:
        return bus_id.strip().lower()


def rule_matches(rule: Obj, driver: str, pool: str, device: str) -> bool:
    """Whether a ``DeviceTaintRule`` selects the device (module docstring)."""
    sel = (rule.get("spec") or {}).get("deviceSelector")
    if sel is None:
        return False
    return all(sel.get(key) in (None, value) for key, value in (("driver", driver), ("pool", pool), ("device", device)))


def gpus_by_node(slices: Iterable[Obj], rules: Iterable[Obj] = (), driver: str = GPU_DRIVER) -> dict[str, list[Gpu]]:
    """Every GPU of ``driver`` per node, with the taints of its slice and of every matching DeviceTaintRule.

    Only the newest generation of each pool counts (a driver replaces its
    slices by bumping ``spec.pool.generation``); slices without a node (network-attached
    pools) are left out.

    Args:
        slices: ResourceSlice objects (any drivers; others are ignored).
        rules: DeviceTaintRule objects.
        driver: the driver whose devices are GPUs.

    Returns:
        node -> its GPUs, ordered by index then device name.
    """
    slices = [s for s in slices if (s.get("spec") or {}).get("driver") == driver and (s.get("spec") or {}).get("nodeName")]
    newest: dict[str, int] = {}
    for s in slices:
        pool = s["spec"].get("pool") or {}
        newest[pool.get("name", "")] = max(newest.get(pool.get("name", ""), 0), int(pool.get("generation") or 0))
    rules = list(rules)
    out: dict[str, list[Gpu]] = {}
    for s in slices:
        spec = s["spec"]
        pool = (spec.get("pool") or {}).get("name", "")
        if int((spec.get("pool") or {}).get("generation") or 0) != newest[pool]:
            continue
        for d in spec.get("devices") or []:
            name = d.get("name", "")
            taints: list[tuple[Mapping[str, Any], str]] = [(t, "slice") for t in d.get("taints") or []]
            for r in rules:
                if rule_matches(r, driver, pool, name):
                    taint = (r.get("spec") or {}).get("taint") or {}
                    taints.append((taint, f"rule:{(r.get('metadata') or {}).get('name', '')}"))
            index = _attr(d, GPU_ATTR_INDEX, driver)
            if index is None:
                index = _attr(d, "minor", driver)
            out.setdefault(spec["nodeName"], []).append(Gpu(
                node=spec["nodeName"], driver=driver, pool=pool, device=name, uuid=_attr(d, GPU_ATTR_UUID, driver),
                pci_bus_id=normalize_bus_id(_attr(d, GPU_ATTR_PCI_BUS_ID, driver)),
                index=int(index) if isinstance(index, int) else None, taints=tuple(taints)))
    for gpus in out.values():
        gpus.sort(key=lambda g: (g.index if g.index is not None else 1 << 30, g.device))
    return out


class UnknownGpu(LookupError):
    """No GPU of the node matches what was named; the message lists the node's GPUs."""


def find(gpus: Sequence[Gpu], node: str, which: str) -> Gpu:
    """The GPU of ``node`` that ``which`` names: a device name (``gpu-3``), an index (``3``), a UUID or a PCI bus id.

    Raises:
        UnknownGpu: none matches (naming the node, the value and its GPUs), or the node has no DRA GPUs.
    """
    if not gpus:
        raise UnknownGpu(f"node {node} has no GPUs published through DRA (no ResourceSlice of {GPU_DRIVER} for it): "
                         "its GPUs are removed with the node (invoke node.swap), not one by one")
    w = which.strip()
    bus = normalize_bus_id(w)
    for g in gpus:
        if w == g.device or w == g.uuid or (w.isdigit() and g.index == int(w)) or (bus and bus == g.pci_bus_id):
            return g
    known = ", ".join(f"{g.device} (index {g.index}, {g.uuid})" for g in gpus)
    raise UnknownGpu(f"node {node}: no GPU {which!r}: expected a device name, index, UUID or PCI bus id of {known}")


def match_series(gpus: Sequence[Gpu], labels: Mapping[str, str]) -> Gpu | None:
    """The GPU an exporter series is about: by its ``uuid`` label, else ``pci_bus_id``, else ``gpu`` (index).

    The UUID and bus id stay with a GPU when another drops off the bus; the
    index does not, so it is the last resort (the exporter's labels,
    :mod:`gpufleet.exporter.collector`).
    """
    uuid, bus, index = labels.get("uuid") or None, normalize_bus_id(labels.get("pci_bus_id")), labels.get("gpu", "")
    for g in gpus:
        if uuid and g.uuid == uuid:
            return g
    for g in gpus:
        if bus and g.pci_bus_id == bus:
            return g
    if index.isdigit():
        for g in gpus:
            if g.index == int(index):
                return g
    return None
