"""One GPU out of service and back (:mod:`gpufleet.ops.gpus`) against the in-memory API server: the DeviceTaintRule
selects that device alone, a dry run writes nothing, both ways are idempotent, a rule gpufleet does not own is left
alone, a lemon and failed checks keep the GPU out, and ``invoke status`` lists the GPUs out per node."""

from __future__ import annotations

import pytest

from gpufleet.names import (ANN_GPU_HEALTH_HISTORY, ANN_GPU_LEMON, ANN_GPU_REMOVED_BY, DEVICE_TAINT_RULE_LABEL,
                            GPU_UNHEALTHY_TAINT, RESOURCE_API)
from gpufleet.ops import gpus as gpuops
from gpufleet.ops.reads import NodeNotFound, list_gpus
from gpufleet_workshop.tasks.fleet_status import gpus_out_rows
from gpufleet_workshop.testing import FakeKube

from ..builders import node
from ..fleet.test_devices import device, slice_of

MANUAL = {"key": GPU_UNHEALTHY_TAINT, "value": "manual", "effect": "NoExecute"}


def _slice(name: str) -> dict:
    return {"apiVersion": RESOURCE_API, "kind": "ResourceSlice", **slice_of(name, [device(i) for i in range(8)])}


@pytest.fixture
def kube() -> FakeKube:
    k = FakeKube()
    k.add(node("n1"), node("n2"), _slice("n1"), _slice("n2"))
    return k


def writes(kube: FakeKube) -> list[str]:
    return [f"{a.verb} {a.resource}" for a in kube.actions if a.verb in ("create", "update", "patch", "delete")]


def test_resolve_names_the_gpu_by_device_index_uuid_or_bus_id_and_refuses_others(kube):
    assert {gpuops.resolve(kube, "n1", w).device for w in ("gpu-5", "5", "GPU-0005", "0000:1d:00.0")} == {"gpu-5"}
    with pytest.raises(gpuops.UnknownGpuInput, match="node n1: no GPU '9': expected a device name"):
        gpuops.resolve(kube, "n1", "9")
    with pytest.raises(NodeNotFound, match="not found"):
        gpuops.resolve(kube, "nowhere", "1")


def test_remove_writes_one_rule_selecting_the_device_alone_and_is_idempotent_a_dry_run_writes_nothing(kube):
    gpu = gpuops.resolve(kube, "n1", "5")
    kube.actions.clear()
    dry = gpuops.remove(kube, gpu, MANUAL, detail="fan noise", dry_run=True)
    assert dry.changed and dry.dry_run and writes(kube) == []
    assert kube.get_or_none(RESOURCE_API, "devicetaintrules", "gpufleet-n1-gpu-5") is None

    done = gpuops.remove(kube, gpu, MANUAL, detail="fan noise")
    rule = kube.get(RESOURCE_API, "devicetaintrules", "gpufleet-n1-gpu-5")
    assert done.changed and rule["spec"] == {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1",
                                                                "device": "gpu-5"}, "taint": MANUAL}
    assert rule["metadata"]["labels"] == {DEVICE_TAINT_RULE_LABEL: "n1"}
    assert rule["metadata"]["annotations"][ANN_GPU_REMOVED_BY] == "person"
    assert '"action": "remove"' in kube.get("v1", "nodes", "n1")["metadata"]["annotations"][ANN_GPU_HEALTH_HISTORY]
    # the node path is untouched: the Node is neither cordoned nor tainted by gpufleet
    assert not kube.get("v1", "nodes", "n1")["spec"].get("unschedulable")
    # only that GPU is out
    gpus = list_gpus(kube)
    assert [g.device for g in gpus["n1"] if not g.usable()] == ["gpu-5"] and all(g.usable() for g in gpus["n2"])

    kube.actions.clear()
    again = gpuops.remove(kube, gpuops.resolve(kube, "n1", "5"), MANUAL, detail="again")
    assert not again.changed and writes(kube) == []


def test_a_rule_gpufleet_does_not_own_is_left_alone(kube):
    kube.add({"apiVersion": RESOURCE_API, "kind": "DeviceTaintRule", "metadata": {"name": "gpufleet-n1-gpu-2"},
              "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-2"},
                       "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}})
    gpu = gpuops.resolve(kube, "n1", "2")
    with pytest.raises(gpuops.ForeignRule, match="not gpufleet's"):
        gpuops.remove(kube, gpu, MANUAL, detail="x")
    kube.actions.clear()
    back = gpuops.give_back(kube, gpu)
    assert not back.changed and writes(kube) == [] and "is not out" in back.notes[-1]
    assert "example.com/maintenance" in back.notes[0]  # named, not deleted
    assert kube.get_or_none(RESOURCE_API, "devicetaintrules", "gpufleet-n1-gpu-2") is not None


def test_give_back_runs_the_checks_refuses_a_lemon_and_is_idempotent(kube):
    gpu = gpuops.resolve(kube, "n1", "3")
    gpuops.remove(kube, gpu, MANUAL, detail="xid 79", by=gpuops.BY_NODE_HEALTH, lemon="3 failures in 168h")
    gpu = gpuops.resolve(kube, "n1", "3")
    with pytest.raises(gpuops.LemonGpu, match="--clear-lemon"):
        gpuops.give_back(kube, gpu)
    kube.actions.clear()
    dry = gpuops.give_back(kube, gpu, clear_lemon=True, dry_run=True, checks=lambda g: pytest.fail("checks ran"))
    assert dry.changed and dry.dry_run and writes(kube) == []
    with pytest.raises(gpuops.ChecksRefused, match=r"stays out: its node checks failed: test_gpu_temp\[n1-gpu3\]"):
        gpuops.give_back(kube, gpu, clear_lemon=True, checks=lambda g: ["test_gpu_temp[n1-gpu3]"])
    assert kube.get_or_none(RESOURCE_API, "devicetaintrules", "gpufleet-n1-gpu-3") is not None
    done = gpuops.give_back(kube, gpu, clear_lemon=True, checks=lambda g: [])
    assert done.changed and kube.get_or_none(RESOURCE_API, "devicetaintrules", "gpufleet-n1-gpu-3") is None
    kube.actions.clear()
    assert not gpuops.give_back(kube, gpuops.resolve(kube, "n1", "3")).changed and writes(kube) == []


def test_a_gpu_check_is_the_one_parametrized_by_that_gpu():
    gpu = list_gpus(_kube_with_one_slice())["n1"][3]
    ids = ["test_gpu_temp[n1-gpu3]", "test_gpu_temp[n1-gpu13]", "test_ib_ports[n1]", "test_pcie[n1-0000:1b:00.0]"]
    assert gpuops.gpu_check_ids(gpu, ids) == ["test_gpu_temp[n1-gpu3]", "test_pcie[n1-0000:1b:00.0]"]


def _kube_with_one_slice() -> FakeKube:
    k = FakeKube()
    k.add(node("n1"), _slice("n1"))
    return k


def test_status_lists_the_gpus_out_per_node_with_who_took_them_out(kube):
    gpuops.remove(kube, gpuops.resolve(kube, "n2", "1"), MANUAL, detail="RMA")
    gpuops.remove(kube, gpuops.resolve(kube, "n1", "6"), {**MANUAL, "value": "xid"}, detail="xid 79",
                  by=gpuops.BY_NODE_HEALTH, lemon="lemon")
    rows = gpus_out_rows(list_gpus(kube), gpuops.rules(kube))
    assert [(r.node, r.device, r.index, r.by, r.lemon) for r in rows] == [("n1", "gpu-6", 6, "node-health", True),
                                                                           ("n2", "gpu-1", 1, "person", False)]
    assert rows[0].taint == f"{GPU_UNHEALTHY_TAINT}=xid:NoExecute"
    assert kube.get(RESOURCE_API, "devicetaintrules", "gpufleet-n1-gpu-6")["metadata"]["annotations"][ANN_GPU_LEMON]
