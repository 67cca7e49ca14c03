"""Pure parts of ops: node classification, drain planning, swap/return/degrade plans."""

from __future__ import annotations

import json

import pytest

from gpufleet.fleet import nodes
from gpufleet.ops import drain
from gpufleet.ops.reads import NodeNotFound
from gpufleet.names import (ANN_CORDONED_BY_SWAP, ANN_HEALTH_HISTORY, ANN_SWAP_REASON, DEGRADED_TAINT, LEMON_LABEL,
                                REPLACEMENT_LABEL, SWAP_TAINT)
from gpufleet.ops.swap import LemonNode, NotOut, plan_degrade, plan_return, plan_swap, slug

from ..builders import node, pod

SWAP = {"key": SWAP_TAINT, "value": "hot", "effect": "NoSchedule"}


@pytest.mark.parametrize(("kwargs", "reasons"), [
    ({}, []),
    ({"ready": False}, ["NotReady"]),
    ({"cordoned": True}, ["cordoned"]),
    ({"cordoned": True, "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}, ["cordoned"]),
    ({"taints": [SWAP]}, ["swap: hot"]),
    ({"taints": [{"key": DEGRADED_TAINT, "value": "ib_errors", "effect": "NoSchedule"}]}, ["degraded: ib_errors"]),
    ({"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
     ["taint node.kubernetes.io/unreachable:NoExecute"]),
    ({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "PreferNoSchedule"}]}, []),
    # Any key training pods do not tolerate keeps the node out (not a fixed list of keys).
    ({"taints": [{"key": "example.com/other", "effect": "NoSchedule"}]}, ["taint example.com/other:NoSchedule"]),
])
def test_out_reasons(kwargs, reasons):
    assert nodes.out_reasons(node("n1", **kwargs)) == reasons
    assert nodes.schedulable(node("n1", **kwargs)) == (reasons == [])


def test_near_matches_and_not_found_message():
    names = [f"gpu-rack-a-{i:04d}" for i in range(1, 9)] + ["cpu-0001"]
    err = NodeNotFound("gpu-rack-a-001", names)
    assert "'gpu-rack-a-001' not found" in str(err)
    assert "gpu-rack-a-0001" in str(err)
    assert "cpu-0001" not in str(err)
    assert "the cluster has 2 nodes" in str(NodeNotFound("zzz", ["a", "b"]))


def test_slug_makes_a_label_value():
    assert slug("GPU 3 at 84 C!") == "GPU-3-at-84-C"
    assert slug("   ") == "manual"
    assert len(slug("x" * 100)) == 63
    assert slug("--ok--") == "ok"


def test_plan_swap_fresh_node():
    p = plan_swap(node("n1"), "GPU 3 hot", now="2026-01-01T00:00:00Z")
    assert not p.resume
    assert p.patch["spec"]["unschedulable"] is True
    assert {"key": SWAP_TAINT, "value": "GPU-3-hot", "effect": "NoSchedule"} in p.patch["spec"]["taints"]
    # the GPU taint is kept: merge patch replaces the whole list
    assert any(t["key"] == "nvidia.com/gpu" for t in p.patch["spec"]["taints"])
    assert p.patch["metadata"]["labels"] == {REPLACEMENT_LABEL: "true"}
    assert p.patch["metadata"]["annotations"][ANN_SWAP_REASON] == "GPU 3 hot"
    assert p.patch["metadata"]["annotations"][ANN_CORDONED_BY_SWAP] == "true"
    assert [c.what for c in p.changes][:2] == ["spec.unschedulable (cordon)", f"taint {SWAP_TAINT}"]


def test_plan_swap_replaces_degraded_and_remembers_foreign_cordon():
    n = node("n1", cordoned=True, taints=[{"key": DEGRADED_TAINT, "value": "gpu_temp", "effect": "NoSchedule"}])
    p = plan_swap(n, "escalated")
    keys = [t["key"] for t in p.patch["spec"]["taints"]]
    assert DEGRADED_TAINT not in keys and SWAP_TAINT in keys
    assert "unschedulable" not in p.patch["spec"]
    assert p.patch["metadata"]["annotations"][ANN_CORDONED_BY_SWAP] == "false"


def test_plan_swap_of_a_node_already_out_changes_nothing():
    n = node("n1", cordoned=True, taints=[SWAP], labels={REPLACEMENT_LABEL: "true"},
             annotations={ANN_CORDONED_BY_SWAP: "true", ANN_SWAP_REASON: "hot"})
    p = plan_swap(n, "another reason")
    assert p.resume and p.changes == [] and p.patch == {}


def test_plan_swap_needs_a_reason():
    with pytest.raises(Exception, match="--reason is empty"):
        plan_swap(node("n1"), "  ")


def test_plan_return_undoes_swap():
    n = node("n1", cordoned=True, taints=[SWAP], labels={REPLACEMENT_LABEL: "true"},
             annotations={ANN_CORDONED_BY_SWAP: "true", ANN_SWAP_REASON: "hot"})
    p = plan_return(n, now="2026-01-02T00:00:00Z")
    assert p.patch["spec"]["unschedulable"] is None
    assert [t["key"] for t in p.patch["spec"]["taints"]] == ["nvidia.com/gpu"]
    assert p.patch["metadata"]["labels"] == {REPLACEMENT_LABEL: None}
    assert p.patch["metadata"]["annotations"][ANN_SWAP_REASON] is None


def test_plan_return_leaves_a_foreign_cordon():
    n = node("n1", cordoned=True, taints=[SWAP], annotations={ANN_CORDONED_BY_SWAP: "false"})
    p = plan_return(n)
    assert "unschedulable" not in p.patch["spec"]
    assert any("left as is" in c.after for c in p.changes)


def test_plan_return_of_a_node_in_service():
    with pytest.raises(NotOut, match="n1 is not out"):
        plan_return(node("n1"))


def test_lemon_needs_a_person():
    hist = [{"time": "2026-01-01T00:00:00Z", "fault": "xid"}]
    n = node("n1", cordoned=True, taints=[SWAP], labels={LEMON_LABEL: "true"},
             annotations={ANN_HEALTH_HISTORY: json.dumps(hist)})
    with pytest.raises(LemonNode, match="--clear-lemon"):
        plan_return(n)
    p = plan_return(n, clear_lemon=True)
    assert p.patch["metadata"]["labels"][LEMON_LABEL] is None
    assert p.patch["metadata"]["annotations"][ANN_HEALTH_HISTORY] == "[]"


def test_plan_degrade():
    p = plan_degrade(node("n1"), "ib_errors")
    assert {"key": DEGRADED_TAINT, "value": "ib_errors", "effect": "NoSchedule"} in p.patch["spec"]["taints"]
    assert "unschedulable" not in p.patch["spec"]
    assert plan_degrade(node("n1", taints=[SWAP]), "ib_errors") is None


def test_drain_plan_skips_and_blocks():
    pods = [pod("rs", "n1"), pod("ds", "n1", owner="DaemonSet"), pod("bare", "n1", owner=None),
            pod("done", "n1", phase="Succeeded"), pod("job", "n1", owner="Job")]
    evict, blocked, skipped = drain.plan(pods)
    assert [p["metadata"]["name"] for p in evict] == ["rs", "job"]
    assert [r.name for r in blocked] == ["bare"] and "unmanaged" in next(iter(blocked.values()))
    assert sorted(r.name for r in skipped) == ["done", "ds"]
    evict, blocked, _ = drain.plan(pods, force=True)
    assert [p["metadata"]["name"] for p in evict] == ["rs", "bare", "job"] and not blocked


def test_pods_already_going_away_are_waited_for_not_evicted():
    deleting = pod("deleting", "n1")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    in_dying_ns = pod("bare", "n1", owner=None, ns="old")
    assert drain.going_away(deleting, set())
    assert drain.going_away(in_dying_ns, {"old"})
    assert not drain.going_away(in_dying_ns, set()) and not drain.going_away(pod("rs", "n1"), {"old"})


# --------------------------------------------------------------------------- drain: budgets and backoff


def pdb(name: str, *, min_available=None, max_unavailable=None, selector=None, expected: int | None = 3,
        healthy: int = 3, desired: int = 2, allowed: int = 1, policy: str | None = None, ns: str = "default") -> dict:
    spec: dict = {"selector": {"matchLabels": {"app": "a"}} if selector is None else selector}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    status = {"currentHealthy": healthy, "desiredHealthy": desired, "disruptionsAllowed": allowed}
    if expected is not None:
        status["expectedPods"] = expected
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec, "status": status}


def app_pod(ready: bool = True) -> dict:
    p = pod("a-1", "n1", labels={"app": "a"})
    p["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return p


@pytest.mark.parametrize(("budget", "ready", "permanent", "words"), [
    (pdb("strict", min_available=3, allowed=0, desired=3), True, True, ["minAvailable 3 for 3 pods", "can never allow"]),
    (pdb("all", min_available="100%", allowed=0, desired=3), True, True, ["minAvailable 100% for 3 pods"]),
    (pdb("zero", max_unavailable=0, allowed=0), True, True, ["maxUnavailable 0", "never allows an eviction"]),
    (pdb("zero-pct", max_unavailable="0%", allowed=0), True, True, ["maxUnavailable 0%"]),
    (pdb("busy", min_available=2, allowed=0, healthy=2, desired=2), True, False, ["allows no disruption now",
                                                                                   "2 healthy, 2 needed"]),
    (pdb("sick", min_available=2, allowed=0, healthy=1, desired=2), False, False,
     ["not Ready", "unhealthyPodEvictionPolicy IfHealthyBudget", "1 of 2 healthy", "AlwaysAllow"]),
    # No status yet: the pods it selects are counted here (3), so minAvailable 3 is seen as permanent.
    (pdb("unsynced", min_available=3, expected=None, allowed=0), True, True, ["minAvailable 3 for 3 pods"]),
])
def test_a_blocked_pod_says_which_budget_and_why(budget, ready, permanent, words):
    block = drain.pdb_block(app_pod(ready), [budget, pdb("elsewhere", ns="other")], {"unsynced": 3})
    assert block is not None and block.permanent is permanent
    assert block.reason.startswith("not Ready" if not ready else "PodDisruptionBudget " + budget["metadata"]["name"])
    for word in words:
        assert word in block.reason, block.reason


def test_budgets_that_let_the_pod_go():
    assert drain.pdb_block(app_pod(), [pdb("ok", min_available=2, allowed=1)]) is None
    assert drain.pdb_block(app_pod(False), [pdb("always", min_available=2, allowed=0, healthy=1,
                                                policy="AlwaysAllow")]) is None
    assert drain.pdb_block(app_pod(), [pdb("other-app", min_available=3, allowed=0,
                                           selector={"matchLabels": {"app": "b"}})]) is None
    assert drain.pdb_block(app_pod(), [pdb("null-selects-none", min_available=3, allowed=0) | {"spec": {}}]) is None


def test_an_empty_selector_selects_every_pod_and_two_budgets_are_refused():
    block = drain.pdb_block(app_pod(), [pdb("x", min_available=1), pdb("everything", min_available=1, selector={})])
    assert block.permanent and "more than one PodDisruptionBudget selects it (everything, x)" in block.reason


def test_refusals_back_off_exponentially_with_jitter_up_to_a_cap():
    b = drain.refusal_backoff()
    delays = [b.next() for _ in range(11)]
    for n, d in enumerate(delays, start=1):
        base = min(60.0, 2.0 ** (n - 1))
        assert base * 0.9 <= d <= base * 1.1
    # 10 minutes of a budget that stays shut: about 15 requests, not 600 (1 s polling).
    b, t, requests = drain.refusal_backoff(), 0.0, 0
    while t < 600:
        requests += 1
        t += b.next()
    assert requests <= 17


def test_an_eviction_by_a_process_that_no_longer_leads_ends_the_drain_instead_of_counting_as_refused():
    from gpufleet.kube import Kube, LeadershipLost
    from gpufleet.kube.config import from_dict
    from gpufleet.kube.fence import Fence
    from gpufleet.ops.drain import PodRef, evict

    doc = {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
           "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:9"}}],
           "users": [{"name": "u", "user": {"token": "t"}}]}
    kube = Kube(from_dict(doc, source="test"))
    fence = Fence("gpufleet-system/gpufleet-node-health")
    kube.fence_writes(fence)
    fence.trip("not renewed within the renew deadline (10 s)")
    with pytest.raises(LeadershipLost, match="was lost"):
        evict(kube, PodRef("ns", "p", "uid-1"))
