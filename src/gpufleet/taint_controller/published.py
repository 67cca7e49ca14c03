"""Whether an in-cluster pod is published: a ready endpoint of every Service that selects it.

Why: a replacement that is Ready serves nobody until the Services in front
of the workload send it requests. The way back's replacement runs
in-cluster, where kube-controller-manager's EndpointSlice controller
publishes a pod (at its pod IP) a moment after it is Ready; the flip-back
lets the pod outside go only once that happened (:mod:`gpufleet.taint_controller.surge`).
A pod outside is published by its virtual kubelet, which says so on the pod
itself (:data:`gpufleet.names.PUBLISHED_CONDITION`); both are judged by the
one test, :func:`gpufleet.virtual_kubelet.endpoints.published_in`.

How: two watches of every namespace, Services (the fields that decide
selection) and EndpointSlices (each endpoint's addresses, conditions and
``targetRef`` UID, whoever manages the slice), so a check is a look at the
caches, not a request; both are indexed by namespace, and the slices by
their Service, so a check reads what concerns its pod's namespace only.
"""

from __future__ import annotations

from typing import Any

from gpufleet.kube import Kube, api_path
from gpufleet.kube.informer import Informer
from gpufleet.names import SERVICE_NAME_LABEL
from gpufleet.virtual_kubelet.endpoints import (BY_NAMESPACE, BY_SERVICE, SLICES_API, by_namespace, by_service,
                                                published_in, slim_service)

Obj = dict[str, Any]


def slim_slice(s: Obj) -> Obj:
    """What the slice cache keeps: name, namespace, its Service's name, each endpoint's addresses, conditions, pod UID."""
    meta = s.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "labels": {SERVICE_NAME_LABEL: (meta.get("labels") or {}).get(SERVICE_NAME_LABEL, "")}},
            "endpoints": [{"addresses": e.get("addresses") or [], "conditions": e.get("conditions") or {},
                           **({"targetRef": {"uid": e["targetRef"].get("uid")}} if e.get("targetRef") else {})}
                          for e in s.get("endpoints") or []]}


class ServiceEndpoints:
    """Watch caches of Services and EndpointSlices, and :meth:`published` over them.

    Needs list/watch on ``services`` and on ``endpointslices`` (discovery.k8s.io) in every namespace.
    """

    def __init__(self, kube: Kube):
        self.services: Informer[Obj] = Informer(kube, api_path("v1", "services"), transform=slim_service,
                                                name="services", indexers={BY_NAMESPACE: by_namespace})
        self.slices: Informer[Obj] = Informer(kube, api_path(SLICES_API, "endpointslices"), transform=slim_slice,
                                              name="endpointslices", indexers={BY_SERVICE: by_service})

    def start(self, timeout: float = 60.0) -> "ServiceEndpoints":
        """Start both watches and wait for their first lists.

        Raises:
            TimeoutError: not listed within ``timeout`` seconds.
        """
        self.services.start()
        self.slices.start()
        if not (self.services.wait_synced(timeout) and self.slices.wait_synced(timeout)):
            raise TimeoutError(f"Services/EndpointSlices not listed within {timeout:.0f}s")
        return self

    def stop(self) -> None:
        """Stop both watches."""
        self.services.stop()
        self.slices.stop()

    def published(self, pod: Obj) -> bool:
        """Whether ``pod`` (a :func:`gpufleet.taint_controller.signal.pod_view`) is a ready, serving endpoint, by its UID or
        its pod IP, of every Service that selects it (true when none does); false before both caches are listed."""
        if not (self.services.synced.is_set() and self.slices.synced.is_set()):
            return False
        namespace = pod["metadata"]["namespace"]
        services = self.services.by_index(BY_NAMESPACE, namespace)

        def slices_of(ns: str, service: str) -> list[Obj]:
            return self.slices.by_index(BY_SERVICE, f"{ns}/{service}")

        return published_in(pod, services, slices_of, pod.get("ip") or None)
