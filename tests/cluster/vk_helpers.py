"""Helpers shared by the virtual-kubelet, taint and flip cluster tests (not a test module)."""

from __future__ import annotations

import http.client
import os
import ssl
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from gpufleet.kube import Kube, KubeError, NotFound
from gpufleet.names import FREE_GPUS_EFFECT, FREE_GPUS_TAINT, RESERVED_TAINT
from gpufleet.taint_controller.signal import ApiServerSignal
from gpufleet.virtual_kubelet.main import VirtualKubelet
from gpufleet_workshop.rental.provider import SimulatedProvider

from .helpers import busy_nodes

H100 = "NVIDIA-H100-80GB-HBM3"
#: The label that marks the nodes a flip test may use (its Deployments and trainers select it).
MARK = ("gpufleet.io/surge-test", "yes")
#: The flip tests' training PriorityClass (preemptionPolicy Never: the flip-out, not the scheduler, makes room).
TRAINING_CLASS = "surge-test-training"
#: The flip tests' replacements' PriorityClass, above :data:`TRAINING_CLASS` as the taint_controller role puts
#: :data:`gpufleet.names.SURGE_PRIORITY_CLASS` above training's (a name of its own: a PriorityClass's value is
#: immutable, and ``sim.flip`` applies the role's, valued from the inventory, on the same cluster).
SURGE_CLASS = "surge-test-surge"


def simulated_provider(pool: str, node: str) -> SimulatedProvider:
    """A started simulated rental of 8 H100s at 2.85 per GPU-hour, serving the virtual node ``node``."""
    return SimulatedProvider(pool, gpus=8, gpu_product=H100, price_per_gpu_hour=2.85, node_name=node).start()


def start_virtual_kubelet(kube: Kube, pool: str, provider: Any, kind: str = "simulated", **options: Any) -> VirtualKubelet:
    """A started virtual kubelet of ``pool`` on its own client (as its own process has), resyncing every 2 s.

    Args:
        kube: the cluster (its config is used for a new client).
        pool: the pool (the node is ``vk-<pool>``).
        provider: the pool's provider.
        kind: the provider kind (``simulated``, ``kubernetes``).
        options: more :class:`~gpufleet.virtual_kubelet.main.VirtualKubelet` keywords (``lease_seconds``, ``endpoint_health``).
    """
    options.setdefault("resync_seconds", 2.0)
    return VirtualKubelet(Kube(kube.config), pool, kind, {pool: provider}, **options).start()


def close_virtual_kubelet(kube: Kube, vk: VirtualKubelet, ns: str, node: str) -> None:
    """After a test: ``vk`` closed, the test's namespace ``ns`` deleted (not waited for) and the virtual ``node`` gone."""
    vk.close()
    delete_namespace(kube, ns)
    try:
        kube.delete("v1", "nodes", node)
    except NotFound:
        pass


def namespace(kube: Kube, prefix: str) -> str:
    """Create a fresh namespace ``<prefix>-<random>`` and return its name."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    return ns


def delete_namespace(kube: Kube, ns: str) -> None:
    """Delete a namespace, not waiting (best effort)."""
    try:
        kube.delete("v1", "namespaces", ns)
    except (NotFound, KubeError):
        pass


def deployment(name: str, ns: str, replicas: int, *, node_selector: dict | None = None, prefer_virtual: bool = False,
               gpus: int = 1, labels: dict | None = None) -> dict:
    """A Deployment of 1-GPU pods that tolerate the virtual-kubelet provider taint and the GPU taint."""
    sel = {"app": name}
    spec: dict[str, Any] = {
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "server", "image": "registry.invalid/inference:1",
                        "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"},
                                      "limits": {"nvidia.com/gpu": str(gpus)}}}],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if prefer_virtual:
        spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "preference": {"matchExpressions": [{"key": "type", "operator": "In",
                                                                "values": ["virtual-kubelet"]}]}}]}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": sel},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                     "template": {"metadata": {"labels": {**sel, **(labels or {})}}, "spec": spec}}}


def pods(kube: Kube, ns: str, selector: str | None = None) -> list[dict]:
    """Pods of ``ns`` (optionally by label selector)."""
    return kube.list("v1", "pods", ns, labelSelector=selector)["items"]


def ready(pod: dict) -> bool:
    """Whether the pod is Ready and not terminating."""
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def keep() -> bool:
    """Whether to leave clusters running after the session (GPUFLEET_KEEP_CLUSTER=1)."""
    return os.environ.get("GPUFLEET_KEEP_CLUSTER") == "1"


def flip_classes(kube: Kube) -> None:
    """Create :data:`TRAINING_CLASS` and :data:`SURGE_CLASS` (one above it, ``Never``) when absent (they are left
    for the session's other tests)."""
    for name, value in ((TRAINING_CLASS, 1000000), (SURGE_CLASS, 1000001)):
        try:
            kube.get("scheduling.k8s.io/v1", "priorityclasses", name)
        except NotFound:
            kube.create("scheduling.k8s.io/v1", "priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "preemptionPolicy": "Never"})


def free_nodes(kube: Kube, count: int) -> list[str]:
    """The first ``count`` simulated GPU nodes that run no pod (by name); fails the test when fewer are free."""
    free = sorted({n["metadata"]["name"] for n in kube.list("v1", "nodes", labelSelector="gpufleet.io/simulated=true")
                   ["items"]} - busy_nodes(kube))
    if len(free) < count:
        pytest.fail(f"{count} free simulated GPU nodes needed, {len(free)} free: {free}")
    return free[:count]


def mark(kube: Kube, node: str) -> None:
    """Label ``node`` with :data:`MARK`."""
    kube.patch("v1", "nodes", node, {"metadata": {"labels": {MARK[0]: MARK[1]}}})


def release(kube: Kube, node: str) -> None:
    """Undo a flip test on ``node``: :data:`MARK` off, the flip-out's reservation taint off, uncordoned."""
    kube.patch("v1", "nodes", node, {"metadata": {"labels": {MARK[0]: None}}})
    live = kube.get("v1", "nodes", node)
    taints = [t for t in live["spec"].get("taints") or [] if t.get("key") != RESERVED_TAINT]
    kube.patch("v1", "nodes", node, {"spec": {"taints": taints or None, "unschedulable": None}})


def free_gpus_taint(kube: Kube, node: str, *, on: bool) -> None:
    """Add or remove the taint controller's free-GPU taint on ``node`` (other taints stay)."""
    taints = [t for t in kube.get("v1", "nodes", node)["spec"].get("taints") or [] if t.get("key") != FREE_GPUS_TAINT]
    if on:
        taints.append({"key": FREE_GPUS_TAINT, "value": "true", "effect": FREE_GPUS_EFFECT})
    kube.patch("v1", "nodes", node, {"spec": {"taints": taints}})


@dataclass
class FlipStage:
    """What a flip test with a real outside works on: its namespace, its marked in-cluster nodes, the flip's
    caches (on real watches) and the virtual kubelet of the simulated rental."""

    ns: str
    nodes: list[str]
    caches: ApiServerSignal
    vk: VirtualKubelet


@contextmanager
def flip_stage(kube: Kube, pool: str, prefix: str, nodes: int = 1, **provider: Any) -> Iterator[FlipStage]:
    """``nodes`` free kwok nodes marked, the flip's PriorityClasses, a namespace ``<prefix>-<random>``, the
    flip-out's caches, and a virtual kubelet (pool ``pool``, marked, closed by the free-GPU taint) on a
    simulated rental of 32 H100s at 2.85 per GPU-hour with ``provider``'s settings over those
    (``start_latency_seconds``, ``failure_rate``, ``gpus``); everything undone after."""
    chosen = free_nodes(kube, nodes)
    for node in chosen:
        mark(kube, node)
    flip_classes(kube)
    prov = SimulatedProvider(pool, **{"gpus": 32, "gpu_product": H100, "price_per_gpu_hour": 2.85,
                                      "node_name": f"vk-{pool}", **provider}).start()
    vk = start_virtual_kubelet(kube, pool, prov)
    mark(kube, vk.node_name)
    free_gpus_taint(kube, vk.node_name, on=True)
    ns = namespace(kube, prefix)
    caches = ApiServerSignal(kube).start()
    try:
        yield FlipStage(ns, chosen, caches, vk)
    finally:
        caches.stop()
        close_virtual_kubelet(kube, vk, ns, vk.node_name)
        for node in chosen:
            release(kube, node)


def direct_status(ip: str, port: int, path: str, token: str | None = None) -> int:
    """The status a kubelet API at ``ip:port`` answers ``GET path`` with (a bearer ``token`` or no credentials)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the node's self-signed certificate, as a client without its CA
    conn = http.client.HTTPSConnection(ip, port, context=ctx, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        return conn.getresponse().status
    finally:
        conn.close()


def service_account_token(kube: Kube, ns: str, account: str) -> str:
    """A bound token of ServiceAccount ``ns/account`` (TokenRequest, ten minutes)."""
    path = f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token"
    review = kube.request("POST", path, body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                              "spec": {"expirationSeconds": 600}})
    return review["status"]["token"]
