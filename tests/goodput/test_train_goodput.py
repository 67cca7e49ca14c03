"""``invoke train.goodput`` without a cluster: input checks, and the table and timeline it shows."""

from __future__ import annotations

from rich.console import Console

from gpufleet.goodput.account import account
from gpufleet.goodput.report import plot_timeline, table

from .builders import T0
from .test_account import CHECKPOINTS, two_runs


def test_bad_inputs_exit_2_before_reaching_a_cluster(cli, tmp_path):
    (tmp_path / "file").write_text("")
    code, _, err = cli("train.goodput", "Bad_Name", "--namespace", "x..y", "--out", str(tmp_path / "file"),
                       "--checkpoint-dir", str(tmp_path / "missing"), "--kubeconfig", "/nonexistent")
    assert code == 2
    assert "NAME 'Bad_Name': expected the job's name" in err
    assert "--namespace 'x..y': expected a namespace name" in err
    assert f"--out '{tmp_path / 'file'}': expected a folder path" in err
    assert f"--checkpoint-dir '{tmp_path / 'missing'}': expected an existing folder" in err


def test_without_a_kubeconfig(cli, tmp_path):
    code, _, err = cli("train.goodput", "llm", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 2 and "--kubeconfig" in err


def test_table_and_timeline(tmp_path):
    w, pods = two_runs()
    a = account(w, pods, CHECKPOINTS, now=T0 + 10_000)
    console = Console(width=120, record=True)
    console.print(table(a))
    text = console.export_text()
    assert "JobSet team-a/llm" in text and "68.0%" in text and "interruption 1" in text and "lost 1.2 min" in text
    png = plot_timeline(a, tmp_path / "timeline.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


def test_a_bad_prometheus_url_exits_2(cli):
    code, _, err = cli("train.goodput", "llm", "--prometheus-url", "prometheus:9090", "--kubeconfig", "/nonexistent")
    assert code == 2 and "--prometheus-url" in err


def test_what_the_admission_cost_outside_is_read_per_window_and_an_unreachable_prometheus_is_said():
    from gpufleet_workshop.tasks.goodput import outside_table, outside_while_admitted
    from gpufleet_workshop.testing.fakeprom import FakeProm

    prom = FakeProm()
    prom.set("sum by (pool) (increase(gpufleet_flip_external_gpu_seconds_total[600s]))",
             [{"metric": {"pool": "rental"}, "value": [0, "7200"]}])
    prom.set("sum by (pool, currency) (increase(gpufleet_flip_external_gpu_cost_total[600s]))",
             [{"metric": {"pool": "rental", "currency": "USD"}, "value": [0, "14.4"]}])
    doc = outside_while_admitted(prom, [(T0, T0 + 600)])
    assert doc["pools"] == {"rental": {"gpu_seconds": 7200.0, "cost": 14.4, "currency": "USD"}}
    console = Console(width=120, record=True)
    console.print(outside_table(doc))
    text = console.export_text()
    assert "rental" in text and "2.00" in text and "14.40 USD" in text
    prom.fail(error="connection refused")
    failed = outside_while_admitted(prom, [(T0, T0 + 600)])
    assert "connection refused" in failed["error"] and "pools" not in failed
    console.print(outside_table(failed))
    assert "not read" in console.export_text()
