"""Records from API objects (Workloads, pods, Events) and how views of them merge (no cluster)."""

from __future__ import annotations

from gpufleet.goodput import history as h

from .builders import T0, pod_json, ts, workload_json


def test_workload_conditions_give_admission_transitions_and_finish():
    w = h.workload_record(workload_json(conditions=[
        ("QuotaReserved", "True", "QuotaReserved", 10), ("Admitted", "True", "Admitted", 10),
        ("PodsReady", "True", "PodsReady", 30), ("Finished", "True", "Succeeded", 900)]))
    assert (w.job_kind, w.job_name, w.pods_expected) == ("JobSet", "llm", 2)
    assert w.admissions == ((T0 + 10, True),)
    assert w.finished == T0 + 900 and w.succeeded
    assert not w.admitted_at(T0 + 5) and w.admitted_at(T0 + 11)


def test_an_eviction_overwritten_in_the_conditions_is_kept_from_events_and_earlier_views():
    evicted = workload_json(conditions=[("Admitted", "False", "NoReservation", 300),
                                        ("Evicted", "True", "PodsReadyTimeout", 300)])
    seen = h.workload_record(evicted, events=[{"reason": "Admitted", "eventTime": ts(10) .replace("Z", ".000000Z")}])
    readmitted = workload_json(conditions=[("Admitted", "True", "Admitted", 420),
                                           ("Evicted", "False", "QuotaReserved", 420)])
    merged = h.merge_workload(seen, h.workload_record(readmitted))
    assert merged.admissions == ((T0 + 10, True), (T0 + 300, False), (T0 + 420, True))
    # the one-shot view: only the current object and its Events
    events = [{"reason": "Admitted", "lastTimestamp": ts(10)}, {"reason": "EvictedDueToPodsReadyTimeout", "lastTimestamp": ts(300)},
              {"reason": "Pending", "lastTimestamp": ts(310)}, {"reason": "Admitted", "lastTimestamp": ts(420)}]
    assert h.workload_record(readmitted, events=events).admissions == merged.admissions


def test_workloads_of_other_owners_are_not_training_jobs():
    assert h.workload_record(workload_json(kind="Deployment")) is None
    assert h.workload_record(workload_json(kind="PyTorchJob")).job_kind == "PyTorchJob"


def test_pod_running_then_evicted_ends_when_the_stop_was_asked():
    running = h.pod_record(pod_json("w-0", created=11, scheduled=("True", "", 12),
                                    state={"running": {"startedAt": ts(20)}}))
    assert running.runs == ((T0 + 20, None),) and running.ended is None and running.scheduled == T0 + 12
    # eviction: deletionTimestamp = request + grace period
    evicted = h.pod_record(pod_json("w-0", created=11, scheduled=("True", "", 12),
                                    state={"running": {"startedAt": ts(20)}}, deleted=(450, 30)), running)
    assert evicted.ended == T0 + 450 and evicted.runs == ((T0 + 20, T0 + 450),)
    # a pod that vanished without a last view ends when it was noticed gone
    assert h.gone(running, T0 + 460).runs == ((T0 + 20, T0 + 460),)


def test_pod_unschedulable_then_scheduled_keeps_when_it_first_waited():
    waiting = h.pod_record(pod_json("w-0b", created=452, scheduled=("False", "Unschedulable", 452), phase="Pending"))
    assert waiting.unschedulable_since == T0 + 452 and waiting.scheduled is None
    placed = h.pod_record(pod_json("w-0b", created=452, scheduled=("True", "", 500),
                                   state={"running": {"startedAt": ts(505)}}), waiting)
    assert placed.unschedulable_since == T0 + 452 and placed.scheduled == T0 + 500
    assert placed.runs == ((T0 + 505, None),)


def test_terminal_pods_and_in_place_restarts():
    done = h.pod_record(pod_json("w-1", phase="Succeeded",
                                 state={"terminated": {"startedAt": ts(20), "finishedAt": ts(800), "exitCode": 0}}))
    assert done.succeeded and done.ended == T0 + 800 and done.runs == ((T0 + 20, T0 + 800),)
    first = h.pod_record(pod_json("m", state={"running": {"startedAt": ts(20)}}))
    restarted = h.pod_record(pod_json("m", state={"running": {"startedAt": ts(230)}},
                                      last_state={"terminated": {"startedAt": ts(20), "finishedAt": ts(200)}}), first)
    assert restarted.runs == ((T0 + 20, T0 + 200), (T0 + 230, None))


def test_job_and_checkpoint_dir_of_a_pod():
    p = pod_json("x", labels={"jobset.sigs.k8s.io/jobset-name": "sim"}, env={"CHECKPOINT_DIR": "/mnt/c/ns/sim/ckpt"})
    assert h.job_of_pod(p) == "sim" and h.checkpoint_dir_of_pod(p) == "/mnt/c/ns/sim/ckpt"
    assert h.job_of_pod(pod_json("y")) == "llm" and h.checkpoint_dir_of_pod(pod_json("y")) is None


def test_kwok_completion_without_a_start_time_keeps_the_run():
    running = h.pod_record(pod_json("k", state={"running": {"startedAt": ts(20)}}))
    done_json = pod_json("k", phase="Succeeded", state={"terminated": {"startedAt": ts(800), "finishedAt": ts(800)}})
    done_json["status"]["conditions"].append({"type": "ContainersReady", "status": "True", "lastTransitionTime": ts(20)})
    # merged with an earlier view, and alone (the one-shot view)
    assert h.pod_record(done_json, running).runs == ((T0 + 20, T0 + 800),)
    assert h.pod_record(done_json).runs == ((T0 + 20, T0 + 800),)


def test_admitted_windows_follow_the_admissions_up_to_the_end():
    readmitted = workload_json(conditions=[("Admitted", "True", "Admitted", 420),
                                           ("Evicted", "False", "QuotaReserved", 420)])
    events = [{"reason": "Admitted", "lastTimestamp": ts(10)}, {"reason": "EvictedDueToPodsReadyTimeout", "lastTimestamp": ts(300)},
              {"reason": "Admitted", "lastTimestamp": ts(420)}]
    w = h.workload_record(readmitted, events=events)
    assert w.admitted_windows(T0 + 1000) == [(T0 + 10, T0 + 300), (T0 + 420, T0 + 1000)]
    assert w.admitted_windows(T0 + 350) == [(T0 + 10, T0 + 300)], "an admission after the end is not counted"
    assert h.workload_record(workload_json(conditions=[])).admitted_windows(T0 + 1000) == []
