"""The checkpoint convention: step-<N>/ directories complete once their marker exists."""

from __future__ import annotations

import json
import os
import shutil

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
    write(tmp_path / "step-2" / "COMPLETE", 210, json.dumps({"started": 500}))  # after completion: ignored
    assert [(c.step, c.started) for c in scan(tmp_path)] == [(1, 100), (2, None)]


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
