"""One training job's account: ETTR and lost time by bucket, from its records alone (pure).

Wall-clock time runs from the Workload's creation to its ``Finished``
condition (or ``now``). Each moment belongs to exactly one state:

* **run**: every pod of the gang (``spec.podSets[].count``) has its main
  container running;
* otherwise, when Kueue has not admitted the Workload: ``queued``;
* otherwise ``waiting_for_hardware`` while a pod of the job is
  unschedulable (``PodScheduled`` False, reason ``Unschedulable``: no
  healthy node fits), ``other`` once the gang has succeeded and only
  finishing remains, else ``starting`` (pods being created, scheduled,
  started: admission or a gang restart to all pods running).

A run is split with the job's checkpoints
(:mod:`gpufleet.goodput.checkpoints`):

* ``checkpoint_saving``: each save completed during the run;
* ``starting`` again for the trainer's own start and checkpoint restore:
  the time to the run's first save minus the compute the steps it made
  need at the job's step rate (the median, over pairs of consecutive
  checkpoints in one run, of steps over the time between them); a run
  with no checkpoint of its own gets the median start-up of the others;
* ``progress_lost``: when the run ends in an interruption (a pod failed,
  was evicted or deleted), everything since its last completed checkpoint
  (or since its start-up) is work the job must do again;
* the rest is productive.

ETTR = productive / wall-clock (Kokolis et al., arXiv:2410.21680); the
buckets sum to wall-clock minus productive. Without checkpoints the whole
run counts as productive: an upper bound (``checkpoints`` None: the job's
checkpoint directory is unknown or unreadable).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpufleet.goodput import BUCKETS
from gpufleet.goodput.checkpoints import Checkpoint
from gpufleet.goodput.history import PodRecord, WorkloadRecord

#: Seconds within which pods ending together count as one ending (API times are whole seconds).
SAME_MOMENT = 2.0
PRODUCTIVE = "productive"


@dataclass(frozen=True)
class Phase:
    """A stretch of the job's wall-clock time in one state (``productive`` or a bucket)."""

    start: float
    end: float
    state: str


@dataclass(frozen=True)
class Interruption:
    """A run that ended before the job did.

    Attributes:
        time: when the gang broke.
        lost_seconds: work since the last checkpoint, lost.
        resumed: when the gang ran again (None: not yet).
    """

    time: float
    lost_seconds: float
    resumed: float | None


@dataclass(frozen=True)
class Account:
    """The account of one job (seconds; times are Unix seconds).

    Attributes:
        namespace, job, kind: the job (the Workload's owner).
        start, end: its wall-clock window (Workload creation to finish or now).
        productive_seconds: training progress kept.
        badput: bucket -> seconds (:data:`gpufleet.goodput.BUCKETS`).
        phases: the timeline, in order, covering ``start``..``end``.
        interruptions: runs that ended early.
        checkpoints: complete checkpoints seen.
        step_rate: training steps per productive second, when two checkpoints of one run give it.
        finished: the Workload has finished.
        checkpoints_known: the job's checkpoints were readable (else nothing counts as lost).
    """

    namespace: str
    job: str
    kind: str
    start: float
    end: float
    productive_seconds: float
    badput: dict[str, float]
    phases: tuple[Phase, ...] = ()
    interruptions: tuple[Interruption, ...] = ()
    checkpoints: int = 0
    step_rate: float | None = None
    finished: bool = False
    checkpoints_known: bool = True

    @property
    def wall_seconds(self) -> float:
        """Wall-clock seconds of the account."""
        return max(0.0, self.end - self.start)

    @property
    def ettr(self) -> float:
        """Productive / wall-clock time (0 for an empty window)."""
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


@dataclass
class _Run:
    start: float
    end: float
    interrupted: bool
    cps: list[Checkpoint] = field(default_factory=list)
    prior_step: int = 0
    startup: float | None = None


def _segments(wl: WorkloadRecord, pods: Sequence[PodRecord], t0: float, t1: float) -> list[tuple[float, float, str]]:
    """The job's wall clock cut into ``(start, end, state)`` with state ``run`` or a bucket, merged."""
    events: list[tuple[float, str, int]] = []
    for p in pods:
        for s, e in p.runs:
            events.append((s, "running", 1))
            if e is not None:
                events.append((e, "running", -1))
        if p.unschedulable_since is not None:
            until = p.scheduled if p.scheduled is not None and p.scheduled >= p.unschedulable_since else p.ended
            events.append((p.unschedulable_since, "unschedulable", 1))
            if until is not None:
                events.append((until, "unschedulable", -1))
        if p.succeeded and p.ended is not None:
            events.append((p.ended, "succeeded", 1))
    for t, admitted in wl.admissions:
        events.append((t, "admitted", 1 if admitted else 0))
    events.sort(key=lambda e: e[0])
    counts = {"running": 0, "unschedulable": 0, "succeeded": 0, "admitted": 0}
    out: list[tuple[float, float, str]] = []
    i, t = 0, t0
    while t < t1:
        while i < len(events) and events[i][0] <= t:
            _apply(events[i], counts)
            i += 1
        nxt = min(events[i][0] if i < len(events) else t1, t1)
        if counts["running"] >= wl.pods_expected:
            state = "run"
        elif not counts["admitted"]:
            state = "queued"
        elif counts["unschedulable"] > 0:
            state = "waiting_for_hardware"
        elif counts["succeeded"] >= wl.pods_expected and counts["running"] == 0:
            state = "other"
        else:
            state = "starting"
        if out and out[-1][2] == state:
            out[-1] = (out[-1][0], nxt, state)
        else:
            out.append((t, nxt, state))
        t = nxt
    return out


def _apply(event: tuple[float, str, int], counts: dict[str, int]) -> None:
    _, kind, delta = event
    if kind == "admitted":
        counts[kind] = delta  # a state, not a count
    else:
        counts[kind] += delta


def _interrupted(wl: WorkloadRecord, pods: Sequence[PodRecord], end: float, t1: float) -> bool:
    """Whether the run that ended at ``end`` ended in an interruption (not success, not still going)."""
    if end >= t1:
        return wl.finished is not None and not wl.succeeded
    ending = [p for p in pods for s, e in p.runs if e is not None and abs(e - end) <= SAME_MOMENT and s < end]
    return not ending or not all(p.succeeded for p in ending)


def _step_rate(runs: Sequence[_Run]) -> float | None:
    """Median steps per compute second over consecutive checkpoints of one run."""
    rates = []
    for r in runs:
        for a, b in zip(r.cps, r.cps[1:]):
            compute = (b.started if b.started is not None else b.completed) - a.completed
            if b.step > a.step and compute > 0:
                rates.append((b.step - a.step) / compute)
    return statistics.median(rates) if rates else None


def account(wl: WorkloadRecord, pods: Iterable[PodRecord], checkpoints: Sequence[Checkpoint] | None,
            now: float) -> Account:
    """The account of job ``wl`` (module docstring) from its pods and checkpoints, as of ``now``.

    Args:
        wl: its Workload.
        pods: every pod incarnation of the job known (deleted ones included).
        checkpoints: its complete checkpoints (any order); None when they cannot be read.
        now: Unix seconds; the window ends here unless the Workload finished earlier.

    Returns:
        :class:`Account`; ``productive_seconds + sum(badput) == wall_seconds``.
    """
    pods = list(pods)
    t0 = wl.created
    t1 = max(t0, min(now, wl.finished) if wl.finished is not None else now)
    known = checkpoints is not None
    cps = sorted(checkpoints or (), key=lambda c: (c.completed, c.step))
    badput = dict.fromkeys(BUCKETS, 0.0)
    segments = _segments(wl, pods, t0, t1)

    runs: list[_Run] = []
    for s, e, state in segments:
        if state != "run":
            continue
        r = _Run(s, e, _interrupted(wl, pods, e, t1))
        r.cps = [c for c in cps if s < c.completed <= e]
        r.prior_step = max((c.step for c in cps if c.completed <= s), default=0)
        runs.append(r)
    rate = _step_rate(runs)
    for r in runs:
        if r.cps and rate:
            first = r.cps[0]
            before = (first.started if first.started is not None else first.completed) - r.start
            r.startup = min(max(0.0, before - (first.step - r.prior_step) / rate), max(0.0, before))
    measured = [r.startup for r in runs if r.startup is not None]
    typical = statistics.median(measured) if measured else 0.0

    phases: list[Phase] = []
    interruptions: list[Interruption] = []
    productive = 0.0
    run_iter = iter(runs)
    for idx, (s, e, state) in enumerate(segments):
        if state != "run":
            badput[state] += e - s
            phases.append(Phase(s, e, state))
            continue
        r = next(run_iter)
        length = e - s
        startup = r.startup if r.startup is not None else min(typical, length)
        saving = sum(c.completed - max(c.started if c.started is not None else c.completed, s) for c in r.cps)
        last_kept = r.cps[-1].completed if r.cps else s + startup
        lost = max(0.0, e - last_kept) if r.interrupted and known else 0.0
        startup = max(0.0, min(startup, length - saving - lost))
        badput["starting"] += startup
        badput["checkpoint_saving"] += saving
        badput["progress_lost"] += lost
        productive += length - startup - saving - lost
        phases.extend(_run_phases(s, e, startup, r.cps, lost))
        if r.interrupted:
            resumed = next((seg[0] for seg in segments[idx + 1:] if seg[2] == "run"), None)
            interruptions.append(Interruption(e, lost, resumed))
    return Account(namespace=wl.namespace, job=wl.job_name, kind=wl.job_kind, start=t0, end=t1,
                   productive_seconds=productive, badput=badput, phases=tuple(_merge(phases)),
                   interruptions=tuple(interruptions), checkpoints=len(cps), step_rate=rate,
                   finished=wl.finished is not None and wl.finished <= now, checkpoints_known=known)


def _run_phases(s: float, e: float, startup: float, cps: Sequence[Checkpoint], lost: float) -> list[Phase]:
    out = [Phase(s, s + startup, "starting")] if startup > 0 else []
    t = s + startup
    for c in cps:
        begin = max(t, c.started if c.started is not None else c.completed)
        if begin > t:
            out.append(Phase(t, begin, PRODUCTIVE))
        if c.completed > begin:
            out.append(Phase(begin, c.completed, "checkpoint_saving"))
        t = max(t, c.completed)
    tail_lost = e - lost
    if tail_lost > t:
        out.append(Phase(t, tail_lost, PRODUCTIVE))
    if lost > 0:
        out.append(Phase(max(t, tail_lost), e, "progress_lost"))
    return out


def _merge(phases: Iterable[Phase]) -> list[Phase]:
    out: list[Phase] = []
    for p in phases:
        if p.end <= p.start:
            continue
        if out and out[-1].state == p.state and math.isclose(out[-1].end, p.start):
            out[-1] = Phase(out[-1].start, p.end, p.state)
        else:
            out.append(p)
    return out
