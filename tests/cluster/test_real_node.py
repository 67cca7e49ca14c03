"""The local cluster's real node: a kubelet on containerd beside the kwok nodes, nothing pulled, nothing left."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from gpufleet import names
from gpufleet.build import image as images
from gpufleet.build import pause
from gpufleet.local import cluster as local
from gpufleet.local import node as realnode
from gpufleet.versions import pin

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


def _wait_phase(v1: client.CoreV1Api, name: str, phases: set[str], timeout: float = 120) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while True:
        pod = v1.read_namespaced_pod(name, NAMESPACE)
        if pod.status.phase in phases:
            return pod
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {name} is {pod.status.phase}, not {phases}: {pod.status}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def node(local_cluster) -> client.V1Node:
    v1 = client.CoreV1Api(local_cluster.api_client)
    return v1.read_node(realnode.node_name(local_cluster.name))


def test_real_node_is_a_tainted_system_node_without_gpus(local_cluster, node):
    key, value = names.SYSTEM_NODE_LABEL
    assert node.metadata.labels[key] == value
    assert "gpufleet.io/simulated" not in node.metadata.labels
    taint = names.SYSTEM_NODE_TAINT
    assert any((t.key, t.value, t.effect) == taint for t in node.spec.taints)
    assert "nvidia.com/gpu" not in node.status.capacity
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    assert node.status.node_info.kubelet_version == pin("kubernetes")
    assert node.status.node_info.container_runtime_version.startswith("containerd://1.6")
    internal = [a.address for a in node.status.addresses if a.type == "InternalIP"]
    assert internal == [realnode.host_ip()] and internal != ["127.0.0.1"]
    st = local.status(local_cluster.name)
    assert st.up and st.real_node is not None and st.real_node.ready


def test_images_are_imported_never_pulled(local_cluster, node):
    npaths = realnode.NodePaths.of(local_cluster.cluster.layout)
    have = realnode.images(npaths)
    built = images.built()
    assert pause.reference() in have
    assert have[built["reference"]] == built["digest"]
    v1 = client.CoreV1Api(local_cluster.api_client)
    name = "pull-refused"
    v1.create_namespaced_pod(NAMESPACE, _pod(name, node.metadata.name, "registry.example.com/nothing/here:1"))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            statuses = v1.read_namespaced_pod(name, NAMESPACE).status.container_statuses or []
            waiting = statuses[0].state.waiting if statuses else None
            if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff"):
                break
            time.sleep(0.5)
        assert waiting is not None and waiting.reason in ("ErrImagePull", "ImagePullBackOff"), statuses
        events = v1.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
        assert any("127.0.0.1:1" in (e.message or "") for e in events), [e.message for e in events]
    finally:
        v1.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def test_gpufleet_image_runs_as_a_pod_and_its_logs_come_through_the_kubelet(local_cluster, node):
    v1 = client.CoreV1Api(local_cluster.api_client)
    name = "gpufleet-help"
    v1.create_namespaced_pod(NAMESPACE, _pod(name, node.metadata.name, images.built()["reference"],
                                             args=["exporter", "--help"]))
    try:
        pod = _wait_phase(v1, name, {"Succeeded", "Failed"})
        logs = v1.read_namespaced_pod_log(name, NAMESPACE)
        assert pod.status.phase == "Succeeded", logs
        assert "usage: gpufleet exporter" in logs
    finally:
        v1.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def test_pods_have_no_default_route_and_resolve_through_loopback(local_cluster, node):
    v1 = client.CoreV1Api(local_cluster.api_client)
    name = "no-way-out"
    code = ("print(open('/proc/net/route').read()); print(open('/etc/resolv.conf').read()); "
            "import os; print('KUBERNETES_SERVICE_HOST', os.environ.get('KUBERNETES_SERVICE_HOST'))")
    v1.create_namespaced_pod(NAMESPACE, _pod(name, node.metadata.name, images.built()["reference"],
                                             command=["python3", "-c", code]))
    try:
        pod = _wait_phase(v1, name, {"Succeeded", "Failed"})
        logs = v1.read_namespaced_pod_log(name, NAMESPACE)
        assert pod.status.phase == "Succeeded", logs
        routes = [line.split() for line in logs.splitlines() if line.startswith("eth0")]
        assert routes and not any(r[1] == "00000000" for r in routes), logs  # no default route
        assert "nameserver 127.0.0.1" in logs and "nameserver" not in logs.replace("nameserver 127.0.0.1", "")
        assert pod.status.pod_ip.startswith("10.244.")
    finally:
        v1.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


