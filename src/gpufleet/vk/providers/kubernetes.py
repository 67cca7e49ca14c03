"""The kubernetes provider: run a virtual node's pods in another Kubernetes cluster.

Mapping: source pod ``ns/name`` -> remote pod ``<namespace_prefix><ns>/name``
(one remote namespace per source namespace, created on demand and labelled
``gpufleet.io/managed-by=virtual-kubelet``). The remote pod is the
translated source pod (:mod:`gpufleet.vk.translate`) with the remote side's
own tolerations (default: the GPU node taint ``nvidia.com/gpu``, Exists) and
node selector (default: none), labelled ``gpufleet.io/virtual-node=<node>``
and annotated with the source UID, namespace and name.

State comes from one watch (an :class:`~gpufleet.kube.informer.Informer`) on
the remote pods labelled with this virtual node, in every namespace: no
polling, and status changes reach the notifier at once.

Capacity is the pool's (``capacity_gpus``; CPU and memory per GPU as in the
simulated provider); the remote scheduler still decides where pods run, and
a pod that stays unschedulable remotely stays Pending here too.

Errors: a 4xx from the remote API server (invalid pod, quota, forbidden)
is a non-retryable ``ProviderFailed`` carrying the remote message; 5xx and
network errors are retryable (the pod side retries, then fails the pod).
A remote pod with the same name but another source UID is a leftover of an
earlier pod: it is deleted, and the create is retried.

Deletes are by identity, never by name alone: every remote delete carries
the remote pod's own UID as a precondition (``DeleteOptions.preconditions``),
taken from the remote pod whose source-UID annotation is the source pod's.
With a stale watch cache, a clean-up aimed at an orphan whose name a
replacement now carries gets 409 Conflict from the remote API server and
the replacement keeps serving.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gpufleet.kube import Conflict, Kube, KubeError, NotFound, Unreachable, api_path
from gpufleet.kube.informer import Informer
from gpufleet.kube.retry import retryable
from gpufleet.vk.provider import (
    GPU, SOURCE_NAME, SOURCE_NAMESPACE, SOURCE_UID, VIRTUAL_NODE_LABEL, Capacity, Notifier, Pod, PodNotFound,
    ProviderError, RemotePod, pod_requests,
)
from gpufleet.vk.providers.simulated import CPU_PER_GPU, MEMORY_PER_GPU
from gpufleet.vk.translate import translate

log = logging.getLogger(__name__)

MANAGED_LABEL = ("gpufleet.io/managed-by", "virtual-kubelet")
DEFAULT_TOLERATIONS = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
TERMINAL = ("Succeeded", "Failed")


def _slim(pod: dict) -> dict:
    """What the cache keeps of a remote pod: metadata essentials, containers' names, requests (parsed once), status."""
    meta = pod.get("metadata") or {}
    return {
        "requests": pod_requests(pod),
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "annotations", "labels", "deletionTimestamp")
                     if k in meta},
        "spec": {"containers": [{"name": c.get("name")} for c in (pod.get("spec") or {}).get("containers") or []]},
        "status": pod.get("status") or {},
    }


class KubernetesProvider:
    """Runs pods in another cluster; implements :class:`gpufleet.vk.provider.Provider`.

    Args:
        name: provider (pool) name.
        kube: client of the remote cluster.
        node_name: the virtual node whose pods this provider runs.
        gpus: pool capacity in GPUs; gpu_product / price_per_gpu_hour: the pool's.
        namespace_prefix: remote namespace = prefix + source namespace.
        tolerations / node_selector: set on every remote pod.
        max_pods: pods at most.
    """

    def __init__(self, name: str, kube: Kube, *, node_name: str, gpus: int, gpu_product: str,
                 price_per_gpu_hour: float, namespace_prefix: str = "", tolerations: list[dict] | None = None,
                 node_selector: dict[str, str] | None = None, max_pods: int = 1000,
                 cpu_per_gpu: int = CPU_PER_GPU, memory_per_gpu: int = MEMORY_PER_GPU):
        self.name = name
        self.kube = kube
        self.node_name = node_name
        self.prefix = namespace_prefix
        self.tolerations = DEFAULT_TOLERATIONS if tolerations is None else tolerations
        self.node_selector = node_selector
        self._capacity = Capacity(gpus=gpus, cpu=max(gpus, 1) * cpu_per_gpu, memory_bytes=max(gpus, 1) * memory_per_gpu,
                                  pods=max_pods, gpu_product=gpu_product, price_per_gpu_hour=price_per_gpu_hour)
        self._namespaces: set[str] = set()
        self._ns_lock = threading.Lock()
        self._notifier: Notifier | None = None
        self.pods = Informer(kube, api_path("v1", "pods"), params={"labelSelector": f"{VIRTUAL_NODE_LABEL}={node_name}"},
                             transform=_slim, handlers=[self._on_event], name=f"remote-pods-{name}")

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> "KubernetesProvider":
        """Start watching the remote pods; wait for the first list.

        Raises:
            ProviderError: the remote cluster did not answer within ``timeout`` s.
        """
        self.pods.start()
        if not self.pods.wait_synced(timeout):
            raise ProviderError(f"{self.name}: the remote cluster {self.kube.server} did not list pods "
                                f"within {timeout:.0f}s", reason="ProviderUnavailable", retryable=True)
        return self

    def close(self) -> None:
        """Stop the watch and close connections."""
        self.pods.stop()
        self.kube.close()

    def _on_event(self, kind: str, new: Any, old: Any) -> None:
        if self._notifier is None:
            return
        ann = ((new or old).get("metadata") or {}).get("annotations") or {}
        if ann.get(SOURCE_NAMESPACE) and ann.get(SOURCE_NAME):
            self._notifier(ann[SOURCE_NAMESPACE], ann[SOURCE_NAME])

    def notify_pods(self, callback: Notifier) -> None:
        """Register ``callback(source_namespace, source_name)`` for remote status changes."""
        self._notifier = callback

    # ------------------------------------------------------------------ protocol

    def remote_namespace(self, namespace: str) -> str:
        """The remote namespace for source namespace ``namespace``."""
        return f"{self.prefix}{namespace}"

    def capacity(self) -> Capacity:
        """The pool's capacity (see the module docstring)."""
        return self._capacity

    def used(self) -> dict[str, float]:
        """Requests of the remote pods that are not terminal."""
        used = {GPU: 0.0, "cpu": 0.0, "memory": 0.0, "pods": 0.0}
        for p in self.pods.items():
            if (p.get("status") or {}).get("phase") in TERMINAL:
                continue
            for k, v in p["requests"].items():
                if k in used:
                    used[k] += v
            used["pods"] += 1
        return used

    def _ensure_namespace(self, ns: str) -> None:
        with self._ns_lock:
            if ns in self._namespaces:
                return
        try:
            self.kube.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": ns, "labels": {MANAGED_LABEL[0]: MANAGED_LABEL[1]}}})
        except Conflict:
            pass
        with self._ns_lock:
            self._namespaces.add(ns)

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (NotFound, Conflict):
            raise
        except Unreachable as exc:
            raise ProviderError(f"{self.name}: {what}: the remote cluster is unreachable: {exc.message}",
                                reason="ProviderUnavailable", retryable=True) from None
        except KubeError as exc:
            raise ProviderError(f"{self.name}: {what}: the remote API server answered {exc.status} {exc.reason}: "
                                f"{exc.message}", reason="ProviderFailed", retryable=retryable(exc)) from None

    def create_pod(self, pod: Pod) -> None:
        """Create the remote pod (adopt it if it exists for the same source UID).

        Raises:
            gpufleet.vk.translate.Refused: the pod cannot run remotely.
            ProviderError: out of capacity (retryable), remote refusal, or unreachable.
        """
        meta = pod["metadata"]
        rns = self.remote_namespace(meta["namespace"])
        body = translate(pod, node_name=self.node_name, namespace=rns, tolerations=self.tolerations,
                         node_selector=self.node_selector)
        existing = self.pods.get(f"{rns}/{meta['name']}")
        if existing is not None and (existing["metadata"].get("annotations") or {}).get(SOURCE_UID) == meta["uid"]:
            return
        req, used, cap = pod_requests(pod), self.used(), self._capacity
        if used[GPU] + req.get(GPU, 0) > cap.gpus or used["pods"] + 1 > cap.pods:
            raise ProviderError(f"{self.name}: out of capacity ({used[GPU]:g}/{cap.gpus} GPUs in use, "
                                f"{req.get(GPU, 0):g} asked)", reason="OutOfCapacity", retryable=True)
        self._call("create namespace", self._ensure_namespace, rns)
        try:
            self._call("create pod", self.kube.create, "v1", "pods", body, rns)
        except Conflict:
            live = self._call("read pod", self.kube.get, "v1", "pods", meta["name"], rns)
            if (live["metadata"].get("annotations") or {}).get(SOURCE_UID) == meta["uid"]:
                return
            try:  # exactly the leftover read: not a pod that took its name since
                self.kube.delete("v1", "pods", meta["name"], rns, grace_seconds=0, uid=live["metadata"]["uid"])
            except (NotFound, Conflict):
                pass
            raise ProviderError(f"{self.name}: a leftover remote pod {rns}/{meta['name']} of an earlier source pod "
                                "is being removed", reason="ProviderBusy", retryable=True) from None

    def update_pod(self, pod: Pod) -> None:
        """Copy the source pod's labels to the remote pod (keeping our tag)."""
        meta = pod["metadata"]
        labels = {**(meta.get("labels") or {}), VIRTUAL_NODE_LABEL: self.node_name}
        try:
            self._call("update pod", self.kube.patch, "v1", "pods", meta["name"], {"metadata": {"labels": labels}},
                       self.remote_namespace(meta["namespace"]))
        except NotFound:
            raise PodNotFound(f"{self.name}: no remote pod for {meta['namespace']}/{meta['name']}") from None

    def _remote_of(self, pod: Pod) -> dict | None:
        """The remote pod of source pod ``pod`` (its source-UID annotation matches), cached or live; None if none."""
        meta = pod["metadata"]
        rns = self.remote_namespace(meta["namespace"])
        for candidate in (lambda: self.pods.get(f"{rns}/{meta['name']}"),
                          lambda: self._call("read pod", self.kube.get, "v1", "pods", meta["name"], rns)):
            try:
                remote = candidate()
            except NotFound:
                return None
            if remote is not None and ((remote.get("metadata") or {}).get("annotations") or {}).get(SOURCE_UID) == meta["uid"]:
                return remote
        return None

    def delete_pod(self, pod: Pod) -> None:
        """Delete the remote pod of ``pod`` with the source pod's grace period (no error if gone).

        The remote pod is the one annotated with the source pod's UID (from the
        watch cache, else read live); the delete carries its UID as a
        precondition, so a same-named pod of another source pod, created since
        the cache was filled, is never deleted (409 from the remote API server).
        """
        meta = pod["metadata"]
        if not meta.get("uid"):
            log.warning("%s: not deleting remote pod %s/%s: no source UID to match", self.name, meta.get("namespace"),
                        meta.get("name"))
            return
        remote = self._remote_of(pod)
        if remote is None:
            return
        grace = meta.get("deletionGracePeriodSeconds")
        try:
            self._call("delete pod", self.kube.delete, "v1", "pods", meta["name"],
                       self.remote_namespace(meta["namespace"]), grace_seconds=grace, uid=remote["metadata"]["uid"])
        except NotFound:
            pass
        except Conflict:
            log.info("%s: remote pod %s/%s is another pod now (UID precondition failed): left alone", self.name,
                     self.remote_namespace(meta["namespace"]), meta["name"])

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        """The remote pod (as cached: metadata, containers, status) of source pod ``namespace/name``, or None."""
        return self.pods.get(f"{self.remote_namespace(namespace)}/{name}")

    def get_pod_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The remote pod's status, or None if it is gone."""
        pod = self.get_pod(namespace, name)
        return None if pod is None else pod.get("status") or {}

    def get_pods(self) -> list[RemotePod]:
        """Every remote pod of this virtual node, with its source UID (from the watch cache)."""
        out = []
        for p in self.pods.items():
            meta = p["metadata"]
            ann = meta.get("annotations") or {}
            out.append(RemotePod(ann.get(SOURCE_UID, ""), ann.get(SOURCE_NAMESPACE, ""), ann.get(SOURCE_NAME, meta["name"]),
                                 p.get("status") or {}))
        return out
