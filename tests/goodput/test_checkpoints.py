"""The checkpoint convention: step-<N>/ directories complete once their marker exists."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from gpufleet.goodput.checkpoints import Scanner, read_checkpoint, scan


def write(path, mtime: float, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_markers_steps_and_save_start(tmp_path):
    write(tmp_path / "step-100" / "model.pt", 1000)
    write(tmp_path / "step-100" / "COMPLETE", 1010)  # empty marker: start = oldest file
    write(tmp_path / "step-0200" / "shard-0", 1200)
    write(tmp_path / "step-0200" / "COMPLETE", 1215, json.dumps({"started": 1190}))
    write(tmp_path / "step-300" / "__0_0.distcp", 1290)
    write(tmp_path / "step-300" / ".metadata", 1300)  # torch.distributed.checkpoint writes it last
    write(tmp_path / "step-400" / "model.pt", 1400)  # no marker: a save in progress
    write(tmp_path / "latest" / "COMPLETE", 1500)    # not step-<N>
    cps = scan(tmp_path)
    assert [(c.step, c.completed, c.started) for c in cps] == [(100, 1010, 1000), (200, 1215, 1190), (300, 1300, 1290)]
    assert cps[1].save_seconds == 25
    assert scan(tmp_path / "missing") == []
    assert read_checkpoint(tmp_path / "step-400") is None


def test_a_bad_started_value_falls_back_to_file_times(tmp_path):
    write(tmp_path / "step-1" / "a", 100)
    write(tmp_path / "step-1" / "COMPLETE", 110, "not json")
    # the writer's clock, not the filesystem's: believed up to STARTED_SLACK_SECONDS after the mtime
    write(tmp_path / "step-2" / "COMPLETE", 210, json.dumps({"started": 500}))
    write(tmp_path / "step-3" / "COMPLETE", 310, json.dumps({"started": 5000}))  # a broken clock: ignored
    assert [(c.step, c.started, c.started_on_fs) for c in scan(tmp_path)] == [
        (1, 100, True), (2, 500, False), (3, None, True)]


def test_the_scanner_remembers_checkpoints_the_trainer_deleted(tmp_path):
    s = Scanner()
    write(tmp_path / "step-1" / "COMPLETE", 100)
    write(tmp_path / "step-2" / "COMPLETE", 200)
    assert [c.step for c in s.scan(tmp_path)] == [1, 2]
    shutil.rmtree(tmp_path / "step-1")
    write(tmp_path / "step-3" / "COMPLETE", 300)
    assert [c.step for c in s.scan(tmp_path)] == [1, 2, 3]
    s.forget(tmp_path)
    assert [c.step for c in s.scan(tmp_path)] == [2, 3]


def test_versions_of_one_step_written_again_are_two_checkpoints(tmp_path):
    s = Scanner()
    write(tmp_path / "step-1" / "COMPLETE", 100)
    assert [c.completed for c in s.scan(tmp_path)] == [100]
    shutil.rmtree(tmp_path / "step-1")
    write(tmp_path / "step-1" / "COMPLETE", 400)  # a later run writes step 1 again
    assert [(c.step, c.completed) for c in s.scan(tmp_path)] == [(1, 100), (1, 400)]
    assert [c.completed for c in s.scan(tmp_path)] == [100, 400]  # read once


def test_the_marker_may_name_its_writer(tmp_path):
    write(tmp_path / "step-1" / "COMPLETE", 100, json.dumps({"started": 90, "pod": "llm-workers-0-0-x"}))
    write(tmp_path / "step-2" / "COMPLETE", 200, json.dumps({"pod": 7}))
    assert [c.writer for c in scan(tmp_path)] == ["llm-workers-0-0-x", None]


def test_start_records_and_the_clock_offset_they_measure(tmp_path):
    from gpufleet.goodput.checkpoints import clock_offset, starts
    from gpufleet.names import CHECKPOINT_STARTS_DIR

    d = tmp_path / CHECKPOINT_STARTS_DIR
    for i, (clock, skew) in enumerate([(1000.25, 30), (1001.5, 30), (1002.0, 31.5), (1003.0, -400)]):
        write(d / f"uid-{i}.{i}", clock + skew, json.dumps({"pod": f"p{i}", "pod_uid": f"uid-{i}", "job": "llm",
                                                            "job_uid": "js-1", "time": clock}))
    write(d / "broken", 5, "{")
    write(d / "no-uid", 5, json.dumps({"pod": "x", "time": 1}))
    recs = starts(tmp_path)
    assert [r.pod for r in recs] == ["p3", "p0", "p1", "p2"]  # by modification time
    assert (recs[1].job, recs[1].job_uid, recs[1].clock) == ("llm", "js-1", 1000.25)
    assert clock_offset(recs) == pytest.approx(30.0)  # the median: one node's bad clock does not move it
    assert clock_offset([]) is None
    assert starts(tmp_path / "missing") == []
