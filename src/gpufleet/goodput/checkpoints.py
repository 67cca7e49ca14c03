"""The checkpoint convention the accountant reads, and a reader of it that never raises on one bad entry.

The convention (``templates/training/README.md``), which trainers that save
a directory per step already follow:

* each checkpoint is a directory ``$CHECKPOINT_DIR/step-<N>/``, ``N`` the
  global training step (decimal, leading zeros allowed);
* it is complete once a marker file exists in it, written after everything
  else: ``COMPLETE`` (an empty file, or JSON ``{"started": <Unix seconds>}``
  recording when the save began), or ``.metadata``, which PyTorch's
  ``torch.distributed.checkpoint.save`` writes last, once every rank's
  shard is written;
* a directory without a marker is a save in progress or an aborted one, and
  does not count.

The marker's modification time is when the checkpoint completed. The save
started at the marker's ``started`` when given, else at the oldest
modification time of the directory's other files: a lower bound on the
save's duration (shards written in parallel finish together), so trainers
that stall on saves should write ``started``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet.names import CHECKPOINT_MARKER

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
        completed: Unix time the marker was written.
        started: Unix time the save began (the marker's ``started``, or the oldest file), None if unknown.
        path: its directory.
    """

    step: int
    completed: float
    started: float | None
    path: str = ""

    @property
    def save_seconds(self) -> float:
        """Seconds the save took (0 when its start is unknown)."""
        return max(0.0, self.completed - self.started) if self.started is not None else 0.0


def _started(marker: Path, step_dir: Path, completed: float) -> float | None:
    """When the save began: the marker's JSON ``started``, else the oldest other file's mtime."""
    try:
        if marker.name == CHECKPOINT_MARKER and marker.stat().st_size:
            data = json.loads(marker.read_text())
            started = data.get("started") if isinstance(data, dict) else None
            if isinstance(started, (int, float)) and not isinstance(started, bool) and started <= completed:
                return float(started)
    except (OSError, ValueError, UnicodeDecodeError):
        pass
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
        return None
    return oldest if oldest is not None and oldest <= completed else None


def read_checkpoint(step_dir: Path) -> Checkpoint | None:
    """The checkpoint in ``step_dir`` (a ``step-<N>`` directory), None when it is not complete or not one."""
    m = STEP_DIR.match(step_dir.name)
    if not m:
        return None
    for name in MARKERS:
        marker = step_dir / name
        try:
            completed = marker.stat().st_mtime
        except OSError:
            continue
        return Checkpoint(int(m.group(1)), completed, _started(marker, step_dir, completed), str(step_dir))
    return None


class Scanner:
    """Reads the complete checkpoints of checkpoint directories and remembers them.

    A complete checkpoint is read once; one deleted later (trainers keep the
    last few) stays in the answer, because the account of the runs before
    it still needs it. Never raises: a missing or unreadable directory has
    no new checkpoints (logged once per directory).
    """

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, Checkpoint]] = {}
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
        for name in names:
            path = str(root / name)
            if path not in seen:
                cp = read_checkpoint(root / name)
                if cp is not None:
                    seen[path] = cp
        return sorted(seen.values(), key=lambda c: (c.completed, c.step))

    def forget(self, checkpoint_dir: str | Path) -> None:
        """Drop what is remembered of one directory (its job is gone)."""
        self._seen.pop(str(Path(checkpoint_dir)), None)
        self._warned.discard(str(Path(checkpoint_dir)))


def scan(checkpoint_dir: str | Path) -> list[Checkpoint]:
    """Complete checkpoints under ``checkpoint_dir``, by completion time (one-shot, no cache)."""
    return Scanner().scan(checkpoint_dir)
