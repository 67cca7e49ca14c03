"""``invoke up --env local``: every gpufleet component runs from gpufleet's image on the real node.

The stack is the engine's ``pulumi up`` with the stack config the task
computes (:func:`gpufleet_workshop.sim.incluster.stack_config`; the ``other`` pool's
cluster started by :func:`gpufleet_workshop.sim.incluster.pool_clusters`). The
provider waits for each Deployment and DaemonSet, so a finished ``up`` means
they are Available; the tests then check where the pods run, who holds each
Lease, that the kubelet serves every controller's log with no 403 in it, and
that the exporter on the real node serves the fixture node's GPUs.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpufleet_admin.build import pulumi as tools
from gpufleet.kube import Kube
from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.local import workshop_image
from gpufleet_workshop.sim import incluster
from gpufleet_admin.stack import engine
from gpufleet.wait import poll_until
from roles.registry import load

from .vk_helpers import direct_status, service_account_token

pytestmark = pytest.mark.cluster

#: Deployment -> the Lease its active replica holds (one replica leads; virtual kubelets run one replica).
LEASES = {("gpufleet-system", "taint-controller"): "gpufleet-taint-controller",
          ("gpufleet-system", "quota-sync"): "gpufleet-quota-sync",
          ("gpufleet-system", "node-health"): "gpufleet-node-health"}


@dataclasses.dataclass
class Stack:
    kube: Kube
    node: str
    deployments: list[tuple[str, str]]
    up_seconds: float


@pytest.fixture(scope="module")
def stack(local_cluster, other_cluster, tmp_path_factory) -> Iterator[Stack]:
    """``pulumi up`` of the local stack as ``invoke up --env local`` runs it; destroyed at module end."""
    tools.ensure_all(progress=print)
    inv = load("local")
    other = other_cluster.name  # the session's, shared (conftest.other_cluster)
    root: Path = tmp_path_factory.mktemp("pulumi")
    config = incluster.stack_config(local_cluster.cluster)
    target = engine.Target(env="local", kubeconfig=local_cluster.kubeconfig, work_dir=root / "project",
                           backend=root / "backend", config=config, refresh=True)
    target.work_dir.mkdir()
    try:
        incluster.pool_clusters(local_cluster.kube, inv, inv.role("virtual_kubelet").virtual_kubelet_pools,
                                names={"other": other})
        started = time.monotonic()
        engine.up(target, printer=print)
        objs = load("local", overrides=incluster.overrides(config))
        from gpufleet_admin.stack.render import render

        # gpufleet's pods: its image, or its workshop image (the simulated rental's virtual kubelet).
        images = (inv.fleet.gpufleet_image, workshop_image.reference())
        deps = [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in render(objs).objects
                if o["kind"] == "Deployment" and o["spec"]["template"]["spec"]["containers"][0]["image"] in images]
        yield Stack(local_cluster.kube, realnode.node_name(local_cluster.name), deps, time.monotonic() - started)
    finally:
        engine.destroy(target, printer=print, remove=True)
        incluster.orphan_virtual_nodes(local_cluster.kube, inv)  # the virtual kubelets' own Nodes


def test_every_gpufleet_deployment_is_available_on_the_real_node(stack):
    assert {n for _, n in stack.deployments} >= {"taint-controller", "quota-sync", "node-health", "vk-other",
                                                 "vk-rental"}
    for ns, name in stack.deployments:
        assert incluster.available(stack.kube, ns, name), f"{ns}/{name}: {incluster.pod_states(stack.kube, ns, name)}"
        live = [p for p in incluster.pods(stack.kube, ns, name) if not p["metadata"].get("deletionTimestamp")]
        assert live and {p["spec"]["nodeName"] for p in live} == {stack.node}, f"{ns}/{name}"
    print(f"pulumi up with every component Available: {stack.up_seconds:.0f}s")


def test_two_replicas_one_holding_the_lease(stack):
    for (ns, name), lease in LEASES.items():
        names = [p["metadata"]["name"] for p in incluster.pods(stack.kube, ns, name)]
        assert len(names) == 2, f"{name}: {names}"
        holder = lambda: ((stack.kube.get_or_none("coordination.k8s.io/v1", "leases", lease, ns) or {})  # noqa: E731
                          .get("spec") or {}).get("holderIdentity") or ""
        poll_until(lambda: sum(n in holder() for n in names) == 1, what=f"Lease {ns}/{lease} held by one of {names}",
                   timeout=60, interval=1, detail=lambda: f"held by {holder()!r}")


def test_every_controller_logs_through_the_kubelet_without_403(stack):
    time.sleep(10)  # a few loops of every controller
    for ns, name in stack.deployments:
        logs = incluster.logs(stack.kube, ns, name)
        assert logs, f"{ns}/{name}: no pods"
        if ns == "gpufleet-system":  # the controllers log their start and Lease; a standby may say nothing more
            assert any(text.strip() for text in logs.values()), f"{ns}/{name}: no log at all"
        for pod, text in logs.items():
            assert " 403" not in text and "Forbidden" not in text, f"{ns}/{pod}:\n{text[-2000:]}"


def test_the_exporter_on_the_real_node_serves_the_fixture_gpus(stack):
    pods = stack.kube.list("v1", "pods", "gpu-metrics", fieldSelector=f"spec.nodeName={stack.node}")["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    ip = pods[0]["status"]["podIP"]
    port = pods[0]["spec"]["containers"][0]["ports"][0]["containerPort"]
    # The host reaches pod IPs on the node's bridge.
    text = urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=10).read().decode()
    assert "gpufleet_gpu_nvml_available 1.0" in text
    assert text.count("gpufleet_gpu_temperature_celsius{") == 8


def test_each_virtual_node_serves_the_kubelet_api_under_its_roles_rights(stack):
    """The node proxy (the API server's client certificate: the role's read of the cluster's client CA) gets the
    resource metrics; asked directly, a ServiceAccount's token is reviewed (the role's TokenReview and
    SubjectAccessReview rights) and refused with the kubelet's 403, no token is 401."""
    nodes = [n for n in stack.kube.list("v1", "nodes", labelSelector="type=virtual-kubelet")["items"]]
    assert {n["metadata"]["name"] for n in nodes} >= {"vk-other", "vk-rental"}
    token = service_account_token(stack.kube, "default", "default")
    for node in nodes:
        name = node["metadata"]["name"]
        port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        assert port == 10250, name
        text = stack.kube.node_proxy_text(name, "metrics/resource")
        # The rental reports its instances, the other cluster's pods come from its metrics-server.
        assert "resource_scrape_error 0.0" in text, f"{name}:\n{text}"
        assert direct_status(ip, port, "/metrics/resource") == 401, name
        assert direct_status(ip, port, "/stats/summary", token) == 403, name
