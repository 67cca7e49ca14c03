"""GPUs allocated through DRA: slices and DeviceTaintRules to devices, matching, and the classifier per device."""

from __future__ import annotations

import pytest

from gpufleet.fleet.classify import INFERENCE, TRAINING, classify, default_classes
from gpufleet.fleet.capacity import flavor_capacity
from gpufleet.fleet.devices import UnknownGpu, find, gpus_by_node, match_series, normalize_bus_id, rule_matches

from ..builders import node


def device(i: int, **extra) -> dict:
    """A GPU as NVIDIA's driver publishes it (gpufleet_workshop.local.dra.gpu_device's shape)."""
    return {"name": f"gpu-{i}", "attributes": {
        "uuid": {"string": f"GPU-{i:04d}"}, "index": {"int": i},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + i:02x}:00.0"}}, **extra}


def slice_of(node_name: str, devices: list[dict], generation: int = 1, driver: str = "gpu.nvidia.com") -> dict:
    return {"metadata": {"name": f"{node_name}-{generation}"},
            "spec": {"driver": driver, "nodeName": node_name, "pool": {"name": node_name, "generation": generation},
                     "devices": devices}}


def rule(name: str, taint: dict, **selector) -> dict:
    return {"metadata": {"name": name}, "spec": {"deviceSelector": selector, "taint": taint}}


HOT = {"key": "gpufleet.io/gpu-degraded", "value": "gpu_temp", "effect": "NoSchedule"}
DEAD = {"key": "gpufleet.io/gpu-unhealthy", "value": "xid", "effect": "NoExecute"}


def test_devices_carry_their_slice_and_rule_taints():
    slices = [slice_of("n1", [device(i) for i in range(8)]),
              slice_of("n1", [device(0)], generation=0),  # an older generation: ignored
              slice_of("n2", [device(0, taints=[{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}])]),
              slice_of("n3", [device(0)], driver="other.example.com")]
    rules = [rule("r1", HOT, driver="gpu.nvidia.com", pool="n1", device="gpu-3"),
             {"metadata": {"name": "no-selector"}, "spec": {"taint": DEAD}}]  # no selector: matches nothing
    gpus = gpus_by_node(slices, rules)
    assert sorted(gpus) == ["n1", "n2"] and len(gpus["n1"]) == 8
    g3 = gpus["n1"][3]
    assert (g3.device, g3.uuid, g3.index, g3.pci_bus_id) == ("gpu-3", "GPU-0003", 3, "0000:1b:00.0")
    assert [src for _, src in g3.taints] == ["rule:r1"]
    assert not g3.usable() and g3.usable([{"key": "gpufleet.io/gpu-degraded", "operator": "Exists"}])
    assert all(g.usable() for g in gpus["n1"] if g.device != "gpu-3")
    assert not gpus["n2"][0].usable()  # the driver's own taint


def test_rule_selector_semantics():
    r = rule("r", DEAD, driver="gpu.nvidia.com", pool="n1")
    assert rule_matches(r, "gpu.nvidia.com", "n1", "gpu-0") and rule_matches(r, "gpu.nvidia.com", "n1", "gpu-7")
    assert not rule_matches(r, "gpu.nvidia.com", "n2", "gpu-0")
    assert not rule_matches({"spec": {"taint": DEAD}}, "gpu.nvidia.com", "n1", "gpu-0")
    assert rule_matches(rule("all", DEAD), "gpu.nvidia.com", "n1", "gpu-0")  # the empty selector matches all


def test_find_and_match_series_prefer_uuid_then_bus_id_then_index():
    gpus = gpus_by_node([slice_of("n1", [device(i) for i in range(4)])])["n1"]
    assert find(gpus, "n1", "gpu-2").index == 2 and find(gpus, "n1", "2").device == "gpu-2"
    assert find(gpus, "n1", "GPU-0001").device == "gpu-1"
    assert find(gpus, "n1", "00000000:1B:00.0").device == "gpu-3"  # NVML's form of the bus id
    with pytest.raises(UnknownGpu, match="node n1: no GPU 'gpu-9': expected a device name, index"):
        find(gpus, "n1", "gpu-9")
    with pytest.raises(UnknownGpu, match="no GPUs published through DRA"):
        find([], "n9", "0")
    # the index moves when a GPU drops off the bus; UUID and bus id do not
    assert match_series(gpus, {"gpu": "0", "uuid": "GPU-0002"}).device == "gpu-2"
    assert match_series(gpus, {"gpu": "0", "pci_bus_id": "00000000:1A:00.0"}).device == "gpu-2"
    assert match_series(gpus, {"gpu": "1"}).device == "gpu-1"
    assert match_series(gpus, {"gpu": "7"}) is None
    assert normalize_bus_id("00000000:5D:00.0") == "0000:5d:00.0"


def dra_node(name: str = "n1") -> dict:
    """A DRA GPU node: flavor label, Ready, no nvidia.com/gpu in its status."""
    obj = node(name, gpus=0, flavor="h100")
    for key in ("allocatable", "capacity"):
        obj["status"][key].pop("nvidia.com/gpu", None)
    return obj


@pytest.mark.parametrize("partial,train_gpus", [(False, 0), (True, 7)])
def test_a_tainted_gpu_counts_per_device_and_by_the_partial_node_policy(partial, train_gpus):
    gpus = gpus_by_node([slice_of("n1", [device(i) for i in range(8)])],
                        [rule("r", HOT, driver="gpu.nvidia.com", pool="n1", device="gpu-3")])["n1"]
    nc = classify(dra_node(), default_classes(partial_nodes_train=partial), gpus)
    assert nc.gpus_for(TRAINING) == train_gpus
    assert nc.gpus_for(INFERENCE) == 8  # inference claims tolerate the degraded-GPU taint
    if not partial:
        assert nc.reasons[TRAINING] == ("GPUs out 1 of 8: gpu-3 gpufleet.io/gpu-degraded=gpu_temp:NoSchedule",)
    cap = flavor_capacity([dra_node()], classes=default_classes(partial_nodes_train=partial), devices={"n1": gpus})
    assert cap["h100"].gpus == 8 and cap["h100"].schedulable_gpus == train_gpus


def test_an_unhealthy_gpu_is_out_for_inference_too_and_a_node_without_slices_has_no_gpus():
    gpus = gpus_by_node([slice_of("n1", [device(i) for i in range(8)])],
                        [rule("r", DEAD, driver="gpu.nvidia.com", pool="n1", device="gpu-0")])["n1"]
    nc = classify(dra_node(), default_classes(partial_nodes_train=True), gpus)
    assert nc.gpus_for(TRAINING) == nc.gpus_for(INFERENCE) == 7
    assert classify(dra_node()).gpus_for(TRAINING) == 0  # no devices published: nothing to count
