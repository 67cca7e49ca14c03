"""The client layer's pieces that need no cluster: errors, paths, backoff, the cache's event rules, timings."""

from __future__ import annotations

import socket

import pytest

from gpufleet.kube import Conflict, Expired, Forbidden, Invalid, Kube, KubeError, NotFound, ServerError, TooManyRequests
from gpufleet.kube import Unauthorized, Unreachable, api_path
from gpufleet.kube.config import from_dict
from gpufleet.kube.errors import error_from
from gpufleet.kube.informer import Informer
from gpufleet.kube.leader import Timings
from gpufleet.kube.retry import Backoff, conflict_wait, retryable


@pytest.mark.parametrize("status, cls", [(401, Unauthorized), (403, Forbidden), (404, NotFound), (409, Conflict),
                                         (410, Expired), (422, Invalid), (429, TooManyRequests), (500, ServerError),
                                         (503, ServerError), (400, KubeError)])
def test_status_codes_map_to_typed_errors(status, cls):
    err = error_from(status, b'{"kind":"Status","reason":"R","message":"what went wrong"}', "GET /api/v1/x")
    assert type(err) is cls and err.status == status and err.reason == "R" and err.message == "what went wrong"
    assert "GET /api/v1/x" in str(err)
    assert error_from(status, b"not json").message == "not json"


def test_paths():
    assert api_path("v1", "pods", "ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert api_path("coordination.k8s.io/v1", "leases", "kube-node-lease", "n") == \
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n"
    assert api_path("v1", "nodes") == "/api/v1/nodes"


def test_no_answer_is_unreachable_and_retryable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    doc = {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
           "clusters": [{"name": "k", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
           "users": [{"name": "u", "user": {"token": "t"}}]}
    kube = Kube(from_dict(doc, source="test"), timeout=2)
    with pytest.raises(Unreachable) as err:
        kube.get("v1", "nodes", "n")
    assert err.value.status == 0 and f"127.0.0.1:{port}" in str(err.value) and retryable(err.value)
    assert not retryable(NotFound(404, "NotFound", "x")) and retryable(ServerError(503, "", ""))


def test_backoff_doubles_to_its_cap_with_jitter_and_resets():
    b = Backoff(initial=1.0, cap=4.0, jitter=0.1)
    waits = [b.next() for _ in range(5)]
    for got, nominal in zip(waits, [1, 2, 4, 4, 4]):
        assert nominal * 0.9 <= got <= nominal * 1.1
    b.reset()
    assert 0.9 <= b.next() <= 1.1
    assert [conflict_wait(a) for a in range(6)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]


def test_informer_events_keep_the_cache_and_call_handlers():
    seen = []
    inf = Informer(None, "/api/v1/pods", transform=lambda o: o["metadata"]["name"].upper(),
                   handlers=[lambda kind, new, old: seen.append((kind, new, old))])
    pod = {"metadata": {"name": "p", "namespace": "ns"}}
    inf.apply("ADDED", pod)
    inf.apply("ADDED", pod)  # a restarted watch replays it: reported as a change
    assert inf.get("ns/p") == "P" and len(inf) == 1
    inf.apply("DELETED", pod)
    assert inf.get("ns/p") is None
    assert seen == [("ADDED", "P", None), ("MODIFIED", "P", "P"), ("DELETED", "P", "P")]


def _on_node(p: dict) -> tuple[str, ...]:
    node = (p.get("spec") or {}).get("nodeName")
    return (node,) if node else ()


def _pod(name: str, node: str | None) -> dict:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": node} if node else {}}


def test_an_index_follows_every_event_and_answers_by_key():
    inf = Informer(None, "/api/v1/pods", indexers={"node": _on_node})
    inf.apply("ADDED", _pod("a", "n1"))
    inf.apply("ADDED", _pod("b", "n1"))
    inf.apply("ADDED", _pod("c", None))  # filed nowhere
    assert sorted(p["metadata"]["name"] for p in inf.by_index("node", "n1")) == ["a", "b"]
    inf.apply("MODIFIED", _pod("a", "n2"))  # moved: out of n1's entry, into n2's
    assert [p["metadata"]["name"] for p in inf.by_index("node", "n1")] == ["b"]
    assert [p["metadata"]["name"] for p in inf.by_index("node", "n2")] == ["a"]
    inf.apply("DELETED", _pod("b", "n1"))
    assert inf.by_index("node", "n1") == [] and "n1" not in inf._indices["node"], "an empty entry is dropped"
    with pytest.raises(KeyError, match="informer informer: no index 'zone' \\(have: node\\)"):
        inf.by_index("zone", "a")


def test_a_relist_rebuilds_the_indexes():
    class Lister:
        def __init__(self, items):
            self.items = items

        def request(self, method, path, params=None):
            return {"items": self.items, "metadata": {"resourceVersion": "7"}}

    lister = Lister([_pod("a", "n1"), _pod("b", "n2")])
    inf = Informer(lister, "/api/v1/pods", indexers={"node": _on_node})
    inf.relist()
    lister.items = [_pod("b", "n1")]  # a gone, b moved while the watch was down
    inf.relist()
    assert [p["metadata"]["name"] for p in inf.by_index("node", "n1")] == ["b"]
    assert inf.by_index("node", "n2") == []


def test_an_index_added_later_is_filled_and_added_twice_is_one_index():
    inf = Informer(None, "/api/v1/pods")
    inf.apply("ADDED", _pod("a", "n1"))
    inf.add_indexers({"node": _on_node})
    inf.add_indexers({"node": _on_node})  # the same function: nothing to do
    assert [p["metadata"]["name"] for p in inf.by_index("node", "n1")] == ["a"]
    with pytest.raises(ValueError, match="index 'node' exists with another function"):
        inf.add_indexers({"node": lambda p: ()})


def test_lease_timings_must_nest():
    assert Timings() == Timings(15, 10, 2)
    with pytest.raises(ValueError, match=r"lease duration \(10 s\) > renew deadline \(10 s\)"):
        Timings(10, 10, 2)


def test_retry_after_is_honoured_only_where_the_server_did_not_process_the_request():
    from gpufleet.kube.retry import RETRY_AFTER_ATTEMPTS, retry_after

    assert retry_after(429, "1", 0) == 1.0  # API priority and fairness, storage initializing
    assert retry_after(503, "2", 3) == 2.0
    assert retry_after(429, "600", 0) == 10.0  # capped
    assert retry_after(429, None, 0) is None  # a PodDisruptionBudget refusing an eviction: the caller's
    assert retry_after(409, "1", 0) is None and retry_after(429, "soon", 0) is None
    assert retry_after(429, "1", RETRY_AFTER_ATTEMPTS) is None
