"""The local DRA fleet's devices, slices and DeviceClass (gpufleet_workshop.local.dra), and the driver's build."""

from __future__ import annotations

from gpufleet.fleet.devices import gpus_by_node
from gpufleet_admin.schemas import validate
from gpufleet_workshop.fixtures.node import healthy_node
from gpufleet_workshop.local import dra
from gpufleet_workshop.local.components import component
from gpufleet_workshop.local.install import local_module_files
from roles.registry import load


def test_a_simulated_nodes_slice_lists_its_gpus_as_nvidias_driver_does():
    spec = next(s for s in load("local-dra").node_specs())
    obj = dra.resource_slice(spec.name, "uid-1", dra.simulated_devices(spec.name, spec.gpus, dra.model_of(spec)))
    assert validate(obj) == []  # the pinned Kubernetes' resource.k8s.io/v1 schema
    assert obj["spec"]["pool"] == {"name": spec.name, "generation": 1, "resourceSliceCount": 1}
    devices = obj["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    attrs = devices[3]["attributes"]
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:5d:00.0"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"} and devices[3]["capacity"]["memory"] == {"value": "80Gi"}
    # the same identities as the simulated exporter of that node (sim.fleet), so its series name these devices
    gpu3 = healthy_node(spec.name)["gpus"][3]
    assert attrs["uuid"] == {"string": gpu3["uuid"]}
    g = gpus_by_node([obj])[spec.name][3]
    assert (g.uuid, g.index, g.pci_bus_id) == (gpu3["uuid"], 3, "0000:5d:00.0")


def test_the_device_class_selects_nvidias_gpus():
    assert validate(dra.device_class()) == []
    assert dra.device_class()["metadata"]["name"] == "gpu.nvidia.com"


def test_the_driver_is_built_from_the_pinned_kubelet_plugin_library():
    comp = component("dra_driver")
    files = local_module_files(comp)
    assert "main.go" in files and "kubeletplugin" in files["main.go"]
    assert "\tk8s.io/dynamic-resource-allocation v0.37.2\n" in files["go.mod"]
    assert comp.version.startswith("v0.37.2-") and comp.verify_version == "v0.37.2"


def test_device_plugin_nodes_keep_nvidia_gpu_and_dra_nodes_do_not():
    assert "nvidia.com/gpu" in load("local").node_specs()[0].capacity
    dra_spec = load("local-dra").node_specs()[0]
    assert "nvidia.com/gpu" not in dra_spec.capacity and dra_spec.gpus == 8
    assert dra_spec.labels["gpufleet.io/gpu-allocation"] == "dra"
