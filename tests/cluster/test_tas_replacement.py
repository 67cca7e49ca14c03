"""A running gang loses a node to a health taint; Kueue rebuilds it on another node of the same rack.

A hot GPU goes through the real path: the project's exporter over a fake
NVML (the stand-in of :mod:`gpufleet_workshop.sim.fleet`) scraped by a real
Prometheus, the remediation controller (:class:`gpufleet.node_health.remediate.Remediator`)
sends the node to the degraded tier (``gpufleet.io/degraded=gpu_temp:NoSchedule``;
hot GPUs are fit for inference, not training) and evicts the training pod
there. Kueue's topology-aware scheduling (v0.17, feature gates
TASFailedNodeReplacement, TASReplaceNodeOnNodeTaints and
TASReplaceNodeOnPodTermination, all beta and on by default) marks the node
unhealthy once the pod on it has terminated, finds a replacement node in the
gang's rack and pins the Job's new pod there; the other pods keep running
and the Workload is never evicted. Where the rack has no free node,
TASFailedNodeReplacementFailFast (beta, on) evicts the Workload at the first
failed search and Kueue requeues the whole gang, which lands in another rack.
"""

from __future__ import annotations

import time
import uuid

import pytest

from gpufleet.fleet import nodes as nodeutil
from gpufleet.node_health.faults import Rules
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.remediate import Remediator
from gpufleet.kube import NotFound
from gpufleet.kube.events import events_for
from gpufleet.kube.retry import update_with_retry
from gpufleet.names import DEGRADED_TAINT, LEMON_LABEL, REPLACEMENT_LABEL
from gpufleet.ops.reads import get_node
from gpufleet.ops import swap as swapper
from gpufleet.prom.client import PromClient
from gpufleet.prom.server import running_prometheus
from gpufleet_workshop.sim.fleet import scrape_config, start_node
from gpufleet.wait import poll_until

from .helpers import TEAM_NAMESPACE, busy_nodes, delete_job, gpu_nodes_by, wait

pytestmark = pytest.mark.cluster

NS = TEAM_NAMESPACE
RACK = "gpufleet.io/rack"
KUEUE = "kueue.x-k8s.io/v1beta2"
RULES = Rules(hot_samples=3, gpu_temp_celsius=78, memory_temp_celsius=85, scrape_interval_seconds=1)
# The production default tiers: a hot GPU degrades the node (inference only), it is not swapped.
SETTINGS = Configuration(rules=RULES, max_nodes_out=2, namespace="gpufleet-system", degraded_clear_seconds=3600)


@pytest.fixture
def gang(local_cluster, local_queues, train, tmp_path):
    """``start(nodes) -> (job name, pods by name)``: a running gang required in one rack; hot-node tooling; cleanup."""
    api = local_cluster.kube
    state: dict = {"jobs": [], "sims": {}, "prom": None}

    def start(nodes: int):
        name = f"tas-{uuid.uuid4().hex[:5]}"
        state["jobs"].append(name)
        code, _, err = train("submit", "--env", "local", "--template", "job", "--name", name, "--nodes", str(nodes),
                             "--queue", f"{NS}/pretrain", "--topology", "rack", "--topology-mode", "required",
                             "--timeout", "90")
        assert code == 0, err
        return name

    yield start, state
    for sim in state["sims"].values():
        sim.stop()
    for name in state["jobs"]:
        delete_job(api, NS, name)
    for node in state["sims"]:
        restore(api, node)


def restore(api, node: str) -> None:
    """The node back in service with no record of the test's faults (history, lemon, swap request)."""
    def change(obj):
        meta = obj["metadata"]
        return {"spec": {"taints": [t for t in obj["spec"].get("taints") or []
                                    if not t["key"].startswith("gpufleet.io/")] or None, "unschedulable": None},
                "metadata": {"labels": {k: None for k in meta.get("labels", {}) if k in (LEMON_LABEL, REPLACEMENT_LABEL)},
                             "annotations": {k: None for k in meta.get("annotations", {}) if k.startswith("gpufleet.io/")}}}
    update_with_retry(api, f"/api/v1/nodes/{node}", change)
    try:
        api.delete("v1", "configmaps", swapper.request_name(node), SETTINGS.namespace)
    except NotFound:
        pass


def running(api, name: str) -> list[dict]:
    return [p for p in api.list("v1", "pods", NS, labelSelector=f"gpufleet.io/job={name}")["items"]
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def workload(api, name: str) -> dict:
    items = api.list(KUEUE, "workloads", NS)["items"]
    return next(w for w in items if w["metadata"]["ownerReferences"][0]["name"] == name)


def heat(local_cluster, state, node: str, tmp_path) -> float:
    """Make ``node`` hot through its exporter stand-in; step the remediation controller until it is degraded.

    Returns the wall time (time.time()) at which the node carried the degraded taint.
    """
    api = local_cluster.kube
    sim = state["sims"][node] = start_node(node, workdir=tmp_path / node)
    with running_prometheus([scrape_config([sim])]) as prom:
        prom.wait_for_targets_up(1)
        # only this node has an exporter: the others' GPU telemetry is not this test's business
        rem = Remediator(api, PromClient(prom.url), SETTINGS.replace(telemetry_node_selector={"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}))
        try:
            for g in range(8):
                sim.set_temperature(g, 41)
            sim.set_temperature(3, 91)
            def degraded() -> bool:
                if nodeutil.taint(get_node(api, node), DEGRADED_TAINT) is not None:
                    return True
                report = rem.step()
                assert not report.errors, report.errors
                return False

            poll_until(degraded, what=f"{node} degraded", timeout=60, interval=0.5)
            tainted = time.time()
        finally:
            rem.close()
    assert nodeutil.taint(get_node(api, node), DEGRADED_TAINT)["value"] == "gpu_temp"
    return tainted


def test_hot_node_of_a_gang_is_replaced_in_the_same_rack(local_cluster, gang, tmp_path):
    api = local_cluster.kube
    start, state = gang
    assert not busy_nodes(api), f"GPU pods left on {busy_nodes(api)}"
    name = start(3)  # a rack has 4 nodes: one spare
    pods = running(api, name)
    nodes = {p["spec"]["nodeName"] for p in pods}
    rack = {get_node(api, n)["metadata"]["labels"][RACK] for n in nodes}
    assert len(rack) == 1
    (rack,) = rack
    (spare,) = set(gpu_nodes_by(api, RACK)[rack]) - nodes
    hot = sorted(nodes)[0]
    stay = {p["metadata"]["uid"] for p in pods if p["spec"]["nodeName"] != hot}

    tainted = heat(local_cluster, state, hot, tmp_path)
    try:
        back = wait("the gang running again, rebuilt on the spare node", lambda: (ps := running(api, name)) and len(
            ps) == 3 and spare in {p["spec"]["nodeName"] for p in ps} and ps, timeout=120)
    except BaseException:
        print(describe(api, name, [hot, spare]))
        raise
    took = time.time() - tainted
    print(f"health taint to gang running again: {took:.1f} s")

    assert hot not in {p["spec"]["nodeName"] for p in back}
    assert stay <= {p["metadata"]["uid"] for p in back}, "the pods on healthy nodes were not restarted"
    wl = workload(api, name)
    conds = {c["type"]: c for c in wl["status"]["conditions"]}
    assert conds["Admitted"]["status"] == "True"
    assert conds.get("Evicted", {}).get("status") != "True" and not evictions(wl)
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    hosts = assigned_hosts(psa["topologyAssignment"])
    assert spare in hosts and hot not in hosts
    ev = events_for(api, "Node", hot)
    assert any(e["reason"] == "NodeDegraded" and "evicted 1 pod(s)" in e["message"] for e in ev)


def test_without_a_spare_in_the_rack_the_gang_is_requeued_whole(local_cluster, gang, tmp_path):
    api = local_cluster.kube
    start, state = gang
    assert not busy_nodes(api), f"GPU pods left on {busy_nodes(api)}"
    name = start(4)  # the whole rack: no spare
    nodes = {p["spec"]["nodeName"] for p in running(api, name)}
    (rack,) = {get_node(api, n)["metadata"]["labels"][RACK] for n in nodes}
    hot = sorted(nodes)[0]

    heat(local_cluster, state, hot, tmp_path)
    wait("the Workload evicted for the failed node", lambda: evictions(workload(api, name)).get("NodeFailures"),
         timeout=60)
    back = wait("the gang running again in one rack", lambda: (ps := running(api, name)) and len(ps) == 4 and len(
        {get_node(api, p["spec"]["nodeName"])["metadata"]["labels"][RACK] for p in ps}) == 1 and ps, timeout=120)
    assert hot not in {p["spec"]["nodeName"] for p in back}
    (new_rack,) = {get_node(api, p["spec"]["nodeName"])["metadata"]["labels"][RACK] for p in back}
    assert new_rack != rack  # its rack has only 3 healthy nodes left


def describe(api, name: str, nodes: list[str]) -> str:
    """The gang's pods, its Workload's status and the nodes' taints, for a failure message."""
    pods = [(p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName"),
             bool(p["metadata"].get("deletionTimestamp")))
            for p in api.list("v1", "pods", NS, labelSelector=f"gpufleet.io/job={name}")["items"]]
    taints = {n: nodeutil.taints(get_node(api, n)) for n in nodes}
    return f"pods {pods}\nworkload status {workload(api, name).get('status')}\ntaints {taints}"


def evictions(wl: dict) -> dict[str, int]:
    """Kueue's eviction counts of a Workload by reason (``status.schedulingStats.evictions``)."""
    return {e["reason"]: e["count"] for e in (wl["status"].get("schedulingStats") or {}).get("evictions") or []}


def assigned_hosts(ta: dict) -> set[str]:
    """Hostnames of a Kueue v1beta2 TopologyAssignment: the last level's values of every slice."""
    assert ta["levels"][-1] == "kubernetes.io/hostname"
    out: set[str] = set()
    for s in ta["slices"]:
        last = s["valuesPerLevel"][-1]
        if "universal" in last:
            out.add(last["universal"])
        else:
            ind = last["individual"]
            out |= {ind.get("prefix", "") + r + ind.get("suffix", "") for r in ind["roots"]}
    return out
