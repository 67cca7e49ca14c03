"""Pods that run outside, published into the Services that select them: EndpointSlices gpufleet manages.

A pod on a virtual node runs in another cluster or on a rented instance;
its provider reports where the main cluster reaches it
(:meth:`gpufleet.virtual_kubelet.provider.Provider.pod_address`). Each virtual kubelet
publishes its own node's pods into every Service whose selector matches
them, through EndpointSlices labelled ``kubernetes.io/service-name=<svc>``,
``endpointslice.kubernetes.io/managed-by=endpointslice.gpufleet.io`` and
``gpufleet.io/virtual-node=<node>``, owned by the Service (deleted with it).

How this coexists with kube-controller-manager's EndpointSlice controller:
each endpoint has exactly one publisher. The standard controller publishes
every pod the Service selects that has a ``status.podIP``
(``k8s.io/endpointslice`` ``ShouldPodBeInEndpoints``: no IP, no endpoint);
the virtual kubelet never writes ``status.podIP`` on a pod that runs
outside (:func:`gpufleet.virtual_kubelet.translate.mirror_status`), so the standard
controller publishes the in-cluster pods and passes over the outside ones,
and gpufleet publishes the outside ones with the address their provider
reports. Both kinds of slice carry the Service's name, which is all a data
plane reads: kube-proxy (``pkg/proxy/endpointslicecache.go``) merges every
slice of a Service whatever manages it, and so do Cilium and Gateway API
implementations; the ``managed-by`` label keeps each controller off the
other's slices (the standard controller only touches
``endpointslice-controller.k8s.io`` slices). The Service keeps its selector,
so in-cluster routing, DNS, topology hints and everything else stay the
standard controller's, unchanged.

Why not the other two ways: reporting the reachable address as the
pod's ``status.podIP`` (the standard controller would publish it) fails
for a load balancer in front of several remote pods (one address shared by
pods, on the Service's port rather than the container's) and for a
rental's mapped ports: a pod IP has no port, and ``status.podIP`` means
the pod's own address. A selector-less Service that gpufleet fills
entirely would make gpufleet re-implement the standard controller for
in-cluster pods, and would change the user's Service.

Conditions mirror the standard controller's ``podToEndpoint``
(``k8s.io/endpointslice`` ``utils.go``): ``serving`` = the pod is Ready,
``terminating`` = it has a ``deletionTimestamp``, ``ready`` = serving and
not terminating (always true with ``publishNotReadyAddresses``). A pod is
published once its provider reports an address, until it is terminal or
gone. Ports: each Service port's ``targetPort`` (a number, or a container
port's name) is resolved against the pod's containers as the standard
controller does, then through the provider's port map (a rental's public
ports). Slices group endpoints by address family and port set, at most
:data:`MAX_ENDPOINTS_PER_SLICE` each.

An address the virtual kubelet's own TCP check finds dead
(:mod:`gpufleet.virtual_kubelet.endpoint_health`) is published with ``serving`` and ``ready``
false while its pod still reports Ready (``ready`` stays true under
``publishNotReadyAddresses``).

Pods sharing one address (a remote load balancer per workload) are one
endpoint: data planes key backends by address and port and keep the
first of duplicates (kube-proxy's ``addEndpoints``), so the merged
endpoint is ready/serving while any pod behind it is, terminating once all
are, and names no pod (no ``targetRef``).

A slice of this node changed or deleted by someone else (the taint
controller marks the endpoints of a publisher whose Lease expired not
ready, :mod:`gpufleet.virtual_kubelet.orphans`) queues its Service: a publisher that
was only slow, or is back, publishes its pods as they are again.

Published (:data:`gpufleet.names.PUBLISHED_CONDITION`): once every
Service that selects a running pod holds it, in this node's slices, as a
ready and serving endpoint at the address its provider reports, the
publisher sets the pod's condition ``endpoints.gpufleet.io/Published`` True
(False once that no longer holds: a dead address, a lost one). A pod no
Service selects is published as it is. Until the provider reports an
address there is none: a remote load balancer's ingress IP comes minutes
after its pods are Ready, and the condition waits for it. The flip reads
it before a replacement outside takes a pod's place (:mod:`gpufleet.taint_controller.surge`);
:func:`published_in` is the one test of it, for in-cluster pods too (the
standard controller's slices, by ``targetRef``).

Order on removal (:meth:`EndpointPublisher.sync_pod`): the pod side
publishes a deleted pod as terminating and not ready before it stops the
remote pod, and drops the endpoint once the pod is gone; a pod that
finished (Succeeded/Failed) is dropped at once. As under a real kubelet,
the remote pod then still gets its grace period (SIGTERM, preStop hooks),
which covers the time data planes take to apply the change.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpufleet.kube import Kube, KubeError, NotFound, api_path
from gpufleet.kube.informer import Informer
from gpufleet.kube.workqueue import RateLimitingQueue
from gpufleet.kube.times import now_rfc3339
from gpufleet.names import (
    ENDPOINTSLICE_MANAGED_BY, ENDPOINTSLICE_MANAGED_BY_LABEL, FIELD_MANAGER, PUBLISHED_CONDITION, SERVICE_NAME_LABEL,
)

from .endpoint_health import Dial, EndpointHealthChecker, HealthSettings
from .provider import REMOTE_NODE_LABEL, Address

log = logging.getLogger(__name__)

SLICES_API = "discovery.k8s.io/v1"
#: Endpoints per slice at most: kube-controller-manager's default ``--max-endpoints-per-slice``.
MAX_ENDPOINTS_PER_SLICE = 100
TERMINAL = ("Succeeded", "Failed")
#: Published-condition writes at once (:meth:`EndpointPublisher._mark_all`): well within the client's 32 connections,
#: and a virtual kubelet's other writes (pod status, its Lease) keep theirs.
MARK_WRITERS = 8

Obj = dict[str, Any]


# ------------------------------------------------------------------------------- pure


def selects(service: Obj, pod: Obj) -> bool:
    """Whether ``service`` (same namespace, non-empty selector, not ExternalName) selects ``pod``."""
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    if not selector or spec.get("type") == "ExternalName":
        return False
    if (service.get("metadata") or {}).get("namespace") != (pod.get("metadata") or {}).get("namespace"):
        return False
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _is_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _container_port(pod: Obj, target: Any, protocol: str) -> int | None:
    """The container port a Service ``targetPort`` names on ``pod`` (``podutil.FindPort``): a number as is, a name looked up."""
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target and p.get("protocol", "TCP") == protocol:
                return int(p["containerPort"])
    return None


def endpoint_ports(service: Obj, pod: Obj, address: Address) -> tuple[tuple[str, str, int, str], ...]:
    """The slice ports of ``pod`` behind ``address``: ``((name, protocol, port, appProtocol), ...)`` sorted.

    A Service port whose ``targetPort`` the pod does not declare (by name),
    or that the provider does not expose, is left out for this pod.
    """
    out = []
    for sp in (service.get("spec") or {}).get("ports") or []:
        protocol = sp.get("protocol", "TCP")
        container = _container_port(pod, sp.get("targetPort", sp.get("port")), protocol)
        if container is None:
            continue
        port = address.port_for(protocol, container)
        if port is None:
            continue
        out.append((sp.get("name", ""), protocol, port, sp.get("appProtocol", "")))
    return tuple(sorted(out))


def _address_type(ip: str) -> str | None:
    try:
        return "IPv6" if ipaddress.ip_address(ip).version == 6 else "IPv4"
    except ValueError:
        return None


def slice_name(service_name: str, node_name: str, address_type: str, ports: tuple, index: int) -> str:
    """A stable slice name: ``<service>-gf-<10 hex of node, family, ports, index>`` (a DNS subdomain, <= 63 chars)."""
    digest = hashlib.sha256(json.dumps([node_name, address_type, ports, index]).encode()).hexdigest()[:10]
    return f"{service_name[:48].rstrip('-.')}-gf-{digest}"


def build_slices(service: Obj, pods: Iterable[Obj], addresses: Mapping[str, Address | None], *,
                 node_name: str, unreachable: Collection[str] = ()) -> list[Obj]:
    """The EndpointSlices that publish ``pods`` (those of one virtual node) into ``service``.

    Args:
        service: the Service (its ``metadata`` name/namespace/uid and
            ``spec`` selector, ports, type, ipFamilies, publishNotReadyAddresses).
        pods: the virtual node's pods (any namespace); those the Service does
            not select, terminal ones and those without an address are left out.
        addresses: pod UID -> where the main cluster reaches it (None: nowhere yet).
        node_name: the virtual node (``nodeName`` of the endpoints, part of the slice names and labels).
        unreachable: addresses failing the health check (:mod:`gpufleet.virtual_kubelet.endpoint_health`): not serving, not ready.

    Returns:
        Slice manifests (discovery.k8s.io/v1), sorted by name; empty when nothing is to be published.
        Conditions, grouping and shared addresses: see the module docstring.
    """
    meta, spec = service.get("metadata") or {}, service.get("spec") or {}
    families = set(spec.get("ipFamilies") or ("IPv4", "IPv6"))
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    groups: dict[tuple[str, tuple], dict[str, list[tuple[Obj, Address]]]] = {}
    for pod in pods:
        pmeta = pod.get("metadata") or {}
        address = addresses.get(pmeta.get("uid", ""))
        if address is None or (pod.get("status") or {}).get("phase") in TERMINAL or not selects(service, pod):
            continue
        family = _address_type(address.ip)
        ports = endpoint_ports(service, pod, address)
        if family not in families or (spec.get("ports") and not ports):
            continue
        groups.setdefault((family, ports), {}).setdefault(address.ip, []).append((pod, address))

    out = []
    for (family, ports), by_ip in groups.items():
        endpoints = [_endpoint(ip, members, service, node_name, publish_not_ready, ip in unreachable)
                     for ip, members in sorted(by_ip.items())]
        for index in range(0, len(endpoints), MAX_ENDPOINTS_PER_SLICE):
            out.append({
                "apiVersion": SLICES_API, "kind": "EndpointSlice",
                "metadata": {"name": slice_name(meta["name"], node_name, family, ports, index // MAX_ENDPOINTS_PER_SLICE),
                             "namespace": meta["namespace"],
                             "labels": {SERVICE_NAME_LABEL: meta["name"],
                                        ENDPOINTSLICE_MANAGED_BY_LABEL: ENDPOINTSLICE_MANAGED_BY,
                                        REMOTE_NODE_LABEL: node_name},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": meta["name"],
                                                  "uid": meta.get("uid", "")}]},
                "addressType": family,
                "ports": [{"name": n, "protocol": proto, "port": port, **({"appProtocol": app} if app else {})}
                          for n, proto, port, app in ports],
                "endpoints": endpoints[index:index + MAX_ENDPOINTS_PER_SLICE],
            })
    return sorted(out, key=lambda s: s["metadata"]["name"])


def _endpoint(ip: str, members: list[tuple[Obj, Address]], service: Obj, node_name: str,
              publish_not_ready: bool, dead: bool = False) -> Obj:
    """One endpoint: a pod's, or the merge of the pods sharing ``ip`` (module docstring); ``dead``: fails its check."""
    serving = [_is_ready(p) and not dead for p, _ in members]
    terminating = [bool((p.get("metadata") or {}).get("deletionTimestamp")) for p, _ in members]
    any_serving = any(serving)
    all_terminating = all(terminating)
    ready = publish_not_ready or any(s and not t for s, t in zip(serving, terminating))
    ep: Obj = {"addresses": [ip], "conditions": {"ready": ready, "serving": any_serving, "terminating": all_terminating},
               "nodeName": node_name}
    if len(members) == 1 and not members[0][1].shared:
        pod = members[0][0]
        pmeta, pspec = pod["metadata"], pod.get("spec") or {}
        ep["targetRef"] = {"kind": "Pod", "namespace": pmeta["namespace"], "name": pmeta["name"], "uid": pmeta["uid"]}
        svc_meta = service.get("metadata") or {}
        if pspec.get("hostname") and pspec.get("subdomain") == svc_meta.get("name"):
            ep["hostname"] = pspec["hostname"]
    return ep


def holds(slices: Iterable[Obj], uid: str, ip: str | None) -> bool:
    """Whether ``slices`` (one Service's) list pod ``uid`` as a ready and serving endpoint: by its ``targetRef``,
    or, for an endpoint naming no pod (an address pods share), by its address ``ip``.

    A condition left out (nil) counts as true, as the discovery API says consumers should read it.
    """
    for s in slices:
        for e in s.get("endpoints") or []:
            cond = e.get("conditions") or {}
            if cond.get("ready") is False or cond.get("serving") is False:
                continue
            ref = e.get("targetRef")
            if (ref.get("uid") == uid) if ref else (ip is not None and ip in (e.get("addresses") or [])):
                return True
    return False


#: Index (:class:`gpufleet.kube.informer.Informer`) of Services or EndpointSlices by namespace.
BY_NAMESPACE = "namespace"
#: Index of EndpointSlices by ``namespace/service`` (their ``kubernetes.io/service-name`` label).
BY_SERVICE = "service"


def by_namespace(obj: Obj) -> tuple[str, ...]:
    """Index function of :data:`BY_NAMESPACE`."""
    return ((obj.get("metadata") or {}).get("namespace") or "",)


def by_service(slice_: Obj) -> tuple[str, ...]:
    """Index function of :data:`BY_SERVICE`."""
    meta = slice_.get("metadata") or {}
    return (f'{meta.get("namespace")}/{(meta.get("labels") or {}).get(SERVICE_NAME_LABEL, "")}',)


def published_in(pod: Obj, services: Iterable[Obj], slices_of: Callable[[str, str], Iterable[Obj]],
                 ip: str | None) -> bool:
    """Whether ``pod`` is published (module docstring: Published): a ready, serving endpoint in the slices of
    every Service of ``services`` that selects it (:func:`holds`); true when none selects it.

    Args:
        pod: a pod (its ``metadata`` name/namespace/uid/labels).
        services: candidate Services (those of other namespaces, or not selecting it, are passed over).
        slices_of: ``(namespace, service name)`` -> the slices to look in.
        ip: the address the pod is reached at (a shared one matches an endpoint naming no pod); None: none yet.
    """
    meta = pod.get("metadata") or {}
    return all(holds(slices_of(meta["namespace"], svc["metadata"]["name"]), meta.get("uid", ""), ip)
               for svc in services if selects(svc, pod))


def essence(slice_: Obj) -> str:
    """What decides whether a slice must be written: labels, owners, address type, ports, endpoints (canonical JSON)."""
    meta = slice_.get("metadata") or {}
    labels = {k: (meta.get("labels") or {}).get(k) for k in (SERVICE_NAME_LABEL, ENDPOINTSLICE_MANAGED_BY_LABEL,
                                                              REMOTE_NODE_LABEL)}
    owners = sorted((o.get("kind"), o.get("name"), o.get("uid")) for o in meta.get("ownerReferences") or [])
    return json.dumps([labels, owners, slice_.get("addressType"), slice_.get("ports") or [],
                       slice_.get("endpoints") or []], sort_keys=True)


def plan(desired: list[Obj], existing: list[Obj]) -> tuple[list[Obj], list[Obj]]:
    """``(to_apply, to_delete)``: desired slices that are missing or differ, and existing ones not desired."""
    have = {s["metadata"]["name"]: s for s in existing}
    want = {s["metadata"]["name"] for s in desired}
    apply = [s for s in desired if s["metadata"]["name"] not in have or essence(have[s["metadata"]["name"]]) != essence(s)]
    return apply, [s for name, s in sorted(have.items()) if name not in want]


# ------------------------------------------------------------------------------- publisher


def slim_service(svc: Obj) -> Obj:
    """What a Service cache keeps: ``metadata`` name/namespace/uid and the ``spec`` fields slices depend on."""
    meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
            "spec": {k: spec[k] for k in ("selector", "ports", "type", "ipFamilies", "publishNotReadyAddresses")
                     if k in spec}}


class EndpointPublisher:
    """Keeps this virtual node's EndpointSlices in line with its pods (see the module docstring).

    Args:
        kube: client of the cluster the node is in.
        node_name: the virtual node.
        pods: the pod side's watch cache of the node's pods.
        address_of: source pod -> its :class:`~gpufleet.virtual_kubelet.provider.Address`, or None.
        health: check the published addresses (:mod:`gpufleet.virtual_kubelet.endpoint_health`); None: no check.
        dial_of: source pod -> its provider's own connect (:data:`gpufleet.virtual_kubelet.endpoint_health.Dial`), or None
            (a real TCP connect).

    Reads every Service (one watch) and its own slices (one watch, by
    label); writes slices by server-side apply (field manager ``gpufleet``)
    and deletes the ones no longer wanted.
    """

    def __init__(self, kube: Kube, node_name: str, pods: Informer, address_of: Callable[[Obj], Address | None], *,
                 health: HealthSettings | None = None, dial_of: Callable[[Obj], Dial | None] | None = None):
        self.kube = kube
        self.node = node_name
        self.pods = pods
        self.address_of = address_of
        # Indexed so that a pod's candidate Services and a Service's slices are read, not scanned for.
        self.services: Informer[Obj] = Informer(kube, api_path("v1", "services"), transform=slim_service,
                                                handlers=[self._on_service], name=f"services-{node_name}",
                                                indexers={BY_NAMESPACE: by_namespace})
        selector = f"{ENDPOINTSLICE_MANAGED_BY_LABEL}={ENDPOINTSLICE_MANAGED_BY},{REMOTE_NODE_LABEL}={node_name}"
        self.slices: Informer[Obj] = Informer(kube, api_path(SLICES_API, "endpointslices"),
                                              params={"labelSelector": selector}, handlers=[self._on_slice],
                                              name=f"endpointslices-{node_name}",
                                              indexers={BY_NAMESPACE: by_namespace, BY_SERVICE: by_service})
        #: Service keys; a failed publish comes back at the Service's own pace (:mod:`gpufleet.kube.ratelimit`).
        self.queue: RateLimitingQueue[str] = RateLimitingQueue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0
        self._writers: ThreadPoolExecutor | None = None
        self.health = None if health is None else EndpointHealthChecker(
            kube, node_name, self.slices, pods, address_of, dial_of or (lambda pod: None),
            self._requeue, health)

    def start(self, sync_timeout: float = 60.0) -> "EndpointPublisher":
        """Start both watches, wait for their first lists, queue every Service concerned, start the worker.

        Raises:
            TimeoutError: the API server did not list Services or slices within ``sync_timeout`` s.
        """
        self.services.start()
        self.slices.start()
        if not (self.services.wait_synced(sync_timeout) and self.slices.wait_synced(sync_timeout)):
            raise TimeoutError(f"{self.node}: Services/EndpointSlices not listed within {sync_timeout:.0f}s")
        for s in self.slices.items():
            self.queue.add(f"{s['metadata']['namespace']}/{s['metadata']['labels'].get(SERVICE_NAME_LABEL, '')}")
        for pod in self.pods.items():
            self.pod_changed(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", pod)
        self._thread = threading.Thread(target=self._work, daemon=True, name=f"endpoints-{self.node}")
        self._thread.start()
        if self.health is not None:
            self.health.start()
        return self

    def stop(self) -> None:
        """Stop the worker, the health check and the watches (slices stay as they are; a restart takes them over)."""
        self._stop.set()
        if self.health is not None:
            self.health.stop()
        self.services.stop()
        self.slices.stop()
        self.queue.shutdown()
        if self._writers is not None:
            self._writers.shutdown(wait=False)

    def _requeue(self, keys: Iterable[str]) -> None:
        """Queue Services ``namespace/name`` for publishing (an address behind them changed health)."""
        for key in keys:
            self.queue.add(key)

    def _on_slice(self, kind: str, new: Any, old: Any) -> None:
        """One of this node's slices was changed or deleted by someone else (the taint controller marks a silent
        publisher's endpoints not ready, :mod:`gpufleet.virtual_kubelet.orphans`): publish its Service again."""
        if kind == "ADDED" or (kind == "MODIFIED" and old is not None and essence(old) == essence(new)):
            return
        meta = (new or old)["metadata"]
        self.queue.add(f"{meta['namespace']}/{(meta.get('labels') or {}).get(SERVICE_NAME_LABEL, '')}")

    def _on_service(self, kind: str, new: Any, old: Any) -> None:
        meta = (new or old)["metadata"]
        self.queue.add(f"{meta['namespace']}/{meta['name']}")

    def _selecting(self, namespace: str, pod: Obj) -> list[Obj]:
        """The Services of ``namespace`` that select ``pod`` now."""
        return sorted((svc for svc in self.services.by_index(BY_NAMESPACE, namespace) if selects(svc, pod)),
                      key=lambda svc: svc["metadata"]["name"])

    def services_of(self, namespace: str, name: str, pod: Obj | None) -> set[str]:
        """Keys of the Services that select ``pod`` now, or whose slices here name it (its labels may have changed)."""
        keys = set()
        if pod is not None:
            keys = {f"{namespace}/{svc['metadata']['name']}" for svc in self._selecting(namespace, pod)}
        for s in self.slices.by_index(BY_NAMESPACE, namespace):
            meta = s["metadata"]
            if pod is None or any((e.get("targetRef") or {}).get("name") == name for e in s.get("endpoints") or []):
                keys.add(f"{namespace}/{(meta.get('labels') or {}).get(SERVICE_NAME_LABEL, '')}")
        return keys

    def pod_changed(self, key: str, pod: Obj | None) -> None:
        """Queue the Services concerned by pod ``namespace/name`` (``pod`` None: it is gone)."""
        namespace, name = key.split("/", 1)
        keys = self.services_of(namespace, name, pod)
        for svc in keys:
            self.queue.add(svc)
        if pod is not None and not keys:
            try:  # no Service to publish into: published as it is (the Services' worker marks the others)
                self.mark(pod)
            except KubeError as exc:
                log.warning("%s: marking pod %s published: %s; retried with its next change", self.node, key, exc)

    def published(self, pod: Obj) -> bool:
        """Whether ``pod`` is published now in this node's slices (module docstring: Published; :func:`published_in`)."""
        meta = pod["metadata"]
        selecting = self._selecting(meta["namespace"], pod)
        if not selecting:
            return True
        address = self.address_of(pod)
        if address is None:
            return False
        def slices_of(namespace: str, service: str) -> list[Obj]:
            return self.slices.by_index(BY_SERVICE, f"{namespace}/{service}")

        return published_in(pod, selecting, slices_of, address.ip)

    def mark(self, pod: Obj) -> None:
        """Set :data:`~gpufleet.names.PUBLISHED_CONDITION` on ``pod`` as :meth:`published` says, when it changed.

        Only a running pod that is not terminating is marked (the flip never
        looks at others); an absent condition counts as False, so a pod is
        written once it is published, and again only when that changes.

        Raises:
            KubeError: the status write failed.
        """
        condition = self._published_condition(pod)
        if condition is not None:
            self._write_condition(pod, condition)

    def _published_condition(self, pod: Obj) -> Obj | None:
        """The condition :meth:`mark` would write on ``pod``, or None when there is nothing to write."""
        meta, status = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") != "Running":
            return None
        want = self.published(pod)
        current = next((c for c in status.get("conditions") or [] if c.get("type") == PUBLISHED_CONDITION), None)
        if (current.get("status") == "True") == want if current is not None else not want:
            return None
        return {"type": PUBLISHED_CONDITION, "status": "True" if want else "False",
                "reason": "Published" if want else "NotPublished", "lastTransitionTime": now_rfc3339(),
                "message": "a ready endpoint of every Service selecting it" if want
                else "not a ready endpoint of every Service selecting it (no address yet, or it does not answer)"}

    def _write_condition(self, pod: Obj, condition: Obj) -> None:
        meta = pod["metadata"]
        self.kube.patch("v1", "pods", meta["name"], {"status": {"conditions": [condition]}}, meta["namespace"],
                        subresource="status", patch="strategic")

    def _mark_all(self, pods: list[Obj]) -> None:
        """:meth:`mark` ``pods``, the writes up to :data:`MARK_WRITERS` at once: when a provider starts many
        pods together (a flip-out moves hundreds), one write after another made the last pod wait for
        every other's (at 1,024 nodes, up to 35 s from Ready to published), and the flip-out waits for the
        condition before each hand-over. Every write is tried.

        Raises:
            KubeError: the first write that failed (the Service is synced again, which writes the rest).
        """
        writes = [(p, c) for p in pods if (c := self._published_condition(p)) is not None]
        if len(writes) <= 1 or self._stop.is_set():  # stopping: its writers are shut down
            for p, c in writes:
                self._write_condition(p, c)
            return
        if self._writers is None:
            self._writers = ThreadPoolExecutor(MARK_WRITERS, thread_name_prefix=f"mark-{self.node}")
        futures = [self._writers.submit(self._write_condition, p, c) for p, c in writes]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def sync_pod(self, pod: Obj) -> None:
        """Publish ``pod``'s Services now, in this thread (before its remote pod is stopped).

        Raises:
            KubeError: a write failed (the caller retries; the remote pod must not stop first).
        """
        meta = pod["metadata"]
        for key in sorted(self.services_of(meta["namespace"], meta["name"], pod)):
            self.sync_service(key)

    def _work(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout=1.0)
            if key is not None:
                self.process(key)

    def process(self, key: str) -> None:
        """One worker step for a Service key :attr:`queue` handed out: publish it (its failures forgotten), or
        queue it again at its rate-limited pace when that failed; mark it done
        (:meth:`~gpufleet.kube.workqueue.RateLimitingQueue.process`). Never raises."""
        self.queue.process(key, self.sync_service, what=f"{self.node}: endpoints of Service {key}",
                           retry_on=(KubeError,), logger=log)

    def sync_service(self, key: str) -> None:
        """Bring Service ``namespace/name``'s slices of this node in line with the node's pods.

        Raises:
            KubeError: a write was refused or the API server is unreachable.
        """
        namespace, name = key.split("/", 1)
        with self._lock:
            service = self.services.get(key)
            existing = self.slices.by_index(BY_SERVICE, key)
            desired: list[Obj] = []
            pods: list[Obj] = []
            if service is not None:
                pods = [p for p in self.pods.items() if p["metadata"].get("namespace") == namespace and selects(service, p)]
                addresses = {p["metadata"]["uid"]: self.address_of(p) for p in pods}
                desired = build_slices(service, pods, addresses, node_name=self.node,
                                       unreachable=self.health.unreachable() if self.health is not None else ())
            to_apply, to_delete = plan(desired, existing)
            for s in to_apply:
                live = self.kube.patch(SLICES_API, "endpointslices", s["metadata"]["name"], s, namespace, patch="apply",
                                       fieldManager=FIELD_MANAGER, force=True)
                self.slices.apply("MODIFIED", live)  # our own write, before the watch brings it
                self.writes += 1
            for s in to_delete:
                try:
                    self.kube.delete(SLICES_API, "endpointslices", s["metadata"]["name"], namespace,
                                     uid=s["metadata"].get("uid"))
                except NotFound:
                    pass
                self.slices.apply("DELETED", s)
                self.writes += 1
            self._mark_all(pods)
