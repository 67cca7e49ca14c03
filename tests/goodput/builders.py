"""Constructed API objects and records for the accountant's tests (no cluster)."""

from __future__ import annotations

from datetime import datetime, timezone

from dataclasses import replace

from gpufleet.goodput.checkpoints import Checkpoint, Start
from gpufleet.goodput.history import PodRecord, WorkloadRecord

T0 = 1_800_000_000.0  # a fixed epoch for readable offsets


def ts(offset: float) -> str:
    """RFC 3339 of ``T0 + offset`` (whole seconds, as the API writes)."""
    return datetime.fromtimestamp(T0 + offset, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def wl(pods: int = 2, admissions=((10, True),), finished: float | None = None, succeeded: bool = True,
       job_uid: str = "js-1") -> WorkloadRecord:
    return WorkloadRecord(namespace="team-a", name="jobset-llm-1a2b3", uid="wl-1", job_kind="JobSet", job_name="llm",
                          created=T0, pods_expected=pods, admissions=tuple((T0 + t, a) for t, a in admissions),
                          finished=None if finished is None else T0 + finished, succeeded=succeeded, job_uid=job_uid)


def pod(name: str, created: float, runs, *, unschedulable: float | None = None, scheduled: float | None = None,
        ended: float | None = None, succeeded: bool = False) -> PodRecord:
    return PodRecord(uid=name, name=name, created=T0 + created,
                     unschedulable_since=None if unschedulable is None else T0 + unschedulable,
                     scheduled=None if scheduled is None else T0 + scheduled,
                     runs=tuple((T0 + s, None if e is None else T0 + e) for s, e in runs),
                     ended=None if ended is None else T0 + ended, succeeded=succeeded)


def cp(step: int, started: float | None, completed: float, *, writer: str | None = None,
       started_on_fs: bool = True) -> Checkpoint:
    return Checkpoint(step, T0 + completed, None if started is None else T0 + started, writer=writer,
                      started_on_fs=started_on_fs)


def start(pod: str, at: float, *, job: str = "llm", job_uid: str = "js-1", skew: float = 0.0) -> Start:
    """A start record of pod ``pod`` (uid = name, as :func:`pod` makes them) written at ``at`` by the pod's
    clock (the API server's), ``skew`` seconds later by the checkpoint filesystem's."""
    return Start(pod=pod, pod_uid=pod, job=job, job_uid=job_uid, written=T0 + at + skew, clock=T0 + at)


def skewed(c: Checkpoint, skew: float) -> Checkpoint:
    """``c`` as a checkpoint filesystem whose clock is ``skew`` seconds ahead records it."""
    return replace(c, completed=c.completed + skew,
                   started=c.started + skew if c.started is not None and c.started_on_fs else c.started)


def workload_json(*, conditions=(), pods: int = 2, owner: str = "llm", kind: str = "JobSet") -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"jobset-{owner}-1a2b3", "namespace": "team-a", "uid": "wl-1", "creationTimestamp": ts(0),
                     "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": kind, "name": owner,
                                          "uid": "js-1", "controller": True}]},
        "spec": {"podSets": [{"name": "workers", "count": pods}], "queueName": "pretrain"},
        "status": {"conditions": [{"type": t, "status": s, "reason": r, "lastTransitionTime": ts(at), "message": ""}
                                  for t, s, r, at in conditions]},
    }


def pod_json(name: str, *, created: float = 0, scheduled: tuple[str, str, float] | None = None, phase: str = "Running",
             state: dict | None = None, last_state: dict | None = None, deleted: tuple[float, int] | None = None,
             labels: dict | None = None, env: dict | None = None) -> dict:
    meta = {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "creationTimestamp": ts(created),
            "labels": labels or {"gpufleet.io/job": "llm"}}
    if deleted:
        at, grace = deleted
        meta["deletionTimestamp"] = ts(at + grace)
        meta["deletionGracePeriodSeconds"] = grace
    conds = []
    if scheduled:
        status, reason, at = scheduled
        conds.append({"type": "PodScheduled", "status": status, "reason": reason, "lastTransitionTime": ts(at)})
    cs = {"name": "trainer", "state": state or {}, "lastState": last_state or {}}
    return {"metadata": meta,
            "spec": {"containers": [{"name": "trainer", "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}]},
            "status": {"phase": phase, "conditions": conds, "containerStatuses": [cs] if state or last_state else []}}
