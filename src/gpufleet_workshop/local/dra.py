"""GPUs allocated through DRA on the local cluster, as NVIDIA's DRA driver publishes them.

Two publishers, one description of a GPU:

* kwok nodes whose inventory group says ``gpu_allocation: dra`` have no
  kubelet and no driver: ``local.up`` applies a ``ResourceSlice`` per node
  (:func:`resource_slice`), owned by the Node (it goes with the node), that
  lists the node's GPUs as the driver would (:func:`gpu_device`). The
  scheduler allocates claims from them and kwok plays the pods.
* the real node runs a real kubelet plugin (``gpufleet-dra-driver``, Go, on
  ``k8s.io/dynamic-resource-allocation/kubeletplugin``; sources in
  ``dra_driver/``, built by ``local.install``), which publishes the real
  node's fixture GPUs from :func:`devices_file` and answers the kubelet's
  NodePrepareResources and NodeUnprepareResources.

Each GPU is one device named ``gpu-<minor>`` (NVIDIA's canonical name), pool
= the node's name, with the attributes NVIDIA's driver sets
(kubernetes-sigs/dra-driver-nvidia-gpu ``cmd/gpu-kubelet-plugin/deviceinfo.go``):
``type: gpu``, ``uuid``, ``productName``, ``brand``, ``architecture``,
``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion`` (versions
as semver), ``index`` and ``minor``, the standard
``resource.kubernetes.io/pciBusID``, and capacity ``memory``. The UUIDs and
bus ids are the fixture node's (:func:`gpufleet_workshop.fixtures.node.h100_gpu`),
so a simulated exporter's series (labels ``uuid``, ``pci_bus_id``) name the
same devices. The DeviceClass ``gpu.nvidia.com`` is the one the driver's
chart installs (:func:`device_class`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpufleet.names import (
    GPU_ATTR_INDEX,
    GPU_ATTR_PCI_BUS_ID,
    GPU_ATTR_UUID,
    GPU_DEVICE_CLASS,
    GPU_DRIVER,
    RESOURCE_API,
)
from gpufleet.fleet.catalog import GpuModel
from gpufleet_workshop.fixtures.node import DRIVER_VERSION, Node, healthy_node

#: CUDA driver API version of :data:`gpufleet_workshop.fixtures.node.DRIVER_VERSION` (R550: CUDA 12.4).
CUDA_DRIVER_VERSION = "12.4.0"
#: Architecture and compute capability by GPU product name (NVIDIA's CUDA GPUs table).
ARCHITECTURES = {
    "NVIDIA H100 80GB HBM3": ("Hopper", "9.0.0"),
    "NVIDIA H200": ("Hopper", "9.0.0"),
    "NVIDIA A100-SXM4-80GB": ("Ampere", "8.0.0"),
    "NVIDIA L40S": ("Ada Lovelace", "8.9.0"),
}


def _semver(version: str) -> str:
    """``550.54.15`` stays; ``12.4`` -> ``12.4.0`` (the driver publishes semver versions)."""
    parts = version.split(".")
    return ".".join((parts + ["0", "0"])[:3])


def gpu_device(gpu: Mapping[str, Any], memory_gib: int, driver_version: str = DRIVER_VERSION) -> dict[str, Any]:
    """One GPU as NVIDIA's DRA driver publishes it in a ``ResourceSlice`` (``resource.k8s.io/v1`` Device).

    Args:
        gpu: a fixture GPU (:func:`gpufleet_workshop.fixtures.node.h100_gpu`): ``index``,
            ``uuid``, ``name`` (NVML's product name), ``pci_bus_id`` (``00000000:18:00.0``).
        memory_gib: the GPU's memory (GiB), the device's ``memory`` capacity.
        driver_version: the NVIDIA driver version (``550.54.15``).

    Raises:
        KeyError: ``gpu`` lacks one of the keys above.
    """
    arch, cc = ARCHITECTURES.get(gpu["name"], ("Hopper", "9.0.0"))
    # NVML's bus id has an 8-digit domain; the standard attribute is the PCI address (4-digit domain, lower case).
    domain, rest = gpu["pci_bus_id"].split(":", 1)
    address = f"{int(domain, 16):04x}:{rest.lower()}"
    return {
        "name": f"gpu-{gpu['index']}",
        "attributes": {
            "type": {"string": "gpu"},
            GPU_ATTR_UUID: {"string": gpu["uuid"]},
            "productName": {"string": gpu["name"]},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": arch},
            "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": _semver(driver_version)},
            "cudaDriverVersion": {"version": _semver(CUDA_DRIVER_VERSION)},
            GPU_ATTR_INDEX: {"int": gpu["index"]},
            "minor": {"int": gpu["index"]},
            GPU_ATTR_PCI_BUS_ID: {"string": address},
        },
        "capacity": {"memory": {"value": f"{memory_gib}Gi"}},
    }


def node_devices(desc: Node, memory_gib: int = 80) -> list[dict[str, Any]]:
    """The devices of a fixture node description (its GPUs still on the PCI bus), in index order."""
    return [gpu_device(g, memory_gib, desc.get("driver_version") or DRIVER_VERSION)
            for g in sorted(desc.get("gpus", []), key=lambda g: g["index"]) if g.get("on_pci", True)]


def simulated_devices(node: str, gpus: int, model: GpuModel) -> list[dict[str, Any]]:
    """The devices of a simulated (kwok) node: the fixture node of that name (as ``sim.fleet`` serves its
    exporter), its product name the model's."""
    desc = healthy_node(node, gpus=gpus, hcas=0, nvlinks=0, roce=False)
    for g in desc["gpus"]:
        g["name"] = _product_name(model)
    return node_devices(desc, model.memory_gib)


def _product_name(model: GpuModel) -> str:
    """NVML's product name of a catalog model (``NVIDIA-H100-80GB-HBM3`` -> ``NVIDIA H100 80GB HBM3``)."""
    for name in ARCHITECTURES:
        if name.replace(" ", "-") == model.product or name == model.product:
            return name
    return model.product.replace("-", " ")


def slice_name(node: str) -> str:
    """Name of a simulated node's one ResourceSlice: ``<node>-gpu.nvidia.com``."""
    return f"{node}-{GPU_DRIVER}"


def resource_slice(node: str, node_uid: str | None, devices: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``ResourceSlice`` of a simulated node: pool ``<node>`` (one slice), owned by the Node when its uid is known."""
    meta: dict[str, Any] = {"name": slice_name(node)}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                    "controller": True}]
    return {
        "apiVersion": RESOURCE_API, "kind": "ResourceSlice", "metadata": meta,
        "spec": {"driver": GPU_DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [dict(d) for d in devices]},
    }


def device_class() -> dict[str, Any]:
    """The ``DeviceClass`` of full GPUs, as NVIDIA's driver chart installs it (``gpu.nvidia.com``)."""
    return {
        "apiVersion": RESOURCE_API, "kind": "DeviceClass", "metadata": {"name": GPU_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression":
                                        f"device.driver == '{GPU_DRIVER}' && "
                                        f"device.attributes['{GPU_DRIVER}'].type == 'gpu'"}}]},
    }


def devices_file(path: Path, desc: Node, memory_gib: int = 80) -> bool:
    """Write the real node's devices (the fixture node's GPUs) for ``gpufleet-dra-driver --devices``.

    Returns:
        True when the file changed (the driver reads it at start).
    """
    text = json.dumps(node_devices(desc, memory_gib), indent=1, sort_keys=True) + "\n"
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def driver_argv(binary: Path, node: str, kubeconfig: Path, devices: Path, kubelet_root: Path) -> list[str]:
    """Command line of ``gpufleet-dra-driver`` on the real node (the kubelet's kubeconfig and root folder)."""
    return [str(binary), f"--node-name={node}", f"--kubeconfig={kubeconfig}", f"--devices={devices}",
            f"--kubelet-root={kubelet_root}", "--v=2"]


def model_of(spec: Any) -> GpuModel:
    """The catalog GPU model of an inventory ``NodeSpec`` (by its ``nvidia.com/gpu.product`` label).

    Raises:
        KeyError: no catalog model has that product (naming it).
    """
    from gpufleet.names import GPU_PRODUCT_LABEL
    from gpufleet.fleet.catalog import GPU_MODELS

    product = spec.labels.get(GPU_PRODUCT_LABEL, "")
    for m in GPU_MODELS.values():
        if m.product == product:
            return m
    raise KeyError(f"node {spec.name}: no GPU model of the catalog has product {product!r}")


def apply_slices(k: Any, specs: Iterable[Any]) -> tuple[int, int]:
    """Publish the ResourceSlices of the simulated nodes whose GPUs are allocated through DRA.

    Creates or updates one slice per such node (owned by its Node) and the
    DeviceClass when any is wanted; deletes slices of driver ``gpu.nvidia.com``
    on simulated nodes that are no longer DRA nodes (the real node's driver
    owns its own slice and is left alone). Idempotent.

    Args:
        k: a :class:`gpufleet.kube.Kube` of the cluster.
        specs: the inventory's ``NodeSpec`` objects (``gpu_allocation``, ``gpus``, labels).

    Returns:
        ``(slices applied, slices deleted)``.
    """
    from gpufleet.kube import NotFound
    from gpufleet.names import SIMULATED_LABEL

    specs = [s for s in specs if getattr(s, "gpu_allocation", "device_plugin") == "dra" and s.gpus]
    nodes = {n["metadata"]["name"]: n for n in k.list("v1", "nodes", labelSelector=f"{SIMULATED_LABEL}=true")["items"]}
    if specs:
        k.apply(device_class())
    applied = 0
    wanted = set()
    for s in specs:
        node = nodes.get(s.name)
        obj = resource_slice(s.name, node["metadata"]["uid"] if node else None,
                             simulated_devices(s.name, s.gpus, model_of(s)))
        wanted.add(obj["metadata"]["name"])
        live = k.get_or_none(RESOURCE_API, "resourceslices", obj["metadata"]["name"])
        if live is None or live.get("spec", {}).get("devices") != obj["spec"]["devices"]:
            k.apply(obj)
            applied += 1
    deleted = 0
    for sl in k.list(RESOURCE_API, "resourceslices", fieldSelector=f"spec.driver={GPU_DRIVER}")["items"]:
        name, node = sl["metadata"]["name"], sl["spec"].get("nodeName")
        if node in nodes and name not in wanted:
            try:
                k.delete(RESOURCE_API, "resourceslices", name)
                deleted += 1
            except NotFound:
                pass
    return applied, deleted
