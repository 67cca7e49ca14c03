"""Which checkpoints are the job's, and on which clock: copies, reused directories, other jobs, skewed clocks."""

from __future__ import annotations

import os
import shutil

import pytest

from gpufleet.goodput import BUCKETS
from gpufleet.goodput.account import account
from gpufleet.goodput.checkpoints import Scanner

from .builders import T0, cp, pod, skewed, start, wl
from .test_account import CHECKPOINTS, two_runs


def test_a_checkpoint_copied_in_while_the_job_is_queued_is_its_resume_point_not_a_run():
    """Queued 0-100; someone copies step-1000 in at 50 (a plain copy: a new mtime). The job resumes from it at
    110: start-up 30 s, then 100 steps (1 step/s) and a 10 s save each."""
    w = wl(admissions=((100, True),))
    pods = [pod("a", 101, [(110, None)]), pod("b", 101, [(110, None)])]
    cps = [cp(1000, 45, 50), cp(1100, 240, 250), cp(1200, 350, 360)]
    a = account(w, pods, cps, now=T0 + 400)
    assert a.reconstructed_runs == 0 and a.interruptions == ()
    assert a.badput["queued"] == pytest.approx(100)
    assert a.badput["starting"] == pytest.approx(10 + 30)  # the first run resumed from step 1000, not from 0
    assert a.productive_seconds == pytest.approx(100 + 100 + 40)
    assert a.checkpoints == 2 and a.checkpoints_not_counted == 1


def test_a_checkpoint_copied_in_while_the_pods_wait_for_nodes_is_not_a_run():
    w = wl(admissions=((10, True),))
    pods = [pod("a", 11, [(200, None)], unschedulable=11, scheduled=190), pod("b", 11, [(200, None)], scheduled=12)]
    a = account(w, pods, [cp(1000, 95, 100), cp(1100, 320, 330), cp(1200, 430, 440)], now=T0 + 500)
    assert a.reconstructed_runs == 0 and a.checkpoints_not_counted == 1
    assert a.badput["waiting_for_hardware"] == pytest.approx(190 - 11)
    assert a.badput["starting"] == pytest.approx(1 + 10 + 20)  # resumed from step 1000: a 20 s start-up
    assert a.productive_seconds == pytest.approx(100 + 100 + 60)


def write(path, mtime: float, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def save(root, step: int, started: float, completed: float) -> None:
    d = root / f"step-{step}"
    if d.exists():
        shutil.rmtree(d)
    write(d / "model.pt", T0 + started)
    write(d / "COMPLETE", T0 + completed)


def test_a_later_run_that_writes_the_same_steps_again_keeps_its_checkpoints(tmp_path):
    """Run 1 (20-300) saves steps 100 and 200; run 2 (320-600) starts over and saves them again, then fails;
    run 3 runs from 620. The accountant scanned the directory during each run."""
    scanner = Scanner()
    save(tmp_path, 100, 150, 160)
    save(tmp_path, 200, 260, 270)
    scanner.scan(tmp_path)
    save(tmp_path, 100, 440, 450)
    save(tmp_path, 200, 550, 560)
    cps = scanner.scan(tmp_path)
    assert sorted(round(c.completed - T0) for c in cps) == [160, 270, 450, 560]
    w = wl(finished=None)
    pods = [pod(f"{g}-{k}", c, [(s, e)], ended=e) for g, c, s, e in (("r1", 11, 20, 300), ("r2", 301, 320, 600))
            for k in range(2)] + [pod(f"r3-{k}", 601, [(620, None)]) for k in range(2)]
    a = account(w, pods, cps, now=T0 + 700)
    assert [round(i.lost_seconds) for i in a.interruptions] == [30, 40]  # run 2 keeps what it saved
    assert a.reconstructed_runs == 0 and a.checkpoints == 4


def test_checkpoints_another_job_writes_while_this_one_is_evicted_are_not_its_runs():
    """The job runs 20-300, Kueue evicts it (queued 300-500); another job writes steps 5000 and 5100 into the same
    directory meanwhile; the job comes back at 520 and finishes at 800."""
    w = wl(admissions=((10, True), (300, False), (500, True)), finished=801)
    pods = [pod("a", 11, [(20, 300)], ended=300), pod("b", 11, [(20, 300)], ended=300),
            pod("c", 501, [(520, 800)], ended=800, succeeded=True),
            pod("d", 501, [(520, 800)], ended=800, succeeded=True)]
    cps = [cp(100, 150, 160), cp(200, 260, 270), cp(5000, 340, 350), cp(5100, 410, 420),
           cp(300, 640, 650), cp(400, 750, 760)]
    a = account(w, pods, cps, now=T0 + 1000)
    assert a.reconstructed_runs == 0 and a.checkpoints_not_counted == 2
    assert a.badput["queued"] == pytest.approx(10 + 200)
    assert a.badput["progress_lost"] == pytest.approx(30)
    assert a.productive_seconds == pytest.approx(100 + 100 + 100 + 100 + 40)


def test_start_records_tell_another_jobs_checkpoints_from_runs_whose_pods_are_gone():
    """The one-shot view: only the last gang's pods are known. Before it, the job's first gang (its pods gone)
    and, while the job waited, another job's gang wrote into the directory; their start records tell which."""
    w = wl(finished=None)
    last = [pod(f"c{k}", 700, [(710, None)]) for k in range(2)]
    cps = [cp(100, 150, 160), cp(200, 260, 270), cp(5000, 540, 550), cp(5100, 640, 650), cp(300, 840, 850)]
    starts = [start("a0", 20), start("a1", 20), start("x0", 430, job="other", job_uid="js-9"),
              start("x1", 430, job="other", job_uid="js-9"), start("c0", 710), start("c1", 710)]
    a = account(w, last, cps, now=T0 + 900, starts=starts)
    assert a.reconstructed_runs == 1 and a.checkpoints_not_counted == 2
    without = account(w, last, cps, now=T0 + 900)  # no records: the other job's checkpoints look like the job's
    assert a.checkpoints == 3 and without.checkpoints == 5
    assert a.productive_seconds < without.productive_seconds


def test_a_checkpoint_naming_another_jobs_pod_as_its_writer_is_not_the_jobs():
    w = wl(finished=None)
    pods = [pod("a", 11, [(20, None)]), pod("b", 11, [(20, None)])]
    starts = [start("a", 20), start("b", 20), start("x0", 25, job="other", job_uid="js-9")]
    cps = [cp(100, 150, 160, writer="a"), cp(7000, 200, 210, writer="x0"), cp(200, 260, 270, writer="b")]
    a = account(w, pods, cps, now=T0 + 300, starts=starts)
    assert a.checkpoints == 2 and a.checkpoints_not_counted == 1
    assert a.badput["checkpoint_saving"] == pytest.approx(20)


# ------------------------------------------------------------------ clocks

SKEWS = (-60, -45, -15, 15, 45, 60)


def close_calls():
    """Saves near the edges of runs, where a skewed clock moves them across: run 1 (20-400) saves step 300 at 390,
    10 s before it breaks; the old pods are gone at 400 and the new ones created at 420 (a gang restart that waits
    for the old pods, as JobSet's BlockingRecreate does); run 2 (425-800) restores in 5 s and saves 20 steps later,
    at 455, then every 100 steps; Finished at 801."""
    pods = [pod(f"a{k}", 11, [(20, 400)], scheduled=12, ended=400) for k in range(2)]
    pods += [pod(f"b{k}", 420, [(425, 800)], scheduled=421, ended=800, succeeded=True) for k in range(2)]
    cps = [cp(100, 150, 160), cp(200, 260, 270), cp(300, 380, 390), cp(320, 450, 455), cp(420, 560, 570),
           cp(520, 680, 690)]
    return wl(finished=801), pods, cps


def two_runs_with_checkpoints():
    w, pods = two_runs()
    return w, pods, CHECKPOINTS


def four_runs():
    """A steady trainer (1 step/s, a 3 s save every 150 steps, resumed 1.5 s after its gang runs) broken three
    times; each new gang is created 20 s after the old one ends and runs 1 s later; Finished at 1861."""
    pods, cps, saved, t = [], [], 0, 5.0
    for k, length in enumerate((300, 200, 400, 600)):
        start, end = t + 1, t + 1 + length
        pods += [pod(f"g{k}-{i}", t, [(start, end)], scheduled=t, ended=end, succeeded=k == 3) for i in range(2)]
        clock, step = start + 1.5, saved
        while clock + 153 <= end:
            step, clock = step + 150, clock + 150
            cps.append(cp(step, clock, clock + 3))
            clock += 3
        saved = step
        t = end + 20
    return wl(finished=end + 1, admissions=((1, True),)), pods, cps


HISTORIES = {"close-calls": close_calls, "two-runs": two_runs_with_checkpoints, "four-runs": four_runs}


def _moved(a, b) -> dict[str, float]:
    out = {k: abs(a.badput[k] - b.badput[k]) for k in BUCKETS}
    out["productive"] = abs(a.productive_seconds - b.productive_seconds)
    return out


def _same_shape(a, b) -> None:
    assert a.reconstructed_runs == b.reconstructed_runs
    assert len(a.interruptions) == len(b.interruptions)
    assert a.checkpoints == b.checkpoints


def _records(pods, skew: float = 0.0):
    return [start(p.name, p.runs[0][0] - T0, skew=skew) for p in pods]


@pytest.mark.parametrize("started_on_fs", [True, False], ids=["save-start-from-files", "save-start-from-marker"])
@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("skew", SKEWS)
def test_a_skewed_filesystem_clock_is_measured_from_the_start_records(skew, history, started_on_fs):
    """The training templates' pods record their starts: the offset is measured, the account does not move."""
    w, pods, cps = HISTORIES[history]()
    cps = [cp(c.step, c.started - T0, c.completed - T0, started_on_fs=started_on_fs) for c in cps]
    truth = account(w, pods, cps, now=T0 + 10_000, starts=_records(pods))
    a = account(w, pods, [skewed(c, skew) for c in cps], now=T0 + 10_000, starts=_records(pods, skew))
    _same_shape(a, truth)
    moved = _moved(a, truth)
    assert max(moved.values()) <= abs(skew), moved
    assert max(moved.values()) == pytest.approx(0, abs=1e-6), moved
    assert a.clock_offset == pytest.approx(skew) and a.clock_offset_source == "start records"


@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("skew", SKEWS)
def test_a_skewed_filesystem_clock_rebuilds_no_run_in_the_one_shot_view(skew, history):
    """The first gang's pods are gone; with start records its run is rebuilt where it was, whatever the skew."""
    w, pods, cps = HISTORIES[history]()
    truth = account(w, pods[2:], cps, now=T0 + 10_000, starts=_records(pods))
    a = account(w, pods[2:], [skewed(c, skew) for c in cps], now=T0 + 10_000, starts=_records(pods, skew))
    assert truth.reconstructed_runs == 1
    _same_shape(a, truth)
    moved = _moved(a, truth)
    assert max(moved.values()) <= abs(skew) and max(moved.values()) == pytest.approx(0, abs=1e-6), moved


@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("skew", SKEWS)
def test_without_start_records_a_skewed_clock_is_fitted_by_order(skew, history):
    """Pods that record no starts (jobs not rendered from the templates): the offset is fitted to what the
    job did; no run is made up or lost, productive time and each interruption's loss move by at most the
    skew, and each bucket by at most the skew once per run."""
    w, pods, cps = HISTORIES[history]()
    truth = account(w, pods, cps, now=T0 + 10_000)
    a = account(w, pods, [skewed(c, skew) for c in cps], now=T0 + 10_000)
    _same_shape(a, truth)
    moved = _moved(a, truth)
    assert moved["productive"] <= abs(skew) + 1e-6, moved
    assert abs(a.ettr - truth.ettr) <= abs(skew) / truth.wall_seconds + 1e-9
    assert all(abs(x.lost_seconds - y.lost_seconds) <= abs(skew) + 1e-6
               for x, y in zip(a.interruptions, truth.interruptions))
    runs = len(truth.interruptions) + 1
    assert max(moved.values()) <= runs * abs(skew) + 1e-6, moved
    assert abs(a.clock_offset - skew) <= abs(skew)


# ------------------------------------------------------------------ through the tracker, from disk


def _tracker_job(tracker, tmp_path, job: str = "llm", uid: str = "wl-1", job_uid: str = "js-1"):
    from .builders import pod_json, ts, workload_json

    w = workload_json(conditions=[("Admitted", "True", "Admitted", 10)], owner=job)
    w["metadata"]["uid"] = uid
    w["metadata"]["ownerReferences"][0]["uid"] = job_uid
    tracker.observe_workload(w)
    for k in range(2):
        p = pod_json(f"{job}-{k}", created=11, scheduled=("True", "", 12), state={"running": {"startedAt": ts(20)}},
                     labels={"gpufleet.io/job": job}, env={"CHECKPOINT_DIR": str(tmp_path)})
        tracker.observe_pod(p)


def test_the_tracker_measures_the_offset_from_start_records_on_disk(tmp_path):
    import json

    from gpufleet.goodput.tracker import Tracker
    from gpufleet.names import CHECKPOINT_STARTS_DIR

    skew = 45
    for k in range(2):
        write(tmp_path / CHECKPOINT_STARTS_DIR / f"uid-llm-{k}.1", T0 + 20 + skew,
              json.dumps({"pod": f"llm-{k}", "pod_uid": f"uid-llm-{k}", "job": "llm", "job_uid": "js-1",
                          "time": T0 + 20}))
    save(tmp_path, 100, 150 + skew, 160 + skew)
    save(tmp_path, 200, 260 + skew, 270 + skew)
    tracker = Tracker()
    _tracker_job(tracker, tmp_path)
    (a,) = tracker.accounts(T0 + 300)
    assert (a.clock_offset, a.clock_offset_source) == (pytest.approx(skew), "start records")
    assert a.badput["checkpoint_saving"] == pytest.approx(20) and a.badput["starting"] == pytest.approx(10 + 30)
    assert a.productive_seconds == pytest.approx(300 - 10 - 10 - 30 - 20)


def test_a_directory_two_jobs_share_is_remembered_while_one_of_them_remains(tmp_path):
    from gpufleet.goodput.tracker import Tracker

    save(tmp_path, 100, 150, 160)
    tracker = Tracker()
    _tracker_job(tracker, tmp_path, "llm", "wl-1", "js-1")
    _tracker_job(tracker, tmp_path, "other", "wl-2", "js-2")
    assert {a.job: a.checkpoints for a in tracker.accounts(T0 + 300)} == {"llm": 1, "other": 1}
    shutil.rmtree(tmp_path / "step-100")  # the trainer keeps the last few
    tracker.forget_workload({"metadata": {"uid": "wl-1"}})
    assert {a.job: a.checkpoints for a in tracker.accounts(T0 + 300)} == {"other": 1}


# ------------------------------------------------------------------ what the training templates' pods write


def _trainer_container(template: str):
    import yaml

    from gpufleet_admin.training import render as r

    docs = [d for d in yaml.safe_load_all(r.render("local", template, "llm", 2)) if d]
    found = []

    def walk(o):
        if isinstance(o, dict):
            if "containers" in o:
                found.extend(o["containers"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(docs)
    return found[0]


@pytest.mark.parametrize("template", ["jobset", "job", "pytorchjob"])
def test_the_start_record_a_training_pod_writes_is_the_one_the_accountant_reads(tmp_path, template):
    import subprocess

    from gpufleet.goodput.checkpoints import clock_offset, starts

    c = _trainer_container(template)
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    uid_label = {"jobset": "jobset.sigs.k8s.io/jobset-uid", "job": "batch.kubernetes.io/controller-uid"}.get(template)
    if uid_label:
        assert env["JOB_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{uid_label}']"
    else:
        assert "JOB_UID" not in env  # the training-operator labels no uid
    line = c["args"][0]
    assert c["command"] == ["bash", "-c"] and "exec torchrun" in line
    prelude = line[:line.index("exec torchrun")]
    run = {"PATH": os.environ["PATH"], "CHECKPOINT_DIR": str(tmp_path), "POD_NAME": "llm-0", "POD_UID": "u-0",
           **({"JOB_UID": "js-1"} if uid_label else {})}
    subprocess.run(["bash", "-c", prelude + "true"], env=run, check=True, timeout=30)
    subprocess.run(["bash", "-c", prelude + "true"], env=run, check=True, timeout=30)  # the trainer restarts in place
    recs = starts(tmp_path)
    assert len(recs) == 2
    assert {(r.pod, r.pod_uid, r.job, r.job_uid) for r in recs} == {
        ("llm-0", "u-0", "llm", "js-1" if uid_label else "")}
    assert abs(clock_offset(recs)) < 1.0  # one machine: one clock
    # a checkpoint filesystem it cannot write to does not stop the trainer
    bad = {**run, "CHECKPOINT_DIR": str(tmp_path / "file" / "below-a-file")}
    (tmp_path / "file").write_text("")
    assert subprocess.run(["bash", "-c", prelude + "echo trains"], env=bad, capture_output=True, text=True,
                          timeout=30).stdout == "trains\n"
