"""``invoke status`` on the local cluster: GPUs by holder, nodes out, virtual nodes, quota vs capacity."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from gpufleet.kube.retry import update_with_retry
from gpufleet.ops.reads import list_nodes
from gpufleet_workshop.tasks import fleet_status as st
from gpufleet.names import DEGRADED_TAINT, FREE_GPUS_TAINT, SWAP_TAINT
from gpufleet.paths import REPO_ROOT

from .helpers import wait

pytestmark = pytest.mark.cluster


@pytest.fixture
def scene(local_cluster, local_queues):
    """Two nodes out (swap, degraded), a virtual node with the free-GPUs taint, training and inference pods."""
    api = local_cluster.kube
    from gpufleet.fleet import nodes as nodeutil

    sim = list_nodes(api, "gpufleet.io/simulated=true")
    left_out = {nodeutil.name(n): nodeutil.out_reasons(n) for n in sim if nodeutil.out_reasons(n)}
    assert len(sim) == 16 and not left_out, f"the local cluster should have 16 schedulable nodes; out: {left_out}"
    names = sorted(nodeutil.name(n) for n in sim)
    swapped, degraded = names[0], names[1]
    taints = {swapped: {"key": SWAP_TAINT, "value": "fan", "effect": "NoSchedule"},
              degraded: {"key": DEGRADED_TAINT, "value": "ib_errors", "effect": "NoSchedule"}}
    for n, t in taints.items():
        update_with_retry(api, f"/api/v1/nodes/{n}", lambda o, t=t: {"spec": {"taints": (o["spec"].get("taints") or []) + [t]}})
    vnode = f"vk-rental-{uuid.uuid4().hex[:4]}"
    api.create("v1", "nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": vnode, "labels": {"type": "virtual-kubelet", "gpufleet.io/pool": "rental"}},
        "spec": {"taints": [{"key": FREE_GPUS_TAINT, "effect": "NoSchedule"},
                            {"key": "virtual-kubelet.io/provider", "value": "gpufleet", "effect": "NoSchedule"}]}})
    api.patch("v1", "nodes", vnode, {"status": {"capacity": {"nvidia.com/gpu": "64", "pods": "110"},
                                                "allocatable": {"nvidia.com/gpu": "64", "pods": "110"}}},
              subresource="status")
    ns = f"status-{uuid.uuid4().hex[:6]}"
    api.create("v1", "namespaces", {"metadata": {"name": ns}})
    tol = [{"operator": "Exists"}]

    def pod(name, gpus, pc, labels=None, node=None):
        spec = {"priorityClassName": pc, "tolerations": tol,
                "containers": [{"name": "c", "image": "registry.invalid/x:1",
                                "resources": {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}}]}
        if node:
            spec["nodeName"] = node
        else:  # keep off the nodes that are out
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": names[4:]}]}]}}}
        api.create("v1", "pods", {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}, ns)

    pod("trainer", 8, "gpufleet-training", {"kueue.x-k8s.io/queue-name": "research"})  # admitted by Kueue: not subtracted
    pod("chat-0", 1, "gpufleet-inference", {"gpufleet.io/workload": "inference"})
    pod("chat-1", 1, "gpufleet-inference", {"gpufleet.io/workload": "inference"})
    pod("chat-out", 2, "gpufleet-inference", {"gpufleet.io/workload": "inference"}, node=vnode)
    wait("in-cluster pods running", lambda: {p["metadata"]["name"] for p in api.list("v1", "pods", ns)["items"]
                                             if p["status"].get("phase") == "Running"} >= {"trainer", "chat-0", "chat-1"})
    yield {"swapped": swapped, "degraded": degraded, "vnode": vnode, "ns": ns}
    api.delete("v1", "namespaces", ns, grace_seconds=0)
    api.delete("v1", "nodes", vnode)
    for n in taints:
        update_with_retry(api, f"/api/v1/nodes/{n}", lambda o: {"spec": {"taints": [
            t for t in o["spec"].get("taints") or [] if t["key"] not in (SWAP_TAINT, DEGRADED_TAINT)] or None}})


def test_status_figures(local_cluster, local_queues, scene):
    fleet = st.gather(local_cluster.kube, local_queues)
    assert fleet.gpus_total == 128 and fleet.nodes_total == 16
    assert fleet.gpus_schedulable == 112
    assert (fleet.training, fleet.inference_in_cluster, fleet.inference_outside) == (8, 2, 2)
    assert fleet.free == 112 - 10 - fleet.other
    out = {s.name: s.reasons for s in fleet.nodes_out}
    assert out[scene["swapped"]] == ("swap: fan",) and out[scene["degraded"]] == ("degraded: ib_errors",)
    v = next(r for r in fleet.virtual_nodes if r.name == scene["vnode"])
    assert v.pool == "rental" and v.free_gpus_taint and v.gpus == 64 and v.used == 2
    rows = {(r.cluster_queue, r.flavor): r for r in fleet.queues}
    assert rows[("training", "h100-sxm-80gb")].share_of_real == 84 and rows[("research", "h100-sxm-80gb")].share_of_real == 28


def test_status_task_renders_and_rejects_bad_input(local_cluster, local_queues, scene):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "invoke", "status", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})

    r = run("--env", "local", "--kubeconfig", str(local_cluster.kubeconfig))
    assert r.returncode == 0, r.stderr
    for text in ("GPUs — env local", "inference (outside)", "ClusterQueue quota vs real capacity", scene["swapped"],
                 "swap: fan", scene["vnode"], "tainted: inference stays in"):
        assert text in r.stdout, text
    r = run("--env", "nope", "--kubeconfig", str(local_cluster.kubeconfig))
    assert r.returncode == 2 and "known: local" in r.stderr
