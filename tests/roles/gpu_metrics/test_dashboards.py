"""roles/gpu_metrics/dashboards.py: the dashboards build, reference the right series, and every query parses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpufleet.prom.server import running_prometheus
from roles.gpu_metrics.dashboards import build_dashboards

EXPOSITIONS = Path(__file__).parents[2] / "exporter" / "fixtures"


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict]:
    from roles.gpu_metrics.manifests import dashboard_rules
    from roles.registry import load

    return build_dashboards(dashboard_rules(load("local")))


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p.get("type") != "row"]


def exprs(board: dict) -> list[str]:
    return [t["expr"] for p in panels(board) for t in p.get("targets", [])]


def test_builds_three_json_dashboards(dashboards):
    assert sorted(dashboards) == ["gpufleet-fabric", "gpufleet-gpus", "gpufleet-queues"]
    for name, board in dashboards.items():
        json.dumps(board)  # plain JSON
        assert board["uid"] == name
        assert "gpufleet" in board["tags"]
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)) and 0 not in ids, f"{name}: panel ids must be unique and set"
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        for panel in panels(board):
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), panel["title"]
            assert panel.get("description"), f"{name}/{panel['title']}: say what the panel shows"


def test_tensor_activity_and_gpu_utilisation_side_by_side(dashboards):
    by_title = {p["title"]: p for p in panels(dashboards["gpufleet-gpus"])}
    tensor, util = by_title["Tensor-core activity"], by_title["GPU utilisation"]
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in tensor["targets"][0]["expr"]
    assert "DCGM_FI_DEV_GPU_UTIL" in util["targets"][0]["expr"]
    assert tensor["gridPos"]["y"] == util["gridPos"]["y"]
    assert tensor["gridPos"]["x"] + tensor["gridPos"]["w"] == util["gridPos"]["x"]


@pytest.mark.parametrize(
    ("name", "needles"),
    [
        (
            "gpufleet-gpus",
            [
                "gpufleet_gpu_temperature_celsius",
                "gpufleet_gpu_memory_temperature_celsius",
                "DCGM_FI_DEV_GPU_TEMP",
                "gpufleet_gpu_lost",
                "gpufleet_gpu_xid_events_total",
                "gpufleet_exporter_collector_success",
                "gpufleet_exporter_collector_last_success_timestamp_seconds",
                "gpufleet_node_health_expected_gpus",
            ],
        ),
        (
            "gpufleet-fabric",
            [
                "rate(gpufleet_infiniband_port_transmit_bytes_total",
                "rate(gpufleet_infiniband_port_receive_bytes_total",
                "gpufleet_infiniband_port_symbol_errors_total",
                "gpufleet_infiniband_port_link_downed_total",
                "gpufleet_infiniband_port_link_error_recovery_total",
                "gpufleet_infiniband_port_receive_errors_total",
                "gpufleet_infiniband_counter_saturated",
                "gpufleet_gpu_nvlink_errors_total",
            ],
        ),
        (
            "gpufleet-queues",
            [
                "kueue_pending_workloads",
                "kueue_admitted_active_workloads",
                "kueue_cluster_queue_resource_usage",
                "kueue_cluster_queue_nominal_quota",
                "gpufleet_flip_external_gpu_cost_total",
                "gpufleet_flip_external_gpu_seconds_total",
            ],
        ),
    ],
)
def test_references_the_series(dashboards, name, needles):
    text = "\n".join(exprs(dashboards[name]))
    missing = [n for n in needles if n not in text]
    assert not missing, f"{name} does not query {missing}"


def test_temperature_panels_draw_node_healths_threshold(dashboards):
    by_title = {p["title"]: p for p in panels(dashboards["gpufleet-gpus"])}
    steps = by_title["GPU temperature"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == 78
    assert by_title["GPU temperature"]["fieldConfig"]["defaults"]["unit"] == "celsius"


def _exported_metric_names() -> set[str]:
    names = set()
    for prom in EXPOSITIONS.glob("*.prom"):
        for line in prom.read_text().splitlines():
            if line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, 1)[0])
    return names


def _goodput_metric_names() -> set[str]:
    """Names the goodput accountant exports (``gpufleet goodput``), from its collector."""
    from prometheus_client import generate_latest

    from gpufleet.goodput.account import Account
    from gpufleet.goodput.metrics import GoodputCollector, registry

    collector = GoodputCollector()
    collector.update([Account("ns", "job", "JobSet", 0.0, 10.0, 9.0, {"other": 1.0})], at=10.0)
    return {re.split(r"[{ ]", line, 1)[0] for line in generate_latest(registry(collector)).decode().splitlines()
            if line and not line.startswith("#")}


def _ledger_metric_names() -> set[str]:
    """Names the virtual kubelets' offload cost ledger exports (:mod:`gpufleet.virtual_kubelet.ledger`), from its collector."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpufleet.virtual_kubelet.ledger import Ledger, LedgerCollector

    registry = CollectorRegistry()
    collector = LedgerCollector()
    registry.register(collector)
    ledger = Ledger(["pool"], register=False)
    collector.add(ledger)
    return {re.split(r"[{ ]", line, 1)[0] for line in generate_latest(registry).decode().splitlines()
            if line and not line.startswith("#")}


def _node_health_metric_names() -> set[str]:
    """Names node health exports (``gpufleet node-health``), from its metrics."""
    from prometheus_client import CollectorRegistry

    from gpufleet.node_health.remediate import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    families = list(registry.collect())
    return {f.name for f in families} | {s.name for f in families for s in f.samples}


#: The exporter's per-collector status (node_exporter's ``node_scrape_collector_success`` convention),
#: ``{collector="nvml"|"infiniband"}``: names fixed with the exporter's collectors, which set them.
COLLECTOR_STATUS = {"gpufleet_exporter_collector_success", "gpufleet_exporter_collector_last_success_timestamp_seconds"}


def test_rules_and_dashboards_only_use_metrics_the_exporter_exports(dashboards):
    """Every gpufleet_* name in alerts and panels exists in some fixture exposition (typos break alerts silently)."""
    exported = (_exported_metric_names() | _goodput_metric_names() | _node_health_metric_names() | COLLECTOR_STATUS
                | _ledger_metric_names())
    texts = [e for board in dashboards.values() for e in exprs(board)]
    from roles.gpu_metrics.manifests import rule_file
    from roles.registry import load

    texts += [r["expr"] for g in rule_file(load("local"))["groups"] for r in g["rules"]]
    # a name ending in "_" is a prefix inside a regex matcher ({__name__=~"gpufleet_gpu_.+"})
    used = {m for t in texts for m in re.findall(r"\bgpufleet_[a-z0-9_]+", t) if not m.endswith("_")}
    assert used, "no gpufleet_ metric referenced at all?"
    assert used - exported == set()


def test_every_query_parses_in_real_prometheus(dashboards, tmp_path):
    """Each panel query, with Grafana's variables substituted, is valid PromQL for Debian's Prometheus."""
    with running_prometheus([], workdir=tmp_path / "prometheus") as prom:
        for name, board in dashboards.items():
            for expr in exprs(board):
                concrete = (expr.replace("$__rate_interval", "1m").replace("$__range", "1h").replace("$node", ".*")
                            .replace("$cluster_queue", ".*"))
                prom.query(concrete)  # raises PrometheusError with the parse error


def test_saturated_error_counters_are_plotted_not_a_flat_zero(dashboards):
    """Beside the link-error rates, a time series of the saturation gauge of the same counters node health reads."""
    from gpufleet.node_health.faults import IB_ERROR_FILES

    from roles.gpu_metrics.dashboards import SATURABLE_ERRORS

    by_title = {p["title"]: p for p in panels(dashboards["gpufleet-fabric"])}
    sat = by_title["Saturated error counters"]
    assert sat["type"] == "timeseries"
    (target,) = sat["targets"]
    assert "gpufleet_infiniband_counter_saturated" in target["expr"] and "{{counter}}" in target["legendFormat"]
    assert set(SATURABLE_ERRORS.split("|")) == set(IB_ERROR_FILES)
    assert "Saturated error counters" in by_title["Link errors (per 5m)"]["description"]
    assert sat["gridPos"]["y"] == by_title["Link errors (per 5m)"]["gridPos"]["y"]  # same row, side by side


def test_gpu_telemetry_panels_use_the_inventorys_stale_bound(dashboards):
    by_title = {p["title"]: p for p in panels(dashboards["gpufleet-gpus"])}
    assert "> 60))" in by_title["GPU telemetry failing or stale"]["targets"][0]["expr"]  # the local inventory's
    assert "gpufleet_node_health_expected_gpus" in by_title["GPU nodes without GPU telemetry"]["targets"][0]["expr"]


def _gpu_panels(**overrides) -> dict[str, dict]:
    from roles.gpu_metrics.manifests import objects
    from roles.registry import load

    cm = next(o for o in objects(load("local", overrides=overrides))
              if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "dashboard-gpufleet-gpus")
    return {p["title"]: p for p in panels(json.loads(cm["data"]["gpufleet-gpus.json"]))}


def test_the_thresholds_drawn_and_stated_are_the_inventorys():
    by_title = _gpu_panels(gpu_metrics_gpu_temp_threshold_celsius=72.5, gpu_metrics_memory_temp_threshold_celsius=90,
                           gpu_metrics_telemetry_stale_seconds=120)
    for title, value in (("GPU temperature", 72.5), ("GPU temperature (dcgm-exporter)", 72.5), ("HBM temperature", 90)):
        assert by_title[title]["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"] == value, title
    assert "above 72.5 C" in by_title["GPU temperature"]["description"]
    assert "above 90 C" in by_title["HBM temperature"]["description"]
    assert "> 120))" in by_title["GPU telemetry failing or stale"]["targets"][0]["expr"]


def test_the_panel_text_states_the_rule_node_health_applies():
    text = _gpu_panels()["GPU temperature"]["description"]
    # node health's rule: the last node_health_hot_samples samples of one GPU above the threshold; gpu_temp is a
    # degraded-tier fault by default; the alert waits gpu_metrics_alert_for_seconds.
    assert "Once 3 samples in a row of one GPU (15 s apart) are above 78 C" in text
    assert "degraded tier (inference only)" in text and "GpufleetGPUTemperatureHigh alert fires after 60 s" in text
    assert "for 1 minute the node is pulled" not in text
    swapped = _gpu_panels(node_health_hot_samples=5, node_health_degraded_faults=["telemetry"])
    assert "Once 5 samples in a row" in swapped["GPU temperature"]["description"]
    assert "out for swap" in swapped["GPU temperature"]["description"]
    assert "out for swap" in swapped["HBM temperature"]["description"]
    off = _gpu_panels(node_health_enabled=False)["GPU temperature"]["description"]
    assert "node health is not deployed here" in off
