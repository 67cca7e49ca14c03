"""Pure parts of node health: fault rules over raw samples, decisions (tiers, rate limit, lemons)."""

from __future__ import annotations

import json

from gpufleet.node_health.faults import Queries, Rules, evaluate, growth, hot_streak
from gpufleet.node_health.config import Configuration
from roles.node_health.config import configuration as node_health_configuration
from gpufleet.node_health.remediate import decide
from gpufleet.names import ANN_HEALTH_HISTORY, DEGRADED_TAINT, SWAP_TAINT

from ..builders import node

NOW = 1_800_000_000.0
RULES = Rules(hot_samples=3, gpu_temp_celsius=78, scrape_interval_seconds=15)


def series(metric: dict, values: list[float], *, step: float = 15.0, end: float = NOW) -> dict:
    """A matrix series whose last sample is at ``end``."""
    n = len(values)
    return {"metric": metric, "values": [[end - step * (n - 1 - i), str(v)] for i, v in enumerate(values)]}


def test_hot_streak_needs_n_consecutive_samples():
    pts = [(1, 70), (2, 80), (3, 81), (4, 79)]
    assert hot_streak(pts, 78, 3) == (4, [80, 81, 79])
    assert hot_streak(pts, 78, 4) is None
    assert hot_streak(pts[:2], 78, 3) is None


def test_growth_handles_resets_and_new_series():
    assert growth([(0, 5), (15, 5), (30, 7)], 0, 15) == (2, 30)
    assert growth([(0, 5), (15, 1), (30, 3)], 0, 15) == (3, 15)  # reset: 1 counts from zero
    assert growth([(100, 1), (115, 1)], 0, 15, count_new_series=True) == (1, 100)  # XID counter born in the window
    assert growth([(100, 1), (115, 1)], 0, 15) == (0, None)  # a hardware counter's history is not news
    assert growth([(10, 1), (25, 1)], 0, 15, count_new_series=True) == (0, None)  # existed at the window start


def test_temperature_rule_counts_the_last_n_samples():
    res = {"gpu_temp": [series({"node": "a", "gpu": "3"}, [70, 80, 81, 84]),
                        series({"node": "b", "gpu": "0"}, [80, 81, 70]),
                        series({"node": "c", "gpu": "1"}, [90, 91])]}
    faults = evaluate(res, RULES, NOW)
    assert list(faults) == ["a"]
    f = faults["a"][0]
    assert f.kind == "gpu_temp" and f.since == NOW and "GPU 3: 80, 81, 84 C > 78 C" in f.detail


def test_samples_before_a_return_are_ignored():
    res = {"gpu_temp": [series({"node": "a", "gpu": "3"}, [80, 81, 84, 85])]}
    assert evaluate(res, RULES, NOW, returned_at={"a": NOW - 20}) == {}
    assert "a" in evaluate(res, RULES, NOW, returned_at={"a": NOW - 50})


def test_fatal_xid_ecc_nvlink_ib_and_missing_gpus():
    res = {
        "xid": [series({"node": "x", "gpu": "2", "xid": "79"}, [1, 1], end=NOW - 10),
                series({"node": "y", "gpu": "2", "xid": "13"}, [1, 1], end=NOW - 10)],  # 13 is not fatal
        "ecc": [series({"node": "e", "gpu": "0", "type": "uncorrected"}, [3] * 38 + [4]),
                series({"node": "old", "gpu": "0", "type": "uncorrected"}, [9] * 5)],  # lifetime errors, no growth
        "nvlink_errors": [series({"node": "l", "gpu": "0", "link": "2", "type": "replay"}, [10] * 19 + [12])],
        "ib_errors": [series({"__name__": "gpufleet_infiniband_port_link_downed_total", "node": "i", "hca": "mlx5_0",
                              "port": "1"}, [0] * 19 + [1])],
        "gpu_lost": [{"metric": {"node": "g", "gpu": "5"}, "value": [NOW, "1"]}],
        "gpu_devices": [{"metric": {"node": "d"}, "value": [NOW, "7"]}, {"metric": {"node": "ok"}, "value": [NOW, "8"]}],
    }
    faults = evaluate(res, RULES, NOW, expected_gpus={"d": 8, "ok": 8})
    kinds = {n: [f.kind for f in fs] for n, fs in faults.items()}
    assert kinds == {"d": ["gpu_missing"], "e": ["ecc_uncorrectable"], "g": ["gpu_missing"], "i": ["ib_errors"],
                     "l": ["nvlink_errors"], "x": ["xid"]}
    assert "fatal XID 79" in faults["x"][0].detail
    # thresholds: 2 NVLink errors tolerated -> no fault
    lenient = Rules(scrape_interval_seconds=15, nvlink_error_threshold=2)
    assert "l" not in evaluate(res, lenient, NOW)


def test_queries_are_range_selectors_for_sampled_rules():
    q = Queries(RULES).all()
    assert q["gpu_temp"] == "gpufleet_gpu_temperature_celsius[60s]"
    assert q["ecc"] == 'gpufleet_gpu_ecc_errors_total{type="uncorrected"}[600s]'
    assert q["ib_errors"].startswith('{__name__=~"gpufleet_infiniband_port_symbol_errors_total|')


def _faults(*pairs):
    from gpufleet.node_health.faults import Fault

    return {n: [Fault(n, k, "detail", NOW - i)] for i, (n, k) in enumerate(pairs)}


def test_decide_tiers_and_rate_limit():
    settings = Configuration(max_nodes_out=2)
    nodes = {n: node(n) for n in ("hot1", "hot2", "xid1", "xid2", "gone")}
    nodes["gone"] = node("gone", taints=[{"key": SWAP_TAINT, "value": "x", "effect": "NoSchedule"}])
    d = {x.node: x for x in decide(_faults(("hot1", "gpu_temp"), ("hot2", "gpu_temp"), ("xid1", "xid"), ("xid2", "xid"),
                                           ("gone", "xid"), ("ghost", "xid")), nodes, settings, NOW)}
    # one slot left (gone is out): swaps first, oldest evidence first
    assert d["gone"].action == "skip" and d["ghost"].action == "skip"
    assert d["xid2"].action == "swap"
    assert [d[n].action for n in ("xid1", "hot1", "hot2")] == ["defer"] * 3
    assert d["hot1"].intended == "degrade"


def test_decide_degraded_tier_escalation_and_lemon():
    settings = Configuration(max_nodes_out=1, lemon_failures=3, lemon_window_hours=1)
    deg = node("deg", taints=[{"key": DEGRADED_TAINT, "value": "gpu_temp", "effect": "NoSchedule"}])
    hist = [{"time": "2027-01-15T07:50:00Z", "fault": "gpu_temp"}, {"time": "2027-01-15T07:55:00Z", "fault": "gpu_temp"}]
    lemon = node("lemon", annotations={ANN_HEALTH_HISTORY: json.dumps(hist)})
    nodes = {"deg": deg, "lemon": lemon, "fresh": node("fresh")}
    now = 1_800_000_000.0 + 300  # 2027-01-15T08:05Z
    d = {x.node: x for x in decide(_faults(("deg", "gpu_temp"), ("lemon", "gpu_temp")), nodes, settings, now)}
    assert d["deg"].action == "skip" and d["deg"].why == "already degraded"
    assert d["lemon"].action == "defer" and d["lemon"].lemon  # deg holds the only slot
    d = {x.node: x for x in decide(_faults(("deg", "xid"), ("fresh", "ib_errors")), nodes, settings, now)}
    assert d["deg"].action == "swap" and d["deg"].escalation
    assert d["fresh"].action == "defer"
    d = {x.node: x for x in decide(_faults(("lemon", "gpu_temp")), {"lemon": lemon, "fresh": node("fresh")}, settings, now)}
    assert d["lemon"].action == "swap" and d["lemon"].lemon


def test_a_gpu_erroring_is_missing_like_a_lost_one_and_named_by_bus_id():
    res = {"gpu_erroring": [{"metric": {"node": "n", "gpu": "1", "pci_bus_id": "00000000:2A:00.0", "uuid": ""},
                             "value": [NOW, "1"]}],
           "gpu_lost": [{"metric": {"node": "m", "gpu": "3", "pci_bus_id": "00000000:5D:00.0"}, "value": [NOW, "1"]}]}
    faults = evaluate(res, RULES, NOW)
    assert [(f.kind, f.detail) for f in faults["n"]] == [
        ("gpu_missing", "GPU 1 (00000000:2A:00.0) answers NVML with errors (device handle or every read)")]
    assert faults["m"][0].detail == "GPU 3 (00000000:5D:00.0) lost (NVML GPU_IS_LOST)"
    assert Queries(RULES).all()["gpu_erroring"] == "gpufleet_gpu_erroring == 1"


def test_infiniband_and_roce_rules_select_their_link_layer():
    q = Queries(RULES).all()
    assert q["ib_errors"].endswith(',link_layer!="Ethernet"}[300s]')
    assert q["ib_down"] == 'gpufleet_infiniband_port_state_id{link_layer!="Ethernet"} != 4'
    assert q["roce_down"] == 'gpufleet_infiniband_port_state_id{link_layer="Ethernet"} != 4'
    assert q["roce_errors"] == ('gpufleet_infiniband_port_hw_stat_total{link_layer="Ethernet",counter=~"out_of_sequence|'
                                'packet_seq_err|local_ack_timeout_err|implied_nak_seq_err"}[300s]')
    res = {"roce_errors": [series({"node": "r", "hca": "mlx5_2", "port": "1", "link_layer": "Ethernet",
                                   "counter": "packet_seq_err"}, [4] * 19 + [9])],
           "roce_down": [{"metric": {"node": "d", "hca": "mlx5_3", "port": "1", "link_layer": "Ethernet"},
                          "value": [NOW, "1"]}]}
    faults = evaluate(res, RULES, NOW)
    assert faults["r"][0].kind == "roce_errors" and "counter=packet_seq_err" in faults["r"][0].detail
    assert faults["d"][0].kind == "roce_errors" and "mlx5_3 port 1 (RoCE) state 1" in faults["d"][0].detail
    assert "r" not in evaluate(res, Rules(scrape_interval_seconds=15, roce_error_threshold=5), NOW)


def test_above_the_gpu_threshold_means_strictly_greater_for_alert_node_health_and_node_checks(local_inv):
    """One variable, one meaning: at 78 C nothing acts, above it everything does."""
    import sys
    from pathlib import Path

    from roles.gpu_metrics.manifests import rule_file

    sys.path.insert(0, str(Path(__file__).parents[1] / "nodes"))
    from nodecheck import role_defaults

    m = local_inv.role("gpu_metrics")
    threshold = m.gpu_metrics_gpu_temp_threshold_celsius
    settings = node_health_configuration(local_inv)
    assert settings.rules.gpu_temp_celsius == threshold == role_defaults()["gpu_metrics_gpu_temp_threshold_celsius"]
    exprs = {r["expr"] for g in rule_file(local_inv)["groups"] for r in g["rules"]}
    assert f"gpufleet_gpu_temperature_celsius > {threshold:g}" in exprs
    at = {"gpu_temp": [series({"node": "a", "gpu": "0"}, [threshold] * 4)]}
    above = {"gpu_temp": [series({"node": "a", "gpu": "0"}, [threshold + 1] * 4)]}
    assert evaluate(at, settings.rules, NOW) == {}
    assert [f.kind for f in evaluate(above, settings.rules, NOW)["a"]] == ["gpu_temp"]
