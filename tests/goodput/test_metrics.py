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


def test_queues_dashboard_has_a_goodput_row():
    board = build_dashboards()["gpufleet-queues"]
    rows = [p["title"] for p in board["panels"] if p.get("type") == "row"]
    assert rows[-1] == "Goodput"
    exprs = "\n".join(t["expr"] for p in board["panels"] if p.get("type") != "row" for t in p.get("targets", []))
    assert "gpufleet_job_ettr_ratio" in exprs and "sum by (bucket) (gpufleet_job_badput_seconds)" in exprs
