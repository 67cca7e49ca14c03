"""Pure parts of the quota-sync controller: the slim node cache and what marks it dirty."""

from __future__ import annotations

from decimal import Decimal

from gpufleet.fleet import nodes as nodeutil
from gpufleet.names import SWAP_TAINT
from gpufleet.quota_sync.controller import NodeCache, signature, slim

from ..builders import node, pod


def test_slim_keeps_what_capacity_needs():
    n = node("a", taints=[{"key": SWAP_TAINT, "value": "x", "effect": "NoSchedule"}], labels={"big": "x" * 1000})
    s = slim(n)
    assert signature(s) == signature(n) == ("h100-sxm-80gb", False, 8, 8, (("inference", ("swap: x",)), ("training", ("swap: x",))),
                                            Decimal(224), Decimal(2**41))
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


def test_cache_is_dirty_when_a_nodes_allocatable_cpu_or_memory_changes():
    cache = NodeCache(None)
    cache.informer.apply("ADDED", node("a"))
    cache.take()
    smaller = node("a")
    smaller["status"]["allocatable"]["cpu"] = "220"  # kubelet reservations changed
    cache.informer.apply("MODIFIED", smaller)
    assert cache.dirty.is_set()


def test_pod_watch_follows_what_unmanaged_pods_request_not_only_gpus():
    from gpufleet.quota_sync.controller import PodWatch, slim_pod

    cache = NodeCache(None)
    watch = PodWatch(None, cache, reclaim_below=1000)
    ds = pod("fabric-exporter-x", "a", owner="DaemonSet")
    ds["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m", "memory": "256Mi"}}
    watch.informer.apply("ADDED", slim_pod(ds))
    assert cache.dirty.is_set()  # a DaemonSet pod with no GPU takes CPU from quota
    cache.take()
    watch.informer.apply("MODIFIED", slim_pod({**ds, "status": {"phase": "Running"}}))
    assert not cache.dirty.is_set()  # same requests: nothing to resync
    watch.informer.apply("DELETED", slim_pod(ds))
    assert cache.dirty.is_set()
