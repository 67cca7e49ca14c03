"""Pure parts of the quota-sync controller: the slim node cache and what marks it dirty."""

from __future__ import annotations

from gpufleet.fleet import nodes as nodeutil
from gpufleet.names import SWAP_TAINT
from gpufleet.quota.controller import NodeCache, signature, slim

from ..builders import node


def test_slim_keeps_what_capacity_needs():
    n = node("a", taints=[{"key": SWAP_TAINT, "value": "x", "effect": "NoSchedule"}], labels={"big": "x" * 1000})
    s = slim(n)
    assert signature(s) == signature(n) == ("h100-sxm-80gb", False, 8, 8, (("inference", ("swap: x",)), ("training", ("swap: x",))))
    assert "big" not in s["metadata"]["labels"] and nodeutil.out_reasons(s) == ["swap: x"]


def test_cache_is_dirty_only_on_capacity_changes():
    cache = NodeCache(None)  # the informer fed by hand: no cluster
    cache.informer.apply("ADDED", node("a"))
    assert cache.dirty.is_set()
    nodes, first = cache.take()
    assert len(nodes) == 1 and first is not None and not cache.dirty.is_set()
    hb = node("a")
    hb["status"]["conditions"][0]["lastHeartbeatTime"] = "2027-01-01T00:00:00Z"
    hb["metadata"]["annotations"]["kwok"] = "beat"
    cache.informer.apply("MODIFIED", hb)  # a heartbeat: nothing quota depends on
    assert not cache.dirty.is_set()
    cache.informer.apply("MODIFIED", node("a", cordoned=True))
    assert cache.dirty.is_set()
    cache.take()
    cache.informer.apply("DELETED", node("a", cordoned=True))
    assert cache.dirty.is_set() and cache.take()[0] == []
