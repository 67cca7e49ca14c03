"""Node health's per-GPU path (pure parts): faults per GPU, what stays the node's, taints, hysteresis, lemons."""

from __future__ import annotations

from gpufleet.fleet.devices import gpus_by_node
from gpufleet.kube.times import now_rfc3339
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.devices import decide, gpu_faults, node_faults_left, taint_for
from gpufleet.node_health.faults import Rules, evaluate
from gpufleet.names import ANN_GPU_HEALTHY_SINCE, ANN_GPU_REMOVED_BY
from gpufleet.ops import gpus as gpuops

from ..fleet.test_devices import device, slice_of
from .test_health_rules import NOW, series

RULES = Rules(hot_samples=3, gpu_temp_celsius=78, scrape_interval_seconds=15)
SETTINGS = Configuration(gpu_hold_seconds=60, lemon_failures=3, degraded_faults=frozenset({"gpu_temp", "memory_temp"}))
GPUS = gpus_by_node([slice_of("n1", [device(i) for i in range(8)]), slice_of("n2", [device(i) for i in range(8)])])


def t(seconds_ago: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - seconds_ago))


def test_a_hot_gpu_is_a_fault_of_that_gpu_named_by_uuid_whatever_its_index():
    res = {"gpu_temp": [series({"node": "n1", "gpu": "0", "uuid": "GPU-0005"}, [80, 85, 90]),  # index moved: uuid wins
                        series({"node": "n1", "gpu": "1", "uuid": "GPU-0001"}, [40, 41, 42]),
                        series({"node": "n3", "gpu": "0", "uuid": "GPU-0000"}, [90, 90, 90])],  # not a DRA node
           "xid": [series({"node": "n2", "gpu": "2", "xid": "79"}, [1, 1], end=NOW - 10)]}
    by_gpu = gpu_faults(res, RULES, NOW, GPUS)
    assert {k: [f.kind for f in fs] for k, fs in by_gpu.items()} == {("n1", "gpu-5"): ["gpu_temp"],
                                                                       ("n2", "gpu-2"): ["xid"]}
    f = by_gpu[("n1", "gpu-5")][0]
    assert f.fault.node == "n1" and f.fault.since == NOW and f.fault.detail.startswith("gpu-5: GPU 0: 80, 85, 90 C")
    # evidence from before the GPU's return is ignored
    assert gpu_faults(res, RULES, NOW, GPUS, {("n1", "gpu-5"): NOW - 20}).keys() == {("n2", "gpu-2")}


def test_the_node_keeps_its_own_faults_and_device_plugin_nodes_keep_everything():
    res = {"gpu_temp": [series({"node": "n1", "gpu": "3", "uuid": "GPU-0003"}, [90, 90, 90]),
                        series({"node": "dp", "gpu": "3"}, [90, 90, 90])],
           "ib_errors": [series({"__name__": "gpufleet_infiniband_port_link_downed_total", "node": "n1", "hca": "mlx5_0",
                                 "port": "1"}, [0] * 19 + [1])],
           "gpu_devices": [{"metric": {"node": "n2"}, "value": [NOW, "7"]}]}
    node_faults = evaluate(res, RULES, NOW, expected_gpus={"n2": 8})
    left = node_faults_left(node_faults, GPUS, gpu_faults(res, RULES, NOW, GPUS))
    assert {n: [f.kind for f in fs] for n, fs in left.items()} == {
        "dp": ["gpu_temp"], "n1": ["ib_errors"], "n2": ["gpu_missing"]}  # 7 of 8 on the bus: no one GPU explains it


def test_taints_by_fault():
    assert taint_for(["gpu_temp"], SETTINGS) == {"key": "gpufleet.io/gpu-degraded", "value": "gpu_temp",
                                                 "effect": "NoSchedule"}
    assert taint_for(["nvlink_errors"], SETTINGS) == {"key": "gpufleet.io/gpu-unhealthy", "value": "nvlink_errors",
                                                      "effect": "NoSchedule"}
    assert taint_for(["gpu_temp", "xid"], SETTINGS) == {"key": "gpufleet.io/gpu-unhealthy", "value": "xid",
                                                        "effect": "NoExecute"}
    assert taint_for(["gpu_temp"], SETTINGS, lemon=True)["effect"] == "NoExecute"


def test_the_configured_noexecute_faults_and_hold_decide():
    """node_health_gpu_noexecute_faults and node_health_gpu_hold_seconds reach the per-GPU path through the
    configuration file's model (roles/node_health/config.py), nothing else."""
    strict = SETTINGS.replace(gpu_noexecute_faults=frozenset({"nvlink_errors"}), gpu_hold_seconds=5)
    assert taint_for(["nvlink_errors"], strict)["effect"] == "NoExecute"
    assert taint_for(["xid"], strict)["effect"] == "NoSchedule"
    name = gpuops.rule_name("n1", "gpu-3")
    cooling = {name: ours("n1", "gpu-3", HOT, **{ANN_GPU_HEALTHY_SINCE: t(30)})}
    assert by(decide({}, GPUS, cooling, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "wait"}
    assert by(decide({}, GPUS, cooling, {}, strict, NOW)) == {("n1", "gpu-3"): "return"}


def ours(node: str, device: str, taint: dict, **ann: str) -> dict:
    """A gpufleet DeviceTaintRule of node health."""
    from gpufleet.fleet.devices import Gpu

    gpu = Gpu(node, "gpu.nvidia.com", node, device)
    obj = gpuops.rule_object(gpu, taint, detail="x", by=gpuops.BY_NODE_HEALTH)
    obj["metadata"]["annotations"].update(ann)
    return obj


def by(decisions) -> dict:
    return {(d.gpu.node, d.gpu.device): d.action for d in decisions}


HOT = {"key": "gpufleet.io/gpu-degraded", "value": "gpu_temp", "effect": "NoSchedule"}


def test_remove_hold_cool_wait_return():
    res = {"gpu_temp": [series({"node": "n1", "gpu": "3", "uuid": "GPU-0003"}, [90, 90, 90])]}
    faulty = gpu_faults(res, RULES, NOW, GPUS)
    assert by(decide(faulty, GPUS, {}, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "remove"}
    name = gpuops.rule_name("n1", "gpu-3")
    out = {name: ours("n1", "gpu-3", HOT)}
    assert by(decide(faulty, GPUS, out, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "hold"}
    assert by(decide({}, GPUS, out, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "cooling"}
    cooling = {name: ours("n1", "gpu-3", HOT, **{ANN_GPU_HEALTHY_SINCE: t(30)})}
    assert by(decide({}, GPUS, cooling, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "wait"}  # 30 s of a 60 s hold
    assert by(decide(faulty, GPUS, cooling, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "reset"}  # back: hold restarts
    cooled = {name: ours("n1", "gpu-3", HOT, **{ANN_GPU_HEALTHY_SINCE: t(61)})}
    assert by(decide({}, GPUS, cooled, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "return"}


def test_escalation_and_what_node_health_leaves_alone():
    name = gpuops.rule_name("n1", "gpu-3")
    xid = gpu_faults({"xid": [series({"node": "n1", "gpu": "3", "uuid": "GPU-0003", "xid": "79"}, [1, 1], end=NOW - 10)]},
                     RULES, NOW, GPUS)
    ds = decide(xid, GPUS, {name: ours("n1", "gpu-3", HOT)}, {}, SETTINGS, NOW)
    assert by(ds) == {("n1", "gpu-3"): "escalate"} and ds[0].taint["effect"] == "NoExecute"
    person = ours("n1", "gpu-3", HOT)
    person["metadata"]["annotations"][ANN_GPU_REMOVED_BY] = gpuops.BY_PERSON
    assert by(decide({}, GPUS, {name: person}, {}, SETTINGS, NOW)) == {}  # a person returns it
    lemon = ours("n1", "gpu-3", HOT, **{"gpufleet.io/gpu-lemon": "repeated failures"})
    assert by(decide({}, GPUS, {name: lemon}, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "skip"}
    foreign = {"metadata": {"name": name}, "spec": {"taint": HOT}}  # not gpufleet's: never touched
    assert by(decide(xid, GPUS, {name: foreign}, {}, SETTINGS, NOW)) == {("n1", "gpu-3"): "skip"}


def test_a_gpu_failing_again_within_the_window_is_a_lemon():
    hot = gpu_faults({"gpu_temp": [series({"node": "n1", "gpu": "3", "uuid": "GPU-0003"}, [90, 90, 90])]}, RULES, NOW, GPUS)
    past = [{"time": t(3600), "action": "remove", "by": "node-health", "fault": "gpu_temp"},
            {"time": t(1800), "action": "return", "by": "node-health"},
            {"time": t(900), "action": "remove", "by": "node-health", "fault": "gpu_temp"},
            {"time": t(800), "action": "remove", "by": "person", "fault": "manual"}]  # a person's: not attributable
    d, = decide(hot, GPUS, {}, {("n1", "gpu-3"): past}, SETTINGS, NOW)
    assert d.action == "remove" and d.lemon and d.taint["effect"] == "NoExecute"
    d, = decide(hot, GPUS, {}, {("n1", "gpu-3"): past[:2]}, SETTINGS, NOW)
    assert not d.lemon and d.taint == HOT


def test_gpu_check_ids_pick_that_gpus_checks():
    gpu = GPUS["n1"][3]
    ids = ["test_gpu_temperature[n1-gpu3]", "test_gpu_temperature[n1-gpu13]", "test_driver_version[n1]",
           "test_gpu_on_pci_bus[n1-0000:1b:00.0]"]
    assert gpuops.gpu_check_ids(gpu, ids) == ["test_gpu_temperature[n1-gpu3]", "test_gpu_on_pci_bus[n1-0000:1b:00.0]"]
    assert now_rfc3339()
