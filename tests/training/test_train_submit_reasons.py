"""How train.submit words Kueue's reasons (pure functions; the cluster tests cover the rest)."""

from __future__ import annotations

from gpufleet_admin.training.submit import pods_reason, workload_reason


def wl(*conditions: dict) -> dict:
    return {"metadata": {"name": "jobset-run1-5f3a2"}, "status": {"conditions": list(conditions)}}


def test_pending_for_quota():
    msg = ("couldn't assign flavors to pod set workers: insufficient quota for nvidia.com/gpu in flavor "
           "h100-sxm-80gb, previously considered podsets requests (0) + current podset request (136) > "
           "maximum capacity (128)")
    reason = workload_reason(wl({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": msg}))
    assert reason == f"Workload jobset-run1-5f3a2: QuotaReserved=False (Pending): {msg}"


def test_eviction_wins_over_pending():
    reason = workload_reason(wl(
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "waiting"},
        {"type": "Evicted", "status": "True", "reason": "PodsReadyTimeout", "message": "Exceeded the PodsReady timeout"},
    ))
    assert "Evicted=True (PodsReadyTimeout): Exceeded the PodsReady timeout" in reason


def test_no_workload_points_at_kueue():
    assert "Kueue created no Workload for the JobSet" in workload_reason(None, "JobSet")


def test_no_conditions_yet():
    assert workload_reason(wl()) == "Workload jobset-run1-5f3a2: no conditions yet: Kueue has not considered it"


def test_pods_reason_quotes_the_scheduler():
    pending = {"metadata": {"name": "run1-workers-0-1-abcde"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/16 nodes are available: 16 Insufficient nvidia.com/gpu."},
    ]}}
    running = {"metadata": {"name": "run1-workers-0-0-xyz"}, "status": {"phase": "Running", "conditions": []}}
    assert pods_reason([running, pending]) == (
        "pod run1-workers-0-1-abcde: Unschedulable: 0/16 nodes are available: 16 Insufficient nvidia.com/gpu.")
    assert pods_reason([running]) == "pods: 1 Running"
    assert pods_reason([]) == "pods: none created yet"
