"""Variables that describe nodes (host-level) and the fleet itself.

Role variables live with their roles (``roles/<role>/vars.py``); these are the
variables that are not any role's: what a node is (GPU model, HCAs, capacity,
pinned driver versions) and how the simulated fleet of the local environment
is sized.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gpufleet_admin.versions import pin

from .types import STRICT, HttpsEndpoint, ImageReference, KnownGpuModel, NonNegativeInt, PositiveInt, Quantity


class Hca(BaseModel):
    """One host channel adapter port as cabled: ``mlx5_0`` port 1 at 400 Gb/s InfiniBand."""

    model_config = STRICT

    name: str = Field(pattern=r"^[a-z0-9_]+$")
    port: PositiveInt = 1
    rate_gbps: PositiveInt
    link_layer: Literal["InfiniBand", "Ethernet"] = "InfiniBand"


class HostVars(BaseModel):
    """What one GPU node is. Set in group_vars/<group>.yml or host_vars/<host>.yml.

    ``node_rack`` and ``node_block`` place the node in the fabric: its rack
    and the block (leaf group of racks) the rack belongs to, each a DNS
    label (a node label value); Kueue's Topology levels are built from them
    (block, rack, hostname). Set them in the rack's and the block's
    group_vars; ``node_block`` is optional, but all GPU nodes have one or none.
    ``node_memory`` is a Kubernetes quantity (bytes, e.g. ``2Ti``); ``node_cpu``
    counts cores. ``gpu_nvlink_count`` overrides the NVLinks per GPU of the
    GPU model's catalog entry. ``node_sysfs_root``, ``node_proc_root``,
    ``node_nvidia_smi``, ``node_nv_fabricmanager`` and
    ``node_kernel_log_command`` (``{minutes}`` is substituted; default
    ``journalctl -k``, then ``dmesg``) exist so the node checks can run against
    fixture nodes; on real nodes leave the defaults.

    ``gpu_allocation`` says how pods get the node's GPUs: ``device_plugin``
    (the default: NVIDIA's device plugin, ``nvidia.com/gpu`` in the Node's
    allocatable) or ``dra`` (NVIDIA's DRA driver publishes one device per GPU
    in ``ResourceSlice``s of driver ``gpu.nvidia.com``; pods ask through
    ResourceClaims, and node health can take one GPU out of service with a
    device taint instead of the whole node). Set it per node group, in the
    group's group_vars; all hosts of one GPU model (one ResourceFlavor) must
    agree, since a flavor is requested one way.
    """

    model_config = STRICT

    node_rack: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    node_block: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    gpu_model: KnownGpuModel
    gpu_count: NonNegativeInt
    node_cpu: PositiveInt
    node_memory: Quantity
    node_max_pods: PositiveInt = 110
    node_hcas: list[Hca] = []
    nvidia_driver_version: str
    nvidia_fabric_manager_version: str
    gpu_nvlink_count: NonNegativeInt | None = None
    gpu_allocation: Literal["device_plugin", "dra"] = "device_plugin"
    node_sysfs_root: str = "/sys"
    node_proc_root: str = "/proc"
    node_nvidia_smi: str = "nvidia-smi"
    node_nv_fabricmanager: str = "nv-fabricmanager"
    node_kernel_log_command: str | None = None
    # Ansible connection settings pass through untouched (testinfra reads them).
    ansible_host: str | None = None
    ansible_user: str | None = None
    ansible_connection: str | None = None
    ansible_python_interpreter: str | None = None


class FleetVars(BaseModel):
    """Fleet-level variables that belong to no role.

    ``fleet_simulated_nodes``: when above 0 (the local environment), that many
    hosts are generated round-robin over the rack groups of ``gpu_nodes``
    instead of being listed in hosts.yml; ``invoke local.up --nodes N`` overrides it.

    ``gpufleet_image``: the image every gpufleet component runs from (the
    virtual kubelets, taint controller, quota sync, node health and the
    fabric exporter): ``REGISTRY/REPO:TAG``, ``REGISTRY/REPO@sha256:<digest>``
    or both; default the image ``invoke image.build`` names
    (``versions.yaml`` ``gpufleet.image``). Pin by digest in production
    (``invoke image.push`` prints the pinned reference).

    ``gpufleet_api_server``: ``https://HOST:PORT`` of the API server for
    gpufleet's pods, where the cluster has no service network to reach it
    through the ``kubernetes`` Service (as Cilium's ``k8sServiceHost``):
    set as ``GPUFLEET_API_SERVER`` in their containers, which
    :func:`gpufleet.kube.config.load_config` reads. Unset: the Service, as usual.

    ``gpufleet_node_selector``: labels of the nodes gpufleet's controllers
    run on (system nodes); with it, their pods tolerate the system-node
    taint (``gpufleet.names.SYSTEM_NODE_TAINT``), e.g.
    ``{gpufleet.io/node-role: system}`` for the local cluster's real node.
    """

    model_config = STRICT

    fleet_name: str = "gpufleet"
    fleet_simulated_nodes: NonNegativeInt = 0
    gpufleet_image: ImageReference = pin("gpufleet", "image")
    gpufleet_api_server: HttpsEndpoint | None = None
    gpufleet_node_selector: dict[str, str] = {}


HOST_KEYS = frozenset(HostVars.model_fields)
FLEET_KEYS = frozenset(FleetVars.model_fields)
