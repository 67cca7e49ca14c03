"""The accountant's exposition and its dashboard row."""

from __future__ import annotations

from prometheus_client import generate_latest

from gpufleet.goodput.account import Account, Interruption
from gpufleet.goodput.metrics import GoodputCollector, registry
from roles.gpu_metrics.dashboards import build_dashboards


def test_exposition_per_job_and_bucket():
    c = GoodputCollector()
    assert "gpufleet_goodput_jobs 0.0" in generate_latest(registry(c)).decode()
    badput = {"queued": 10.0, "starting": 77.0, "checkpoint_saving": 50.0, "progress_lost": 70.0,
              "waiting_for_hardware": 48.0, "other": 1.0}
    c.update([Account("team-a", "llm", "JobSet", 0.0, 801.0, 545.0, badput,
                      interruptions=(Interruption(450.0, 70.0, 505.0),))], duration=0.01, at=1000.0)
    text = generate_latest(registry(c)).decode()
    assert 'gpufleet_job_ettr_ratio{job="llm",namespace="team-a"} 0.680' in text
    assert 'gpufleet_job_badput_seconds{bucket="progress_lost",job="llm",namespace="team-a"} 70.0' in text
    assert text.count("gpufleet_job_badput_seconds{") == 6
    assert 'gpufleet_job_interruptions{job="llm",namespace="team-a"} 1.0' in text
    assert "gpufleet_goodput_last_success_timestamp_seconds 1000.0" in text
    assert 'gpufleet_job_checkpoints_not_counted{job="llm",namespace="team-a"} 0.0' in text
    assert "gpufleet_job_checkpoint_clock_offset_seconds{" not in text  # nothing measured: absent, not 0
    c.update([Account("team-a", "llm", "JobSet", 0.0, 801.0, 545.0, badput, clock_offset=-31.5,
                      clock_offset_source="start records", checkpoints_not_counted=2)])
    text = generate_latest(registry(c)).decode()
    assert ('gpufleet_job_checkpoint_clock_offset_seconds{job="llm",namespace="team-a",source="start records"} -31.5'
            in text)
    assert 'gpufleet_job_checkpoints_not_counted{job="llm",namespace="team-a"} 2.0' in text


def test_queues_dashboard_has_a_goodput_row():
    from roles.gpu_metrics.manifests import dashboard_rules
    from roles.registry import load

    board = build_dashboards(dashboard_rules(load("local")))["gpufleet-queues"]
    rows = [p["title"] for p in board["panels"] if p.get("type") == "row"]
    assert "Goodput" in rows
    exprs = "\n".join(t["expr"] for p in board["panels"] if p.get("type") != "row" for t in p.get("targets", []))
    assert "gpufleet_job_ettr_ratio" in exprs and "sum by (bucket) (gpufleet_job_badput_seconds)" in exprs


def test_the_json_account_keeps_its_keys_and_says_what_it_did_not_count():
    from gpufleet.goodput.main import account_json

    a = Account("team-a", "llm", "JobSet", 0.0, 801.0, 545.0, dict.fromkeys(
        ("queued", "starting", "checkpoint_saving", "progress_lost", "waiting_for_hardware", "other"), 1.0),
        clock_offset=12.25, clock_offset_source="fitted", checkpoints_not_counted=3)
    j = account_json(a)
    assert {"namespace", "job", "kind", "ettr", "wall_clock_seconds", "productive_seconds", "badput_seconds",
            "interruptions", "checkpoints", "checkpoints_known", "reconstructed_runs", "finished"} <= set(j)
    assert (j["checkpoints_not_counted"], j["checkpoint_clock_offset_seconds"], j["checkpoint_clock_offset_source"]) \
        == (3, 12.25, "fitted")
