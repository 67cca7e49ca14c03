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
