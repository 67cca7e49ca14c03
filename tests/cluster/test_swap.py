"""Node swap and return on the local cluster: drain under PodDisruptionBudgets, reports, idempotence, bad input.

A Deployment's pods prefer one node; the swap must move all of them
through the Eviction API while a watcher checks, every 100 ms, that the
ready pods never drop below the PDB's minAvailable. Every node change is
undone at the end of each test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import pytest

from gpufleet.fleet import nodes as nodeutil
from gpufleet.kube import KubeError, NotFound, api_path
from gpufleet.kube.events import events_for
from gpufleet.kube.retry import update_with_retry
from gpufleet.ops.reads import NodeNotFound, get_node, list_nodes
from gpufleet.ops import swap as swapper
from gpufleet.names import (ANN_SWAP_REASON, REPLACEMENT_LABEL, SWAP_NODE_LABEL, SWAP_REQUEST_LABEL, SWAP_STATE_LABEL,
                                SWAP_TAINT)
from gpufleet.paths import REPO_ROOT

from .helpers import wait

pytestmark = pytest.mark.cluster

NS = "gpufleet-system"


@pytest.fixture
def target(local_cluster):
    """A simulated node to swap; restored (taints, cordon, gpufleet labels/annotations) and its swap request removed after."""
    api = local_cluster.kube
    names = sorted(n["metadata"]["name"] for n in list_nodes(api, "gpufleet.io/simulated=true"))
    name = names[3]
    before = get_node(api, name)
    yield name
    keep = lambda d: {k: v for k, v in (d or {}).items() if not k.startswith("gpufleet.io/") or k in ("gpufleet.io/flavor", "gpufleet.io/block", "gpufleet.io/rack", "gpufleet.io/simulated", "gpufleet.io/local-cluster")}  # noqa: E731

    def change(obj):
        labels = {k: None for k in obj["metadata"].get("labels", {}) if k not in keep(obj["metadata"].get("labels"))}
        anns = {k: None for k in obj["metadata"].get("annotations", {}) if k not in keep(obj["metadata"].get("annotations"))}
        return {"spec": {"taints": before["spec"].get("taints"), "unschedulable": before["spec"].get("unschedulable")},
                "metadata": {"labels": labels, "annotations": anns}}

    update_with_retry(api, f"/api/v1/nodes/{name}", change)
    try:
        api.delete("v1", "configmaps", swapper.request_name(name), NS)
    except KubeError:
        pass


@pytest.fixture(scope="module")
def fixture_checks(local_cluster, tmp_path_factory):
    """Node checks on fixture nodes standing in for the local cluster's kwok nodes (which have no host to check).

    The 4th simulated node (``target``) is a healthy fixture node, the 5th one with GPU faults; returns
    ``(NodeChecks, the faulty node's name)``.
    """
    from gpufleet.ops.nodechecks import NodeChecks

    from ..node_fixtures.conftest import HOSTS, build_fleet

    names = sorted(n["metadata"]["name"] for n in list_nodes(local_cluster.kube, "gpufleet.io/simulated=true"))
    inventory, _ = build_fleet(tmp_path_factory.mktemp("swap-fleet"), {names[3]: HOSTS["healthy"],
                                                                        names[4]: HOSTS["gpu-faults"]})
    return NodeChecks(inventory), names[4]


@pytest.fixture
def namespace(local_cluster):
    """A fresh namespace, deleted after."""
    api = local_cluster.kube
    ns = f"swap-{uuid.uuid4().hex[:6]}"
    api.create("v1", "namespaces", {"metadata": {"name": ns}})
    yield ns
    api.delete("v1", "namespaces", ns, grace_seconds=0)


def deployment(name: str, replicas: int, node: str) -> dict:
    """Pods that prefer ``node`` (so they start there and can move elsewhere when it is cordoned)."""
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "terminationGracePeriodSeconds": 0,
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                         "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                             "weight": 100, "preference": {"matchExpressions": [
                                 {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}}]}},
                         "containers": [{"name": "c", "image": "registry.invalid/serve:1",
                                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}}


def ready_pods(api, ns: str, app: str) -> list:
    def ready(p) -> bool:
        return not p["metadata"].get("deletionTimestamp") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in (p["status"].get("conditions") or []))
    return [p for p in api.list("v1", "pods", ns, labelSelector=f"app={app}")["items"] if ready(p)]


def on_node(pods: list, node: str) -> list:
    return [p for p in pods if p["spec"].get("nodeName") == node]


def start_app(api, ns: str, node: str, replicas: int, min_available: int, name: str = "app") -> None:
    api.create("apps/v1", "deployments", deployment(name, replicas, node), ns)
    api.create("policy/v1", "poddisruptionbudgets", {"metadata": {"name": name}, "spec": {
        "minAvailable": min_available, "selector": {"matchLabels": {"app": name}}}}, ns)
    wait(f"{replicas} pods ready on {node}", lambda: len(on_node(ready_pods(api, ns, name), node)) == replicas,
         timeout=90)
    wait("the PDB observed", lambda: (api.get("policy/v1", "poddisruptionbudgets", name, ns).get("status") or {})
         .get("currentHealthy", 0) == replicas)


class ReadyWatcher(threading.Thread):
    """Samples ready pods every 100 ms; ``minimum`` is the lowest count seen."""

    def __init__(self, api, ns: str, app: str):
        super().__init__(daemon=True)
        self.api, self.ns, self.app = api, ns, app
        self.minimum = 10**9
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.minimum = min(self.minimum, len(ready_pods(self.api, self.ns, self.app)))
            self.stop.wait(0.1)


def test_swap_drains_under_a_pdb_without_breaking_it(local_cluster, target, namespace, fixture_checks):
    api = local_cluster.kube
    start_app(api, namespace, target, replicas=6, min_available=5)

    # dry run: the diff and an eviction check, nothing changes
    check = swapper.swap(api, target, "GPU 5 at 84 C", dry_run=True)
    assert check.dry_run and {c.what for c in check.plan.changes} >= {"spec.unschedulable (cordon)", f"taint {SWAP_TAINT}"}
    assert len(check.drain.evicted) + len(check.drain.blocked) == 6
    assert not nodeutil.is_cordoned(get_node(api, target))
    assert swapper.get_request(api, target, NS) is None

    watcher = ReadyWatcher(api, namespace, "app")
    watcher.start()
    seen = []
    result = swapper.swap(api, target, "GPU 5 at 84 C", timeout=120, progress=seen.append)
    watcher.stop.set()
    watcher.join()
    assert result.drain.complete and len(result.drain.evicted) == 6, result.drain.blocked
    assert watcher.minimum >= 5, f"ready pods fell to {watcher.minimum} (PDB minAvailable 5)"
    assert seen and seen[-1].done == 6 and seen[-1].total == 6
    assert not on_node(api.list("v1", "pods", namespace)["items"], target)
    assert len(ready_pods(api, namespace, "app")) == 6

    node = get_node(api, target)
    assert nodeutil.is_cordoned(node)
    assert nodeutil.taint(node, SWAP_TAINT) == {"key": SWAP_TAINT, "value": "GPU-5-at-84-C", "effect": "NoSchedule"}
    assert nodeutil.labels(node)[REPLACEMENT_LABEL] == "true"
    assert nodeutil.annotations(node)[ANN_SWAP_REASON] == "GPU 5 at 84 C"
    cms = api.list_all(api_path("v1", "configmaps", NS), label_selector=f"{SWAP_REQUEST_LABEL}=true,"
                       f"{SWAP_NODE_LABEL}={target}")[0]
    assert len(cms) == 1
    req = cms[0]
    assert req["metadata"]["labels"][SWAP_STATE_LABEL] == "requested"
    assert req["data"]["node"] == target and req["data"]["reason"] == "GPU 5 at 84 C" and req["data"]["source"] == "manual"
    assert len(json.loads(req["data"]["evicted"])) == 6 and json.loads(req["data"]["blocked"]) == {}
    reasons = [e["reason"] for e in events_for(api, "Node", target)]
    assert "NodeSwapRequested" in reasons and "NodeDrained" in reasons

    # idempotent: nothing left to do is a clear error
    with pytest.raises(swapper.AlreadyOut, match=f"node {target} is already out.*GPU 5 at 84 C.*node.return {target}"):
        swapper.swap(api, target, "again")

    # return: its node checks pass, then taint, label and cordon go; the request is kept as a record
    checks, _ = fixture_checks
    back = swapper.return_node(api, target, checks=checks)
    node = get_node(api, target)
    assert nodeutil.schedulable(node) and REPLACEMENT_LABEL not in nodeutil.labels(node)
    assert any("marked returned" in n for n in back.notes) and back.checks and {r.host for r in back.checks} == {target}
    assert swapper.get_request(api, target, NS)["metadata"]["labels"][SWAP_STATE_LABEL] == "returned"
    with pytest.raises(swapper.NotOut, match=f"node {target} is not out"):
        swapper.return_node(api, target, checks=checks)


def test_pods_that_cannot_leave_are_reported_never_deleted(local_cluster, target, namespace):
    api = local_cluster.kube
    start_app(api, namespace, target, replicas=2, min_available=2, name="strict")  # the PDB allows no disruption
    api.create("v1", "pods", {"metadata": {"name": "bare"}, "spec": {
        "nodeName": target, "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "c", "image": "registry.invalid/x:1"}]}}, namespace)
    wait("the bare pod running", lambda: api.get("v1", "pods", "bare", namespace)["status"].get("phase") == "Running")

    result = swapper.swap(api, target, "fan failure", timeout=6)
    assert result.state == "drain-incomplete" and result.drain.timed_out
    blocked = {p.name: why for p, why in result.drain.blocked.items()}
    assert "unmanaged" in blocked["bare"]
    strict = [why for n, why in blocked.items() if n.startswith("strict-")]
    assert len(strict) == 2 and all("PodDisruptionBudget strict has minAvailable 2 for 2 pods" in w for w in strict)
    assert {p.name for p in result.drain.permanent} == {"bare"} | {n for n in blocked if n.startswith("strict-")}
    # nothing was deleted
    assert len(on_node(api.list("v1", "pods", namespace)["items"], target)) == 3
    req = swapper.get_request(api, target, NS)
    assert req["data"]["state"] == "drain-incomplete" and f"{namespace}/bare" in json.loads(req["data"]["blocked"])
    assert "NodeDrainIncomplete" in [e["reason"] for e in events_for(api, "Node", target)]

    # re-running resumes the drain (the node is out but not drained); the PDB still blocks
    again = swapper.swap(api, target, "fan failure", timeout=2)
    assert again.plan.resume and not again.drain.complete


def test_unknown_node_lists_near_matches(local_cluster):
    api = local_cluster.kube
    names = sorted(n["metadata"]["name"] for n in list_nodes(api, "gpufleet.io/simulated=true"))
    typo = names[0][:-1]  # e.g. gpu-rack-a-000
    with pytest.raises(NodeNotFound) as err:
        swapper.swap(api, typo, "x", dry_run=True)
    assert f"node {typo!r} not found; near matches: " in str(err.value) and names[0] in str(err.value)


def test_tasks_exit_codes(local_cluster, target, fixture_checks):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "invoke", *args, "--kubeconfig", str(local_cluster.kubeconfig)],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)

    r = run("node.swap", "no-such-node", "--reason", "x", "--yes")
    assert r.returncode == 2 and "node 'no-such-node' not found" in r.stderr
    r = run("node.swap", target, "--reason", "test", "--dry-run")
    assert r.returncode == 0 and "dry run: nothing changed" in r.stdout and SWAP_TAINT in r.stdout
    r = run("node.swap", target, "--reason", "")
    assert r.returncode == 2 and "--reason is empty" in r.stderr
    r = run("node.swap", target, "--reason", "disk", "--yes", "--timeout", "30")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("node.swap", target, "--reason", "disk", "--yes")
    assert r.returncode == 0 and "already out" in r.stdout  # idempotent: nothing to do
    inventory = str(fixture_checks[0].inventory)
    r = run("node.return", target, "--inventory", inventory)
    assert r.returncode == 0 and "node checks passed" in r.stdout and "back in service" in r.stdout, r.stdout + r.stderr
    r = run("node.return", target, "--inventory", inventory)
    assert r.returncode == 0 and "is not out" in r.stdout
    # A second swap of a returned node starts a new record: nothing says it has returned.
    r = run("node.swap", target, "--reason", "fan", "--yes", "--timeout", "30")
    assert r.returncode == 0, r.stdout + r.stderr
    api = local_cluster.kube
    assert "gpufleet.io/returned-at" not in get_node(api, target)["metadata"].get("annotations", {})
    request = api.get("v1", "configmaps", swapper.request_name(target), NS)
    assert request["data"]["state"] == "requested" and "returned_at" not in request["data"]
    assert request["data"]["reason"] == "fan"


def invoke(local_cluster, *args):
    """``invoke ARGS --kubeconfig ...`` in a subprocess, wide enough that rich does not wrap the notes."""
    return subprocess.run([sys.executable, "-m", "invoke", *args, "--kubeconfig", str(local_cluster.kubeconfig)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})


def test_empty_or_malformed_node_name_is_bad_input(local_cluster):
    for args in (("node.swap", "", "--reason", "x", "--yes", "--dry-run"), ("node.return", "", "--skip-checks"),
                 ("node.swap", "Bad_Node", "--reason", "x", "--dry-run")):
        r = invoke(local_cluster, *args)
        assert r.returncode == 2 and "expected a node name" in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr


def test_bad_or_missing_namespace_is_refused_before_the_node_changes(local_cluster, target):
    api = local_cluster.kube
    missing = f"swap-missing-{uuid.uuid4().hex[:6]}"
    for ns, why in (("Bad_NS", "expected a namespace name"), (missing, "no such namespace")):
        for extra in ((), ("--dry-run",)):
            r = invoke(local_cluster, "node.swap", target, "--reason", "x", "--yes", "--timeout", "10", "--namespace", ns, *extra)
            assert r.returncode == 2, r.stdout + r.stderr
            assert f"--namespace {ns!r}" in r.stderr and why in r.stderr
        node = get_node(api, target)
        assert not nodeutil.is_cordoned(node) and nodeutil.taint(node, SWAP_TAINT) is None
        assert REPLACEMENT_LABEL not in nodeutil.labels(node)
    with pytest.raises(NotFound):  # not created on demand
        api.get("v1", "namespaces", missing)
    r = invoke(local_cluster, "node.return", target, "--namespace", "Bad_NS", "--skip-checks")
    assert r.returncode == 2 and "--namespace 'Bad_NS'" in r.stderr


def test_return_with_the_wrong_namespace_says_so_and_a_rerun_completes(local_cluster, target, namespace):
    api = local_cluster.kube
    r = invoke(local_cluster, "node.swap", target, "--reason", "psu", "--yes", "--timeout", "30", "--namespace", namespace)
    assert r.returncode == 0, r.stdout + r.stderr
    assert swapper.get_request(api, target, namespace)["data"]["state"] == "requested"

    # a namespace that does not exist: refused, the node stays out
    r = invoke(local_cluster, "node.return", target, "--namespace", f"{namespace}-typo", "--skip-checks")
    assert r.returncode == 2 and "no such namespace" in r.stderr
    assert nodeutil.taint(get_node(api, target), SWAP_TAINT) is not None

    # an existing namespace without the request: the node returns, and the output says where the request is
    r = invoke(local_cluster, "node.return", target, "--namespace", "default", "--skip-checks")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"no swap request default/{swapper.request_name(target)}" in r.stdout
    assert f"{namespace}/{swapper.request_name(target)}" in r.stdout and "back in service" in r.stdout
    assert nodeutil.schedulable(get_node(api, target))
    assert swapper.get_request(api, target, namespace)["data"]["state"] == "requested"

    # the right namespace: the request is marked returned (dry run first: nothing changes)
    r = invoke(local_cluster, "node.return", target, "--namespace", namespace, "--dry-run", "--skip-checks")
    assert r.returncode == 0 and "would be marked returned" in r.stdout
    assert swapper.get_request(api, target, namespace)["data"]["state"] == "requested"
    r = invoke(local_cluster, "node.return", target, "--namespace", namespace, "--skip-checks")
    assert r.returncode == 0 and "marked returned" in r.stdout, r.stdout + r.stderr
    req = swapper.get_request(api, target, namespace)
    assert req["data"]["state"] == "returned" and req["metadata"]["labels"][SWAP_STATE_LABEL] == "returned"
    assert req["data"]["returned_at"]
    r = invoke(local_cluster, "node.return", target, "--namespace", namespace, "--skip-checks")
    assert r.returncode == 0 and "is not out" in r.stdout


def test_the_dry_run_names_budgets_that_never_allow_an_eviction_and_the_drain_backs_off(local_cluster, target, namespace):
    """minAvailable == replicas: said before anything is cordoned; the drain asks ever more rarely, not every second."""
    from gpufleet.ops import drain as drainer

    api = local_cluster.kube
    start_app(api, namespace, target, replicas=2, min_available=2, name="strict")
    check = swapper.swap(api, target, "fan failure", dry_run=True)
    strict = {p for p in check.drain.blocked if p.namespace == namespace}
    assert len(strict) == 2 and strict <= check.drain.permanent
    for p in strict:
        assert check.drain.blocked[p].startswith("PodDisruptionBudget strict has minAvailable 2 for 2 pods: it can never "
                                                 "allow an eviction"), check.drain.blocked[p]
    assert not nodeutil.is_cordoned(get_node(api, target))
    result = drainer.drain(api, target, timeout=8)
    assert result.timed_out and strict <= set(result.blocked) and strict <= result.permanent
    # 1 s polling asked each pod ~9 times in 8 s; backing off (1, 2, 4 s ...) asks it 4 times.
    assert result.evictions_requested <= 2 * 5 + len(result.evicted), result.evictions_requested


def test_return_runs_the_node_checks_first_and_refuses_a_node_that_fails_them(local_cluster, target, fixture_checks):
    """A node whose checks fail stays out (the failed test ids named, exit 1); the dry run says the checks would
    run; --skip-checks returns it with a warning; a node whose checks pass returns."""
    api = local_cluster.kube
    checks, faulty = fixture_checks
    inventory = str(checks.inventory)
    names = [faulty, target]
    try:
        for name in names:
            r = invoke(local_cluster, "node.swap", name, "--reason", "checks", "--yes", "--timeout", "30")
            assert r.returncode == 0, r.stdout + r.stderr

        r = invoke(local_cluster, "node.return", faulty, "--inventory", inventory, "--dry-run")
        assert r.returncode == 0 and "the node checks would run first:" in r.stdout and f"--hosts={faulty}" in r.stdout
        assert nodeutil.taint(get_node(api, faulty), SWAP_TAINT) is not None

        r = invoke(local_cluster, "node.return", faulty, "--inventory", inventory)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"node {faulty}: " in r.stderr and "node checks failed; not returned" in r.stderr
        assert f"test_gpu_temperature[{faulty}-gpu1]" in r.stderr and f"test_gpu_reachable[{faulty}-gpu3]" in r.stderr
        node = get_node(api, faulty)
        assert nodeutil.taint(node, SWAP_TAINT) is not None and nodeutil.is_cordoned(node)  # nothing changed
        assert swapper.get_request(api, faulty, NS)["data"]["state"] == "requested"

        r = invoke(local_cluster, "node.return", faulty, "--skip-checks")
        assert r.returncode == 0 and "warning: returned without running the node checks" in r.stdout, r.stdout + r.stderr
        assert nodeutil.schedulable(get_node(api, faulty))
        assert any(e["reason"] == "NodeReturned" and "node checks skipped" in e["message"]
                   for e in events_for(api, "Node", faulty))

        r = invoke(local_cluster, "node.return", target, "--inventory", inventory)
        assert r.returncode == 0 and "node checks passed" in r.stdout and "back in service" in r.stdout
        assert nodeutil.schedulable(get_node(api, target))
    finally:
        for name in names:
            if not nodeutil.schedulable(get_node(api, name)):
                swapper.return_node(api, name, checks=None)
            try:
                api.delete("v1", "configmaps", swapper.request_name(name), NS)
            except KubeError:
                pass
