"""The kubernetes provider: run a virtual node's pods in another Kubernetes cluster.

Mapping: source pod ``ns/name`` -> remote pod ``<namespace_prefix><ns>/name``
(one remote namespace per source namespace, created on demand and labelled
``gpufleet.io/managed-by=virtual-kubelet``). The remote pod is the
translated source pod (:mod:`gpufleet.virtual_kubelet.translate`) with the remote side's
own tolerations (default: the GPU node taint ``nvidia.com/gpu``, Exists) and
node selector (default: none), labelled ``gpufleet.io/virtual-node=<node>``
and annotated with the source UID, namespace and name.

State comes from one watch (an :class:`~gpufleet.kube.informer.Informer`) on
the remote pods labelled with this virtual node, in every namespace: no
polling, and status changes reach the notifier at once.

Addresses (:meth:`KubernetesProvider.pod_address`, the pool's
``address_mode``): ``pod_ip`` reports the remote pod's IP, for clusters
that share one pod network (routed pod CIDRs, a flat VPC, a cluster mesh);
``load_balancer`` gives each workload (the source pod's Deployment, else
its owner, else the pod) one remote Service of type LoadBalancer named
``gf-<workload>``, selecting its remote pods by the label
``gpufleet.io/remote-service`` and exposing every container port at its own
number, and reports the first IP of its ``status.loadBalancer.ingress``
(None until the remote cloud provisions it; a hostname-only ingress is not
reported: EndpointSlices carry IPs). The Service is created with the
workload's first remote pod and deleted with its last (one that vanished
in between is created again when its address is asked for; deleted only
when it carries this node's label, by its UID); pods of one
workload deleted together may each see the others, so :meth:`sweep` (on
the virtual kubelet's resync) also deletes every such Service of this
virtual node whose workload has no remote pod left (asked of the remote
API, not the cache; a Service whose first pod is being created is left
alone). The remote kubeconfig then also needs get/list/watch/create/delete
on services.

ConfigMaps and Secrets the pods reference (:mod:`gpufleet.virtual_kubelet.reflect`)
are copied into the remote namespace under **per-pool names**:
``gf-<pool>.<name>`` (:func:`copy_name`; hashed down to 253 characters when
longer), labelled ``gpufleet.io/reflected-for=<node>`` and
``gpufleet.io/managed-by=virtual-kubelet`` and annotated with their source
namespace and name. The translated pod's references name the copies
(:func:`gpufleet.virtual_kubelet.translate.rename_references`), so the pod sees the
same keys under the same mount paths and variables. Why names rather than
labels alone: a remote namespace is often shared (several pools with the
same ``namespace_prefix``, or the remote cluster's own objects), and the
source name there may belong to someone else: the remote cluster's
``kube-root-ca.crt`` (kube-controller-manager's root-ca-cert-publisher
keeps one in every namespace), a user's ``settings``, another pool's copy.
With per-pool names two pools never contend for one object and the
remote cluster's own objects are never in the way; labels alone would
leave one name to whichever pool came first and fail the other's pods.

Ownership is checked before every write: a copy is created only where its
name is free (POST, which fails if it exists), and updated only when the
object there carries this node's labels and source annotations, by a
server-side apply carrying the resourceVersion that was checked (an
object replaced in between gives 409 and is checked again). A delete reads
the object, checks it is this node's copy, and carries its UID as a
precondition (``DeleteOptions.preconditions``). An object gpufleet does
not own at a copy's name is never written nor deleted: ``put_object``
raises a non-retryable :class:`~gpufleet.virtual_kubelet.provider.ProviderError` with
reason :data:`~gpufleet.names.FOREIGN_OBJECT_REASON`, which the pod side
turns into a failed pod and a Warning Event naming the object.

``kube-root-ca.crt``: the service-account token volume
(``kube-api-access-*``), which is what normally mounts it, is dropped by
the translation (the remote pod runs without this cluster's credentials),
so it is reflected only when a pod references it by name itself; it is
then treated as any ConfigMap: the pod gets *this* cluster's CA (what it
asked for, the object of its own namespace) as
``gf-<pool>.kube-root-ca.crt``, and the remote cluster's own
``kube-root-ca.crt`` is neither read nor written.

Copies an earlier version made under the source names (labelled
``gpufleet.io/reflected-for=<node>``, named without the ``gf-<pool>.``
prefix) are neither listed nor deleted: such an object may be one that
version wrote over (the remote ``kube-root-ca.crt``), so whoever owns the
namespace decides; they no longer back any remote pod once it is recreated.

The remote kubeconfig then also needs get/list/create/patch/delete on
configmaps and secrets. Errors about a Secret never quote its data
(:func:`gpufleet.virtual_kubelet.provider.redact`).

Usage (:meth:`KubernetesProvider.pod_stats`, for the virtual node's kubelet
API): the remote cluster's resource metrics API, one list of
``metrics.k8s.io/v1beta1`` PodMetrics labelled with this virtual node per
call (its metrics-server's figures: CPU as a rate over a window, memory as
the working set); the rates are summed back into the kubelet's cumulative
counter (:class:`~gpufleet.virtual_kubelet.stats.CpuCounters`). The remote
kubeconfig then also needs list on ``pods.metrics.k8s.io``; a cluster
without the API (no metrics-server) or a refusal is a
:class:`~gpufleet.virtual_kubelet.provider.ProviderError`, which the
kubelet API reports as a scrape error.

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

import hashlib
import logging
import math
import threading
import time
from typing import Any, Literal

from gpufleet.kube import Conflict, Kube, KubeError, NotFound, Unreachable, api_path
from gpufleet.kube.informer import Informer
from gpufleet.kube.retry import retryable
from gpufleet.names import (
    FIELD_MANAGER, FOREIGN_OBJECT_REASON, GPU_RESOURCE, MANAGED_BY_LABEL, REFLECTED_LABEL, REFLECTED_NAME_PREFIX,
)
from gpufleet.virtual_kubelet.provider import (
    REMOTE_SERVICE_LABEL, SOURCE_NAME, Address, SOURCE_NAMESPACE, SOURCE_UID, REMOTE_NODE_LABEL, Capacity, Notifier,
    ObjectRef, Pod, PodNotFound, ProviderError, RemotePod, object_payload, pod_requests, redact, CPU_PER_GPU,
    MEMORY_PER_GPU,
)
from gpufleet.kube.quantity import number
from gpufleet.kube.times import parse_time
from gpufleet.virtual_kubelet.stats import ContainerStats, CpuCounters, PodStats
from gpufleet.virtual_kubelet.translate import translate

log = logging.getLogger(__name__)

#: Longest ConfigMap/Secret name (a DNS-1123 subdomain).
MAX_OBJECT_NAME = 253
DEFAULT_TOLERATIONS = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
TERMINAL = ("Succeeded", "Failed")
#: How the main cluster reaches remote pods (a pool's ``address_mode``; see the module docstring).
ADDRESS_MODES = ("pod_ip", "load_balancer")
AddressMode = Literal["pod_ip", "load_balancer"]
#: Seconds after a remote Service was last needed for a create during which the sweep leaves it alone
#: (its first pod may not exist yet).
SERVICE_SWEEP_GRACE_SECONDS = 15.0
OBJECT_PLURALS = {"ConfigMap": "configmaps", "Secret": "secrets"}
#: Seconds the remote metrics API gets to answer a usage list.
STATS_TIMEOUT_SECONDS = 5.0
#: Lists answered with metadata only (never a Secret's data): PartialObjectMetadataList.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


def workload_name(pod: dict) -> str:
    """The workload a source pod belongs to: its Deployment (ReplicaSet name less ``-<pod-template-hash>``),
    else its controller's name, else the pod's own name."""
    meta = pod.get("metadata") or {}
    owners = meta.get("ownerReferences") or []
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    if owner is None:
        return meta.get("name", "")
    name, suffix = owner.get("name", ""), (meta.get("labels") or {}).get("pod-template-hash")
    if owner.get("kind") == "ReplicaSet" and suffix and name.endswith(f"-{suffix}"):
        return name[: -len(suffix) - 1]
    return name


def remote_service_name(workload: str) -> str:
    """``gf-<workload>`` as a Service name (DNS-1035 label: dots become dashes, at most 63 characters)."""
    name = f"gf-{workload.replace('.', '-')}".rstrip("-")
    if len(name) <= 63:
        return name
    return f"{name[:52].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def copy_name(pool: str, name: str) -> str:
    """The name of pool ``pool``'s remote copy of ConfigMap/Secret ``name``: ``gf-<pool>.<name>`` (module
    docstring), shortened with a hash of the full name to at most 253 characters (a DNS-1123 subdomain)."""
    full = f"{REFLECTED_NAME_PREFIX}{pool}.{name}"
    if len(full) <= MAX_OBJECT_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[:MAX_OBJECT_NAME - 11].rstrip('-.')}-{digest}"


def container_ports(pod: dict) -> list[dict]:
    """``[{"protocol", "containerPort"}]`` of every container of ``pod``, in spec order."""
    return [{"protocol": p.get("protocol", "TCP"), "containerPort": int(p["containerPort"])}
            for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]


def _slim(pod: dict) -> dict:
    """What the cache keeps of a remote pod: metadata essentials, containers' names, requests (parsed once), status."""
    meta = pod.get("metadata") or {}
    return {
        "requests": pod_requests(pod),
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "annotations", "labels", "deletionTimestamp")
                     if k in meta},
        "spec": {"containers": [{"name": c.get("name"), "ports": c.get("ports") or []}
                                for c in (pod.get("spec") or {}).get("containers") or []]},
        "status": pod.get("status") or {},
    }


class KubernetesProvider:
    """Runs pods in another cluster; implements :class:`gpufleet.virtual_kubelet.provider.Provider`.

    Args:
        name: provider (pool) name.
        kube: client of the remote cluster.
        node_name: the virtual node whose pods this provider runs.
        gpus: pool capacity in GPUs; gpu_product / price_per_gpu_hour: the pool's.
        namespace_prefix: remote namespace = prefix + source namespace.
        tolerations / node_selector: set on every remote pod.
        max_pods: pods at most.
        address_mode: ``pod_ip`` or ``load_balancer`` (module docstring).
        counting_since: when the CPU counters rebuilt from the remote rates begin, Unix seconds (default: now;
            :class:`~gpufleet.virtual_kubelet.stats.CpuCounters`).

    Raises:
        ValueError: an unknown ``address_mode``.
    """

    def __init__(self, name: str, kube: Kube, *, node_name: str, gpus: int, gpu_product: str,
                 price_per_gpu_hour: float, namespace_prefix: str = "", tolerations: list[dict] | None = None,
                 node_selector: dict[str, str] | None = None, max_pods: int = 1000,
                 cpu_per_gpu: int = CPU_PER_GPU, memory_per_gpu: int = MEMORY_PER_GPU,
                 address_mode: AddressMode = "pod_ip", counting_since: float | None = None):
        if address_mode not in ADDRESS_MODES:
            raise ValueError(f"provider {name}: address_mode {address_mode!r}: expected one of {', '.join(ADDRESS_MODES)}")
        self.name = name
        self.address_mode = address_mode
        self.kube = kube
        self.node_name = node_name
        self.prefix = namespace_prefix
        self.tolerations = DEFAULT_TOLERATIONS if tolerations is None else tolerations
        self.node_selector = node_selector
        self._capacity = Capacity(gpus=gpus, cpu=max(gpus, 1) * cpu_per_gpu, memory_bytes=max(gpus, 1) * memory_per_gpu,
                                  pods=max_pods, gpu_product=gpu_product, price_per_gpu_hour=price_per_gpu_hour)
        self._namespaces: set[str] = set()
        self._ns_lock = threading.Lock()
        #: remote Service key (namespace/name) -> monotonic time a create last needed it (the sweep spares it).
        self._service_needed: dict[str, float] = {}
        self._notifier: Notifier | None = None
        self._cpu = CpuCounters(origin=counting_since)
        self._bad_usage: set[str] = set()
        self.pods = Informer(kube, api_path("v1", "pods"), params={"labelSelector": f"{REMOTE_NODE_LABEL}={node_name}"},
                             transform=_slim, handlers=[self._on_event], name=f"remote-pods-{name}")
        self.services: Informer[dict] | None = None
        if address_mode == "load_balancer":
            self.services = Informer(kube, api_path("v1", "services"),
                                     params={"labelSelector": f"{REMOTE_NODE_LABEL}={node_name}"},
                                     handlers=[self._on_service], name=f"remote-services-{name}")

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> "KubernetesProvider":
        """Start watching the remote pods; wait for the first list.

        Raises:
            ProviderError: the remote cluster did not answer within ``timeout`` s.
        """
        self.pods.start()
        if self.services is not None:
            self.services.start()
        if not self.pods.wait_synced(timeout) or (self.services is not None and not self.services.wait_synced(timeout)):
            raise ProviderError(f"{self.name}: the remote cluster {self.kube.server} did not list pods "
                                f"within {timeout:.0f}s", reason="ProviderUnavailable", retryable=True)
        return self

    def close(self) -> None:
        """Stop the watch and close connections."""
        self.pods.stop()
        if self.services is not None:
            self.services.stop()
        self.kube.close()

    def _on_event(self, kind: str, new: Any, old: Any) -> None:
        if self._notifier is None:
            return
        ann = ((new or old).get("metadata") or {}).get("annotations") or {}
        if ann.get(SOURCE_NAMESPACE) and ann.get(SOURCE_NAME):
            self._notifier(ann[SOURCE_NAMESPACE], ann[SOURCE_NAME])

    def _on_service(self, kind: str, new: Any, old: Any) -> None:
        """A load balancer's address changed: every remote pod behind it has a new address."""
        if self._notifier is None:
            return
        meta = (new or old).get("metadata") or {}
        for p in self.pods.items():
            pmeta = p["metadata"]
            if (pmeta.get("namespace") == meta.get("namespace")
                    and (pmeta.get("labels") or {}).get(REMOTE_SERVICE_LABEL) == meta.get("name")):
                ann = pmeta.get("annotations") or {}
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
        used = {GPU_RESOURCE: 0.0, "cpu": 0.0, "memory": 0.0, "pods": 0.0}
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
                                                  "metadata": {"name": ns, "labels": {MANAGED_BY_LABEL[0]: MANAGED_BY_LABEL[1]}}})
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
            gpufleet.virtual_kubelet.translate.Refused: the pod cannot run remotely.
            ProviderError: out of capacity (retryable), remote refusal, or unreachable.
        """
        meta = pod["metadata"]
        rns = self.remote_namespace(meta["namespace"])
        body = translate(pod, node_name=self.node_name, namespace=rns, tolerations=self.tolerations,
                         node_selector=self.node_selector, rename=lambda kind, name: copy_name(self.name, name))
        if self.address_mode == "load_balancer":
            body["metadata"]["labels"][REMOTE_SERVICE_LABEL] = remote_service_name(workload_name(pod))
        existing = self.pods.get(f"{rns}/{meta['name']}")
        if existing is not None and (existing["metadata"].get("annotations") or {}).get(SOURCE_UID) == meta["uid"]:
            return
        req, used, cap = pod_requests(pod), self.used(), self._capacity
        if used[GPU_RESOURCE] + req.get(GPU_RESOURCE, 0) > cap.gpus or used["pods"] + 1 > cap.pods:
            raise ProviderError(f"{self.name}: out of capacity ({used[GPU_RESOURCE]:g}/{cap.gpus} GPUs in use, "
                                f"{req.get(GPU_RESOURCE, 0):g} asked)", reason="OutOfCapacity", retryable=True)
        self._call("create namespace", self._ensure_namespace, rns)
        if self.address_mode == "load_balancer":
            svc = body["metadata"]["labels"][REMOTE_SERVICE_LABEL]
            self._service_needed[f"{rns}/{svc}"] = time.monotonic()
            self._ensure_service(rns, svc, container_ports(pod))
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

    def _ensure_service(self, rns: str, name: str, ports: list[dict]) -> None:
        """Create the workload's remote LoadBalancer Service ``rns/name`` unless it exists (module docstring)."""
        if not ports or (self.services is not None and self.services.get(f"{rns}/{name}") is not None):
            return  # no port: nothing to reach (a Service needs one)
        body = {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": rns, "labels": {REMOTE_NODE_LABEL: self.node_name,
                                                                       MANAGED_BY_LABEL[0]: MANAGED_BY_LABEL[1]}},
                "spec": {"type": "LoadBalancer",
                         "selector": {REMOTE_SERVICE_LABEL: name, REMOTE_NODE_LABEL: self.node_name},
                         "ports": [{"name": f"{p['protocol'].lower()}-{p['containerPort']}", "protocol": p["protocol"],
                                    "port": p["containerPort"], "targetPort": p["containerPort"]} for p in ports]}}
        try:
            self._call("create service", self.kube.create, "v1", "services", body, rns)
        except Conflict:
            pass

    def pod_address(self, namespace: str, name: str) -> Address | None:
        """Where the main cluster reaches the remote pod (module docstring: ``address_mode``), or None."""
        remote = self.get_pod(namespace, name)
        if remote is None or (remote.get("status") or {}).get("phase") in TERMINAL:
            return None
        if self.address_mode == "pod_ip":
            ip = (remote.get("status") or {}).get("podIP")
            return Address(ip) if ip else None
        rns = self.remote_namespace(namespace)
        svc_name = ((remote.get("metadata") or {}).get("labels") or {}).get(REMOTE_SERVICE_LABEL)
        if not svc_name or self.services is None:
            return None
        svc = self.services.get(f"{rns}/{svc_name}")
        if svc is None:  # removed with an earlier last pod while this one was being created
            ports = [{"protocol": p.get("protocol", "TCP"), "containerPort": int(p["containerPort"])}
                     for c in remote["spec"]["containers"] for p in c.get("ports") or []]
            self._ensure_service(rns, svc_name, ports)
            return None
        for ingress in ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []:
            if ingress.get("ip"):
                return Address(ingress["ip"], shared=True)
        return None

    def _release_service(self, pod: Pod, remote: dict) -> None:
        """Delete the workload's remote Service once ``remote`` was its last remote pod (load_balancer mode)."""
        svc_name = ((remote.get("metadata") or {}).get("labels") or {}).get(REMOTE_SERVICE_LABEL)
        if self.address_mode != "load_balancer" or not svc_name:
            return
        rns = self.remote_namespace(pod["metadata"]["namespace"])
        uid = remote["metadata"].get("uid")
        # The remote API, not the cache: pods of one workload deleted together would each still see the
        # others in a cache that has not caught up, and the Service would never go.
        try:
            others = self._call("list pods", self.kube.list, "v1", "pods", rns,
                                labelSelector=f"{REMOTE_SERVICE_LABEL}={svc_name}")["items"]
        except NotFound:
            others = []
        for p in others:
            m = p["metadata"]
            if m.get("uid") != uid and not m.get("deletionTimestamp"):
                return
        # Only this node's Service (its label), exactly the one read (its UID): never a same-named one of someone else.
        try:
            live = self._call("read service", self.kube.get_or_none, "v1", "services", svc_name, rns)
            if live is None or ((live.get("metadata") or {}).get("labels") or {}).get(REMOTE_NODE_LABEL) != self.node_name:
                return
            self._call("delete service", self.kube.delete, "v1", "services", svc_name, rns,
                       uid=live["metadata"].get("uid"))
        except (NotFound, Conflict):
            pass

    def sweep(self) -> int:
        """Delete each remote Service of this virtual node whose workload has no remote pod left (load_balancer
        mode; see the module docstring); returns how many. Raises ProviderError (remote API failed)."""
        if self.address_mode != "load_balancer" or self.services is None:
            return 0
        # The caches pick the candidates (no API call while every Service has pods); the remote API decides.
        used = {(p["metadata"]["namespace"], (p["metadata"].get("labels") or {}).get(REMOTE_SERVICE_LABEL))
                for p in self.pods.items() if not p["metadata"].get("deletionTimestamp")}
        now, gone = time.monotonic(), 0
        for svc in self.services.items():
            meta = svc["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            if (meta["namespace"], meta["name"]) in used:
                continue
            if now - self._service_needed.get(key, float("-inf")) < SERVICE_SWEEP_GRACE_SECONDS:
                continue
            try:
                live = self._call("list pods", self.kube.list, "v1", "pods", meta["namespace"],
                                  labelSelector=f"{REMOTE_SERVICE_LABEL}={meta['name']}")["items"]
            except NotFound:
                live = []
            if any(not p["metadata"].get("deletionTimestamp") for p in live):
                continue
            try:  # exactly the Service listed: not one created again since
                self._call("delete service", self.kube.delete, "v1", "services", meta["name"], meta["namespace"],
                           uid=meta.get("uid"))
            except (NotFound, Conflict):
                continue
            self._service_needed.pop(key, None)
            log.info("%s: remote Service %s: no remote pod of its workload left: deleted", self.name, key)
            gone += 1
        return gone

    # ------------------------------------------------------------------ objects

    def copy_name(self, name: str) -> str:
        """This pool's remote name for the copy of ConfigMap/Secret ``name`` (:func:`copy_name`)."""
        return copy_name(self.name, name)

    def owns(self, obj: dict, namespace: str, name: str) -> bool:
        """Whether remote ``obj`` is this node's copy of source ``namespace/name`` (its labels and annotations)."""
        meta = obj.get("metadata") or {}
        labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
        return (labels.get(REFLECTED_LABEL) == self.node_name and labels.get(MANAGED_BY_LABEL[0]) == MANAGED_BY_LABEL[1]
                and ann.get(SOURCE_NAMESPACE) == namespace and ann.get(SOURCE_NAME) == name)

    def _foreign(self, kind: str, rns: str, cname: str, namespace: str, name: str, live: dict) -> ProviderError:
        labels = (live.get("metadata") or {}).get("labels") or {}
        holder = labels.get(REFLECTED_LABEL)
        whose = f"the copy of virtual node {holder}" if holder else "not a copy gpufleet made"
        return ProviderError(
            f"{self.name}: {kind} {rns}/{cname}, where {kind} {namespace}/{name} is to be copied, already exists and "
            f"is {whose}: left untouched (gpufleet never writes or deletes an object it does not own); remove or "
            f"rename that object, or give pool {self.name} another namespace_prefix",
            reason=FOREIGN_OBJECT_REASON, retryable=False)

    def put_object(self, kind: str, namespace: str, obj: dict[str, Any]) -> None:
        """Create or update this pool's copy of ConfigMap/Secret ``obj`` in the remote namespace, only where the
        name is free or holds this node's copy already (module docstring).

        Raises:
            ProviderError: reason :data:`~gpufleet.names.FOREIGN_OBJECT_REASON` (not retryable) when an object
                gpufleet does not own holds the copy's name; otherwise refused or unreachable (message redacted).
        """
        rns = self.remote_namespace(namespace)
        name = obj["metadata"]["name"]
        cname = self.copy_name(name)
        plural = OBJECT_PLURALS[kind]
        body = {"apiVersion": "v1", "kind": kind,
                "metadata": {"name": cname, "namespace": rns,
                             "labels": {REFLECTED_LABEL: self.node_name, MANAGED_BY_LABEL[0]: MANAGED_BY_LABEL[1]},
                             "annotations": {SOURCE_NAMESPACE: namespace, SOURCE_NAME: name}},
                **object_payload(obj)}
        if kind == "Secret":
            body.setdefault("type", "Opaque")
        try:
            self._call("create namespace", self._ensure_namespace, rns)
            for _ in range(2):  # a copy created between the read and the create is read once more
                live = self._call(f"read {kind} {rns}/{cname}", self.kube.get_or_none, "v1", plural, cname, rns)
                if live is None:
                    try:
                        self._call(f"create {kind} {rns}/{cname}", self.kube.create, "v1", plural, body, rns,
                                   fieldManager=FIELD_MANAGER)
                        return
                    except Conflict:
                        continue
                if not self.owns(live, namespace, name):
                    raise self._foreign(kind, rns, cname, namespace, name, live)
                # The resourceVersion checked is a precondition of the apply: replaced meanwhile -> 409.
                body["metadata"]["resourceVersion"] = live["metadata"].get("resourceVersion")
                self._call(f"apply {kind} {rns}/{cname}", self.kube.apply, body, field_manager=FIELD_MANAGER)
                return
            raise ProviderError(f"{self.name}: {kind} {rns}/{cname} was created by someone else while being created",
                                reason="ProviderBusy", retryable=True)
        except ProviderError as exc:
            raise ProviderError(redact(str(exc), obj), reason=exc.reason, retryable=exc.retryable) from None
        except KubeError as exc:  # NotFound / Conflict, passed through by _call
            raise ProviderError(redact(f"{self.name}: write {kind} {rns}/{cname}: the remote API server answered "
                                       f"{exc.status} {exc.reason}: {exc.message}", obj),
                                reason="ProviderBusy" if isinstance(exc, Conflict) else "ProviderFailed",
                                retryable=True if isinstance(exc, Conflict) else retryable(exc)) from None

    def delete_object(self, kind: str, namespace: str, name: str) -> None:
        """Delete this pool's copy of ``kind`` ``namespace/name``: only an object that is this node's copy, by
        its UID (no error if gone; an object gpufleet does not own is left alone and logged). Raises ProviderError."""
        rns, cname, plural = self.remote_namespace(namespace), self.copy_name(name), OBJECT_PLURALS[kind]
        try:
            live = self._call(f"read {kind}", self.kube.get_or_none, "v1", plural, cname, rns)
            if live is None:
                return
            if not self.owns(live, namespace, name):
                log.warning("%s: %s %s/%s is not this node's copy of %s/%s: not deleted", self.name, kind, rns, cname,
                            namespace, name)
                return
            self._call(f"delete {kind}", self.kube.delete, "v1", plural, cname, rns, uid=live["metadata"].get("uid"))
        except NotFound:
            pass
        except Conflict as exc:
            raise ProviderError(f"{self.name}: delete {kind} {rns}/{cname}: {exc.message}", retryable=True) from None

    def get_objects(self) -> list[ObjectRef]:
        """The copies this virtual node's pods had reflected here (listed as metadata only, from the remote API):
        objects labelled for this node, under this pool's name for their source."""
        out = []
        for kind, plural in OBJECT_PLURALS.items():
            listed = self._call(f"list {plural}", self.kube.request, "GET", api_path("v1", plural),
                                params={"labelSelector": f"{REFLECTED_LABEL}={self.node_name}"}, accept=METADATA_ONLY)
            for item in listed.get("items") or []:
                meta = item.get("metadata") or {}
                ann = meta.get("annotations") or {}
                ns, name = ann.get(SOURCE_NAMESPACE), ann.get(SOURCE_NAME)
                if ns and name and self.remote_namespace(ns) == meta.get("namespace") and \
                        meta.get("name") == self.copy_name(name) and self.owns(item, ns, name):
                    out.append(ObjectRef(kind, ns, name))
        return out

    def update_pod(self, pod: Pod) -> None:
        """Copy the source pod's labels to the remote pod (keeping our tag)."""
        meta = pod["metadata"]
        labels = {**(meta.get("labels") or {}), REMOTE_NODE_LABEL: self.node_name}
        if self.address_mode == "load_balancer":
            labels[REMOTE_SERVICE_LABEL] = remote_service_name(workload_name(pod))
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
            return
        self._release_service(pod, remote)

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

    # ------------------------------------------------------------------ usage

    def pod_stats(self) -> list[PodStats]:
        """What the remote pods of this virtual node use, from the remote resource metrics API (module docstring).

        Returns one :class:`~gpufleet.virtual_kubelet.stats.PodStats` per remote pod the metrics API reports and
        the watch cache knows (named as its source pod); CPU in core-seconds (cumulative), memory in bytes.

        A pod whose figures are not quantities (or not finite, or negative) or whose times are not times is left
        out, with a warning naming it and the value while it lasts.

        Raises:
            ProviderError: the remote metrics API is absent, refused or unreachable.
        """
        try:
            # Within a scrape's time (metrics-server waits 10 s for the whole node): once, 5 s at most.
            listed = self.kube.request("GET", api_path("metrics.k8s.io/v1beta1", "pods"),
                                       params={"labelSelector": f"{REMOTE_NODE_LABEL}={self.node_name}"},
                                       timeout=STATS_TIMEOUT_SECONDS, retry=False)
        except KubeError as exc:
            raise ProviderError(f"{self.name}: the remote metrics API (metrics.k8s.io/v1beta1 pods) on "
                                f"{self.kube.server}: {exc}", reason="ProviderUnavailable", retryable=True) from None
        out, live, bad = [], set(), set()
        for m in (listed.get("items") or []) if isinstance(listed, dict) else []:
            meta = m.get("metadata") or {}
            remote = self.pods.get(f"{meta.get('namespace')}/{meta.get('name')}")
            ann = ((remote or {}).get("metadata") or {}).get("annotations") or {}
            uid = ann.get(SOURCE_UID)
            if not uid:
                continue  # not (or no longer) one of this node's pods
            where = f"{self.name}: PodMetrics {meta.get('namespace')}/{meta.get('name')}"
            try:
                at = parse_time(m.get("timestamp")) or time.time()
                status = (remote or {}).get("status") or {}
                pod_start = parse_time(status.get("startTime")) or at
                started = {cs.get("name"): parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
                           for cs in status.get("containerStatuses") or []}
                containers = []
                for c in m.get("containers") or []:
                    if not c.get("name"):
                        continue
                    start, usage = self._cpu.start(started.get(c["name"]) or pod_start), c.get("usage") or {}
                    cores, memory = number(usage.get("cpu")), number(usage.get("memory"))
                    if not (math.isfinite(cores) and math.isfinite(memory)) or cores < 0 or memory < 0:
                        raise ValueError(f"container {c['name']}: usage {usage!r}: expected finite quantities >= 0")
                    containers.append(ContainerStats(
                        c["name"], self._cpu.add(uid, c["name"], cores, at, start), int(memory), start, at))
            except (ValueError, TypeError, AttributeError) as exc:
                # One pod's bad answer costs that pod's figures, not the node's: said once while it lasts.
                if where not in self._bad_usage:
                    log.warning("%s: %s; its usage is not reported", where, exc)
                bad.add(where)
                continue
            live.add(uid)
            out.append(PodStats(ann.get(SOURCE_NAMESPACE, ""), ann.get(SOURCE_NAME, meta.get("name", "")), uid,
                                tuple(containers)))
        self._cpu.forget(live)
        self._bad_usage = bad
        return out
