"""The long-horizon goodput model (gpufleet_workshop.sim.goodput) and ``invoke sim.goodput``: pure, no cluster."""

from __future__ import annotations

import json
import math

import pytest

from gpufleet.goodput import BUCKETS
from gpufleet_workshop.sim import goodput as sim


def test_llama3_table_has_the_419_unexpected_interruptions():
    assert sum(c.count for c in sim.CAUSES) == 419
    assert {c.name: c.count for c in sim.CAUSES}["Faulty GPU"] == 148
    assert {c.name: c.count for c in sim.CAUSES}["GPU HBM3 Memory"] == 72
    assert {c.kind for c in sim.CAUSES} == set(sim.KINDS)


def test_rsc1_rate_gives_the_published_mttf_at_16k_gpus():
    # 6.5 failures per 1,000 node-days, 2,048 nodes: 1.8 h (Kokolis et al.)
    assert sim.Model(gpus=16384, days=1).job_mttf_seconds / 3600 == pytest.approx(1.80, abs=0.01)
    assert sim.rate_for_mttf(1024, 7.9) == pytest.approx(23.73, abs=0.01)


def test_same_seed_same_run_other_seed_other_failures():
    model = sim.Model(gpus=2048, days=10)
    a, b, c = sim.run(model, 7), sim.run(model, 7), sim.run(model, 8)
    assert a.summary() == b.summary()
    assert [f.time for f in a.sequence] == [f.time for f in b.sequence]
    assert [f.time for f in a.sequence] != [f.time for f in c.sequence]


def test_summary_has_exactly_the_keys():
    s = sim.run(sim.Model(gpus=1024, days=3), 1).summary()
    assert tuple(s) == sim.SUMMARY_KEYS
    assert set(s["badput_seconds_gpufleet"]) == set(s["badput_seconds_baseline"]) == set(BUCKETS)


@pytest.mark.parametrize("gpus", [128, 1024, 16384])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_buckets_add_up_to_wall_clock_minus_productive(gpus, seed):
    r = sim.run(sim.Model(gpus=gpus, days=7), seed)
    for o in (r.gpufleet, r.baseline):
        assert sum(o.badput.values()) == pytest.approx(o.wall_seconds - o.productive_seconds, abs=1e-3)
        assert all(v >= 0 for v in o.badput.values()), o.badput
        assert 0 < o.ettr < 1


@pytest.mark.parametrize("gpus", [1024, 4096, 16384])
def test_baseline_loses_more_than_gpufleet_on_the_same_failures(gpus):
    r = sim.run(sim.Model(gpus=gpus, days=30), 1)
    assert r.gpufleet.ettr > r.baseline.ettr
    assert r.gpufleet.badput["waiting_for_hardware"] < r.baseline.badput["waiting_for_hardware"]


def test_goal_1024_gpus_30_days_at_rsc1_rates():
    assert sim.run(sim.Model(gpus=1024, days=30), 1).gpufleet.ettr >= 0.95


def test_no_failures_costs_only_the_start_and_checkpoints():
    model = sim.Model(gpus=8, days=1)
    out = sim.simulate(model, sim.baseline_policy(model), [])
    start = model.latencies.gang_restart + model.latencies.startup
    cycles = math.floor((86400 - start) / (1800 + 60))
    assert out.interruptions == 0 and out.badput["starting"] == start
    assert out.badput["checkpoint_saving"] == pytest.approx(cycles * 60 + max(0, 86400 - start - cycles * 1860 - 1800))
    assert out.badput["progress_lost"] == out.badput["waiting_for_hardware"] == 0


def test_one_gpu_fault_gpufleet_recovers_in_seconds_baseline_waits_for_a_person():
    model = sim.Model(gpus=1024, days=1)
    gpu = next(c for c in sim.CAUSES if c.name == "Faulty GPU")
    fault = sim.Failure(time=10_000.0, cause=gpu, node=0, check_phase=0.5, operator_draw=1.0)
    fleet = sim.simulate(model, sim.gpufleet_policy(model), [fault])
    base = sim.simulate(model, sim.baseline_policy(model), [fault])
    assert fleet.badput["waiting_for_hardware"] == pytest.approx(model.latencies.fault_to_tainted)
    assert base.badput["waiting_for_hardware"] == pytest.approx(0.5 * 300 + 1800)
    # progress lost: since the last completed checkpoint before the fault
    resume = model.latencies.gang_restart + model.latencies.startup
    period = 1800 + 60
    assert base.badput["progress_lost"] == pytest.approx((10_000 - resume) % period)


def test_a_hang_on_a_swapped_node_ends_at_eviction_for_gpufleet_and_at_the_timeout_for_the_baseline():
    model = sim.Model(gpus=1024, days=1)
    gsp = next(c for c in sim.CAUSES if c.name == "GPU System Processor")
    fault = sim.Failure(time=5_000.0, cause=gsp, node=0, check_phase=0.0, operator_draw=0.0)
    fleet = sim.simulate(model, sim.gpufleet_policy(model), [fault])
    base = sim.simulate(model, sim.baseline_policy(model), [fault])
    assert base.badput["progress_lost"] - fleet.badput["progress_lost"] == pytest.approx(
        model.collective_timeout - model.latencies.fault_to_evicted, abs=fleet.checkpoint_interval + 60)


def test_lemons_stay_out_under_gpufleet_only():
    model = sim.Model(gpus=1024, days=7, repair_hours=1)
    gpu = next(c for c in sim.CAUSES if c.name == "Faulty GPU")
    seq = [sim.Failure(time=t, cause=gpu, node=3, check_phase=0.0, operator_draw=0.1)
           for t in (10_000.0, 30_000.0, 50_000.0, 70_000.0, 90_000.0)]
    fleet = sim.simulate(model, sim.gpufleet_policy(model), seq)
    base = sim.simulate(model, sim.baseline_policy(model), seq)
    assert fleet.lemons == 1 and fleet.interruptions == 3
    assert base.lemons == 0 and base.interruptions == 5


def test_gpufleet_interval_is_the_advisors_for_the_measured_mttf():
    from gpufleet_admin.training.checkpoint import daly_interval_seconds

    model = sim.Model(gpus=4096, days=1)
    assert sim.gpufleet_policy(model).checkpoint_interval == pytest.approx(
        daly_interval_seconds(60, sim.measured_mttf_hours(model) * 3600))
    assert sim.measured_mttf_hours(model) > model.job_mttf_seconds / 3600  # only what node health sees


def test_latencies_from_a_replay_file(tmp_path):
    f = tmp_path / "latencies.json"
    f.write_text(json.dumps({"fault_to_tainted_seconds": 7.5, "fault_to_evicted_seconds": 8,
                             "readmitted_to_running_seconds": 0.2, "scrape_interval_seconds": 15}))
    lat = sim.Latencies.from_file(f)
    # kwok starts pods at once: the gang restart keeps its documented default
    assert (lat.fault_to_tainted, lat.fault_to_evicted, lat.gang_restart, lat.startup) == (7.5, 8.0, 60.0, 300.0)
    assert "measured" in lat.source and "scrape every 15 s" in lat.source
    f.write_text(json.dumps({"fault_to_tainted_seconds": -1}))
    with pytest.raises(ValueError, match="fault_to_tainted_seconds: -1: expected seconds >= 0"):
        sim.Latencies.from_file(f)


def test_task_writes_the_files(cli, tmp_path):
    code, out, err = cli("sim.goodput", "--gpus", "256", "--days", "2", "--seed", "3", "--out", str(tmp_path),
                         "--latencies", "")
    assert code == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert tuple(summary) == sim.SUMMARY_KEYS and summary["gpus"] == 256 and summary["days"] == 2
    assert (tmp_path / "goodput.png").stat().st_size > 10_000
    assert "ETTR" in out and "wrote" in err
    params = json.loads((tmp_path / "parameters.json").read_text())
    assert sorted(int(k) for k in params["chart"]) == list(sim.CHART_SIZES)


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus", "0", "--days", "30"], "--gpus 0: expected a whole number of 8-GPU nodes"),
    (["--gpus", "1001", "--days", "30"], "--gpus 1001: expected a whole number of 8-GPU nodes"),
    (["--gpus", "1024", "--days", "0"], "--days 0.0: expected a finite number of days > 0"),
    (["--gpus", "1024", "--days", "nan"], "--days nan: expected a finite number of days > 0"),
    (["--gpus", "1024", "--days", "30", "--seed", "-1"], "--seed -1: expected a whole number >= 0"),
    (["--gpus", "1024", "--days", "30", "--mttf-hours", "-2"], "--mttf-hours -2: expected finite hours > 0"),
    (["--gpus", "1024", "--days", "30", "--failure-rate", "2", "--mttf-hours", "3"], "expected one of them, not both"),
    (["--gpus", "1024", "--days", "x"], "--days 'x': expected a number"),
])
def test_bad_flags_exit_2_and_write_nothing(cli, tmp_path, argv, message):
    code, out, err = cli("sim.goodput", *argv, "--out", str(tmp_path / "out"))
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def test_bad_latencies_file_and_out(cli, tmp_path):
    (tmp_path / "lat.json").write_text("{not json")
    (tmp_path / "file").write_text("")
    code, _, err = cli("sim.goodput", "--gpus", "1024", "--days", "1", "--latencies", str(tmp_path / "lat.json"),
                       "--out", str(tmp_path / "file"))
    assert code == 2
    assert f"--latencies {tmp_path / 'lat.json'}:" in err and f"--out '{tmp_path / 'file'}': expected a folder" in err
