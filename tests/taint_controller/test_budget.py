"""The flip-back migration budget: pods per minute per workload, lowest priority first, in-flight cap."""

from __future__ import annotations

from gpufleet.taint_controller.budget import Candidate, MigrationBudget, TokenBucket, workload_of


def cand(name: str, workload: str = "inf/Deployment/chat", priority: int = 1000, created: float = 0.0,
         released: bool = False) -> Candidate:
    return Candidate("inf", name, f"uid-{name}", priority, workload, created, "vk-rental", released)


def test_token_bucket_paces_evenly_with_burst_one():
    b = TokenBucket(10, burst=1, now=0)  # one every 6 s
    assert b.take(0) and not b.take(1) and not b.take(5.9) and b.take(6.0) and not b.take(6.5)


def test_per_workload_rate_over_a_minute():
    budget = MigrationBudget(10, max_in_flight=100)
    pods = [cand(f"p{i}", created=i) for i in range(30)]
    moved = []
    for t in range(0, 60):
        chosen = budget.plan([c for c in pods if c.name not in moved], float(t))
        moved += [c.name for c in chosen]
    assert len(moved) == 10  # t = 0, 6, ..., 54
    assert moved == [f"p{i}" for i in range(10)]  # oldest first at equal priority


def test_workloads_have_separate_budgets():
    budget = MigrationBudget(1, max_in_flight=10)
    chosen = budget.plan([cand("a1", "inf/Deployment/a"), cand("a2", "inf/Deployment/a"), cand("b1", "inf/Deployment/b")], 0)
    assert sorted(c.name for c in chosen) == ["a1", "b1"]


def test_lowest_priority_first_within_a_workload_and_globally():
    budget = MigrationBudget(1, max_in_flight=10, total_per_minute=1)
    chosen = budget.plan([cand("hi", "w/a", priority=5000), cand("lo", "w/b", priority=10), cand("mid", "w/c", priority=100)], 0)
    assert [c.name for c in chosen] == ["lo"]
    budget = MigrationBudget(1, max_in_flight=10)
    chosen = budget.plan([cand("hi", priority=5000), cand("lo", priority=10)], 0)
    assert [c.name for c in chosen] == ["lo"]


def test_in_flight_cap_holds_back_until_released_pods_are_gone():
    budget = MigrationBudget(60, max_in_flight=1)
    assert [c.name for c in budget.plan([cand("a"), cand("b")], 0)] == ["a"]
    # 10 s later tokens are there, but "a" is still running outside (released): nothing more.
    assert budget.plan([cand("a", released=True), cand("b")], 10) == []
    # "a" gone: "b" goes.
    assert [c.name for c in budget.plan([cand("b")], 11)] == ["b"]


def test_refund_gives_the_token_back():
    budget = MigrationBudget(1, max_in_flight=5)
    (c,) = budget.plan([cand("a")], 0)
    assert budget.plan([cand("b")], 1) == []
    budget.refund(c)
    assert [x.name for x in budget.plan([cand("b")], 1)] == ["b"]


def test_workload_of_deployment_statefulset_and_bare_pod():
    rs_pod = {"metadata": {"namespace": "inf", "name": "chat-7d9f-abcde", "labels": {"pod-template-hash": "7d9f"},
                           "ownerReferences": [{"kind": "ReplicaSet", "name": "chat-7d9f", "controller": True}]}}
    assert workload_of(rs_pod) == "inf/Deployment/chat"
    sts = {"metadata": {"namespace": "inf", "name": "db-0", "ownerReferences": [{"kind": "StatefulSet", "name": "db",
                                                                                 "controller": True}]}}
    assert workload_of(sts) == "inf/StatefulSet/db"
    assert workload_of({"metadata": {"namespace": "x", "name": "lonely"}}) == "x/Pod/lonely"
