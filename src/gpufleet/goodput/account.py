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

Which checkpoints are the job's, and when they completed, is settled
first (the assumptions are in :mod:`gpufleet.goodput`):

1. *By identity* (:func:`_by_identity`): the writer pod a marker names, else
   the last start record written before the checkpoint, compared on the
   filesystem's own clock.
2. *On one clock* (:func:`on_api_clock`): the filesystem's offset, measured
   from the start records (:func:`gpufleet.goodput.checkpoints.clock_offset`)
   or fitted by order (:func:`fit_offset`), is taken off every file time.
   Without a measured offset, a run whose first save is dated before its
   gang can have computed the steps since the one it resumed from (at the
   job's step rate) by at most :data:`MAX_CLOCK_OFFSET_SECONDS` keeps its
   checkpoints that much later when its lost work is counted.
3. *By time* (:func:`_by_time`): what completed during a run, or where a run
   whose pods are gone may have been; not while the Workload was not
   admitted, nor while its known pods were there but not all running.

The rest of the directory (copies, other jobs' checkpoints, the job's own
from before its submission) only says which step a run resumed from.

ETTR = productive / wall-clock (Kokolis et al., arXiv:2410.21680); the
buckets sum to wall-clock minus productive. Without checkpoints the whole
run counts as productive: an upper bound (``checkpoints`` None: the job's
checkpoint directory is unknown or unreadable).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpufleet.goodput import BUCKETS
from gpufleet.goodput.checkpoints import Checkpoint, Start, clock_offset
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
        checkpoints: the job's complete checkpoints completed in the window.
        step_rate: training steps per productive second, when two checkpoints of one run give it.
        finished: the Workload has finished.
        checkpoints_known: the job's checkpoints were readable (else nothing counts as lost).
        reconstructed_runs: runs inferred from checkpoints because their pods are gone from the record.
        clock_offset: seconds the checkpoint filesystem's clock was taken to be ahead of the API server's.
        clock_offset_source: how it was found: ``start records`` (measured), ``fitted`` (by order),
            ``given``, or ``none`` (0: nothing to measure, or 0 fits).
        checkpoints_not_counted: checkpoints completed in the window that are not the job's (copied in,
            another job's, written while it was queued).
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
    reconstructed_runs: int = 0
    clock_offset: float = 0.0
    clock_offset_source: str = "none"
    checkpoints_not_counted: int = 0

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
    early: float = 0.0  # seconds its checkpoints are dated before the run can have reached them


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
            now: float, *, starts: Sequence[Start] = (), offset: float | None = None) -> Account:
    """The account of job ``wl`` (module docstring) from its pods and checkpoints, as of ``now``.

    Args:
        wl: its Workload.
        pods: every pod incarnation of the job known (deleted ones included).
        checkpoints: the complete checkpoints in its directory (any order, any writer: those that are
            not the job's are found here); None when they cannot be read.
        now: Unix seconds; the window ends here unless the Workload finished earlier.
        starts: the start records in its directory (:class:`gpufleet.goodput.checkpoints.Start`).
        offset: seconds the checkpoint filesystem's clock is ahead of the API server's, when known;
            by default measured from ``starts`` (:func:`gpufleet.goodput.checkpoints.clock_offset`),
            else fitted (:func:`fit_offset`).

    Returns:
        :class:`Account`; ``productive_seconds + sum(badput) == wall_seconds``.
    """
    pods = list(pods)
    t0 = wl.created
    t1 = max(t0, min(now, wl.finished) if wl.finished is not None else now)
    known = checkpoints is not None
    raw = list(checkpoints or ())
    starts = sorted(starts, key=lambda x: x.written)
    ours = _by_identity(wl, pods, raw, starts)
    mine = [c for c, ok in zip(raw, ours) if ok]
    segments = _segments(wl, pods, t0, t1)
    if offset is not None:
        source = "given"
    elif (measured := clock_offset(starts)) is not None:
        offset, source = measured, "start records"
    else:
        offset = fit_offset(mine, segments, t0, t1)
        source = "fitted" if offset else "none"
    moved = [on_api_clock(c, offset) for c in raw]
    everything = sorted(moved, key=lambda c: (c.completed, c.step))
    mine = [c for c, ok in zip(moved, ours) if ok]
    cps = sorted(_by_time(wl, pods, mine, segments, t0, t1), key=lambda c: (c.completed, c.step))
    counted = sum(1 for c in cps if t0 < c.completed <= t1)
    not_counted = sum(1 for c in everything if t0 < c.completed <= t1) - counted
    badput = dict.fromkeys(BUCKETS, 0.0)
    ghosts = _reconstruct(wl, pods, cps, segments, t0, t1, everything)
    if ghosts:
        pods += ghosts
        segments = _segments(wl, pods, t0, t1)

    runs: list[_Run] = []
    for s, e, state in segments:
        if state != "run":
            continue
        r = _Run(s, e, _interrupted(wl, pods, e, t1))
        r.cps = [c for c in cps if s < c.completed <= e]
        r.prior_step = _prior_step(everything, r.cps[0], s) if r.cps else 0
        runs.append(r)
    rate = _step_rate(runs)
    for r in runs:
        if r.cps and rate:
            first = r.cps[0]
            before = (first.started if first.started is not None else first.completed) - r.start
            compute = (first.step - r.prior_step) / rate
            r.startup = min(max(0.0, before - compute), max(0.0, before))
            if source in ("fitted", "none") and 0.0 < compute - before <= MAX_CLOCK_OFFSET_SECONDS:
                # a first save dated before the gang can have computed its steps, by no more than a clock can
                # be off: the filesystem's clock is behind by that much still; its checkpoints are kept that
                # much later (further off, the trainer saved sooner than its pace, and the times stand)
                r.early = compute - before
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
        last_kept = r.cps[-1].completed + r.early if r.cps else s + startup
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
                   interruptions=tuple(interruptions), checkpoints=counted, step_rate=rate,
                   finished=wl.finished is not None and wl.finished <= now, checkpoints_known=known,
                   reconstructed_runs=len({g.uid.rsplit("-", 1)[0] for g in ghosts}),
                   clock_offset=offset, clock_offset_source=source, checkpoints_not_counted=not_counted)


# ------------------------------------------------------------------ whose checkpoints, on which clock

#: Clock differences between the checkpoint filesystem and the API server the account is built to absorb
#: (seconds): up to this, an account moves by at most the difference (module docstring).
MAX_CLOCK_OFFSET_SECONDS = 60.0
#: Offsets :func:`fit_offset` tries (whole seconds, either sign): what the account promises to absorb, no more
#: (an offset it fits wrongly costs at most this much start-up or lost time in a run).
FIT_RANGE_SECONDS = int(MAX_CLOCK_OFFSET_SECONDS)
#: How much faster than the job's median pace (steps per compute second) :func:`fit_offset` lets a run have
#: gone (a share): step times vary by a few percent; the share :data:`HIDDEN_GAP_SHARE` uses the other way.
PACE_SLACK = 0.1


def on_api_clock(c: Checkpoint, offset: float) -> Checkpoint:
    """``c`` with its filesystem times moved onto the API server's clock (``offset``: filesystem minus API)."""
    if not offset and (c.started is None or c.started <= c.completed):
        return c
    completed = c.completed - offset
    started = c.started - offset if c.started is not None and c.started_on_fs else c.started
    if started is not None and started > completed:  # the writer's clock and the filesystem's disagree
        started = completed
    return replace(c, completed=completed, started=started, started_on_fs=False)


def _by_identity(wl: WorkloadRecord, pods: Sequence[PodRecord], cps: Sequence[Checkpoint],
                 starts: Sequence[Start]) -> list[bool]:
    """For each checkpoint: whether the job's own pods may have written it, by who wrote it and in which order.

    * a checkpoint whose marker names its writer pod is the job's when that pod is one of the job's
      (known pods, or start records of the job's), not when it is another job's;
    * otherwise, in a directory with start records, it belongs to the job of the last record written
      before it (modification times compared with each other: one clock, whatever its offset); one
      written before every record while the job's own pods left records was there before they ran;
    * without either, time decides (:func:`_by_time`).

    ``starts`` sorted by ``written``.
    """
    names, uids = {p.name for p in pods}, {p.uid for p in pods}

    def ours(x: Start) -> bool:
        if x.pod_uid in uids:
            return True
        if x.job_uid and wl.job_uid:
            return x.job_uid == wl.job_uid
        return x.job == wl.job_name

    flags = [ours(x) for x in starts]
    own_pods = {x.pod for x, ok in zip(starts, flags) if ok}
    other_pods = {x.pod for x, ok in zip(starts, flags) if not ok}
    written = [x.written for x in starts]
    out = []
    for c in cps:
        if c.writer and (c.writer in names or c.writer in own_pods):
            out.append(True)
            continue
        if c.writer and c.writer in other_pods:
            out.append(False)
            continue
        i = bisect.bisect_right(written, c.completed)
        out.append(flags[i - 1] if i else not any(flags))
    return out


class _Spans:
    """Sorted, merged half-open ``[start, end)`` intervals; ``t in spans`` by bisection."""

    def __init__(self, spans: Iterable[tuple[float, float]]):
        merged: list[list[float]] = []
        for s, e in sorted(spans):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            elif e > s:
                merged.append([s, e])
        self._starts = [m[0] for m in merged]
        self._spans = merged

    def __contains__(self, t: float) -> bool:
        i = bisect.bisect_right(self._starts, t) - 1
        return i >= 0 and t < self._spans[i][1]


def _alive(pods: Sequence[PodRecord], t1: float) -> _Spans:
    """When some known pod of the job existed (creation to end, or ``t1``)."""
    return _Spans((p.created, p.ended if p.ended is not None else t1) for p in pods)


def _by_time(wl: WorkloadRecord, pods: Sequence[PodRecord], cps: Sequence[Checkpoint],
             segments: Sequence[tuple[float, float, str]], t0: float, t1: float) -> list[Checkpoint]:
    """Of ``cps`` (on the API server's clock), those the job's pods can have written when they completed.

    Completed during one of the job's runs (every pod of its gang running), or where the record has no
    pod of the job at all while the Workload was admitted (a run whose pods are gone:
    :func:`_reconstruct`). Not: while the Workload was not admitted (queued, before its first admission
    or after an eviction; Kueue keeps the job suspended, so none of its pods runs), nor while its known
    pods were there but not all running. Those before the job's submission stay, as the resume points
    of its first run, and count for nothing else.
    """
    runs = _Spans((s + 1e-3, e + 1e-3) for s, e, state in segments if state == "run")  # s < t <= e
    alive = _alive(pods, t1)
    out = []
    for c in cps:
        t = c.completed
        if t <= t0 or t > t1 or t in runs or (wl.admitted_at(t) and t not in alive):
            out.append(c)
    return out


def fit_offset(cps: Sequence[Checkpoint], segments: Sequence[tuple[float, float, str]], t0: float,
               t1: float) -> float:
    """The filesystem's clock offset (seconds, filesystem minus API) under which the job's checkpoints best
    fit its runs, by order; 0 when nothing fits better.

    Without start records nothing measures the offset, but the checkpoints must still fit what the job
    did. A checkpoint *fits* when, moved by the offset, it completes during one of the job's runs
    (``segments``' ``run`` stretches, every pod of the gang running) and that run can have written it:
    its save began after the run did, and ended after it began; its step is not lower than the run's
    checkpoint before it; and the time since that one (for the run's first, since the run started and
    from the highest step before it) covers its steps at the job's pace (the median steps per compute
    second between consecutive checkpoints of one run) with :data:`PACE_SLACK` to spare.

    0 stays while every checkpoint fits (or is ahead of the job's pace by more than any offset in
    range explains: a trainer that saved sooner than its pace). Otherwise every whole-second offset within
    :data:`FIT_RANGE_SECONDS` that leaves no fewer checkpoints in runs is tried, and the one that
    fits the most wins if it fits more than 0 does, of equals the one nearest 0. A shift keeps the
    times between checkpoints, so what it can mend is where a run begins and ends against them: a
    save pushed past its run's end, before its start, or into the next run. A checkpoint copied in,
    another job's, or one of a run whose pods are gone, which no offset puts in a run it fits, does
    not move it.

    Args:
        cps: the job's checkpoints as the filesystem records them.
        segments: the job's states (:func:`_segments`), on the API server's clock.
        t0, t1: the account's window.
    """
    runs = [(s, e) for s, e, state in segments if state == "run"]
    if not runs or not cps:
        return 0.0
    score = _fit_scorer(cps, runs, t0, t1)
    fit0, inside0, beyond0 = score(0.0)
    if fit0 + beyond0 == len(cps):  # every checkpoint fits a run as it is, or fits under no offset in range
        return 0.0
    best, most = 0.0, fit0
    for step in range(1, FIT_RANGE_SECONDS + 1):
        for d in (float(step), float(-step)):
            fit, inside, _ = score(d)
            if inside >= inside0 and fit > most:
                best, most = d, fit
    return best


def _fit_scorer(cps: Sequence[Checkpoint], runs: Sequence[tuple[float, float]], t0: float, t1: float):
    """``offset -> (checkpoints that fit a run, checkpoints in a run, checkpoints further ahead of the job's
    pace than any offset in range explains)`` (:func:`fit_offset`)."""
    run_starts = [s for s, _ in runs]
    run_ends = [e for _, e in runs]
    by_time = sorted(cps, key=lambda c: (c.completed, c.step))
    steps = [c.step for c in by_time]
    done = [c.completed for c in by_time]
    # save starts on the filesystem's clock move with the offset; the writer's do not
    began = [c.started if c.started is not None else c.completed for c in by_time]
    moves = [c.started is None or c.started_on_fs for c in by_time]
    known_start = [c.started is not None for c in by_time]
    # the highest step below each checkpoint's among those before it (the order does not change with the offset)
    below: list[int] = []
    seen: list[int] = []
    for st in steps:
        i = bisect.bisect_left(seen, st)
        below.append(seen[i - 1] if i else 0)
        bisect.insort(seen, st)

    reach = (1 + PACE_SLACK) * FIT_RANGE_SECONDS + SAME_MOMENT

    def score(d: float) -> tuple[int, int, int]:
        t = [x - d for x in done]
        b = [x - d if m else x for x, m in zip(began, moves)]
        where: list[int | None] = []
        for x in t:
            i = bisect.bisect_left(run_starts, x) - 1  # s < x <= e
            where.append(i if i >= 0 and t0 < x <= t1 and x <= run_ends[i] else None)
        # the pace within runs (a pair across a restart or a queue is slower); none known: not checked
        within = [(steps[k] - steps[k - 1]) / (b[k] - t[k - 1]) for k in range(1, len(t))
                  if where[k] is not None and where[k] == where[k - 1] and steps[k] > steps[k - 1]
                  and b[k] > t[k - 1]]
        rate = statistics.median(within) if within else None
        fitting = inside = beyond = 0

        def too_far(n: int, seconds: float) -> bool:
            nonlocal beyond
            excess = n / rate - (1 + PACE_SLACK) * seconds - SAME_MOMENT if rate else 0.0
            beyond += excess > reach and settled  # no offset in range mends that
            return excess > 0

        for k in range(len(t)):
            run = where[k]
            if run is None:
                continue
            inside += 1
            # further than any offset in range from both ends of its run: no shift takes it out of that run
            settled = min(t[k] - run_starts[run], run_ends[run] - t[k]) > FIT_RANGE_SECONDS
            begin = min(b[k], t[k])
            if known_start[k] and b[k] > t[k] + SAME_MOMENT:
                continue  # a save that ends before it begins
            if k and where[k - 1] == run:
                if steps[k] < steps[k - 1] or too_far(steps[k] - steps[k - 1], begin - t[k - 1]):
                    continue
            elif begin < run_starts[run] - SAME_MOMENT or too_far(steps[k] - below[k], begin - run_starts[run]):
                continue  # the gang had not run long enough to reach that step
            fitting += 1
        return fitting, inside, beyond

    return score


def _prior_step(cps: Sequence[Checkpoint], first: Checkpoint, start: float) -> int:
    """The step a run that started at ``start`` resumed from: the highest complete one before it, below
    the run's first checkpoint ``first`` (a run that started over or went back writes lower steps)."""
    return max((c.step for c in cps if c.completed <= start and c.step < first.step), default=0)


def _start(c: Checkpoint) -> float:
    return c.started if c.started is not None else c.completed


def _pair_rates(cps: Sequence[Checkpoint]) -> list[float]:
    return [(b.step - a.step) / compute for a, b in zip(cps, cps[1:])
            if b.step > a.step and (compute := _start(b) - a.completed) > 0]


#: A gap between two checkpoints longer than their steps' compute by this much (seconds, and share of the
#: compute) is an interruption hidden from a record without the pods of that time.
HIDDEN_GAP_SECONDS = 5.0
HIDDEN_GAP_SHARE = 0.25


def _reconstruct(wl: WorkloadRecord, pods: Sequence[PodRecord], cps: Sequence[Checkpoint],
                 segments: Sequence[tuple[float, float, str]], t0: float, t1: float,
                 everything: Sequence[Checkpoint] = ()) -> list[PodRecord]:
    """Stand-in pods for runs whose pods are gone from the record but whose checkpoints are on disk.

    A checkpoint completed while no known gang ran proves the gang ran then
    (the one-shot view, or an accountant that restarted, lacks deleted pods).
    Such checkpoints are cut into runs at the creation of later pods (a gang
    restart creates new pods once the old ones are gone) and where the time
    between two of them exceeds the compute their steps take at the job's
    step rate (median over consecutive checkpoints) by more than
    :data:`HIDDEN_GAP_SECONDS` and :data:`HIDDEN_GAP_SHARE`: there the job
    stopped and restarted. A rebuilt run starts the compute of its first
    checkpoint's steps (and the job's typical start-up, after a hidden
    restart) before that checkpoint's save, and ends at the next pods'
    creation or the next rebuilt run: the kept work is exact; the lost work
    of a hidden interruption absorbs its restart time. ``cps`` are the
    job's own (:func:`_by_time`); ``everything`` in the directory gives the
    steps runs resumed from.
    """
    runs = [(s, e) for s, e, state in segments if state == "run"]
    orphans = [c for c in cps if t0 < c.completed <= t1 and not any(s < c.completed <= e for s, e in runs)]
    if not orphans:
        return []
    boundaries = sorted({p.created for p in pods} | {s for s, _ in runs})
    groups: list[list[Checkpoint]] = []
    for c in orphans:
        if groups and not any(groups[-1][-1].completed < b < c.completed for b in boundaries):
            groups[-1].append(c)
        else:
            groups.append([c])
    in_runs = [[c for c in cps if s < c.completed <= e] for s, e in runs]
    rates = [x for g in [*groups, *in_runs] for x in _pair_rates(g)]
    rate = statistics.median(rates) if rates else None

    def prior(c: Checkpoint) -> int:
        return max((x.step for x in (everything or cps) if x.completed < c.completed and x.step < c.step), default=0)

    startups = [max(0.0, _start(r[0]) - s - (r[0].step - prior(r[0])) / rate)
                for (s, _), r in zip(runs, in_runs) if r and rate]
    typical = statistics.median(startups) if startups else 0.0
    ghosts: list[PodRecord] = []
    n = 0
    for g in groups:
        pieces: list[list[Checkpoint]] = [[g[0]]]
        for a, b in zip(g, g[1:]):
            compute = (b.step - a.step) / rate if rate else 0.0
            gap = _start(b) - a.completed - compute
            if rate and gap > HIDDEN_GAP_SECONDS and gap > HIDDEN_GAP_SHARE * compute:
                pieces.append([b])
            else:
                pieces[-1].append(b)
        floor = max([t0] + [b for b in boundaries if b <= _start(g[0])] + [e for _, e in runs if e <= _start(g[0])])
        starts = []
        for i, piece in enumerate(pieces):
            compute = (piece[0].step - prior(piece[0])) / rate if rate else 0.0
            begin = _start(piece[0]) - compute - (typical if i else 0.0)
            starts.append(max(floor, begin) if i == 0 else max(pieces[i - 1][-1].completed, begin))
        end_of_group = min((b for b in boundaries if b >= g[-1].completed), default=t1 + 1e-3) - 1e-3
        for i, piece in enumerate(pieces):
            # a millisecond apart: two rebuilt runs are two runs, not one
            end = starts[i + 1] - 1e-3 if i + 1 < len(pieces) else end_of_group
            ghosts += [PodRecord(uid=f"ghost-{n}-{k}", name=f"(run {n + 1}, pods gone)", created=starts[i],
                                 runs=((starts[i], end),), ended=end) for k in range(wl.pods_expected)]
            n += 1
    return ghosts


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
