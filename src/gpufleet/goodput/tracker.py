"""What the accountant remembers of every training job, fed with API objects; accounts on demand.

:class:`Tracker` is the service behind ``gpufleet goodput`` and ``invoke
train.goodput``: it folds every version of a Workload or pod it is given
into compact records (:mod:`gpufleet.goodput.history`), so transitions the
API overwrites and pods it deletes stay in the job's history, and reads
each job's checkpoints and start records (:mod:`gpufleet.goodput.checkpoints`)
from the ``CHECKPOINT_DIR`` its pods were given; which of them are the
job's, and on which clock, the account decides (:mod:`gpufleet.goodput.account`).
Thread-safe: watches feed it from their threads while the controller loop
asks for accounts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from gpufleet.goodput.account import Account, account
from gpufleet.goodput.checkpoints import Scanner
from gpufleet.goodput.history import (PodRecord, WorkloadRecord, checkpoint_dir_of_pod, gone, job_of_pod, merge_workload,
                                      pod_record, workload_record)

Obj = dict[str, Any]
JobKey = tuple[str, str]  # (namespace, job)

#: Pods of a job older than its Workload by more than this belong to an earlier job of the same name.
CREATION_SLACK = 5.0
#: Seconds an ended pod of a job without a Workload is remembered (it may be a job Kueue does not manage).
ORPHAN_SECONDS = 3600.0


def _key(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("uid", "")


class Tracker:
    """The accountant's memory (module docstring).

    Args:
        scanner: reads checkpoint directories (a fresh :class:`Scanner` by default).
        checkpoint_dir: ``(namespace, job, CHECKPOINT_DIR or None) -> directory to read or None``;
            by default the pods' ``CHECKPOINT_DIR`` as is (the accountant mounts the checkpoint
            filesystem where the training pods do).
    """

    def __init__(self, scanner: Scanner | None = None,
                 checkpoint_dir: Callable[[str, str, str | None], str | None] | None = None):
        self._lock = threading.Lock()
        self._scanner = scanner or Scanner()
        self._dir_of = checkpoint_dir or (lambda ns, job, d: d)
        self._workloads: dict[str, WorkloadRecord] = {}
        self._pods: dict[JobKey, dict[str, PodRecord]] = {}
        self._pod_job: dict[str, JobKey] = {}
        self._ckpt_dirs: dict[JobKey, str] = {}

    # ------------------------------------------------------------------ workloads

    def observe_workload(self, obj: Obj, events: Iterable[Obj] = ()) -> WorkloadRecord | None:
        """Fold one version of a Workload (and its Events) in; returns its record (None: not a training job)."""
        uid = _key(obj)
        with self._lock:
            prev = self._workloads.get(uid)
            rec = workload_record(obj, events, prev)
            if rec is None:
                return None
            rec = merge_workload(prev, rec)
            self._workloads[uid] = rec
            return rec

    def forget_workload(self, obj: Obj) -> None:
        """A Workload was deleted: forget it, and its job's pods and checkpoints unless another Workload runs it."""
        uid = _key(obj)
        with self._lock:
            rec = self._workloads.pop(uid, None)
            if rec is None:
                return
            key = (rec.namespace, rec.job_name)
            if any((w.namespace, w.job_name) == key for w in self._workloads.values()):
                return
            for pod_uid in self._pods.pop(key, {}):
                self._pod_job.pop(pod_uid, None)
            d = self._ckpt_dirs.pop(key, None)
            if d and d not in self._ckpt_dirs.values():  # another job writes there too: keep its memory
                self._scanner.forget(d)

    def workloads_listed(self, items: Iterable[Obj]) -> None:
        """A full list of Workloads (read once, page by page): fold each in; forget those no longer there."""
        present = set()
        for o in items:
            present.add(_key(o))
            self.observe_workload(o)
        with self._lock:
            missing = [{"metadata": {"uid": uid}} for uid in self._workloads if uid not in present]
        for o in missing:
            self.forget_workload(o)

    def workload_event(self, kind: str, obj: Obj) -> None:
        """A watch event of a Workload."""
        if kind == "DELETED":
            self.forget_workload(obj)
        else:
            self.observe_workload(obj)

    # ------------------------------------------------------------------ pods

    def observe_pod(self, obj: Obj) -> PodRecord | None:
        """Fold one version of a pod in (None: it belongs to no job)."""
        job = job_of_pod(obj)
        meta = obj.get("metadata") or {}
        if job is None:
            return None
        key: JobKey = (meta.get("namespace", ""), job)
        uid = _key(obj)
        with self._lock:
            pods = self._pods.setdefault(key, {})
            rec = pod_record(obj, pods.get(uid))
            if rec is None:
                return None
            pods[uid] = rec
            self._pod_job[uid] = key
            d = checkpoint_dir_of_pod(obj)
            if d:
                self._ckpt_dirs[key] = d
            return rec

    def pod_gone(self, obj: Obj, at: float) -> None:
        """A pod was deleted (seen last as ``obj``, noticed at ``at``)."""
        self.observe_pod(obj)
        self.pod_ended(_key(obj), at)

    def pod_ended(self, uid: str, at: float) -> None:
        """Pod ``uid`` (its last version already observed) is gone, noticed at ``at``; unknown uids are ignored."""
        with self._lock:
            key = self._pod_job.get(uid)
            if key and uid in self._pods.get(key, {}):
                self._pods[key][uid] = gone(self._pods[key][uid], at)

    def pods_listed(self, items: Iterable[Obj], at: float) -> None:
        """A full list of pods at ``at`` (read once, page by page): fold each in; pods known and absent ended by then."""
        present = set()
        for o in items:
            present.add(_key(o))
            self.observe_pod(o)
        with self._lock:
            for key, pods in self._pods.items():
                for uid, rec in list(pods.items()):
                    if uid not in present and rec.ended is None:
                        pods[uid] = gone(rec, at)

    def pod_event(self, kind: str, obj: Obj, at: float) -> None:
        """A watch event of a pod, received at ``at``."""
        if kind == "DELETED":
            self.pod_gone(obj, at)
        else:
            self.observe_pod(obj)

    # ------------------------------------------------------------------ accounts

    def jobs(self) -> list[WorkloadRecord]:
        """Every training job's Workload record."""
        with self._lock:
            return list(self._workloads.values())

    def account_of(self, wl: WorkloadRecord, now: float, checkpoint_dir: str | None = None) -> Account:
        """The account of one job as of ``now`` (``checkpoint_dir`` overrides where its checkpoints are read)."""
        key = (wl.namespace, wl.job_name)
        with self._lock:
            pods = [p for p in self._pods.get(key, {}).values() if p.created >= wl.created - CREATION_SLACK]
            d = checkpoint_dir or self._dir_of(wl.namespace, wl.job_name, self._ckpt_dirs.get(key))
        cps = self._scanner.scan(d) if d else None
        return account(wl, pods, cps, now, starts=self._scanner.starts(d) if d else ())

    def accounts(self, now: float) -> list[Account]:
        """Accounts of every job, as of ``now``; forgets long-ended pods of jobs without a Workload."""
        with self._lock:
            jobs = {(w.namespace, w.job_name) for w in self._workloads.values()}
            for key in [k for k in self._pods if k not in jobs]:
                pods = self._pods[key]
                if all(p.ended is not None and now - p.ended > ORPHAN_SECONDS for p in pods.values()):
                    for uid in self._pods.pop(key):
                        self._pod_job.pop(uid, None)
        return [self.account_of(w, now) for w in self.jobs()]
