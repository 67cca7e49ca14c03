"""The local cluster's real node: a kubelet on containerd beside the kwok nodes, nothing pulled, nothing left."""

from __future__ import annotations

import contextlib

import pytest
from gpufleet import names
from gpufleet_admin.build import image as images
from gpufleet_workshop.local import pause
from gpufleet.kube import Kube
from gpufleet_workshop.local import cluster as local
from gpufleet_workshop.local import node as realnode
from gpufleet_admin.versions import pin
from gpufleet.wait import PollTimeout, poll_until

pytestmark = pytest.mark.cluster

NAMESPACE = "default"


def _pod(name: str, node: str, image: str, args: list[str] | None = None, command: list[str] | None = None) -> dict:
    container = {"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                 "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False}}
    if args is not None:
        container["args"] = args
    if command is not None:
        container["command"] = command
    key, value, effect = names.SYSTEM_NODE_TAINT
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"nodeName": node, "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "tolerations": [{"key": key, "value": value, "effect": effect}],
                     "containers": [container]}}


def _wait_phase(k: Kube, name: str, phases: set[str], timeout: float = 120) -> dict:
    last: list = [None]

    def in_phase():
        last[0] = k.get("v1", "pods", name, NAMESPACE)
        return last[0] if last[0].get("status", {}).get("phase") in phases else None

    return poll_until(in_phase, what=f"pod {name} in {sorted(phases)}", timeout=timeout, interval=0.5,
                      detail=lambda: f"status: {(last[0] or {}).get('status')}")


@pytest.fixture(scope="module")
def node(local_cluster) -> dict:
    return local_cluster.kube.get("v1", "nodes", realnode.node_name(local_cluster.name))


def test_real_node_is_a_tainted_system_node_without_gpus(local_cluster, node):
    key, value = names.SYSTEM_NODE_LABEL
    labels, status = node["metadata"]["labels"], node["status"]
    assert labels[key] == value
    assert "gpufleet.io/simulated" not in labels
    taint = names.SYSTEM_NODE_TAINT
    assert any((t["key"], t.get("value"), t["effect"]) == taint for t in node["spec"]["taints"])
    assert "nvidia.com/gpu" not in status["capacity"]
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])
    assert status["nodeInfo"]["kubeletVersion"] == pin("kubernetes")
    assert status["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6")
    internal = [a["address"] for a in status["addresses"] if a["type"] == "InternalIP"]
    assert internal == [realnode.host_ip()] and internal != ["127.0.0.1"]
    st = local.status(local_cluster.name)
    assert st.up and st.real_node is not None and st.real_node.ready


def test_images_are_imported_never_pulled(local_cluster, node):
    npaths = realnode.NodePaths.of(local_cluster.cluster.layout)
    have = realnode.images(npaths)
    built = images.built()
    assert pause.reference() in have
    assert have[built["reference"]] == built["digest"]
    k = local_cluster.kube
    name = "pull-refused"
    k.create("v1", "pods", _pod(name, node["metadata"]["name"], "registry.example.com/nothing/here:1"), NAMESPACE)
    try:
        def pull_refused():
            statuses[:] = k.get("v1", "pods", name, NAMESPACE).get("status", {}).get("containerStatuses") or []
            found = statuses[0].get("state", {}).get("waiting") if statuses else None
            return found if found and found.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

        statuses: list = []
        with contextlib.suppress(PollTimeout):  # the assertion below shows what was there
            poll_until(pull_refused, what=f"pod {name}'s image pull refused", timeout=60, interval=0.5)
        waiting = statuses[0].get("state", {}).get("waiting") if statuses else None
        assert waiting is not None and waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"), statuses
        events = k.list("v1", "events", NAMESPACE, fieldSelector=f"involvedObject.name={name}")["items"]
        assert any("127.0.0.1:1" in (e.get("message") or "") for e in events), [e.get("message") for e in events]
    finally:
        k.delete("v1", "pods", name, NAMESPACE, grace_seconds=0)


def test_gpufleet_image_runs_as_a_pod_and_its_logs_come_through_the_kubelet(local_cluster, node):
    k = local_cluster.kube
    name = "gpufleet-help"
    k.create("v1", "pods", _pod(name, node["metadata"]["name"], images.built()["reference"],
                                args=["exporter", "--help"]), NAMESPACE)
    try:
        pod = _wait_phase(k, name, {"Succeeded", "Failed"})
        logs = k.pod_log(NAMESPACE, name)
        assert pod["status"]["phase"] == "Succeeded", logs
        assert "usage: gpufleet exporter" in logs
    finally:
        k.delete("v1", "pods", name, NAMESPACE, grace_seconds=0)


def test_pods_have_no_default_route_and_resolve_through_loopback(local_cluster, node):
    k = local_cluster.kube
    name = "no-way-out"
    code = ("print(open('/proc/net/route').read()); print(open('/etc/resolv.conf').read()); "
            "import os; print('KUBERNETES_SERVICE_HOST', os.environ.get('KUBERNETES_SERVICE_HOST'))")
    k.create("v1", "pods", _pod(name, node["metadata"]["name"], images.built()["reference"],
                                command=["python3", "-c", code]), NAMESPACE)
    try:
        pod = _wait_phase(k, name, {"Succeeded", "Failed"})
        logs = k.pod_log(NAMESPACE, name)
        assert pod["status"]["phase"] == "Succeeded", logs
        routes = [line.split() for line in logs.splitlines() if line.startswith("eth0")]
        assert routes and not any(r[1] == "00000000" for r in routes), logs  # no default route
        assert "nameserver 127.0.0.1" in logs and "nameserver" not in logs.replace("nameserver 127.0.0.1", "")
        assert pod["status"]["podIP"].startswith("10.244.")
    finally:
        k.delete("v1", "pods", name, NAMESPACE, grace_seconds=0)


