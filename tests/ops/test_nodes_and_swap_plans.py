"""Pure parts of ops: node classification, drain planning, swap/return/degrade plans."""

from __future__ import annotations

import json

import pytest

from gpufleet.fleet import nodes
from gpufleet.ops import drain
from gpufleet.ops.kube import NodeNotFound
from gpufleet.names import (ANN_CORDONED_BY_SWAP, ANN_HEALTH_HISTORY, ANN_SWAP_REASON, DEGRADED_TAINT, LEMON_LABEL,
                                REPLACEMENT_LABEL, SWAP_TAINT)
from gpufleet.ops.swap import LemonNode, NotOut, plan_degrade, plan_return, plan_swap, slug

from .builders import node, pod

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
