"""The invoke tasks behind invoke's own parser: flags, output, exit codes. No cluster needed."""

from __future__ import annotations

import pytest

import yaml


def test_render_prints_yaml(cli):
    code, out, _ = cli("train.render", "--env", "local", "--template", "jobset", "--name", "demo", "--nodes", "2",
                       "--set", "simulated_duration_seconds=30", "--set", "max_restarts=5")
    assert code == 0
    (js,) = yaml.safe_load_all(out)
    assert js["kind"] == "JobSet" and js["spec"]["failurePolicy"]["maxRestarts"] == 5


def test_render_writes_out(cli, tmp_path):
    out_file = tmp_path / "job.yaml"
    code, out, err = cli("train.render", "--env", "staging", "--template", "job", "--name", "demo", "--nodes", "1",
                         "--out", str(out_file))
    assert code == 0 and out == "" and "wrote" in err
    assert [d["kind"] for d in yaml.safe_load_all(out_file.read_text())] == ["Service", "Job"]


def test_bad_inputs_exit_2_with_every_problem(cli):
    code, out, err = cli("train.render", "--env", "local", "--template", "jobset", "--name", "demo",
                         "--nodes", "40", "--set", "oops", "--queue", "x/y")
    assert code == 2 and out == ""
    assert "--nodes 40: expected at most 16" in err
    assert "--set 'oops': expected key=value" in err
    assert "--queue 'x/y': expected a LocalQueue" in err


def test_unknown_env(cli):
    code, _, err = cli("train.render", "--env", "qa", "--name", "demo", "--nodes", "1")
    assert code == 2 and "--env 'qa': expected one of local, local-dra, prod, staging" in err


def test_fleet_nodes_only_for_simulated_fleets(cli):
    code, _, err = cli("train.render", "--env", "prod", "--name", "demo", "--nodes", "1", "--fleet-nodes", "4")
    assert code == 2 and "--fleet-nodes 4: expected" in err
    code, out, _ = cli("train.render", "--env", "local", "--name", "demo", "--nodes", "20", "--fleet-nodes", "32")
    assert code == 0 and "parallelism: 20" in out


def test_submit_dry_run_needs_no_cluster(cli, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    code, out, err = cli("train.submit", "--env", "prod", "--template", "pytorchjob", "--name", "demo",
                         "--nodes", "4", "--queue", "team-research/research", "--dry-run")
    assert code == 0 and "dry run: nothing submitted" in err
    (pj,) = yaml.safe_load_all(out)
    assert pj["metadata"]["namespace"] == "team-research"
    assert pj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"


def test_submit_validates_before_touching_the_cluster(cli, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    code, _, err = cli("train.submit", "--env", "local", "--name", "demo", "--nodes", "2", "--gpus-per-node", "2")
    assert code == 2 and "--gpus-per-node 2: expected 8" in err
    code, _, err = cli("train.submit", "--env", "local", "--name", "demo", "--nodes", "2", "--timeout", "0")
    assert code == 2 and "--timeout 0: expected seconds > 0" in err


def test_submit_without_a_kubeconfig(cli, tmp_path):
    code, _, err = cli("train.submit", "--env", "local", "--name", "demo", "--nodes", "2",
                       "--kubeconfig", str(tmp_path / "missing"))
    assert code == 2 and "--kubeconfig" in err


def test_checkpoint_interval(cli):
    code, out, _ = cli("train.checkpoint-interval", "--gpus", "16384", "--checkpoint-seconds", "60")
    assert code == 0
    assert "job MTTF: 3.09 h" in out
    assert "Young (1974) sqrt(2*C*M): 1,156 s" in out
    assert "Daly (2006) higher order: 1,116 s" in out
    assert "if checkpoints take 120 s: interval 1,556 s" in out


def test_checkpoint_interval_with_given_mttf(cli):
    code, out, _ = cli("train.checkpoint-interval", "--checkpoint-seconds", "300", "--mttf-hours", "24",
                       "--restart-seconds", "0")
    assert code == 0 and "Young (1974) sqrt(2*C*M): 7,200 s" in out and "MTTF given" in out


def test_checkpoint_interval_bad_values(cli):
    code, _, err = cli("train.checkpoint-interval", "--gpus", "0", "--checkpoint-seconds", "-1")
    assert code == 2
    assert "--gpus 0: expected GPUs > 0" in err and "--checkpoint-seconds -1: expected finite seconds > 0" in err


@pytest.mark.parametrize("flag, value", [("--checkpoint-seconds", "nan"), ("--checkpoint-seconds", "1e400"),
                                         ("--mttf-hours", "inf"), ("--restart-seconds", "nan")])
def test_checkpoint_interval_refuses_nan_and_infinity(cli, flag, value):
    args = {"--gpus": "8", "--checkpoint-seconds": "60", flag: value}
    code, _, err = cli("train.checkpoint-interval", *(x for kv in args.items() for x in kv))
    assert code == 2 and "Traceback" not in err and f"{flag} " in err and "expected finite" in err


def test_every_task_documents_every_argument():
    import importlib
    import inspect

    import gpufleet_workshop.tasks.train as module

    # invoke consumes Task.help while parsing; a fresh import has it whole.
    train = importlib.reload(module).train
    for name in train.task_names:
        t = train[name]
        assert t.__doc__ and t.__doc__.strip()
        params = [p for p in inspect.signature(t.body).parameters if p != "c"]
        assert sorted(t.help) == sorted(params), name


def test_unconvertible_flag_values_exit_2_naming_flag_and_type(cli):
    code, out, err = cli("train.submit", "--env", "local", "--name", "demo", "--nodes", "abc")
    assert code == 2 and out == "" and "--nodes 'abc': expected an integer" in err
    code, _, err = cli("train.checkpoint-interval", "--gpus", "8", "--checkpoint-seconds", "soon")
    assert code == 2 and "--checkpoint-seconds 'soon': expected a number" in err


def test_submit_reports_every_problem_and_a_missing_nodes_flag(cli, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    code, _, err = cli("train.submit", "--env", "local", "--name", "demo", "--timeout", "0")
    assert code == 2
    assert "--nodes 0 (or not given): expected an integer >= 1" in err
    assert "--timeout 0: expected seconds > 0" in err


def test_render_out_to_a_missing_folder_or_a_folder_exits_2(cli, tmp_path):
    for target, why in ((tmp_path / "missing" / "job.yaml", "No such file or directory"), (tmp_path, "Is a directory")):
        code, out, err = cli("train.render", "--env", "local", "--name", "demo", "--nodes", "1", "--out", str(target))
        assert code == 2 and f"--out {target}: {why}" in err
