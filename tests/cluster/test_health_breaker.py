"""Node health on the local cluster: GPU telemetry that stops is a fault, and the circuit breaker.

Three of the cluster's simulated nodes get an exporter each
(:mod:`gpufleet_workshop.sim.fleet`), scraped every second by a real Prometheus, as
in ``test_remediation``. The tests stop one exporter (the node's GPU
telemetry is absent: it goes to the degraded tier, out of training's
quota), and heat three nodes while the breaker's share leaves room for one:
the breaker holds the other two (Events, metric, its ConfigMap, ``invoke
status``), lets one go once the share falls, and the last once a person
resumes it (``invoke health.breaker-resume``).
"""

from __future__ import annotations

import time

import pytest
from rich.console import Console

from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet.classify import TRAINING, classify
from gpufleet.node_health import breaker
from gpufleet.node_health.faults import Rules
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.remediate import Remediator
from gpufleet.kube import NotFound
from gpufleet.kube.events import events_for
from gpufleet.names import BREAKER_CONFIGMAP, DEGRADED_TAINT
from gpufleet.ops import swap as swapper
from gpufleet.ops.reads import get_node, list_nodes
from gpufleet.prom.client import PromClient

from .helpers import exporter_fleet, hostname_selector, return_to_service, step_until

pytestmark = pytest.mark.cluster

NS = "gpufleet-system"
RULES = Rules(hot_samples=3, gpu_temp_celsius=78, scrape_interval_seconds=1)


@pytest.fixture(scope="module")
def fleet(local_cluster, tmp_path_factory):
    """``(names, simulated exporters by name, Prometheus)`` for three simulated nodes no other module uses."""
    with exporter_fleet(local_cluster.kube, tmp_path_factory, slice(-3, None)) as f:
        yield f


def restore(api, names: list[str]) -> None:
    """Every node back in service without gpufleet's marks; the breaker's ConfigMap gone (ours)."""
    return_to_service(api, names)
    try:
        api.delete("v1", "configmaps", BREAKER_CONFIGMAP, NS)
    except NotFound:
        pass


@pytest.fixture
def clean(local_cluster, fleet):
    api = local_cluster.kube
    names, sims, _ = fleet
    assert not [n for n in list_nodes(api) if nodeutil.is_out(n)], "a node is out before the test"
    restore(api, names)
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    yield since
    for s in sims.values():
        for g in range(8):
            s.set_temperature(g, 41)
    restore(api, names)
    time.sleep(4)  # cool samples: the next test starts from healthy series


def events(api, kind: str, name: str, reason: str, since: str, namespace: str = "default") -> list[dict]:
    return [e for e in events_for(api, kind, name, namespace)
            if (e.get("firstTimestamp") or "") >= since and e["reason"] == reason]


def degraded(api, name: str) -> str | None:
    t = nodeutil.taint(get_node(api, name), DEGRADED_TAINT)
    return t and t.get("value")


def test_a_node_whose_gpu_telemetry_stops_leaves_trainings_quota(local_cluster, fleet, clean):
    api = local_cluster.kube
    names, sims, prom = fleet
    blind = names[0]
    rem = Remediator(api, PromClient(prom.url), Configuration(rules=RULES, namespace=NS, telemetry_node_selector=hostname_selector(names)))
    try:
        report = rem.step()
        assert not report.errors and not set(report.faults) & set(names), report.faults
        assert rem.registry.get_sample_value("gpufleet_node_health_expected_gpus", {"node": blind}) == 8
        sims[blind].stop()  # the exporter stops answering: Prometheus marks its series stale
        report = step_until(rem, "a telemetry fault", lambda r: any(d.node == blind and d.action == "degrade"
                                                                     for d in r.decisions))
        (fault,) = report.faults[blind]
        assert (fault.kind, fault.detail) == ("telemetry", "GPU telemetry absent: no gpufleet_gpu_* series in "
                                                           "Prometheus, 8 GPUs expected")
        assert not set(report.faults) & set(names[1:])  # the two nodes still reporting are fine
        assert degraded(api, blind) == "telemetry"
        assert not classify(get_node(api, blind)).counts(TRAINING)  # out of training's quota, inference may stay
        assert rem.registry.get_sample_value("gpufleet_node_health_faulty_nodes", {"fault": "telemetry"}) == 1
    finally:
        rem.close()


def test_breaker_holds_past_the_share_resumes_when_it_falls_and_when_a_person_says_so(local_cluster, fleet, clean):
    from gpufleet_workshop.tasks.fleet_status import gather, render
    from gpufleet_workshop.tasks.health import resume_breaker
    from roles.registry import load

    api = local_cluster.kube
    since = clean
    names, sims, prom = fleet
    live = names[1:]  # names[0]'s exporter was stopped by the test above
    share = breaker.fleet_share({nodeutil.name(n): n for n in list_nodes(api)})
    limit = (len(share.out) + 1) / share.total  # room for exactly one more node out of service
    rem = Remediator(api, PromClient(prom.url), Configuration(rules=RULES, namespace=NS, max_nodes_out=4,
                                                         max_unhealthy_share=limit, telemetry_node_selector=hostname_selector(live)))
    kubeconfig = str(local_cluster.kubeconfig)
    console = Console(width=220, record=True)
    try:
        # two hot nodes, room for one: one is degraded, the breaker holds the other
        for n in live:
            sims[n].set_temperature(2, 90)
        acted: dict = {}

        def one_each(r) -> bool:  # the two may be seen in one step or in two
            for d in r.decisions:
                if d.node in live and d.action in ("degrade", "defer"):
                    acted.setdefault(d.action, d)
            return "degrade" in acted and "defer" in acted

        step_until(rem, "one degrade and one hold", one_each)
        taken, held = acted["degrade"].node, acted["defer"]
        assert held.breaker and held.node != taken and held.why.startswith("circuit breaker: ")
        assert degraded(api, taken) == "gpu_temp" and degraded(api, held.node) is None
        assert rem.registry.get_sample_value("gpufleet_node_health_breaker_open") == 1
        cm = breaker.read(api, NS)
        assert cm["data"]["state"] == "open" and cm["data"]["held"] == held.node
        assert events(api, "Node", held.node, "RemediationHeldByBreaker", since)
        (opened,) = events(api, "ConfigMap", BREAKER_CONFIGMAP, "CircuitBreakerOpen", since, NS)
        assert held.node in opened["message"] and "node_health_max_unhealthy_share" in opened["message"]
        rem.step()  # still held: no second Event
        assert len(events(api, "ConfigMap", BREAKER_CONFIGMAP, "CircuitBreakerOpen", since, NS)) == 1
        console.print(render(gather(api, load("local"))))
        screen = console.export_text(clear=True)
        assert "Node health circuit breaker" in screen and "OPEN since" in screen and held.node in screen

        # the share falls (the degraded node is repaired and returned): the held node goes, the breaker closes by itself
        sims[taken].set_temperature(2, 41)
        swapper.return_node(api, taken, checks=None)  # a person returns it, checks skipped: not what this test is about
        step_until(rem, "the held node degraded once the share fell", lambda r: degraded(api, held.node) == "gpu_temp")
        assert breaker.read(api, NS)["data"]["state"] == "closed"
        assert rem.registry.get_sample_value("gpufleet_node_health_breaker_open") == 0
        (closed,) = events(api, "ConfigMap", BREAKER_CONFIGMAP, "CircuitBreakerClosed", since, NS)
        assert "the share allows actions again" in closed["message"]

        # the returned node fails again: held again, until a person resumes (a dry run first changes nothing)
        sims[taken].set_temperature(4, 92)
        step_until(rem, "held again", lambda r: any(d.node == taken and d.breaker for d in r.decisions))
        assert breaker.read(api, NS)["data"]["state"] == "open"
        plan = resume_breaker("local", 5, dry_run=True, kubeconfig=kubeconfig, console=console)
        assert plan.changed and "resume-until" not in breaker.read(api, NS)["data"]
        rem.step()
        assert degraded(api, taken) is None
        resume_breaker("local", 5, kubeconfig=kubeconfig, console=console)
        step_until(rem, "the held node degraded after the resume", lambda r: degraded(api, taken) == "gpu_temp")
        step_until(rem, "the breaker closed", lambda r: breaker.read(api, NS)["data"]["state"] == "closed")
        closed = events(api, "ConfigMap", BREAKER_CONFIGMAP, "CircuitBreakerClosed", since, NS)
        assert len(closed) == 2 and "resume" in closed[-1]["message"]
        assert len(events(api, "ConfigMap", BREAKER_CONFIGMAP, "CircuitBreakerOpen", since, NS)) == 2
        assert not resume_breaker("local", 0, kubeconfig=kubeconfig, console=console).until
        assert "resume-until" not in breaker.read(api, NS)["data"]
    finally:
        rem.close()
