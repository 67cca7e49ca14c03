"""The in-memory API server (:mod:`gpufleet_workshop.testing.fakekube`) answers as kube-apiserver does.

Every test runs twice: against the fake (unit tier) and against a real
etcd + kube-apiserver (``integration`` tier), with one expectation for
both, written from what the real API server answers. The real one runs
no controllers, so budgets' status is written by the test
(``disruption_controller=False`` on the fake) and garbage collection is
left to the end-to-end tier.
"""

from __future__ import annotations

import uuid

import pytest

from gpufleet.kube import KubeError, api_path
from gpufleet_workshop.testing import FakeKube


class Backend:
    """One API server for a test: its client and a fresh namespace of its own."""

    def __init__(self, kube, namespace):
        self.kube, self.ns = kube, namespace


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.integration)])
def api(request):
    if request.param == "fake":
        kube = FakeKube(disruption_controller=False)
        ns = f"it-{uuid.uuid4().hex[:6]}"
        kube.create("v1", "namespaces", {"metadata": {"name": ns}})
        yield Backend(kube, ns)
        kube.close()
    else:
        server = request.getfixturevalue("apiserver")
        yield Backend(server.kube, server.namespace())


def error_of(call) -> tuple[str, int, str, str]:
    """``(class, status, reason, message)`` of what ``call()`` raises."""
    try:
        call()
    except KubeError as exc:
        return type(exc).__name__, exc.status, exc.reason, exc.message
    raise AssertionError("no error")


def pod(name: str, *, node: str = "", labels: dict | None = None) -> dict:
    spec = {"containers": [{"name": "c", "image": "registry.invalid/c:1"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {"app": "chat"}},
            "spec": spec}


def test_errors_are_the_servers(api):
    k, ns = api.kube, api.ns
    k.create("v1", "configmaps", {"metadata": {"name": "a"}}, ns)
    assert error_of(lambda: k.create("v1", "configmaps", {"metadata": {"name": "a"}}, ns)) == (
        "Conflict", 409, "AlreadyExists", 'configmaps "a" already exists')
    assert error_of(lambda: k.get("v1", "configmaps", "b", ns)) == ("NotFound", 404, "NotFound", 'configmaps "b" not found')
    assert error_of(lambda: k.get("apps/v1", "replicasets", "b", ns)) == (
        "NotFound", 404, "NotFound", 'replicasets.apps "b" not found')
    cls, status, reason, message = error_of(lambda: k.create("v1", "configmaps", {"metadata": {"name": "x"}}, "nope-x"))
    assert (cls, status, reason, message) == ("NotFound", 404, "NotFound", 'namespaces "nope-x" not found')
    cls, status, reason, _ = error_of(lambda: k.create("v1", "configmaps", {"metadata": {}}, ns))
    assert (cls, status, reason) == ("Invalid", 422, "Invalid")


def test_generate_name_and_a_pods_initial_status(api):
    p = api.kube.create("v1", "pods", {**pod(""), "metadata": {"generateName": "chat-"}}, api.ns)
    assert p["metadata"]["name"].startswith("chat-") and len(p["metadata"]["name"]) == 10
    assert p["status"]["phase"] == "Pending" and p["spec"]["priority"] == 0
    assert p["metadata"]["generation"] == 1 and p["metadata"]["uid"]


def test_optimistic_concurrency(api):
    k, ns = api.kube, api.ns
    cm = k.create("v1", "configmaps", {"metadata": {"name": "a"}, "data": {"k": "1"}}, ns)
    newer = k.replace("v1", "configmaps", "a", {**cm, "data": {"k": "2"}}, ns)
    assert error_of(lambda: k.replace("v1", "configmaps", "a", {**cm, "data": {"k": "3"}}, ns)) == (
        "Conflict", 409, "Conflict", 'Operation cannot be fulfilled on configmaps "a": the object has been modified; '
        "please apply your changes to the latest version and try again")
    stale = {"metadata": {"resourceVersion": cm["metadata"]["resourceVersion"]}, "data": {"k": "4"}}
    assert error_of(lambda: k.patch("v1", "configmaps", "a", stale, ns))[:3] == ("Conflict", 409, "Conflict")
    same = k.patch("v1", "configmaps", "a", {"data": {"k": "2"}}, ns)
    assert same["metadata"]["resourceVersion"] == newer["metadata"]["resourceVersion"], "a no-op write is not stored"
    uid = error_of(lambda: k.replace("v1", "configmaps", "a", {"metadata": {"name": "a", "uid": "x"}, "data": {}}, ns))
    assert uid[:3] == ("Conflict", 409, "Conflict") and uid[3].startswith('Operation cannot be fulfilled on configmaps "a": ')
    assert "Precondition failed: UID in precondition: x, UID in object meta: " in uid[3]


def test_selectors(api):
    k, ns = api.kube, api.ns
    k.create("v1", "pods", pod("a", node="n1", labels={"app": "chat", "tier": "x"}), ns)
    k.create("v1", "pods", pod("b", node="n2"), ns)
    k.create("v1", "pods", pod("c", labels={"app": "other"}), ns)
    names = lambda **p: [o["metadata"]["name"] for o in k.list("v1", "pods", ns, **p)["items"]]  # noqa: E731
    assert names(labelSelector="app in (chat,other),tier") == ["a"]
    assert names(labelSelector="tier!=x") == ["b", "c"]
    assert names(labelSelector="!tier,app notin (other)") == ["b"]
    assert names(fieldSelector="spec.nodeName=n1") == ["a"]
    assert names(fieldSelector="spec.nodeName!=,status.phase!=Succeeded") == ["a", "b"]
    assert names(fieldSelector="metadata.name=c") == ["c"]
    cls, status, _, message = error_of(lambda: names(fieldSelector="spec.priority=0"))
    assert (cls, status) == ("KubeError", 400) and "field label not supported: spec.priority" in message
    page = k.list("v1", "pods", ns, limit=2)
    assert len(page["items"]) == 2 and page["metadata"]["continue"] and page["metadata"]["remainingItemCount"] == 1


def test_patches_and_the_status_subresource(api):
    k, ns = api.kube, api.ns
    k.create("v1", "pods", pod("a", node="n1"), ns)
    p = k.patch("v1", "pods", "a", [{"op": "add", "path": "/metadata/labels/y", "value": "2"}], ns, patch="json")
    assert p["metadata"]["labels"] == {"app": "chat", "y": "2"}
    assert error_of(lambda: k.patch("v1", "pods", "a", [{"op": "test", "path": "/metadata/labels/y", "value": "9"}], ns,
                                    patch="json"))[:3] == ("Invalid", 422, "Invalid")
    k.patch("v1", "pods", "a", {"status": {"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
                                          "conditions": [{"type": "Ready", "status": "False"}]}}, ns,
            subresource="status", patch="strategic")
    p = k.patch("v1", "pods", "a", {"status": {"hostIP": "10.0.0.2", "hostIPs": [{"$patch": "replace"}, {"ip": "10.0.0.2"}],
                                              "conditions": [{"type": "PodScheduled", "status": "True"}]}}, ns,
                subresource="status", patch="strategic")
    assert p["status"]["hostIPs"] == [{"ip": "10.0.0.2"}]
    assert sorted(c["type"] for c in p["status"]["conditions"]) == ["PodScheduled", "Ready"]
    p = k.patch("v1", "pods", "a", {"metadata": {"labels": {"z": "3"}}, "status": {"phase": "Failed"}}, ns)
    assert p["metadata"]["labels"]["z"] == "3" and p["status"]["phase"] == "Pending", "status ignored on the pod"
    p = k.patch("v1", "pods", "a", {"metadata": {"labels": {"w": "4"}}, "status": {"phase": "Running"}}, ns,
                subresource="status")
    assert p["metadata"]["labels"]["w"] == "4" and p["status"]["phase"] == "Running", "a pod's /status takes labels too"
    k.create("apps/v1", "deployments", {"metadata": {"name": "d"}, "spec": {
        "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod("x")["spec"]}}}, ns)
    d = k.patch("apps/v1", "deployments", "d", {"metadata": {"labels": {"w": "4"}}, "status": {"replicas": 0}}, ns,
                subresource="status")
    assert "w" not in (d["metadata"].get("labels") or {}), "a Deployment's /status takes its status only"


def test_server_side_apply(api):
    k, ns = api.kube, api.ns
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s", "namespace": ns}, "data": {"a": "1", "b": "2"}}
    k.apply(cm)
    k.patch("v1", "configmaps", "s", {"data": {"mine": "x"}}, ns)
    live = k.apply({**cm, "data": {"a": "1"}})
    assert live["data"] == {"a": "1", "mine": "x"}
    cls, status, reason, message = error_of(lambda: k.apply({**cm, "data": {"a": "other"}}, field_manager="someone",
                                                            force=False))
    assert (cls, status, reason) == ("Conflict", 409, "Conflict") and 'conflict with "gpufleet"' in message
    assert k.apply({**cm, "data": {"a": "other"}}, field_manager="someone")["data"]["a"] == "other"
    stale = {**cm, "metadata": {**cm["metadata"], "resourceVersion": "1"}}
    assert error_of(lambda: k.apply(stale))[:3] == ("Conflict", 409, "Conflict")
    fresh = {**cm, "metadata": {"name": "new", "namespace": ns, "resourceVersion": "1"}}
    assert k.apply(fresh)["metadata"]["name"] == "new", "creating, the resourceVersion is ignored"


def test_delete_preconditions_finalizers_and_graceful_pods(api):
    k, ns = api.kube, api.ns
    k.create("v1", "pods", pod("bound", node="n1"), ns)
    k.create("v1", "pods", pod("unbound"), ns)
    cls, status, reason, message = error_of(lambda: k.delete("v1", "pods", "bound", ns, uid="x"))
    assert (cls, status, reason) == ("Conflict", 409, "Conflict") and message.startswith(
        'Operation cannot be fulfilled on Pod "bound": the UID in the precondition (x) does not match the UID in record (')
    k.delete("v1", "pods", "unbound", ns)
    assert k.get_or_none("v1", "pods", "unbound", ns) is None
    gone = k.delete("v1", "pods", "bound", ns)
    assert gone["metadata"]["deletionGracePeriodSeconds"] == 30 and gone["metadata"]["deletionTimestamp"]
    k.delete("v1", "pods", "bound", ns, grace_seconds=0)
    assert k.get_or_none("v1", "pods", "bound", ns) is None, "grace 0: gone at once"
    k.create("v1", "configmaps", {"metadata": {"name": "f", "finalizers": ["example.com/x"]}}, ns)
    k.delete("v1", "configmaps", "f", ns)
    assert k.get("v1", "configmaps", "f", ns)["metadata"]["deletionTimestamp"]
    k.patch("v1", "configmaps", "f", {"metadata": {"finalizers": None}}, ns)
    assert k.get_or_none("v1", "configmaps", "f", ns) is None


def test_eviction_over_the_budgets_status(api):
    k, ns = api.kube, api.ns
    for name in ("a", "b"):
        k.create("v1", "pods", pod(name, node="n1"), ns)
        k.patch("v1", "pods", name, {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                ns, subresource="status")
    k.create("v1", "pods", pod("pending"), ns)
    k.create("policy/v1", "poddisruptionbudgets", {"metadata": {"name": "chat"}, "spec": {
        "minAvailable": 1, "selector": {"matchLabels": {"app": "chat"}}}}, ns)
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a", "namespace": ns}}
    # Its status not written yet (observedGeneration 0): refused with Retry-After 10, sent once here (the client
    # would honour the header ten times: gpufleet.kube.retry.retry_after).
    assert error_of(lambda: k.request("POST", api_path("v1", "pods", ns, "a", "eviction"), body=eviction,
                                      retry=False)) == (
        "TooManyRequests", 429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
    k.evict(ns, "pending")  # a Pending pod goes without consulting the budget
    allow_one = {"status": {"observedGeneration": 1, "disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1,
                            "expectedPods": 2}}
    k.patch("policy/v1", "poddisruptionbudgets", "chat", allow_one, ns, subresource="status")
    # A stale UID is refused, but only after the budget was used: the disruption is spent until the next sync.
    assert error_of(lambda: k.evict(ns, "a", uid="x"))[:3] == ("Conflict", 409, "Conflict")
    budget = k.get("policy/v1", "poddisruptionbudgets", "chat", ns)["status"]
    assert budget["disruptionsAllowed"] == 0 and list(budget["disruptedPods"]) == ["a"]
    assert error_of(lambda: k.evict(ns, "b")) == (
        "TooManyRequests", 429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
    k.patch("policy/v1", "poddisruptionbudgets", "chat", allow_one, ns, subresource="status")
    k.evict(ns, "a")
    assert k.get("v1", "pods", "a", ns)["metadata"]["deletionTimestamp"]


def test_a_watch_follows_its_selector(api):
    k, ns = api.kube, api.ns
    rv = k.list("v1", "configmaps", ns)["metadata"]["resourceVersion"]
    k.create("v1", "configmaps", {"metadata": {"name": "w", "labels": {"watched": "yes"}}}, ns)
    k.create("v1", "configmaps", {"metadata": {"name": "other"}}, ns)
    k.patch("v1", "configmaps", "w", {"metadata": {"labels": {"watched": None}}}, ns)
    k.patch("v1", "configmaps", "w", {"metadata": {"labels": {"watched": "yes"}}}, ns)
    seen = []
    for kind, obj in k.watch(api_path("v1", "configmaps", ns), resource_version=rv,
                             params={"labelSelector": "watched=yes"}, timeout_seconds=1):
        if kind != "BOOKMARK":
            seen.append((kind, obj["metadata"]["name"]))
        if len(seen) == 3:
            break
    assert seen == [("ADDED", "w"), ("DELETED", "w"), ("ADDED", "w")]


def test_unknown_resources_and_discovery(api):
    k = api.kube
    assert k.resource("apps/v1", "ReplicaSet") == ("replicasets", True)
    assert error_of(lambda: k.get("v1", "nosuchthings", "x"))[:2] == ("NotFound", 404)
