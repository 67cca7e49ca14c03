"""gpufleet's client layer against the real API server: typed errors, preconditions, server-side apply, eviction,
the watch cache, and leader election through a Lease."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from gpufleet.kube import Conflict, Invalid, Kube, NotFound, TooManyRequests, api_path
from gpufleet.kube.informer import Informer
from gpufleet.kube.leader import LeaderElector, Timings
from gpufleet.names import FIELD_MANAGER

from .helpers import wait

pytestmark = pytest.mark.cluster


@pytest.fixture
def ns(local_cluster):
    """A fresh namespace, deleted after."""
    kube = local_cluster.kube
    name = f"kube-{uuid.uuid4().hex[:6]}"
    kube.create("v1", "namespaces", {"metadata": {"name": name}})
    yield name
    kube.delete("v1", "namespaces", name, grace_seconds=0)


def configmap(name: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_typed_errors_and_preconditions(local_cluster, ns):
    kube = local_cluster.kube
    with pytest.raises(NotFound) as err:
        kube.get("v1", "configmaps", "absent", ns)
    assert err.value.status == 404 and err.value.reason == "NotFound" and "absent" in err.value.message
    assert kube.get_or_none("v1", "configmaps", "absent", ns) is None
    first = kube.create("v1", "configmaps", configmap("c", a="1"), ns)
    with pytest.raises(Conflict) as err:
        kube.create("v1", "configmaps", configmap("c", a="2"), ns)
    assert err.value.reason == "AlreadyExists"
    with pytest.raises(Invalid):
        kube.create("v1", "configmaps", configmap("Not_A_Name"), ns)
    # Writes name gpufleet in managedFields.
    assert {m["manager"] for m in first["metadata"]["managedFields"]} == {FIELD_MANAGER}
    # A stale resourceVersion or another UID is a Conflict, and nothing is written.
    kube.patch("v1", "configmaps", "c", {"data": {"a": "3"}}, ns)
    stale = dict(first, data={"a": "stale"})
    with pytest.raises(Conflict):
        kube.replace("v1", "configmaps", "c", stale, ns)
    with pytest.raises(Conflict):
        kube.delete("v1", "configmaps", "c", ns, uid="not-its-uid")
    assert kube.get("v1", "configmaps", "c", ns)["data"] == {"a": "3"}
    kube.delete("v1", "configmaps", "c", ns, uid=first["metadata"]["uid"])
    assert kube.get_or_none("v1", "configmaps", "c", ns) is None


def test_server_side_apply_owns_fields_under_gpufleet(local_cluster, ns):
    kube = local_cluster.kube
    obj = dict(configmap("ssa", a="1"), metadata={"name": "ssa", "namespace": ns})
    kube.apply(obj)
    live = kube.apply(dict(obj, data={"a": "2"}))
    assert live["data"] == {"a": "2"}
    assert [m["manager"] for m in live["metadata"]["managedFields"] if m["operation"] == "Apply"] == [FIELD_MANAGER]
    # Another manager's apply of the same field conflicts unless forced.
    with pytest.raises(Conflict):
        kube.apply(dict(obj, data={"a": "3"}), field_manager="someone-else", force=False)
    assert kube.apply(dict(obj, data={"a": "3"}), field_manager="someone-else")["data"] == {"a": "3"}
    # Kinds the table does not know come from discovery.
    assert kube.resource("kueue.x-k8s.io/v1beta2", "ClusterQueue") == ("clusterqueues", False)
    with pytest.raises(NotFound, match="serves no kind NoSuchKind"):
        kube.resource("v1", "NoSuchKind")


def test_eviction_respects_a_pdb(local_cluster, ns):
    kube = local_cluster.kube
    labels = {"app": "evict"}
    kube.create("policy/v1", "poddisruptionbudgets", {"metadata": {"name": "evict"}, "spec": {
        "minAvailable": 1, "selector": {"matchLabels": labels}}}, ns)
    kube.create("v1", "pods", {"metadata": {"name": "p", "labels": labels}, "spec": {
        "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "registry.invalid/x:1"}]}}, ns)
    wait("the PDB counts the pod", lambda: (kube.get("policy/v1", "poddisruptionbudgets", "evict", ns).get("status")
                                            or {}).get("currentHealthy") == 1, timeout=60)
    with pytest.raises(TooManyRequests) as err:
        kube.evict(ns, "p")
    assert "disruption budget" in err.value.message
    kube.delete("policy/v1", "poddisruptionbudgets", "evict", ns)
    kube.evict(ns, "p", dry_run=True)
    assert kube.get_or_none("v1", "pods", "p", ns) is not None  # a dry run evicts nothing
    kube.evict(ns, "p")


def test_informer_follows_the_collection(local_cluster, ns):
    kube = local_cluster.kube
    seen: list[tuple[str, str]] = []
    inf = Informer(kube, api_path("v1", "configmaps", ns), transform=lambda o: o.get("data") or {},
                   handlers=[lambda kind, new, old: seen.append((kind, new.get("a", "")))], name="test").start()
    try:
        assert inf.wait_synced(30)
        kube.create("v1", "configmaps", configmap("w", a="1"), ns)
        wait("the create seen", lambda: inf.get(f"{ns}/w") == {"a": "1"})
        kube.patch("v1", "configmaps", "w", {"data": {"a": "2"}}, ns)
        wait("the change seen", lambda: inf.get(f"{ns}/w") == {"a": "2"})
        kube.delete("v1", "configmaps", "w", ns)
        wait("the delete seen", lambda: inf.get(f"{ns}/w") is None)
        assert [e for e in seen if e[1]] == [("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")]
    finally:
        inf.stop()


def test_one_leader_at_a_time_and_a_clean_handover(local_cluster, ns):
    fast = Timings(lease_duration=3, renew_deadline=2, retry_period=0.5)
    a = LeaderElector(Kube(local_cluster.kube.config), "test-lease", ns, identity="a", timings=fast)
    b = LeaderElector(Kube(local_cluster.kube.config), "test-lease", ns, identity="b", timings=fast)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert a.try_acquire_or_renew()  # renewing its own Lease
    lease = local_cluster.kube.get("coordination.k8s.io/v1", "leases", "test-lease", ns)
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 3

    # a leads until stopped, then releases: b takes over at once, not after the duration.
    leading = {"a": threading.Event(), "b": threading.Event()}
    stops = {"a": threading.Event(), "b": threading.Event()}
    results: dict[str, bool] = {}

    def runner(who: str, elector: LeaderElector) -> threading.Thread:
        def lead(stop: threading.Event) -> None:
            leading[who].set()
            stop.wait()
        t = threading.Thread(target=lambda: results.__setitem__(who, elector.run(lead, stops[who])), daemon=True)
        t.start()
        return t

    ta = runner("a", a)
    assert leading["a"].wait(10)
    tb = runner("b", b)
    time.sleep(2 * fast.lease_duration)  # a keeps renewing: b must not lead
    assert not leading["b"].is_set()
    stops["a"].set()
    ta.join(10)
    t0 = time.monotonic()
    assert leading["b"].wait(fast.lease_duration)
    assert time.monotonic() - t0 < fast.lease_duration, "b waited for expiry instead of the release"
    lease = local_cluster.kube.get("coordination.k8s.io/v1", "leases", "test-lease", ns)
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] >= 1

    # Someone else takes the Lease under b: b loses it and says so.
    local_cluster.kube.patch("coordination.k8s.io/v1", "leases", "test-lease",
                             {"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 60}}, ns)
    tb.join(10)
    assert results == {"a": False, "b": True}
