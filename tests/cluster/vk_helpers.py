"""Helpers shared by the virtual-kubelet, taint and flip cluster tests (not a test module)."""

from __future__ import annotations

import os
import uuid
from typing import Any

from gpufleet.kube import Kube, KubeError, NotFound
from gpufleet.virtual_kubelet.main import VirtualKubelet
from gpufleet_workshop.rental.provider import SimulatedProvider

H100 = "NVIDIA-H100-80GB-HBM3"


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
