"""The in-memory API server (:mod:`gpufleet_workshop.testing.fakekube`) behaves as kube-apiserver does where
gpufleet depends on it; ``tests/integration/test_fake_parity.py`` runs the same calls against a real one."""

from __future__ import annotations

import threading
import time

import pytest

from gpufleet.kube import (Conflict, Expired, Forbidden, Invalid, KubeError, NotFound, TooManyRequests, Unreachable,
                           api_path)
from gpufleet.kube.informer import Informer
from gpufleet.kube.retry import update_with_retry
from gpufleet_workshop.testing import FakeKube, Unmodelled
from gpufleet_workshop.testing.fakeprom import FakeProm
from gpufleet.prom.client import PromError
from gpufleet.wait import poll_until

NS = "inference"


def pod(name: str, *, node: str = "", ready: bool = False, labels: dict | None = None, phase: str = "Running",
        owner: dict | None = None) -> dict:
    meta: dict = {"name": name, "namespace": NS, "labels": labels or {"app": "chat"}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pdb(name: str = "chat", **spec) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": "chat"}}, **spec}}


@pytest.fixture
def kube():
    k = FakeKube(bookmark_seconds=0.05)
    k.create("v1", "namespaces", {"metadata": {"name": NS}})
    yield k
    k.close()


# ------------------------------------------------------------------ storage and errors


def test_create_get_and_the_servers_errors(kube):
    made = kube.create("v1", "configmaps", {"metadata": {"name": "a"}, "data": {"k": "v"}}, NS)
    assert made["metadata"]["uid"] and made["metadata"]["resourceVersion"] and made["kind"] == "ConfigMap"
    assert kube.get("v1", "configmaps", "a", NS)["data"] == {"k": "v"}
    with pytest.raises(Conflict) as exc:
        kube.create("v1", "configmaps", {"metadata": {"name": "a"}}, NS)
    assert exc.value.reason == "AlreadyExists" and 'configmaps "a" already exists' in exc.value.message
    with pytest.raises(NotFound, match='configmaps "b" not found'):
        kube.get("v1", "configmaps", "b", NS)
    with pytest.raises(NotFound, match='namespaces "nope" not found'):
        kube.create("v1", "configmaps", {"metadata": {"name": "a"}}, "nope")
    with pytest.raises(Invalid, match="name or generateName is required"):
        kube.create("v1", "configmaps", {"metadata": {}}, NS)
    with pytest.raises(Invalid, match="RFC 1123"):
        kube.create("v1", "configmaps", {"metadata": {"name": "Bad_Name"}}, NS)
    assert kube.get_or_none("v1", "configmaps", "b", NS) is None


def test_generate_name_pod_status_and_priority_from_its_class(kube):
    kube.create("scheduling.k8s.io/v1", "priorityclasses", {"metadata": {"name": "low"}, "value": 10})
    p = kube.create("v1", "pods", {"metadata": {"generateName": "chat-"}, "spec": {"priorityClassName": "low"},
                                   "status": {"phase": "Running"}}, NS)
    assert p["metadata"]["name"].startswith("chat-") and len(p["metadata"]["name"]) == 10
    assert p["status"] == {"phase": "Pending"} and p["spec"]["priority"] == 10
    with pytest.raises(Forbidden, match="no PriorityClass with name high was found"):
        kube.create("v1", "pods", {"metadata": {"name": "x"}, "spec": {"priorityClassName": "high"}}, NS)


def test_a_stale_resource_version_is_a_conflict_and_a_no_op_write_keeps_it(kube):
    cm = kube.create("v1", "configmaps", {"metadata": {"name": "a"}, "data": {"k": "1"}}, NS)
    newer = kube.replace("v1", "configmaps", "a", {**cm, "data": {"k": "2"}}, NS)
    assert int(newer["metadata"]["resourceVersion"]) > int(cm["metadata"]["resourceVersion"])
    with pytest.raises(Conflict, match="the object has been modified"):
        kube.replace("v1", "configmaps", "a", {**cm, "data": {"k": "3"}}, NS)
    with pytest.raises(Conflict, match="the object has been modified"):
        kube.patch("v1", "configmaps", "a", {"metadata": {"resourceVersion": cm["metadata"]["resourceVersion"]}}, NS)
    same = kube.patch("v1", "configmaps", "a", {"data": {"k": "2"}}, NS)
    assert same["metadata"]["resourceVersion"] == newer["metadata"]["resourceVersion"]
    with pytest.raises(Conflict, match="Precondition failed: UID in precondition: other"):
        kube.replace("v1", "configmaps", "a", {"metadata": {"name": "a", "uid": "other"}, "data": {}}, NS)


def test_update_with_retry_rereads_after_a_conflict(kube):
    kube.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {}})
    path = api_path("v1", "nodes", name="n")
    raced = []

    def change(obj):
        if not raced:  # someone else writes between our read and our patch
            raced.append(kube.patch("v1", "nodes", "n", {"metadata": {"labels": {"other": "x"}}}))
        return {"spec": {"unschedulable": True}}

    after, applied = update_with_retry(kube, path, change)
    assert applied and after["spec"]["unschedulable"] and after["metadata"]["labels"] == {"other": "x"}
    assert [a.verb for a in kube.actions].count("patch") == 3  # ours refused once, then accepted


def test_update_with_retry_writes_from_a_current_cache_without_a_read_and_reads_when_it_is_not(kube):
    kube.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {}})
    path = api_path("v1", "nodes", name="n")
    cached = kube.get("v1", "nodes", "n")

    def cordon(obj):
        return None if (obj.get("spec") or {}).get("unschedulable") else {"spec": {"unschedulable": True}}

    before = len(kube.actions)
    update_with_retry(kube, path, cordon, cached=cached)
    assert [a.verb for a in kube.actions[before:]] == ["patch"]
    # The cache is now behind: its write is refused (409), then read and made.
    kube.patch("v1", "nodes", "n", {"spec": {"unschedulable": False}})
    before = len(kube.actions)
    after, applied = update_with_retry(kube, path, cordon, cached=cached)
    assert applied and after["spec"]["unschedulable"]
    assert [a.verb for a in kube.actions[before:]] == ["patch", "get", "patch"]
    # A cache that sees nothing to write is not believed: the object is read.
    kube.patch("v1", "nodes", "n", {"spec": {"unschedulable": False}})
    before = len(kube.actions)
    _, applied = update_with_retry(kube, path, cordon, cached=after)
    assert applied and [a.verb for a in kube.actions[before:]] == ["get", "patch"]


def test_generation_follows_the_spec_and_the_status_subresource_is_apart(kube):
    kube.add({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": NS},
              "spec": {"replicas": 1}, "status": {"replicas": 1}})
    d = kube.patch("apps/v1", "deployments", "d", {"spec": {"replicas": 2}, "status": {"replicas": 9}}, NS)
    assert d["metadata"]["generation"] == 2 and d["status"] == {"replicas": 1}, "status ignored on the main resource"
    d = kube.patch("apps/v1", "deployments", "d", {"spec": {"replicas": 5}, "status": {"replicas": 2}}, NS,
                   subresource="status")
    assert d["spec"]["replicas"] == 2 and d["status"] == {"replicas": 2} and d["metadata"]["generation"] == 2


# ------------------------------------------------------------------ list and selectors


def test_label_and_field_selectors_as_the_server_supports_them(kube):
    kube.add(pod("a", node="n1", labels={"app": "chat", "tier": "x"}), pod("b", node="n2", phase="Succeeded"),
             pod("c", labels={"app": "other"}))
    names = lambda **p: [o["metadata"]["name"] for o in kube.list("v1", "pods", NS, **p)["items"]]  # noqa: E731
    assert names(labelSelector="app=chat") == ["a", "b"]
    assert names(labelSelector="app in (chat, other),tier") == ["a"]
    assert names(labelSelector="tier!=x") == ["b", "c"] and names(labelSelector="!tier,app notin (other)") == ["b"]
    assert names(fieldSelector="spec.nodeName=n1") == ["a"]
    assert names(fieldSelector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed") == ["a"]
    assert names(fieldSelector="metadata.name=c") == ["c"]
    with pytest.raises(KubeError, match="field label not supported: spec.priority") as exc:
        names(fieldSelector="spec.priority=1")
    assert exc.value.status == 400


def test_list_all_pages_with_limit_and_continue(kube):
    kube.add(*[{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i:02}", "namespace": NS}}
               for i in range(7)])
    items, rv = kube.list_all(api_path("v1", "configmaps", NS), limit=3)
    assert [o["metadata"]["name"] for o in items] == [f"c{i:02}" for i in range(7)] and rv == kube.resource_version
    assert len([a for a in kube.actions if a.verb == "list"]) == 3
    page = kube.list("v1", "configmaps", NS, limit=3)
    assert len(page["items"]) == 3 and page["metadata"]["remainingItemCount"] == 4


# ------------------------------------------------------------------ patches


def test_merge_json_and_strategic_patches(kube):
    kube.add(pod("a", node="n1"))
    p = kube.patch("v1", "pods", "a", {"metadata": {"labels": {"app": None, "x": "1"}}}, NS)
    assert p["metadata"]["labels"] == {"x": "1"}
    p = kube.patch("v1", "pods", "a", [{"op": "test", "path": "/metadata/labels/x", "value": "1"},
                                       {"op": "add", "path": "/metadata/labels/y", "value": "2"}], NS, patch="json")
    assert p["metadata"]["labels"] == {"x": "1", "y": "2"}
    with pytest.raises(Invalid, match="testing value /metadata/labels/x failed"):
        kube.patch("v1", "pods", "a", [{"op": "test", "path": "/metadata/labels/x", "value": "9"}], NS, patch="json")
    # strategic: containers merge by name, conditions by type, hostIPs replaced with the $patch directive
    p = kube.patch("v1", "pods", "a", {"spec": {"containers": [{"name": "c", "image": "y"}]}}, NS, patch="strategic")
    assert p["spec"]["containers"] == [{"name": "c", "image": "y"}]
    kube.patch("v1", "pods", "a", {"status": {"hostIPs": [{"ip": "10.0.0.1"}],
                                              "conditions": [{"type": "Published", "status": "True"}]}}, NS,
               subresource="status", patch="strategic")
    p = kube.patch("v1", "pods", "a", {"status": {"hostIPs": [{"$patch": "replace"}, {"ip": "10.0.0.2"}],
                                                  "conditions": [{"type": "Ready", "status": "True"}]}}, NS,
                   subresource="status", patch="strategic")
    assert p["status"]["hostIPs"] == [{"ip": "10.0.0.2"}]
    assert {c["type"]: c["status"] for c in p["status"]["conditions"]} == {"Ready": "True", "Published": "True"}
    with pytest.raises(Unmodelled, match=r"\$setElementOrder/containers"):
        kube.patch("v1", "pods", "a", {"spec": {"$setElementOrder/containers": [{"name": "c"}]}}, NS, patch="strategic")


def test_custom_resources_refuse_strategic_merge_patch(kube):
    kube.add({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "q"}, "spec": {}})
    with pytest.raises(KubeError) as exc:
        kube.patch("kueue.x-k8s.io/v1beta2", "clusterqueues", "q", {"spec": {"x": 1}}, patch="strategic")
    assert exc.value.status == 415


def test_server_side_apply_merges_removes_what_the_manager_dropped_and_reports_conflicts(kube):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s", "namespace": NS},
          "data": {"a": "1", "b": "2"}}
    kube.apply(cm)
    kube.patch("v1", "configmaps", "s", {"data": {"mine": "x"}}, NS)  # an Update: its field survives our applies
    live = kube.apply({**cm, "data": {"a": "1"}})
    assert live["data"] == {"a": "1", "mine": "x"}, "b was ours and we dropped it"
    assert {m["manager"] for m in live["metadata"]["managedFields"]} == {"gpufleet"}
    with pytest.raises(Conflict, match='conflict with "gpufleet": .data.a'):
        kube.apply({**cm, "data": {"a": "other"}}, field_manager="someone", force=False)
    live = kube.apply({**cm, "data": {"a": "other"}}, field_manager="someone")
    assert live["data"]["a"] == "other"
    stale = {**cm, "metadata": {**cm["metadata"], "resourceVersion": "1"}}
    with pytest.raises(Conflict):
        kube.apply(stale)


# ------------------------------------------------------------------ delete


def test_delete_preconditions_and_graceful_pods(kube):
    kube.add(pod("bound", node="n1"), pod("unbound"))
    uid = kube.get("v1", "pods", "bound", NS)["metadata"]["uid"]
    with pytest.raises(Conflict, match=r"the UID in the precondition \(someone-else\) does not match"):
        kube.delete("v1", "pods", "bound", NS, uid="someone-else")
    kube.delete("v1", "pods", "unbound", NS)
    assert kube.object("pods", "unbound", NS) is None, "an unbound pod goes at once"
    gone = kube.delete("v1", "pods", "bound", NS, uid=uid)
    assert gone["metadata"]["deletionTimestamp"] and gone["metadata"]["deletionGracePeriodSeconds"] == 30
    assert kube.complete_deletions() == [f"{NS}/bound"] and kube.object("pods", "bound", NS) is None


def test_finalizers_hold_an_object_until_removed(kube):
    kube.add({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "f", "namespace": NS,
                                                                      "finalizers": ["example.com/x"]}})
    kube.delete("v1", "configmaps", "f", NS)
    assert kube.get("v1", "configmaps", "f", NS)["metadata"]["deletionTimestamp"]
    kube.patch("v1", "configmaps", "f", {"metadata": {"finalizers": None}}, NS)
    assert kube.object("configmaps", "f", NS) is None


@pytest.mark.parametrize("policy, pod_left, owner_refs", [("Orphan", True, None), ("Background", False, None)])
def test_propagation_policy_runs_the_garbage_collector(kube, policy, pod_left, owner_refs):
    rs = kube.add({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs", "namespace": NS},
                   "spec": {"replicas": 1}})[0]
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": rs["metadata"]["uid"], "controller": True}
    kube.add(pod("p", owner=ref))
    kube.delete("apps/v1", "replicasets", "rs", NS, propagation=policy)
    left = kube.object("pods", "p", NS)
    assert (left is not None) == pod_left
    if left is not None:
        assert left["metadata"].get("ownerReferences") == owner_refs


def test_foreground_deletion_keeps_the_owner_until_its_dependents_are_gone(kube):
    rs = kube.add({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs", "namespace": NS},
                   "spec": {"replicas": 1}})[0]
    kube.add(pod("p", node="n1", owner={"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                        "uid": rs["metadata"]["uid"], "controller": True}))
    kube.delete("apps/v1", "replicasets", "rs", NS, propagation="Foreground")
    owner = kube.object("replicasets", "rs", NS)
    assert owner["metadata"]["finalizers"] == ["foregroundDeletion"] and kube.object("pods", "p", NS)
    kube.complete_deletions()
    assert kube.object("replicasets", "rs", NS) is None


def test_a_deleted_namespace_empties_then_goes(kube):
    kube.add(pod("p"))
    kube.delete("v1", "namespaces", NS)
    assert kube.object("pods", "p", NS) is None and kube.object("namespaces", NS) is None


# ------------------------------------------------------------------ eviction


def test_eviction_honours_the_budget_the_disruption_controller_computes(kube):
    kube.add(pdb(minAvailable=1), pod("a", node="n1", ready=True), pod("b", node="n1", ready=True))
    assert kube.get("policy/v1", "poddisruptionbudgets", "chat", NS)["status"]["disruptionsAllowed"] == 1
    kube.evict(NS, "a")
    assert kube.get("v1", "pods", "a", NS)["metadata"]["deletionTimestamp"], "evicted: terminating"
    status = kube.get("policy/v1", "poddisruptionbudgets", "chat", NS)["status"]
    assert (status["disruptionsAllowed"], status["currentHealthy"]) == (0, 1)
    with pytest.raises(TooManyRequests, match="would violate the pod's disruption budget"):
        kube.evict(NS, "b")
    kube.add(pod("pending", phase="Pending"))
    kube.evict(NS, "pending")  # a Pending pod needs no budget
    assert kube.object("pods", "pending", NS) is None


def test_an_eviction_refused_for_a_stale_uid_still_spends_the_disruption(kube):
    """As kube-apiserver: the budget is used before the delete checks its UID precondition; the pod counts as
    disrupted (not healthy) until it goes or the disruption controller's 2 minutes pass."""
    clock = [1000.0]
    kube.clock = lambda: clock[0]
    kube.add(pdb(minAvailable=1), pod("a", node="n1", ready=True), pod("b", node="n1", ready=True))
    with pytest.raises(Conflict, match=r"the UID in the precondition \(not-a\) does not match"):
        kube.evict(NS, "a", uid="not-a")
    kube.add(pod("c"))  # any change: the disruption controller syncs
    status = kube.get("policy/v1", "poddisruptionbudgets", "chat", NS)["status"]
    assert status["disruptionsAllowed"] == 0 and list(status["disruptedPods"]) == ["a"]
    with pytest.raises(TooManyRequests):
        kube.evict(NS, "b")
    clock[0] += 121
    kube.add(pod("d"))
    assert kube.get("policy/v1", "poddisruptionbudgets", "chat", NS)["status"]["disruptionsAllowed"] == 1


def test_a_budget_not_yet_synced_asks_the_client_to_come_back_in_10_seconds():
    kube = FakeKube(disruption_controller=False)
    kube.add(pdb(minAvailable=1), pod("a", node="n1", ready=True))
    resp = kube._send("POST", api_path("v1", "pods", NS, "a", "eviction"), None,
                      {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a", "namespace": NS}},
                      None, None, 5)
    body = __import__("json").loads(resp.read())
    assert (resp.status, resp.headers["Retry-After"]) == (429, "10")
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget",
                                          "message": "The disruption budget chat is still being processed by the server."}]


def test_max_unavailable_counts_the_controllers_scale_and_a_test_may_set_the_status(kube):
    dep = kube.add({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat", "namespace": NS},
                    "spec": {"replicas": 3}})[0]
    rs = kube.add({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {
        "name": "chat-1", "namespace": NS, "ownerReferences": [{"kind": "Deployment", "name": "chat", "controller": True,
                                                                 "uid": dep["metadata"]["uid"]}]}, "spec": {"replicas": 3}})[0]
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "chat-1", "uid": rs["metadata"]["uid"], "controller": True}
    kube.add(pdb(maxUnavailable="34%"), *[pod(f"p{i}", node="n", ready=True, owner=ref) for i in range(2)])
    status = kube.get("policy/v1", "poddisruptionbudgets", "chat", NS)["status"]
    assert (status["expectedPods"], status["desiredHealthy"], status["disruptionsAllowed"]) == (3, 1, 1)
    fixed = FakeKube(disruption_controller=False)
    fixed.add({**pdb(minAvailable=1), "status": {"disruptionsAllowed": 0, "observedGeneration": 1}},
              pod("a", node="n", ready=True), pod("b", node="n", ready=True))
    with pytest.raises(TooManyRequests):
        fixed.evict(NS, "a")


# ------------------------------------------------------------------ watches and informers


def test_an_informer_follows_changes_leaves_a_selector_and_relists_after_410(kube):
    kube.add(pod("a", node="n1"))
    inf = Informer(kube, api_path("v1", "pods"), params={"fieldSelector": "status.phase!=Succeeded"}, name="t").start()
    try:
        assert inf.wait_synced(5)
        kube.add(pod("b", node="n1"))
        poll_until(lambda: inf.get(f"{NS}/b"), what="b cached", timeout=5, interval=0.01)
        kube.patch("v1", "pods", "a", {"status": {"phase": "Succeeded"}}, NS, subresource="status")
        poll_until(lambda: inf.get(f"{NS}/a") is None, what="a gone from the cache", timeout=5, interval=0.01)
        kube.expire_watches()
        kube.add(pod("c", node="n1"))
        poll_until(lambda: inf.relists >= 2 and inf.get(f"{NS}/c"), what="relisted", timeout=5, interval=0.01)
        poll_until(lambda: inf.resource_version == kube.resource_version, what="bookmarked", timeout=5, interval=0.01)
    finally:
        inf.stop()
    poll_until(lambda: kube.watchers() == 0, what="the watch ended", timeout=5, interval=0.01)


def test_a_watch_from_a_compacted_resource_version_is_410(kube):
    kube.add(pod("a"))
    kube.expire_watches()
    with pytest.raises(Expired):
        next(iter(kube.watch(api_path("v1", "pods", NS), resource_version="1")))


# ------------------------------------------------------------------ faults and actions


def test_reactors_fail_and_hang_requests(kube):
    kube.add(pod("a", node="n1", ready=True))
    kube.fail("create", "pods", TooManyRequests(429, "TooManyRequests", "throttled"), subresource="eviction")
    with pytest.raises(TooManyRequests, match="throttled"):
        kube.evict(NS, "a")
    kube.fail("get", "pods", Unreachable("connection refused"), times=None)
    with pytest.raises(Unreachable):
        kube.get("v1", "pods", "a", NS)
    release = kube.hang("patch", "nodes")
    kube.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    with pytest.raises(Unreachable, match="timed out"):
        kube.request("PATCH", api_path("v1", "nodes", name="n1"), body={"spec": {}}, timeout=0.05)
    threading.Timer(0.05, release.set).start()
    started = time.monotonic()
    kube.patch("v1", "nodes", "n1", {"spec": {"unschedulable": True}})
    assert time.monotonic() - started >= 0.04
    verbs = [(a.verb, a.resource, a.subresource) for a in kube.writes()]
    assert ("create", "pods", "eviction") in verbs and ("patch", "nodes", None) in verbs


def test_the_real_clients_fence_still_refuses_writes(kube):
    from gpufleet.kube import LeadershipLost
    from gpufleet.kube.fence import Fence

    fence = Fence("ns/lease")
    kube.fence_writes(fence)
    with pytest.raises(LeadershipLost):
        kube.create("v1", "configmaps", {"metadata": {"name": "x"}}, NS)
    assert not [a for a in kube.actions if a.verb == "create" and a.resource == "configmaps"], "never sent"


def test_fake_prometheus_answers_the_real_clients_methods():
    prom = FakeProm({"up": [{"metric": {"job": "a"}, "value": [1, "1"]}, {"metric": {"job": "b"}, "value": [1, "0"]}]})
    assert prom.value("up") == 1.0 and prom.query("absent") == [] and prom.value("absent") is None
    prom.fail("up")
    with pytest.raises(PromError, match="connection refused"):
        prom.query("up")


def test_json_patch_answers_as_the_api_server_does():
    """400 only for a patch that does not decode; an operation that does not apply, unknown or incomplete
    ones included, is 422 (kube-apiserver's patch handler)."""
    from gpufleet_workshop.testing.patches import PatchError, json_patch

    doc = {"a": {"b": [1, 2]}}
    assert json_patch(doc, [{"op": "add", "path": "/a/b/-", "value": 3}, {"op": "move", "from": "/a/b/0",
                                                                         "path": "/c"}]) == {"a": {"b": [2, 3]}, "c": 1}
    assert doc == {"a": {"b": [1, 2]}}, "the target is not changed"
    for ops, status in (({"op": "add"}, 400), (["add"], 400), ([{"op": "bogus", "path": "/a"}], 422),
                        ([{"op": "remove", "path": "/x"}], 422), ([{"op": "copy", "path": "/x"}], 422),
                        ([{"op": "test", "path": "/a/b/0", "value": 9}], 422)):
        with pytest.raises(PatchError) as exc:
            json_patch(doc, ops)
        assert exc.value.status == status, (ops, exc.value)
