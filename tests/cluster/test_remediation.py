"""Remediation on the local cluster, from a real Prometheus scraping the project's exporter.

Six of the cluster's nodes get a simulated exporter each
(:mod:`gpufleet_workshop.sim.fleet`: the real collectors over a fake NVML and
sysfs), scraped every second by a real Prometheus with a ``node`` label,
as the gpu_metrics role's relabeling does. The tests heat GPUs, raise
XIDs, and check what :class:`gpufleet.node_health.remediate.Remediator` does to
the Nodes: dry run, rate limit, latency, the degraded tier, lemons.
"""

from __future__ import annotations

import json
import time

import pytest

from gpufleet.node_health.faults import Rules
from gpufleet.prom.client import PromClient
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.remediate import Remediator
from gpufleet.fleet import nodes as nodeutil
from gpufleet.kube import KubeError
from gpufleet.kube.events import events_for
from gpufleet.kube.times import now_rfc3339
from gpufleet.ops.reads import get_node, list_nodes
from gpufleet.ops import swap as swapper
from gpufleet.names import ANN_HEALTH_HISTORY, DEGRADED_TAINT, SWAP_TAINT

from .helpers import exporter_fleet, hostname_selector, return_to_service, step_until, wait

pytestmark = pytest.mark.cluster

NS = "gpufleet-system"
RULES = Rules(hot_samples=3, gpu_temp_celsius=78, memory_temp_celsius=85, scrape_interval_seconds=1)
BASE = Configuration(rules=RULES, max_nodes_out=2, degraded_faults=frozenset({"memory_temp"}), namespace=NS,
                drain_timeout_seconds=30, lemon_failures=3, lemon_window_hours=1)



@pytest.fixture(scope="module")
def fleet(local_cluster, tmp_path_factory):
    """``(names, simulated nodes by name, Prometheus)`` for six cluster nodes."""
    with exporter_fleet(local_cluster.kube, tmp_path_factory, slice(8, 14)) as (names, sims, prom):
        # only these nodes have exporters: node health judges only their GPU telemetry
        SCOPE["selector"] = hostname_selector(names)
        yield names, sims, prom


@pytest.fixture
def clean(local_cluster, fleet):
    """Cool every simulated GPU and return every node of the fleet to service after the test."""
    api = local_cluster.kube
    names, sims, _ = fleet
    assert not [n for n in list_nodes(api) if nodeutil.is_out(n)], "a node is out before the test"
    SINCE["t"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    yield
    for s in sims.values():
        for g in range(8):
            s.set_temperature(g, 41)
            s.set_temperature(g, 47, memory=True)
    return_to_service(api, names)
    for name in names:
        try:
            api.delete("v1", "configmaps", swapper.request_name(name), NS)
        except KubeError:
            pass
    time.sleep(4)  # three cool samples: the next test starts from healthy series


def events(api, node: str, reason: str | None = None) -> list[dict]:
    """Events about ``node`` recorded since the test started (the fixture ``clean`` sets :data:`SINCE`)."""
    return [e for e in events_for(api, "Node", node)
            if (e.get("firstTimestamp") or "") >= SINCE["t"] and (reason is None or e["reason"] == reason)]


SINCE = {"t": ""}


SCOPE: dict = {}


def remediator(api, prom, **kw) -> Remediator:
    return Remediator(api, PromClient(prom.url), BASE.replace(**{"telemetry_node_selector": SCOPE["selector"], **kw}))


def actions(report) -> dict[str, str]:
    return {d.node: d.action for d in report.decisions}


def test_dry_run_decides_and_records_but_changes_nothing(local_cluster, fleet, clean):
    api = local_cluster.kube
    names, sims, prom = fleet
    rem = remediator(api, prom, dry_run=True)
    request_before = swapper.get_request(api, names[0], NS)
    sims[names[0]].set_temperature(2, 90)
    step_until(rem, "a dry-run swap decision", lambda r: actions(r).get(names[0]) == "swap")
    rem.wait()
    node = get_node(api, names[0])
    assert nodeutil.schedulable(node) and not nodeutil.is_out(node)
    assert swapper.get_request(api, names[0], NS) == request_before
    ev = events(api, names[0], "RemediationDryRun")
    assert len(ev) == 1 and "would swap" in ev[0]["message"] and "GPU 2: 90, 90, 90 C > 78 C" in ev[0]["message"]
    rem.step()  # the same decision again: no second Event
    assert len(events(api, names[0], "RemediationDryRun")) == 1
    assert rem.registry.get_sample_value("gpufleet_node_health_actions_total",
                                         {"action": "swap", "fault": "gpu_temp", "dry_run": "true"}) >= 1
    rem.close()


def test_hot_gpus_are_pulled_within_the_rate_limit(local_cluster, fleet, clean):
    api = local_cluster.kube
    names, sims, prom = fleet
    rem = remediator(api, prom)
    hot = names[1:4]
    for n in hot:
        sims[n].set_temperature(5, 84)
    seen: dict[str, str] = {}

    def two_swaps_one_deferral(r) -> bool:
        seen.update({n: a for n, a in actions(r).items() if n in hot and a in ("swap", "defer")})
        return sorted(seen.values()) == ["defer", "swap", "swap"]

    step_until(rem, "two swaps and one deferral", two_swaps_one_deferral, timeout=30)
    rem.wait()
    swapped = [n for n in hot if seen[n] == "swap"]
    deferred = next(n for n in hot if seen[n] == "defer")
    for n in swapped:
        node = get_node(api, n)
        assert nodeutil.taint(node, SWAP_TAINT)["value"] == "gpu_temp" and nodeutil.is_cordoned(node)
        assert nodeutil.health_history(node)[-1]["fault"] == "gpu_temp"
        req = swapper.get_request(api, n, NS)
        assert req["data"]["source"] == "node-health" and "GPU 5: 84, 84, 84 C" in req["data"]["reason"]
        reasons = {e["reason"] for e in events(api, n)}
        assert {"NodeSwapRequested", "NodeDrained"} <= reasons
        # latency: from the third hot sample to the taint
        assert rem.latencies[n] <= 15, rem.latencies
    assert not nodeutil.is_out(get_node(api, deferred))
    ev = events(api, deferred, "RemediationDeferred")
    assert ev and "node_health_max_nodes_out is 2" in ev[0]["message"]
    assert sum(1 for n in list_nodes(api) if nodeutil.is_out(n)) == 2
    assert rem.registry.get_sample_value("gpufleet_node_health_deferred_total", {"fault": "gpu_temp"}) >= 1

    # a slot frees up: the deferred node goes next
    swapper.return_node(api, swapped[0], checks=None)  # a person, checks skipped: not what this test is about
    step_until(rem, "the deferred node swapped", lambda r: actions(r).get(deferred) == "swap", timeout=20)
    rem.wait()
    assert nodeutil.taint(get_node(api, deferred), SWAP_TAINT) is not None
    # the returned node is still hot, but samples from before its return are ignored and the limit is reached
    report = rem.step()
    assert actions(report).get(swapped[0]) in (None, "defer")
    rem.close()


def test_degraded_tier_then_recovery(local_cluster, fleet, clean, tmp_path):
    from gpufleet.ops.nodechecks import NodeChecks

    from ..node_fixtures.conftest import HOSTS, build_fleet

    api = local_cluster.kube
    names, sims, prom = fleet
    rem = remediator(api, prom, degraded_clear_seconds=2)
    n = names[4]
    # Fixture nodes standing in for the kwok node when its node checks run: first a faulty one, then a healthy one.
    failing = NodeChecks(build_fleet(tmp_path / "faulty", {n: HOSTS["gpu-faults"]})[0])
    passing = NodeChecks(build_fleet(tmp_path / "healthy", {n: HOSTS["healthy"]})[0])
    sims[n].set_temperature(1, 92, memory=True)
    step_until(rem, "a degrade decision", lambda r: actions(r).get(n) == "degrade")
    node = get_node(api, n)
    assert nodeutil.taint(node, DEGRADED_TAINT) == {"key": DEGRADED_TAINT, "value": "memory_temp", "effect": "NoSchedule"}
    assert not nodeutil.is_cordoned(node) and nodeutil.taint(node, SWAP_TAINT) is None
    assert events(api, n, "NodeDegraded")
    # the fault clears; without node checks to run, the node waits for a person (invoke node.return runs them)
    sims[n].set_temperature(1, 47, memory=True)
    step_until(rem, "the return held for the node checks", lambda r: events(api, n, "ReturnAwaitsChecks"), timeout=30)
    assert nodeutil.taint(get_node(api, n), DEGRADED_TAINT) is not None
    assert f"invoke node.return {n}" in events(api, n, "ReturnAwaitsChecks")[0]["message"]
    # node checks that fail keep it degraded, naming the failed test ids
    rem.return_checks = failing
    step_until(rem, "the return refused", lambda r: events(api, n, "ReturnRefused"), timeout=30)
    refused = events(api, n, "ReturnRefused")[0]["message"]
    assert f"test_gpu_temperature[{n}-gpu1]" in refused and "node checks failed" in refused
    assert nodeutil.taint(get_node(api, n), DEGRADED_TAINT) is not None
    # checks that pass: after degraded_clear_seconds without the fault the node returns by itself
    rem.return_checks = passing
    step_until(rem, "the degraded node recovered", lambda r: n in r.recovered, timeout=60)
    assert nodeutil.schedulable(get_node(api, n))
    assert any("node checks passed" in e["message"] for e in events(api, n, "NodeReturned"))
    rem.close()


def test_repeated_failures_make_a_lemon_that_only_a_person_returns(local_cluster, fleet, clean):
    api = local_cluster.kube
    names, sims, prom = fleet
    n = names[5]
    now = now_rfc3339()
    history = [{"time": now, "fault": "xid", "action": "swap"}, {"time": now, "fault": "gpu_temp", "action": "swap"}]
    api.patch("v1", "nodes", n, {"metadata": {"annotations": {ANN_HEALTH_HISTORY: json.dumps(history)}}})
    rem = remediator(api, prom)
    sims[n].raise_xid(3, 79)
    report = step_until(rem, "a lemon swap", lambda r: any(d.node == n and d.action == "swap" and d.lemon for d in r.decisions))
    rem.wait()
    node = get_node(api, n)
    assert nodeutil.is_lemon(node) and nodeutil.taint(node, SWAP_TAINT)["value"] == "xid"
    assert events(api, n, "NodeLemon")
    assert len(nodeutil.health_history(node)) == 3
    with pytest.raises(swapper.LemonNode, match="--clear-lemon"):
        swapper.return_node(api, n, checks=None)
    swapper.return_node(api, n, checks=None, clear_lemon=True)
    node = get_node(api, n)
    assert not nodeutil.is_lemon(node) and nodeutil.schedulable(node) and nodeutil.health_history(node) == []
    req = swapper.get_request(api, n, NS)
    assert req["data"]["lemon"] == "cleared" and len(json.loads(req["data"]["history"])) == 3
    assert report.faults[n][0].kind == "xid"
    rem.close()


def test_node_health_command_once_dry_run(local_cluster, fleet, clean, tmp_path):
    import subprocess
    import sys

    from gpufleet.paths import REPO_ROOT

    from .helpers import config_file

    api = local_cluster.kube
    names, sims, prom = fleet
    sims[names[2]].raise_xid(0, 48)
    config = config_file(tmp_path / "node-health.yaml", "node-health")  # as the node_health role renders it
    cmd = [sys.executable, "-m", "gpufleet.cli", "node-health", "--config", str(config), "--kubeconfig",
           str(local_cluster.kubeconfig), "--prometheus-url", prom.url, "--scrape-interval", "1", "--once", "--dry-run",
           "--metrics-port", "0"]

    def once():
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    out = wait("the XID seen by the command", lambda: (o := once()) and names[2] in o["faults"] and o, timeout=30, interval=1)
    assert out["dry_run"] is True
    assert {"node": names[2], "action": "swap", "why": "swap", "lemon": False} in out["decisions"]
    assert "fatal XID 48" in out["faults"][names[2]][0]
    assert not nodeutil.is_out(get_node(api, names[2]))
    r = subprocess.run(cmd[:5] + [str(tmp_path / "nope.yaml")] + cmd[6:], cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and f"--config {tmp_path / 'nope.yaml'}: cannot read it" in r.stderr


def test_a_node_whose_gpu_allocatable_fell_is_degraded_and_one_whose_handle_fails_is_swapped(local_cluster, fleet, clean):
    """The classifier's degraded node (allocatable below capacity: out for gangs, in for inference) goes to the
    degraded tier; a GPU answering NVML with errors (not lost) is a missing GPU: the node is swapped."""
    api = local_cluster.kube
    names, sims, prom = fleet
    partial, erroring = names[0], names[1]

    # XIDs earlier tests raised stay in the default 600 s window: look at the last 5 s only.
    rem = remediator(api, prom, degraded_faults=frozenset({"gpu_partial"}), max_nodes_out=4,
                     rules=RULES.model_copy(update={"event_window_seconds": 5}))
    api.patch("v1", "nodes", partial, {"status": {"allocatable": {"nvidia.com/gpu": "7"}}}, subresource="status")
    sims[erroring].fail_gpu_handle(4, "unknown")
    try:
        taken: dict[str, str] = {}

        def acted(r) -> bool:
            taken.update({d.node: d.action for d in r.decisions if d.action != "skip"})
            return taken.get(partial) == "degrade" and taken.get(erroring) == "swap"

        report = step_until(rem, "both nodes acted on", acted)
        assert [f.kind for f in report.faults[partial]] == ["gpu_partial"]
        assert "nvidia.com/gpu allocatable 7 < capacity 8" in report.faults[partial][0].detail
        assert [f.kind for f in report.faults[erroring]] == ["gpu_missing"]
        assert "GPU 4 (00000000:9A:00.0) answers NVML with errors" in report.faults[erroring][0].detail
        rem.wait(60)
        assert nodeutil.taint(get_node(api, partial), DEGRADED_TAINT)["value"] == "gpu_partial"
        assert nodeutil.taint(get_node(api, erroring), SWAP_TAINT) is not None
    finally:
        rem.close()
        sims[erroring].desc["gpus"][4].pop("handle_error", None)
        api.patch("v1", "nodes", partial, {"status": {"allocatable": {"nvidia.com/gpu": "8"}}}, subresource="status")
