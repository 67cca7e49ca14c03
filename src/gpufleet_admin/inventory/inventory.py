"""The validated inventory: hosts, fleet and role variables, and what follows from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gpufleet.kube.quantity import parse_quantity
from gpufleet.names import (
    BLOCK_LABEL,
    FLAVOR_LABEL,
    GPU_ALLOCATION_LABEL,
    GPU_COUNT_LABEL,
    GPU_PRODUCT_LABEL,
    HOSTNAME_LABEL,
    RACK_LABEL,
)

from gpufleet.fleet.catalog import GPU_MODELS, GpuModel
from .models import FleetVars, HostVars

#: Labels every GPU node carries; ResourceFlavors and node checks select on them.
LABEL_FLAVOR = FLAVOR_LABEL
LABEL_RACK = RACK_LABEL
LABEL_BLOCK = BLOCK_LABEL
LABEL_PRODUCT = GPU_PRODUCT_LABEL
LABEL_GPU_COUNT = GPU_COUNT_LABEL
GPU_RESOURCE = "nvidia.com/gpu"
#: GPU nodes are tainted so only pods that asked for GPUs land there.
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Host:
    """One node of the inventory: its name, groups (``all`` first) and validated variables."""

    name: str
    groups: list[str]
    vars: HostVars

    @property
    def gpu(self) -> GpuModel:
        """The host's GPU model from the catalog."""
        return GPU_MODELS[self.vars.gpu_model]


class NodeSpec(BaseModel):
    """A Kubernetes Node as the inventory describes it.

    ``capacity`` maps resource names to quantities: ``nvidia.com/gpu`` (GPUs;
    absent where the GPUs are allocated through DRA), ``cpu`` (cores),
    ``memory`` (bytes, as a quantity) and ``pods``. ``gpus`` and
    ``gpu_allocation`` say how many GPUs the node has and how pods get them
    (``device_plugin`` or ``dra``: then the GPUs are devices of ResourceSlices).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    labels: dict[str, str]
    taints: list[dict[str, str]]
    capacity: dict[str, str]
    gpus: int = 0
    gpu_allocation: str = "device_plugin"


@dataclass(frozen=True)
class FlavorCapacity:
    """Capacity of one ResourceFlavor: nodes, GPUs, CPU cores and memory (bytes), and how its GPUs are allocated."""

    name: str
    gpu_model: GpuModel
    nodes: int
    gpus: int
    cpu: int
    memory_bytes: int
    gpu_allocation: str = "device_plugin"

    @property
    def dra(self) -> bool:
        """The flavor's GPUs are allocated through DRA (pods ask through ResourceClaims)."""
        return self.gpu_allocation == "dra"


@dataclass(frozen=True)
class TopologyLevel:
    """One level of the fabric's topology: its name (``block``, ``rack``, ``hostname``) and node label."""

    name: str
    label: str


#: Every level gpufleet knows, coarse to fine; an inventory uses those its hosts carry.
TOPOLOGY_LEVELS = (TopologyLevel("block", BLOCK_LABEL), TopologyLevel("rack", RACK_LABEL),
                   TopologyLevel("hostname", HOSTNAME_LABEL))


@dataclass
class Inventory:
    """A validated environment: ``hosts`` by name, ``fleet`` and per-role ``roles`` variables.

    ``origin`` maps each cluster-wide variable set outside its role's defaults to the file that set it
    (``inventories/<env>/group_vars/all/...``, the stack config): where a bad value is reported.
    """

    env: str
    root: Path
    hosts: dict[str, Host]
    fleet: FleetVars
    roles: dict[str, BaseModel] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)

    def role(self, name: str) -> BaseModel:
        """Variables of one role (see ``roles/<name>/vars.py``)."""
        return self.roles[name]

    def enabled(self, name: str) -> bool:
        """Whether ``<name>_enabled`` is true."""
        return bool(getattr(self.roles[name], f"{name}_enabled"))

    def node_spec(self, host: Host) -> NodeSpec:
        """The Node ``host`` should be: labels, taints and capacity."""
        v, gpu = host.vars, host.gpu
        labels = {
            "kubernetes.io/hostname": host.name,
            LABEL_FLAVOR: gpu.flavor,
            LABEL_RACK: v.node_rack,
            **({LABEL_BLOCK: v.node_block} if v.node_block else {}),
            LABEL_PRODUCT: gpu.product,
            LABEL_GPU_COUNT: str(v.gpu_count),
            "topology.kubernetes.io/zone": v.node_rack,
            GPU_ALLOCATION_LABEL: v.gpu_allocation,
        }
        capacity = {"cpu": str(v.node_cpu), "memory": v.node_memory, "pods": str(v.node_max_pods)}
        if v.gpu_allocation == "device_plugin":
            capacity = {GPU_RESOURCE: str(v.gpu_count), **capacity}
        return NodeSpec(
            name=host.name,
            labels=labels,
            taints=[dict(GPU_TAINT)] if v.gpu_count else [],
            capacity=capacity,
            gpus=v.gpu_count,
            gpu_allocation=v.gpu_allocation,
        )

    def node_specs(self) -> list[NodeSpec]:
        """Every host as a :class:`NodeSpec`, in inventory order."""
        return [self.node_spec(h) for h in self.hosts.values()]

    def flavors(self) -> dict[str, FlavorCapacity]:
        """Capacity per ResourceFlavor (one flavor per GPU model), from every host."""
        acc: dict[str, list[Host]] = {}
        for h in self.hosts.values():
            if h.vars.gpu_count:
                acc.setdefault(h.gpu.flavor, []).append(h)
        return {
            name: FlavorCapacity(
                name=name,
                gpu_model=hs[0].gpu,
                nodes=len(hs),
                gpus=sum(h.vars.gpu_count for h in hs),
                cpu=sum(h.vars.node_cpu for h in hs),
                memory_bytes=int(sum(parse_quantity(h.vars.node_memory) for h in hs)),
                gpu_allocation=hs[0].vars.gpu_allocation,
            )
            for name, hs in sorted(acc.items())
        }

    def topology_levels(self) -> list[TopologyLevel]:
        """The fabric's levels, coarse to fine: ``block`` (when the hosts carry ``node_block``), ``rack``, ``hostname``.

        These are the levels of the Kueue Topology the kueue role declares,
        and the values ``--topology`` accepts (besides ``none``).
        """
        gpu_hosts = [h for h in self.hosts.values() if h.vars.gpu_count]
        has_blocks = bool(gpu_hosts) and all(h.vars.node_block for h in gpu_hosts)
        return [lv for lv in TOPOLOGY_LEVELS if lv.name != "block" or has_blocks]

    def domains(self, level: str, flavor: str | None = None) -> dict[str, list[Host]]:
        """GPU hosts by topology domain of ``level`` (``block``, ``rack`` or ``hostname``), in inventory order.

        ``flavor`` keeps only the hosts of that ResourceFlavor. A domain is
        named by its own value (racks are unique in the fleet, see
        :mod:`gpufleet_admin.inventory.checks`).

        Raises:
            KeyError: ``level`` is not one of :meth:`topology_levels`.
        """
        names = {lv.name for lv in self.topology_levels()}
        if level not in names:
            raise KeyError(f"topology level {level!r}: expected one of {', '.join(sorted(names))}")
        value = {"block": lambda h: h.vars.node_block, "rack": lambda h: h.vars.node_rack,
                 "hostname": lambda h: h.name}[level]
        out: dict[str, list[Host]] = {}
        for h in self.hosts.values():
            if h.vars.gpu_count and (flavor is None or h.gpu.flavor == flavor):
                out.setdefault(value(h), []).append(h)
        return out
