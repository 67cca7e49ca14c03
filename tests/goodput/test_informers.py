"""The accountant's informers feed the tracker: each version folded in, a deletion ends the pod or forgets the job."""

from __future__ import annotations

from gpufleet.goodput import api as gkube
from gpufleet.goodput.tracker import Tracker

from .builders import T0, pod_json, ts, workload_json


def test_informers_fold_versions_in_and_deletions_end_pods_and_forget_workloads(monkeypatch):
    tracker = Tracker()
    workloads, pods = gkube.informers(None, tracker, "team-a")
    assert workloads.path == "/apis/kueue.x-k8s.io/v1beta2/namespaces/team-a/workloads"
    assert pods.path == "/api/v1/namespaces/team-a/pods"
    workloads.apply("ADDED", workload_json(conditions=[("Admitted", "True", "Admitted", 10)]))
    running = pod_json("llm-0", created=5, scheduled=("True", "", 11),
                       state={"running": {"startedAt": ts(12)}})
    pods.apply("ADDED", running)
    assert pods.get("team-a/llm-0") == "uid-llm-0"  # the informer keeps the uid; the tracker keeps the record
    (job,) = tracker.jobs()
    monkeypatch.setattr(gkube, "now", lambda: T0 + 50)
    pods.apply("DELETED", running)
    (account,) = tracker.accounts(T0 + 60)
    assert account.job == "llm"
    ended = tracker._pods[("team-a", "llm")]["uid-llm-0"].ended
    assert ended == T0 + 50
    workloads.apply("DELETED", workload_json())
    assert tracker.jobs() == [] and ("team-a", "llm") not in tracker._pods


def test_jobs_read_before_the_informers_and_gone_from_their_list_are_forgotten():
    tracker = Tracker()
    tracker.observe_workload(workload_json())  # folded in by the start-up read of the Events' history
    workloads, _ = gkube.informers(None, tracker, "team-a")
    workloads.synced.set()  # listed: no Workload
    gkube.forget_unlisted(tracker, workloads, timeout=0)
    assert tracker.jobs() == []
