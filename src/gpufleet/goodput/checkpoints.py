"""The checkpoint convention the accountant reads, and a reader of it that never raises on one bad entry.

The convention (``templates/training/README.md``), which trainers that save
a directory per step already follow:

* each checkpoint is a directory ``$CHECKPOINT_DIR/step-<N>/``, ``N`` the
  global training step (decimal, leading zeros allowed);
* it is complete once a marker file exists in it, written after everything
  else: ``COMPLETE`` (an empty file, or JSON ``{"started": <Unix seconds>}``
  recording when the save began, and optionally ``"pod": <the writer pod's
  name>``), or ``.metadata``, which PyTorch's
  ``torch.distributed.checkpoint.save`` writes last, once every rank's
  shard is written;
* a directory without a marker is a save in progress or an aborted one, and
  does not count.

The marker's modification time is when the checkpoint completed, on the
checkpoint filesystem's clock. The save started at the marker's
``started`` when given (the writer's clock: its node's, which the
accountant takes to be the API server's), else at the oldest modification
time of the directory's other files (the filesystem's clock): a lower bound
on the save's duration (shards written in parallel finish together), so
trainers that stall on saves should write ``started``.

A checkpoint is one *version* of a step directory: its path with its
marker's modification time and inode. A later run that writes the same
step again (it resumed from an older checkpoint, or started over) makes a
new version; :class:`Scanner` keeps both, each for the run that wrote it.

**Start records.** Every pod of gpufleet's training templates records each
start of its trainer, before the trainer runs, as one small JSON file in
``$CHECKPOINT_DIR/.gpufleet/starts/`` (:data:`gpufleet.names.CHECKPOINT_STARTS_DIR`):
``{"pod", "pod_uid", "job", "job_uid", "time"}``, ``time`` the pod's own
clock as it writes the file. They tell the accountant which job's pods
wrote into the directory and in which order (modification times compared
with each other, on one clock), and how far the filesystem's clock is from
the pods' (:func:`clock_offset`: the file's modification time minus its
``time``, written in the same instant).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.names import CHECKPOINT_MARKER, CHECKPOINT_STARTS_DIR

log = logging.getLogger(__name__)

#: Marker files, in the order they are looked for.
MARKERS = (CHECKPOINT_MARKER, ".metadata")
#: ``step-<N>`` directory names.
STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint.

    Attributes:
        step: the training step it holds.
        completed: Unix time the marker was written (the checkpoint filesystem's clock).
        started: Unix time the save began (the marker's ``started``, or the oldest file), None if unknown.
        path: its directory.
        writer: the pod that wrote it, when its marker says (``"pod"``), else None.
        started_on_fs: ``started`` is a file's modification time (the filesystem's clock); False: the
            marker's ``started``, on the writer's clock.
    """

    step: int
    completed: float
    started: float | None
    path: str = ""
    writer: str | None = None
    started_on_fs: bool = True

    @property
    def save_seconds(self) -> float:
        """Seconds the save took (0 when its start is unknown)."""
        return max(0.0, self.completed - self.started) if self.started is not None else 0.0


#: Seconds a marker's ``started`` (the writer's clock) may lie after its modification time (the filesystem's)
#: and still be believed: clocks apart by more than this are a broken clock, not a save.
STARTED_SLACK_SECONDS = 600.0


def _marker_json(marker: Path) -> dict:
    """The marker's JSON object ({} for an empty, unreadable or non-object marker)."""
    try:
        if marker.name == CHECKPOINT_MARKER and marker.stat().st_size:
            data = json.loads(marker.read_text())
            return data if isinstance(data, dict) else {}
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return {}


def _number(value) -> float | None:
    """``value`` as a finite float, None when it is not a finite number (booleans are not numbers)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _started(data: dict, step_dir: Path, completed: float) -> tuple[float | None, bool]:
    """When the save began, and whether that is a file time: the marker's JSON ``started`` (the writer's
    clock), else the oldest other file's mtime (the filesystem's)."""
    started = _number(data.get("started"))
    if started is not None and started <= completed + STARTED_SLACK_SECONDS:
        return started, False
    oldest = None
    try:
        with os.scandir(step_dir) as entries:
            for e in entries:
                if e.name in MARKERS:
                    continue
                try:
                    t = e.stat(follow_symlinks=False).st_mtime
                except OSError:
                    continue
                oldest = t if oldest is None else min(oldest, t)
    except OSError:
        return None, True
    return (oldest if oldest is not None and oldest <= completed else None), True


def _marker(step_dir: Path | str) -> tuple[Path, os.stat_result] | None:
    for name in MARKERS:
        marker = os.path.join(step_dir, name)
        try:
            return Path(marker), os.stat(marker)
        except OSError:
            continue
    return None


def _read(step_dir: Path, step: int, marker: Path, st: os.stat_result) -> Checkpoint:
    data = _marker_json(marker)
    started, on_fs = _started(data, step_dir, st.st_mtime)
    writer = data.get("pod") if isinstance(data.get("pod"), str) and data.get("pod") else None
    return Checkpoint(step, st.st_mtime, started, str(step_dir), writer=writer, started_on_fs=on_fs)


def read_checkpoint(step_dir: Path) -> Checkpoint | None:
    """The checkpoint in ``step_dir`` (a ``step-<N>`` directory), None when it is not complete or not one."""
    m = STEP_DIR.match(step_dir.name)
    found = _marker(step_dir) if m else None
    if found is None:
        return None
    return _read(step_dir, int(m.group(1)), *found)


@dataclass(frozen=True)
class Start:
    """One start of a training pod's trainer, as the pod recorded it in ``$CHECKPOINT_DIR/.gpufleet/starts/``.

    Attributes:
        pod, pod_uid: the pod's name and uid.
        job, job_uid: its job's name and uid (the JobSet's or Job's; ``""`` when the pod could not tell).
        written: the file's modification time (the checkpoint filesystem's clock, Unix seconds).
        clock: the pod's clock when it wrote the file (Unix seconds), None if absent.
    """

    pod: str
    pod_uid: str
    job: str
    job_uid: str
    written: float
    clock: float | None = None


def read_start(path: Path) -> Start | None:
    """The start record at ``path``, None when it is not one (unreadable, not JSON, no pod uid)."""
    try:
        st = path.stat()
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    fields = {k: data.get(k) if isinstance(data.get(k), str) else "" for k in ("pod", "pod_uid", "job", "job_uid")}
    if not fields["pod_uid"]:
        return None
    return Start(**fields, written=st.st_mtime, clock=_number(data.get("time")))


def clock_offset(starts: Iterable[Start]) -> float | None:
    """Seconds the checkpoint filesystem's clock is ahead of the pods' (negative: behind), None without data.

    The median, over start records that carry their pod's ``time``, of the
    record's modification time minus that time: the file is written in the
    instant its ``time`` is read (a few milliseconds apart), so each record
    compares the two clocks directly; the median keeps one node with a bad
    clock from moving it.
    """
    diffs = [s.written - s.clock for s in starts if s.clock is not None]
    return statistics.median(diffs) if diffs else None


class Scanner:
    """Reads the complete checkpoints and start records of checkpoint directories and remembers them.

    A complete checkpoint version (module docstring) is read once; one
    deleted or overwritten later (trainers keep the last few; a later run
    writes the same step again) stays in the answer, because the account
    of the runs before it still needs it. Never raises: a missing or
    unreadable directory has no new checkpoints (logged once per directory).
    """

    def __init__(self) -> None:
        self._seen: dict[str, dict[tuple[str, int, int], Checkpoint]] = {}
        self._starts: dict[str, dict[str, Start]] = {}
        self._warned: set[str] = set()

    def scan(self, checkpoint_dir: str | Path) -> list[Checkpoint]:
        """Complete checkpoints under ``checkpoint_dir`` (present now or seen before), by completion time."""
        root = Path(checkpoint_dir)
        seen = self._seen.setdefault(str(root), {})
        try:
            with os.scandir(root) as entries:
                names = [e.name for e in entries if STEP_DIR.match(e.name) and e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            if str(root) not in self._warned:
                self._warned.add(str(root))
                log.info("no checkpoints readable at %s: %s", root, exc.strerror or exc)
            names = []
        base = str(root)
        for name in names:
            step_dir = os.path.join(base, name)
            found = _marker(step_dir)
            if found is None:
                continue
            key = (step_dir, found[1].st_mtime_ns, found[1].st_ino)
            if key not in seen:
                seen[key] = _read(Path(step_dir), int(STEP_DIR.match(name).group(1)), *found)
        return sorted(seen.values(), key=lambda c: (c.completed, c.step))

    def starts(self, checkpoint_dir: str | Path) -> list[Start]:
        """Start records under ``checkpoint_dir`` (present now or seen before), by modification time."""
        root = Path(checkpoint_dir) / CHECKPOINT_STARTS_DIR
        seen = self._starts.setdefault(str(Path(checkpoint_dir)), {})
        try:
            with os.scandir(root) as entries:
                names = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        except OSError:
            names = []
        for name in names:
            if name not in seen:
                rec = read_start(root / name)
                if rec is not None:
                    seen[name] = rec
        return sorted(seen.values(), key=lambda s: s.written)

    def forget(self, checkpoint_dir: str | Path) -> None:
        """Drop what is remembered of one directory (its job is gone)."""
        self._seen.pop(str(Path(checkpoint_dir)), None)
        self._starts.pop(str(Path(checkpoint_dir)), None)
        self._warned.discard(str(Path(checkpoint_dir)))


def scan(checkpoint_dir: str | Path) -> list[Checkpoint]:
    """Complete checkpoints under ``checkpoint_dir``, by completion time (one-shot, no cache)."""
    return Scanner().scan(checkpoint_dir)


def starts(checkpoint_dir: str | Path) -> list[Start]:
    """Start records under ``checkpoint_dir``, by modification time (one-shot, no cache)."""
    return Scanner().starts(checkpoint_dir)
