"""Pure parts of node health added for a fleet that must trust it: telemetry faults, saturated counters, the breaker."""

from __future__ import annotations

import pytest

from gpufleet import cliargs
from gpufleet.fleet import nodes as nodeutil
from gpufleet.node_health import breaker
from gpufleet.node_health.faults import Fault, Queries, Rules, evaluate
from gpufleet.node_health.config import Configuration
from roles.node_health.config import configuration as node_health_configuration
from gpufleet.node_health.remediate import decide, telemetry_nodes
from gpufleet.names import DEGRADED_TAINT, GPU_COUNT_LABEL, SWAP_TAINT, VIRTUAL_NODE_LABEL

from ..builders import node

NOW = 1_800_000_000.0
RULES = Rules(hot_samples=3, scrape_interval_seconds=15, telemetry_stale_seconds=60)


def vec(metric: dict, value: float, at: float = NOW) -> dict:
    """An instant-vector sample."""
    return {"metric": metric, "value": [at, str(value)]}


def seen(node_name: str, gpus: int) -> list[dict]:
    """``telemetry_gpus`` rows of a node whose exporter shows ``gpus`` GPUs (and its node-wide series)."""
    return [vec({"node": node_name, "gpu": ""}, 2)] + [vec({"node": node_name, "gpu": str(g)}, 30) for g in range(gpus)]


# ---------------------------------------------------------------------------- telemetry


def test_telemetry_failing_stale_absent_and_short_of_gpus_each_a_telemetry_fault():
    expected = {n: 8 for n in ("ok", "failing", "stale", "absent", "short", "nvml")}
    res = {
        "telemetry_gpus": seen("ok", 8) + seen("failing", 8) + seen("stale", 8) + seen("short", 7)
        + [vec({"node": "nvml", "gpu": ""}, 1)],
        "telemetry_failing": [vec({"node": "failing", "collector": "nvml"}, 0)],
        "telemetry_last_success": [vec({"node": "ok", "collector": "nvml"}, NOW - 15),
                                   vec({"node": "stale", "collector": "nvml"}, NOW - 61)],
        "nvml_unavailable": [vec({"node": "nvml"}, 0)],
    }
    faults = evaluate(res, RULES, NOW, expected_gpus=expected)
    assert {n: [f.kind for f in fs] for n, fs in faults.items()} == {
        n: ["telemetry"] for n in ("absent", "failing", "nvml", "short", "stale")}
    detail = {n: fs[0].detail for n, fs in faults.items()}
    assert detail["failing"].startswith("GPU telemetry failing: the exporter's nvml collector could not read NVML")
    assert detail["stale"] == "GPU telemetry stale: the exporter's nvml collector last read NVML 61s ago (bound 60s)"
    assert detail["absent"] == "GPU telemetry absent: no gpufleet_gpu_* series in Prometheus, 8 GPUs expected"
    assert detail["short"] == "GPU telemetry incomplete: 7 of 8 expected GPUs have series in Prometheus"
    assert detail["nvml"].startswith("GPU telemetry failing: NVML unavailable")


def test_telemetry_at_the_stale_bound_is_fresh():
    res = {"telemetry_gpus": seen("a", 8), "telemetry_last_success": [vec({"node": "a", "collector": "nvml"}, NOW - 60)]}
    assert evaluate(res, RULES, NOW, expected_gpus={"a": 8}) == {}


def test_only_nodes_that_should_have_gpus_and_are_judged_count():
    res = {"telemetry_gpus": seen("a", 8),
           "telemetry_failing": [vec({"node": "cpu", "collector": "nvml"}, 0), vec({"node": "other", "collector": "nvml"}, 0)]}
    # a CPU node (0 GPUs expected) and a node not judged are never telemetry faults
    faults = evaluate(res, RULES, NOW, expected_gpus={"a": 8, "cpu": 0, "other": 8, "b": 8}, telemetry_nodes=["a", "cpu", "b"])
    assert list(faults) == ["b"] and faults["b"][0].detail.startswith("GPU telemetry absent")


def test_no_node_blamed_when_prometheus_has_no_gpu_series_at_all_or_the_query_failed():
    expected = {"a": 8, "b": 8}
    assert evaluate({"telemetry_gpus": []}, RULES, NOW, expected_gpus=expected) == {}
    assert evaluate({}, RULES, NOW, expected_gpus=expected) == {}  # every query failed: nothing judged


def test_telemetry_queries_read_the_exporters_collector_status():
    q = Queries(RULES).all()
    assert q["telemetry_failing"] == 'gpufleet_exporter_collector_success{collector="nvml"} == 0'
    assert q["telemetry_last_success"] == 'gpufleet_exporter_collector_last_success_timestamp_seconds{collector="nvml"}'
    assert q["telemetry_gpus"] == ("count by (node, gpu) (gpufleet_gpu_lost or gpufleet_gpu_erroring or "
                                   "gpufleet_gpu_nvml_available)")
    assert Queries(Rules(node_label="host")).all()["telemetry_gpus"].startswith("count by (host, gpu)")


def test_expected_gpus_from_the_count_label_else_the_capacity():
    assert nodeutil.expected_gpus(node("a", gpus=8, labels={GPU_COUNT_LABEL: "4"})) == 4
    assert nodeutil.expected_gpus(node("b", gpus=8)) == 8
    assert nodeutil.expected_gpus(node("c", gpus=8, labels={GPU_COUNT_LABEL: "eight"})) == 8
    assert nodeutil.expected_gpus({"metadata": {"name": "cpu"}, "status": {}}) is None
    assert nodeutil.expected_gpus(node("v", labels={VIRTUAL_NODE_LABEL[0]: VIRTUAL_NODE_LABEL[1]})) is None


def test_telemetry_judges_ready_selected_gpu_nodes_past_the_grace():
    young = node("young")
    young["metadata"]["creationTimestamp"] = "2027-01-15T07:59:30Z"  # 30 s before NOW: exporter still starting
    old = node("old")
    old["metadata"]["creationTimestamp"] = "2027-01-15T07:00:00Z"
    nodes = {"old": old, "young": young, "down": node("down", ready=False), "cpu": node("cpu", gpus=0),
             "other": node("other", labels={"pool": "b"}), "v": node("v", labels={VIRTUAL_NODE_LABEL[0]: VIRTUAL_NODE_LABEL[1]})}
    assert telemetry_nodes(nodes, Configuration(rules=RULES), NOW) == ["old", "other"]
    picky = Configuration(rules=RULES, telemetry_node_selector={"matchExpressions": [{"key": "pool", "operator": "NotIn",
                                                                                  "values": ["b"]}]})
    assert telemetry_nodes(nodes, picky, NOW) == ["old"]


def test_a_telemetry_fault_degrades_by_default():
    nodes = {n: node(n) for n in ("blind", "a", "b", "c")}
    d = decide({"blind": [Fault("blind", "telemetry", "GPU telemetry absent", NOW)]}, nodes, Configuration(), NOW)
    assert [(x.node, x.action) for x in d] == [("blind", "degrade")]


# ---------------------------------------------------------------------------- saturated counters


def test_a_saturated_error_counter_is_at_least_its_maximum_in_errors():
    res = {"ib_saturated": [vec({"node": "s", "hca": "mlx5_0", "port": "1", "link_layer": "InfiniBand",
                                 "counter": "symbol_error"}, 1),
                            vec({"node": "l", "hca": "mlx5_1", "port": "1", "link_layer": "InfiniBand",
                                 "counter": "link_downed"}, 1),
                            vec({"node": "x", "hca": "mlx5_0", "port": "1", "counter": "port_xmit_data"}, 1)]}
    faults = evaluate(res, RULES, NOW)
    assert sorted(faults) == ["l", "s"]  # a saturated data counter is no error
    assert faults["s"][0].kind == "ib_errors"
    assert "symbol_error{hca=mlx5_0,port=1}=65535: at least 65535 errors" in faults["s"][0].detail
    assert "perfquery -x -R" in faults["s"][0].detail
    assert "link_downed{hca=mlx5_1,port=1}=255: at least 255 errors" in faults["l"][0].detail
    # a threshold above the maximum tolerates it; a return does not clear it (only a reset does)
    assert "l" not in evaluate(res, Rules(ib_error_threshold=255), NOW)
    assert "s" in evaluate(res, RULES, NOW, returned_at={"s": NOW - 5})


def test_the_saturation_query_reads_infiniband_error_counters_only():
    q = Queries(RULES).all()["ib_saturated"]
    assert q.startswith('gpufleet_infiniband_counter_saturated{link_layer!="Ethernet",counter=~"symbol_error|')
    assert "link_downed" in q and "port_xmit_data" not in q and q.endswith("== 1")


def test_a_saturated_counter_keeps_a_degraded_node_degraded():
    """The node stays in the degraded tier (skip: already degraded) until the counter is reset."""
    deg = node("s", taints=[{"key": DEGRADED_TAINT, "value": "ib_errors", "effect": "NoSchedule"}])
    faults = evaluate({"ib_saturated": [vec({"node": "s", "hca": "mlx5_0", "port": "1", "counter": "symbol_error"}, 1)]},
                      RULES, NOW)
    d = decide(faults, {"s": deg, "a": node("a")}, Configuration(), NOW)
    assert [(x.action, x.why) for x in d] == [("skip", "already degraded")]


# ---------------------------------------------------------------------------- circuit breaker


def _faults(*names: str, kind: str = "xid") -> dict[str, list[Fault]]:
    return {n: [Fault(n, kind, "detail", NOW - i)] for i, n in enumerate(names)}


def test_fleet_share_counts_gpu_nodes_out_of_service_with_the_classifier():
    nodes = {"ok": node("ok"), "cordoned": node("cordoned", cordoned=True), "down": node("down", ready=False),
             "deg": node("deg", taints=[{"key": DEGRADED_TAINT, "value": "x", "effect": "NoSchedule"}]),
             "system": node("system", gpus=0, flavor=None),
             "v": node("v", labels={VIRTUAL_NODE_LABEL[0]: VIRTUAL_NODE_LABEL[1]})}
    share = breaker.fleet_share(nodes)
    assert share.total == 4 and share.out == {"cordoned", "down", "deg"} and share.share == 0.75


def test_breaker_holds_actions_past_the_share_and_says_why():
    nodes = {f"n{i}": node(f"n{i}") for i in range(10)}
    nodes["n0"] = node("n0", cordoned=True)  # a person's cordon counts as out of service too
    settings = Configuration(max_nodes_out=10, max_unhealthy_share=0.3)
    d = {x.node: x for x in decide(_faults("n1", "n2", "n3", "n4"), nodes, settings, NOW)}
    # 1 of 10 out; 0.3 allows 3: two more go, the rest are held
    taken = [n for n, x in d.items() if x.action == "swap"]
    held = [n for n, x in d.items() if x.action == "defer"]
    assert len(taken) == 2 and len(held) == 2
    assert all(d[n].breaker and d[n].intended == "swap" for n in held)
    assert d[held[0]].why == ("circuit breaker: 3 of 10 GPU nodes out of service; node_health_max_unhealthy_share 0.3 "
                              "allows 3")


def test_breaker_lets_nodes_already_out_of_service_act_and_a_resume_lifts_it():
    nodes = {f"n{i}": node(f"n{i}") for i in range(4)}
    nodes["n0"] = node("n0", taints=[{"key": DEGRADED_TAINT, "value": "gpu_temp", "effect": "NoSchedule"}])
    nodes["n1"] = node("n1", ready=False)
    settings = Configuration(max_nodes_out=4, max_unhealthy_share=0.5)
    d = {x.node: x for x in decide(_faults("n0", "n1", "n2"), nodes, settings, NOW)}
    assert d["n0"].action == "swap" and d["n0"].escalation  # degraded -> swap: no change to the share
    assert d["n1"].action == "swap"  # NotReady: already out of service
    assert d["n2"].action == "defer" and d["n2"].breaker  # 3 of 4 would be out
    d = {x.node: x for x in decide(_faults("n2"), nodes, settings, NOW, resumed=True)}
    assert d["n2"].action == "swap"


def test_breaker_resumes_by_itself_when_the_share_falls():
    nodes = {f"n{i}": node(f"n{i}") for i in range(4)}
    for n in ("n0", "n1"):
        nodes[n] = node(n, taints=[{"key": SWAP_TAINT, "value": "x", "effect": "NoSchedule"}])
    settings = Configuration(max_nodes_out=4, max_unhealthy_share=0.5)
    assert decide(_faults("n2"), nodes, settings, NOW)[0].breaker
    nodes["n1"] = node("n1")  # returned
    assert decide(_faults("n2"), nodes, settings, NOW)[0].action == "swap"


def test_breaker_share_limits():
    assert breaker.allows(5, 10, 0.5) and not breaker.allows(6, 10, 0.5)
    assert breaker.allows(3, 10, 0.3)  # 0.3 * 10 is 3.0000000000000004
    assert breaker.allows(1, 0, 0.0) and not breaker.allows(1, 2, 0.0)
    assert breaker.max_out(10, 0.3) == 3 and breaker.max_out(3, 0.5) == 1


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_a_share_outside_zero_to_one_is_refused_naming_the_variable(bad):
    from gpufleet_admin.inventory import InventoryError
    from roles.registry import load

    with pytest.raises(ValueError, match=r"max_unhealthy_share\n.*a share from 0 to 1"):
        Configuration(max_unhealthy_share=bad)
    with pytest.raises(InventoryError, match=r"node_health_max_unhealthy_share: .*expected a share from 0 to 1"):
        load("local", overrides={"node_health_max_unhealthy_share": bad})
    with pytest.raises(Exception, match="expected a share from 0 to 1"):
        cliargs.share(str(bad))


def test_resume_plan_is_bounded_idempotent_and_withdrawable():
    plan = breaker.plan_resume(None, "ns", 30, NOW, "alice")
    assert plan.changed and plan.until == NOW + 1800
    assert plan.data == {"resume-until": "2027-01-15T08:30:00Z", "resume-by": "alice"}
    cm = {"data": {**plan.data, "state": "open"}}
    assert breaker.resumed(cm, NOW + 1799) and not breaker.resumed(cm, NOW + 1800)
    assert not breaker.plan_resume(cm, "ns", 30, NOW, "alice").changed  # the same again: nothing to do
    off = breaker.plan_resume(cm, "ns", 0, NOW, "alice")
    assert off.changed and off.data == {"resume-until": None, "resume-by": None} and off.until is None
    assert not breaker.plan_resume({"data": {"state": "open"}}, "ns", 0, NOW, "alice").changed
    with pytest.raises(ValueError, match="--minutes -1: expected 0"):
        breaker.plan_resume(None, "ns", -1, NOW, "alice")


def test_breaker_defaults_follow_the_role(local_inv):
    settings = node_health_configuration(local_inv)
    v = local_inv.role("node_health")
    assert settings.max_unhealthy_share == v.node_health_max_unhealthy_share == 0.5
    # the local environment's kwok nodes run no exporter and its real (system) node's GPUs are patched on while
    # sim.flip runs (inventories/local): neither is judged, a GPU node of any other kind is
    assert settings.telemetry_node_selector.api() == {"matchLabels": {}, "matchExpressions": [
        {"key": "gpufleet.io/simulated", "operator": "DoesNotExist", "values": []},
        {"key": "gpufleet.io/node-role", "operator": "NotIn", "values": ["system"]}]}
    kwok, gpu = node("kwok", labels={"gpufleet.io/simulated": "true"}), node("gpu")
    system = node("system", labels={"gpufleet.io/node-role": "system"})
    assert telemetry_nodes({"kwok": kwok, "gpu": gpu, "system": system}, settings, NOW) == ["gpu"]
    assert "telemetry" in settings.degraded_faults
    assert settings.rules.telemetry_stale_seconds == local_inv.role("gpu_metrics").gpu_metrics_telemetry_stale_seconds == 60
