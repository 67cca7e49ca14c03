"""Node health's remediation step against the in-memory API server and a Prometheus client answered from
memory (:mod:`gpufleet_workshop.testing`): a hot GPU degrades, a fatal XID swaps (cordon, taint, drain within
the PodDisruptionBudget, swap request), a third attributable failure makes a lemon, the circuit breaker holds
actions past the share and records it, an unreachable Prometheus acts on nothing. The PromQL itself is tested
against a real Prometheus in ``test_health_prometheus.py``."""

from __future__ import annotations

import json
import time

import pytest

from gpufleet.names import (ANN_HEALTH_HISTORY, BREAKER_CONFIGMAP, DEGRADED_TAINT, LEMON_LABEL, SWAP_TAINT,
                            SYSTEM_NAMESPACE)
from gpufleet.node_health import breaker
from gpufleet.node_health.faults import Queries, Rules
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.remediate import Remediator
from gpufleet.ops.swap import request_name
from gpufleet_workshop.testing import FakeKube
from gpufleet_workshop.testing.fakeprom import FakeProm

from ..builders import node, pod

RULES = Rules(hot_samples=3, gpu_temp_celsius=78, scrape_interval_seconds=15)
QUERIES = Queries(RULES).all()


def series(metric: dict, values: list[float], end: float, step: float = 15.0) -> dict:
    n = len(values)
    return {"metric": metric, "values": [[end - step * (n - 1 - i), str(v)] for i, v in enumerate(values)]}


def hot(node_name: str, now: float) -> dict:
    return series({"node": node_name, "gpu": "3"}, [80, 81, 84], now)


def xid(node_name: str, now: float, code: str = "79") -> dict:
    return series({"node": node_name, "gpu": "2", "xid": code}, [1, 1], now - 10)


def events(kube: FakeKube, reason: str) -> list[dict]:
    return [e for ns in ("default", SYSTEM_NAMESPACE) for e in kube.objects("events", ns) if e["reason"] == reason]


def taint_keys(kube: FakeKube, name: str) -> dict[str, str]:
    return {t["key"]: t.get("value", "") for t in kube.get("v1", "nodes", name)["spec"].get("taints") or []}


@pytest.fixture
def fleet():
    kube = FakeKube()
    kube.add(*[node(f"gpu-{i}") for i in range(6)],
             {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}})
    prom = FakeProm()
    made: list[Remediator] = []

    def remediator(**settings) -> Remediator:
        r = Remediator(kube, prom, Configuration(rules=RULES, namespace=SYSTEM_NAMESPACE, drain_timeout_seconds=10,
                                            **settings))
        made.append(r)
        return r

    yield kube, prom, remediator
    for r in made:
        r.close()
    kube.close()


def test_a_hot_gpu_sends_its_node_to_the_degraded_tier(fleet):
    kube, prom, remediator = fleet
    now = time.time()
    prom.set(QUERIES["gpu_temp"], [hot("gpu-1", now)])
    r = remediator()
    report = r.step(now)
    assert [(d.node, d.action) for d in report.decisions] == [("gpu-1", "degrade")]
    assert taint_keys(kube, "gpu-1")[DEGRADED_TAINT] == "gpu_temp"
    assert not kube.get("v1", "nodes", "gpu-1")["spec"].get("unschedulable"), "degraded: no cordon"
    assert [e["involvedObject"]["name"] for e in events(kube, "NodeDegraded")] == ["gpu-1"]
    history = json.loads(kube.get("v1", "nodes", "gpu-1")["metadata"]["annotations"][ANN_HEALTH_HISTORY])
    assert history[-1]["fault"] == "gpu_temp"
    assert r.step(now).decisions[0].action == "skip", "already degraded"


def test_a_fatal_xid_swaps_the_node_draining_it_within_its_budget(fleet):
    kube, prom, remediator = fleet
    now = time.time()
    for name in ("chat-a", "chat-b"):
        p = pod(name, "gpu-2", gpus=4, ns="inference", labels={"app": "chat"})
        p["spec"]["terminationGracePeriodSeconds"] = 0
        p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        kube.add(p)
    other = pod("elsewhere", "gpu-3", gpus=4, ns="inference", labels={"app": "chat"})
    other["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    kube.add(other)
    kube.add({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "chat", "namespace": "inference"},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "chat"}}}})
    prom.set(QUERIES["xid"], [xid("gpu-2", now), xid("gpu-4", now, code="13")])  # 13 is not fatal
    r = remediator()
    report = r.step(now)
    assert [(d.node, d.action) for d in report.decisions] == [("gpu-2", "swap")]
    r.wait(30)
    n = kube.get("v1", "nodes", "gpu-2")
    assert n["spec"]["unschedulable"] and taint_keys(kube, "gpu-2")[SWAP_TAINT] == "xid"
    assert [p["metadata"]["name"] for p in kube.objects("pods", "inference")] == ["elsewhere"]
    evictions = [a.name for a in kube.writes() if a.subresource == "eviction"]
    assert sorted(evictions) == ["chat-a", "chat-b"], "drained through the Eviction API"
    request = kube.get("v1", "configmaps", request_name("gpu-2"), SYSTEM_NAMESPACE)
    assert request["data"]["node"] == "gpu-2"
    assert events(kube, "NodeSwapRequested") and not taint_keys(kube, "gpu-4").get(SWAP_TAINT)


def test_a_third_attributable_failure_in_the_window_makes_a_lemon(fleet):
    kube, prom, remediator = fleet
    now = time.time()
    history = [{"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 600 * i)), "fault": "gpu_temp"}
               for i in (1, 2)]
    kube.modify("nodes", "gpu-5", None,
                lambda n: n["metadata"]["annotations"].update({ANN_HEALTH_HISTORY: json.dumps(history)}))
    prom.set(QUERIES["gpu_temp"], [hot("gpu-5", now)])
    r = remediator(lemon_failures=3, lemon_window_hours=1)
    (d,) = r.step(now).decisions
    assert d.action == "swap" and d.lemon, "a lemon is swapped even for a degraded-tier fault"
    r.wait(30)
    assert kube.get("v1", "nodes", "gpu-5")["metadata"]["labels"][LEMON_LABEL] == "true"


def test_the_circuit_breaker_holds_actions_past_the_share_and_records_why(fleet):
    kube, prom, remediator = fleet
    now = time.time()
    for name in ("gpu-0", "gpu-1"):
        kube.modify("nodes", name, None, lambda n: n["spec"].update(unschedulable=True))
    prom.set(QUERIES["xid"], [xid("gpu-2", now), xid("gpu-3", now)])
    r = remediator(max_nodes_out=6, max_unhealthy_share=0.5)
    report = r.step(now)
    actions = {d.node: (d.action, d.breaker) for d in report.decisions}
    assert sorted(a for a, _ in actions.values()) == ["defer", "swap"], "2 of 6 out; 0.5 allows 3"
    r.wait(30)
    cm = kube.get("v1", "configmaps", BREAKER_CONFIGMAP, SYSTEM_NAMESPACE)
    assert cm["data"][breaker.STATE] == breaker.OPEN and cm["data"][breaker.HELD] in ("gpu-2", "gpu-3")
    assert events(kube, "CircuitBreakerOpen") and events(kube, "RemediationHeldByBreaker")
    # The cordoned nodes come back: the share falls, the held node is acted on and the breaker closes.
    for name in ("gpu-0", "gpu-1"):
        kube.modify("nodes", name, None, lambda n: n["spec"].pop("unschedulable"))
    r.step(now + 1)
    r.wait(30)
    assert kube.get("v1", "configmaps", BREAKER_CONFIGMAP, SYSTEM_NAMESPACE)["data"][breaker.STATE] == breaker.CLOSED
    assert all(SWAP_TAINT in taint_keys(kube, n) for n in ("gpu-2", "gpu-3"))


def test_without_prometheus_nothing_is_acted_on_and_the_error_is_reported(fleet):
    kube, prom, remediator = fleet
    prom.fail()
    report = remediator().step(time.time())
    assert report.decisions == [] and report.errors and "connection refused" in report.errors[0]
    assert not [a for a in kube.writes() if a.resource == "nodes"]


def test_an_api_outage_is_reported_not_raised(fleet):
    kube, prom, remediator = fleet
    from gpufleet.kube import Unreachable

    kube.fail("list", "nodes", Unreachable("connection refused"), times=None)
    report = remediator().step(time.time())
    assert report.errors and "listing nodes" in report.errors[0]


def test_a_drain_the_budget_refuses_stays_incomplete_and_says_so(fleet):
    kube, prom, remediator = fleet
    now = time.time()
    for name in ("chat-a", "chat-b"):
        p = pod(name, "gpu-2" if name == "chat-a" else "gpu-3", gpus=4, ns="inference", labels={"app": "chat"})
        p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        kube.add(p)
    kube.add({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "chat", "namespace": "inference"},
              "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "chat"}}}})
    prom.set(QUERIES["xid"], [xid("gpu-2", now)])
    r = Remediator(kube, prom, Configuration(rules=RULES, namespace=SYSTEM_NAMESPACE, drain_timeout_seconds=1))
    try:
        r.step(now)
        r.wait(30)
    finally:
        r.close()
    assert kube.object("pods", "chat-a", "inference") is not None, "the budget allows no disruption"
    assert SWAP_TAINT in taint_keys(kube, "gpu-2") and events(kube, "NodeDrainIncomplete")


@pytest.mark.parametrize("rule, metric, action, taint", [
    ("nvlink_down", {"gpu": "1", "link": "3"}, "swap", SWAP_TAINT),  # a GPU's fabric link: out for repair
    ("ib_down", {"hca": "mlx5_2", "port": "1"}, "degrade", DEGRADED_TAINT),  # one HCA of eight: inference still fits
])
def test_a_link_down_swaps_or_degrades_as_its_fault_kind_says(fleet, rule, metric, action, taint):
    kube, prom, remediator = fleet
    now = time.time()
    prom.set(QUERIES[rule], [{"metric": {"node": "gpu-4", **metric}, "value": [now - 5, "1"]}])
    r = remediator()
    (d,) = r.step(now).decisions
    r.wait(30)
    assert (d.node, d.action) == ("gpu-4", action) and taint in taint_keys(kube, "gpu-4")
    assert bool(kube.get("v1", "nodes", "gpu-4")["spec"].get("unschedulable")) == (action == "swap")
