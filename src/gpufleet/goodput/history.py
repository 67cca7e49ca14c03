"""What the accountant knows of one training job, as plain records built from API objects (pure).

A job is one Kueue Workload (its owner is the JobSet, PyTorchJob or Job),
the pods of that job, and its checkpoints (:mod:`gpufleet.goodput.checkpoints`).
The API keeps only the latest transition of each Workload condition and
forgets deleted pods, so the records are built to be *merged*: the
controller folds every version of an object it sees into the record it
already has (:func:`merge_workload`, :func:`merge_pod`), and the one-shot
``invoke train.goodput`` folds the Workload's Events in (Kueue's
``QuotaReserved``/``Admitted``/``Evicted*`` reasons, kept by the API server
for an hour by default).

Times are Unix seconds (API timestamps have one-second resolution).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from gpufleet.kube.times import parse_time
from gpufleet.names import JOB_LABEL

Obj = dict[str, Any]

#: Pod labels naming a pod's job, tried in order: gpufleet's training templates, then each
#: workload controller's own (JobSet, batch Job, Kubeflow training-operator).
JOB_NAME_LABELS = (JOB_LABEL, "jobset.sigs.k8s.io/jobset-name", "batch.kubernetes.io/job-name",
                   "training.kubeflow.org/job-name")
#: Kinds of Workload owners accounted as training jobs.
JOB_KINDS = ("JobSet", "PyTorchJob", "Job")


@dataclass(frozen=True)
class WorkloadRecord:
    """A job's Kueue Workload.

    Attributes:
        namespace, name, uid: the Workload's.
        job_kind, job_name: its owner (``JobSet``/``PyTorchJob``/``Job``).
        created: its creation (the job's submission).
        pods_expected: pods of the gang (sum of ``spec.podSets[].count``).
        admissions: ``(time, admitted)`` transitions, sorted: admitted (``Admitted`` True)
            or not (``Evicted``/``Preempted`` True, ``Admitted``/``QuotaReserved`` False).
        finished: ``Finished`` condition time, None while the job runs.
        succeeded: whether it finished successfully (``Finished`` reason ``Succeeded``).
        checkpoint_dir: the pods' ``CHECKPOINT_DIR``, when known.
        job_uid: its owner's uid (the JobSet's, PyTorchJob's or Job's), ``""`` when unknown.
    """

    namespace: str
    name: str
    uid: str
    job_kind: str
    job_name: str
    created: float
    pods_expected: int
    admissions: tuple[tuple[float, bool], ...] = ()
    finished: float | None = None
    succeeded: bool = False
    checkpoint_dir: str | None = None
    job_uid: str = ""

    def admitted_windows(self, end: float) -> list[tuple[float, float]]:
        """The ``(start, end)`` intervals (Unix seconds) during which the Workload was admitted, up to
        ``end`` (an admission still in force ends there); empty when it never was."""
        out: list[tuple[float, float]] = []
        since: float | None = None
        for when, admitted in self.admissions:
            if when >= end:
                break
            if admitted and since is None:
                since = when
            elif not admitted and since is not None:
                out.append((since, when))
                since = None
        if since is not None:
            out.append((since, end))
        return out

    def admitted_at(self, t: float) -> bool:
        """Whether the Workload was admitted at time ``t`` (the last transition at or before it)."""
        state = False
        for when, admitted in self.admissions:
            if when > t:
                break
            state = admitted
        return state


@dataclass(frozen=True)
class PodRecord:
    """One pod of a job (an incarnation: a gang restart makes new pods).

    Attributes:
        uid, name: the pod's.
        created: its creation.
        unschedulable_since: when the scheduler first found no node for it (``PodScheduled``
            False, reason ``Unschedulable``), None if never seen so.
        scheduled: when it was bound to a node.
        runs: ``(start, end)`` intervals during which its main container ran (``end`` None:
            still running); several when the container restarted in place.
        ended: when the pod stopped for good (terminal phase, or its deletion was requested).
        succeeded: it ended with phase Succeeded.
    """

    uid: str
    name: str
    created: float
    unschedulable_since: float | None = None
    scheduled: float | None = None
    runs: tuple[tuple[float, float | None], ...] = ()
    ended: float | None = None
    succeeded: bool = False


def _conditions(obj: Obj) -> dict[str, Obj]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def owner(obj: Obj) -> tuple[str, str] | None:
    """``(kind, name)`` of a Workload's training-job owner (JobSet, PyTorchJob, Job), else None."""
    ref = _owner_ref(obj)
    return (ref["kind"], ref.get("name", "")) if ref else None


def _owner_ref(obj: Obj) -> Obj | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") in JOB_KINDS:
            return ref
    return None


def job_of_pod(pod: Obj) -> str | None:
    """The job a pod belongs to, from the first of :data:`JOB_NAME_LABELS` it carries."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), None)


def checkpoint_dir_of_pod(pod: Obj) -> str | None:
    """``CHECKPOINT_DIR`` of the pod's first container (set by gpufleet's training templates)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        for env in c.get("env") or []:
            if env.get("name") == "CHECKPOINT_DIR" and env.get("value"):
                return env["value"]
        return None
    return None


def _transitions(conditions: dict[str, Obj]) -> list[tuple[float, bool]]:
    out = []
    for kind, c in conditions.items():
        t = parse_time(c.get("lastTransitionTime"))
        if t is None:
            continue
        true = c.get("status") == "True"
        if kind == "Admitted":
            out.append((t, true))
        elif kind in ("Evicted", "Preempted") and true:
            out.append((t, False))
        elif kind == "QuotaReserved" and not true:
            out.append((t, False))
    return out


def event_transitions(events: Iterable[Obj]) -> list[tuple[float, bool]]:
    """Admission transitions in a Workload's Events: ``Admitted`` (True), ``Evicted*``/``Preempted`` (False)."""
    out = []
    for e in events:
        reason = e.get("reason") or ""
        t = parse_time(e.get("eventTime")) or parse_time(e.get("lastTimestamp")) or parse_time(e.get("firstTimestamp"))
        if t is None:
            continue
        if reason == "Admitted":
            out.append((t, True))
        elif reason.startswith("Evicted") or reason == "Preempted":
            out.append((t, False))
    return out


def _merge_transitions(*lists: Iterable[tuple[float, bool]]) -> tuple[tuple[float, bool], ...]:
    """Sorted, without repeats of the same state (a False at the same second as a True goes first)."""
    merged = sorted(set(t for lst in lists for t in lst), key=lambda x: (x[0], x[1]))
    out: list[tuple[float, bool]] = []
    for t in merged:
        if not out or out[-1][1] != t[1]:
            out.append(t)
    return tuple(out)


def workload_record(wl: Obj, events: Iterable[Obj] = (), previous: WorkloadRecord | None = None,
                    checkpoint_dir: str | None = None) -> WorkloadRecord | None:
    """A :class:`WorkloadRecord` of a Workload (JSON), its Events, and what was known before; None when
    the Workload's owner is not a training job kind or the object lacks a creation time."""
    meta = wl.get("metadata") or {}
    own = owner(wl)
    created = parse_time(meta.get("creationTimestamp"))
    if own is None or created is None:
        return None
    conds = _conditions(wl)
    pods = sum(int(ps.get("count") or 0) for ps in (wl.get("spec") or {}).get("podSets") or [])
    fin = conds.get("Finished")
    finished = parse_time(fin.get("lastTransitionTime")) if fin and fin.get("status") == "True" else None
    rec = WorkloadRecord(
        namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
        job_kind=own[0], job_name=own[1], created=created, pods_expected=max(pods, 1),
        admissions=_merge_transitions(_transitions(conds), event_transitions(events),
                                      previous.admissions if previous else ()),
        finished=finished, succeeded=bool(fin and fin.get("status") == "True" and fin.get("reason") == "Succeeded"),
        checkpoint_dir=checkpoint_dir or (previous.checkpoint_dir if previous else None),
        job_uid=(_owner_ref(wl) or {}).get("uid", ""),
    )
    return rec


def merge_workload(previous: WorkloadRecord | None, current: WorkloadRecord) -> WorkloadRecord:
    """``current`` with the admission transitions ``previous`` saw and ``current`` no longer shows."""
    if previous is None:
        return current
    return replace(current, admissions=_merge_transitions(previous.admissions, current.admissions),
                   checkpoint_dir=current.checkpoint_dir or previous.checkpoint_dir)


def _main_status(pod: Obj) -> Obj | None:
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if not statuses:
        return None
    main = containers[0].get("name") if containers else None
    return next((s for s in statuses if s.get("name") == main), statuses[0])


def _stop_requested(meta: Obj) -> float | None:
    """When deletion was requested: ``deletionTimestamp`` minus the grace period it added."""
    t = parse_time(meta.get("deletionTimestamp"))
    if t is None:
        return None
    return t - float(meta.get("deletionGracePeriodSeconds") or 0)


def pod_record(pod: Obj, previous: PodRecord | None = None) -> PodRecord | None:
    """A :class:`PodRecord` of a pod (JSON), folded into what was known before; None without a creation time."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    created = parse_time(meta.get("creationTimestamp"))
    if created is None:
        return None
    conds = _conditions(pod)
    sched = conds.get("PodScheduled") or {}
    sched_t = parse_time(sched.get("lastTransitionTime"))
    scheduled = sched_t if sched.get("status") == "True" else None
    unschedulable = sched_t if sched.get("status") == "False" and sched.get("reason") == "Unschedulable" else None
    runs: list[tuple[float, float | None]] = []
    main = _main_status(pod)
    if main:
        for state in (main.get("lastState") or {}, main.get("state") or {}):
            if "terminated" in state:
                term = state["terminated"]
                s, e = parse_time(term.get("startedAt")), parse_time(term.get("finishedAt"))
                if e is not None and (s is None or s >= e) and state is (main.get("state") or {}):
                    # No start recorded with the end (kwok's pod-complete writes startedAt = finishedAt):
                    # the containers became ready when it started.
                    ready = conds.get("ContainersReady") or {}
                    r = parse_time(ready.get("lastTransitionTime")) if ready.get("status") == "True" else None
                    s = r if r is not None and r < e else s
                if s is not None:
                    runs.append((s, e if e is not None else s))
            elif "running" in state:
                s = parse_time(state["running"].get("startedAt"))
                if s is not None:
                    runs.append((s, None))
    phase = status.get("phase")
    stop = _stop_requested(meta)
    if stop is not None:  # the gang is broken once a stop is asked for, not when the grace period ends
        runs = [(s, max(s, min(e, stop)) if e is not None else max(s, stop)) for s, e in runs]
    ended = stop
    if ended is None and phase in ("Succeeded", "Failed"):
        ended = max((e for _, e in runs if e is not None), default=None) or sched_t or created
    if ended is not None:
        runs = [(s, e if e is not None else max(s, ended)) for s, e in runs]
    rec = PodRecord(uid=meta.get("uid", ""), name=meta.get("name", ""), created=created,
                    unschedulable_since=unschedulable, scheduled=scheduled, runs=tuple(runs), ended=ended,
                    succeeded=phase == "Succeeded")
    return merge_pod(previous, rec)


def merge_pod(previous: PodRecord | None, current: PodRecord) -> PodRecord:
    """``current`` with what ``previous`` knew and ``current`` no longer shows (earlier runs, the first
    unschedulable time); an open run closed by a later view is closed."""
    if previous is None:
        return current
    runs: dict[float, float | None] = {}
    for s, e in (*previous.runs, *current.runs):
        if s not in runs or runs[s] is None:
            runs[s] = e
    ended = current.ended if current.ended is not None else previous.ended
    merged = sorted(runs.items())
    if ended is not None:  # a run an earlier view saw open ended with the pod
        merged = [(s, e if e is not None else max(s, ended)) for s, e in merged]
    # a later view's run that starts where an earlier open one did not end is the same run seen twice
    out: list[tuple[float, float | None]] = []
    for s, e in merged:
        if out and (out[-1][1] is None or s <= out[-1][1]):
            out[-1] = (out[-1][0], None if out[-1][1] is None or e is None else max(out[-1][1], e))
        else:
            out.append((s, e))
    return replace(
        current,
        unschedulable_since=previous.unschedulable_since if previous.unschedulable_since is not None
        else current.unschedulable_since,
        scheduled=current.scheduled if current.scheduled is not None else previous.scheduled,
        runs=tuple(out),
        ended=ended,
        succeeded=current.succeeded or previous.succeeded,
    )


def gone(record: PodRecord, at: float) -> PodRecord:
    """``record`` of a pod that disappeared (deleted) by ``at``: ended then if nothing said earlier."""
    ended = record.ended if record.ended is not None else at
    return replace(record, ended=ended, runs=tuple((s, e if e is not None else max(ended, s)) for s, e in record.runs))
