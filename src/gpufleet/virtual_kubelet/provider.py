"""The provider protocol: the only thing the virtual kubelet's node and pod sides see of a backend.

Same seams as virtual-kubelet's ``node.PodLifecycleHandler`` (+ its
``PodNotifier``) and ``node.NodeProvider``: ``create_pod``, ``update_pod``,
``delete_pod``, ``get_pod``, ``get_pod_status``, ``get_pods``, plus
``capacity`` and an optional ``notify_pods``. Pods are the API's JSON
dicts of the *source* pods (the ones bound to the virtual node); a provider
translates them itself (:mod:`gpufleet.virtual_kubelet.translate`).

Identity: every remote pod is tagged with the source pod's UID
(:data:`SOURCE_UID`), so after a restart the virtual kubelet matches remote
pods to source pods by UID, adopts them instead of creating duplicates, and
garbage-collects the ones whose source pod is gone.

Addresses: :meth:`Provider.pod_address` says where the main cluster
reaches a pod running outside (an :class:`Address`: one IP and, where the
provider maps ports, the port each container port is reached at); the pod
side publishes it into the Services selecting the pod
(:mod:`gpufleet.virtual_kubelet.endpoints`). The remote pod's own IP is not mirrored
as the source pod's ``status.podIP``: outside a shared pod network nothing
here reaches it.

Usage (optional ``pod_stats()``, :func:`supports_stats`): what the pods
use, CPU core-seconds and working set per container
(:class:`gpufleet.virtual_kubelet.stats.PodStats`), as the backend reports
it; the virtual node serves it on its kubelet API
(:mod:`gpufleet.virtual_kubelet.kubelet_api`) for metrics-server and
``kubectl top``.

Objects (:meth:`Provider.put_object`, :meth:`Provider.delete_object`,
:meth:`Provider.get_objects`): the ConfigMaps and Secrets a pod references
(:func:`gpufleet.virtual_kubelet.translate.references`), put by the pod side before the
pod is created there, kept in sync while a pod referencing them runs there,
and deleted once none does (:mod:`gpufleet.virtual_kubelet.reflect`). A provider keeps
them as its backend allows (another cluster: in the remote namespace; a
rental: as its API stores files and environment). A Secret's data never
appears in a provider's logs or errors: messages that may quote it pass
through :func:`redact`.

Errors: :class:`ProviderError` for anything a provider cannot do (the pod
side marks the pod Failed with its ``reason`` and message);
:class:`PodNotFound` when the remote pod does not exist.

Choosing a provider for a pod (:func:`choose`): only providers whose GPU
model matches the pod's ``nvidia.com/gpu.product`` node selector (if it
has one), then only those with free capacity for its requests, then the
lowest price per GPU-hour (ties: the most free GPUs, then the name).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gpufleet.fleet.capacity import pod_resource_requests
from gpufleet.names import (  # noqa: F401 (SOURCE_*: re-exported for the providers)
    GPU_PRODUCT_LABEL, GPU_RESOURCE, REMOTE_NODE_LABEL, REMOTE_SERVICE_LABEL, SOURCE_NAME, SOURCE_NAMESPACE, SOURCE_UID,
)

#: Default CPU cores and memory (bytes) a rented or remote GPU comes with (a typical 8-GPU node's share).
CPU_PER_GPU = 28
MEMORY_PER_GPU = 256 * 2**30

#: Labels a provider adds to remote pods (not the source pod's: label sync leaves them out).
TAG_LABELS = (REMOTE_NODE_LABEL, REMOTE_SERVICE_LABEL)

Pod = dict[str, Any]
#: Called by a provider when a remote pod's status changed: ``(source namespace, source name)``.
Notifier = Callable[[str, str], None]


class ProviderError(RuntimeError):
    """A provider could not do what was asked.

    Attributes:
        reason: CamelCase reason for the pod status / Event (``ProviderFailed``,
            ``OutOfCapacity``, ``Refused``...).
        retryable: whether trying again later may succeed (the pod side then
            requeues instead of failing the pod).
    """

    def __init__(self, message: str, *, reason: str = "ProviderFailed", retryable: bool = False):
        super().__init__(message)
        self.reason = reason
        self.retryable = retryable


class PodNotFound(ProviderError):
    """The provider has no pod for this source pod."""

    def __init__(self, message: str):
        super().__init__(message, reason="ProviderLost")


@dataclass(frozen=True)
class Capacity:
    """What a provider can run at most: GPUs, CPU cores, memory bytes, pods; price in USD per GPU-hour."""

    gpus: int
    cpu: int
    memory_bytes: int
    pods: int
    gpu_product: str
    price_per_gpu_hour: float

    def resources(self) -> dict[str, str]:
        """As Node ``status.capacity``: ``{"nvidia.com/gpu": "64", "cpu": "2048", "memory": "...", "pods": "1000"}``."""
        return {GPU_RESOURCE: str(self.gpus), "cpu": str(self.cpu), "memory": str(self.memory_bytes),
                "pods": str(self.pods)}


@dataclass
class RemotePod:
    """A remote pod as :meth:`Provider.get_pods` lists it: the source UID it belongs to and its ref."""

    source_uid: str
    namespace: str
    name: str
    status: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Address:
    """Where the main cluster reaches a pod that runs outside.

    Attributes:
        ip: an IPv4 or IPv6 address (EndpointSlices carry IPs; data planes ignore FQDN slices).
        ports: ``{(protocol, containerPort): port}`` where the provider maps
            ports (a rental's public ports); None: every container port is
            reached at its own number.
        shared: the address serves several pods (a load balancer in front
            of a workload's remote pods), not this pod alone.
    """

    ip: str
    ports: dict[tuple[str, int], int] | None = field(default=None, hash=False)
    shared: bool = False

    def port_for(self, protocol: str, container_port: int) -> int | None:
        """The port ``container_port``/``protocol`` is reached at, or None if the provider does not expose it."""
        if self.ports is None:
            return container_port
        return self.ports.get((protocol, container_port))


@dataclass(frozen=True, order=True)
class ObjectRef:
    """A ConfigMap or Secret a provider holds for the source namespace ``namespace`` (``kind``: ConfigMap or Secret)."""

    kind: str
    namespace: str
    name: str


#: Secret types whose meaning is this cluster's (a token of one of its ServiceAccounts): reflected as Opaque.
LOCAL_SECRET_TYPES = ("kubernetes.io/service-account-token",)


def object_payload(obj: dict[str, Any]) -> dict[str, Any]:
    """What a provider stores of a ConfigMap or Secret: ``data``, ``binaryData`` (ConfigMap), ``type`` (Secret).

    Values stay as the API gives them (a Secret's ``data`` base64). Not its
    labels, annotations, owners or ``immutable`` (the copy is the provider's
    to update while the source changes).
    """
    out = {k: dict(obj[k]) for k in ("data", "binaryData") if obj.get(k)}
    if obj.get("kind") == "Secret":
        kind = obj.get("type") or "Opaque"
        out["type"] = "Opaque" if kind in LOCAL_SECRET_TYPES else kind
    return out


def redact(text: str, obj: dict[str, Any] | None) -> str:
    """``text`` with every value of Secret ``obj``'s ``data`` (base64 as given, and decoded) and ``stringData``
    replaced by ``<redacted>``; ``text`` as is for anything else. For messages (errors, logs) that may quote one."""
    if not obj or obj.get("kind") != "Secret":
        return text
    values: set[str] = set()
    for v in (obj.get("data") or {}).values():
        if not v:
            continue
        values.add(v)
        try:
            plain = base64.b64decode(v).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        values.update({plain, plain.strip()} - {""})
    values.update(v for v in (obj.get("stringData") or {}).values() if v)
    for v in sorted(values, key=len, reverse=True):
        text = text.replace(v, "<redacted>")
    return text


@runtime_checkable
class Provider(Protocol):
    """A backend that runs pods for one virtual node (see the module docstring)."""

    name: str

    def create_pod(self, pod: Pod) -> None:
        """Start ``pod`` remotely; idempotent per source UID (an existing remote pod is adopted).

        Raises:
            ProviderError: refused, out of capacity, or the backend failed.
        """

    def update_pod(self, pod: Pod) -> None:
        """Apply what may change on a running pod (labels, annotations); raises ProviderError."""

    def delete_pod(self, pod: Pod) -> None:
        """Stop and remove the remote pod of ``pod`` (no error if already gone)."""

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        """The remote pod of source pod ``namespace/name`` as the provider sees it, or None."""

    def get_pod_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod status to mirror onto the source pod, or None if the remote pod is gone.

        Shape: a Pod ``status`` dict (``phase``, ``conditions``,
        ``containerStatuses``, ``startTime``, ``podIP``, ``reason``, ``message``).
        """

    def get_pods(self) -> list[RemotePod]:
        """Every remote pod this provider runs for this virtual node (for resync and orphan GC)."""

    def pod_address(self, namespace: str, name: str) -> Address | None:
        """Where the main cluster reaches the remote pod of source pod ``namespace/name``.

        None while there is none (not started, no IP yet, load balancer not
        provisioned, pod gone); readiness is not its business (the pod's
        mirrored conditions are).
        """

    def capacity(self) -> Capacity:
        """What the provider offers (the virtual node's capacity and allocatable)."""

    def used(self) -> dict[str, float]:
        """What its running (non-terminal) remote pods request now, as :func:`pod_requests` shapes it."""

    def put_object(self, kind: str, namespace: str, obj: dict[str, Any]) -> None:
        """Create or update the provider's copy of ConfigMap or Secret ``obj`` of source namespace ``namespace``.

        ``kind``: ConfigMap or Secret; ``obj``: the source object (API JSON;
        the provider keeps :func:`object_payload` of it under its name).

        Raises:
            ProviderError: the backend refused or is unreachable (message redacted: :func:`redact`).
        """

    def delete_object(self, kind: str, namespace: str, name: str) -> None:
        """Remove the provider's copy of ``kind`` ``namespace/name`` (no error if it is gone); raises ProviderError."""

    def get_objects(self) -> list[ObjectRef]:
        """Every ConfigMap and Secret the provider holds for this virtual node (for the clean-up after a restart)."""

    # Optional: ``notify_pods(callback: Notifier) -> None`` registers a callback
    # the provider calls whenever a remote pod's status changes, so status
    # reaches the source pod without waiting for the next resync.
    #
    # Optional: ``dial(ip, port, timeout) -> None``, a TCP connect to one of its
    # published addresses for a provider whose addresses exist only in a
    # simulation (raises OSError as a refused or timed-out connect would); the
    # endpoint health check (gpufleet.virtual_kubelet.endpoint_health) uses it instead of a socket.
    # Optional: ``sweep() -> None``, called on every resync of the pod side:
    # the provider removes what it keeps for pods that are gone (the kubernetes
    # provider's load-balancer Services).


def supports_objects(provider: Any) -> bool:
    """Whether ``provider`` carries ConfigMaps and Secrets (``put_object``, ``delete_object``, ``get_objects``)."""
    return all(callable(getattr(provider, m, None)) for m in ("put_object", "delete_object", "get_objects"))


def supports_stats(provider: Any) -> bool:
    """Whether ``provider`` reports what its pods use: the optional ``pod_stats() -> list[PodStats]``
    (:mod:`gpufleet.virtual_kubelet.stats`; raises :class:`ProviderError` when the backend cannot say)."""
    return callable(getattr(provider, "pod_stats", None))


def supports_notify(provider: Any) -> bool:
    """Whether ``provider`` has the optional ``notify_pods(callback)``."""
    return callable(getattr(provider, "notify_pods", None))


# ------------------------------------------------------------------------------- resources


def pod_requests(pod: Pod) -> dict[str, float]:
    """What a pod requests, as floats for the providers' sums of free and used capacity.

    The rule is :func:`gpufleet.fleet.capacity.pod_resource_requests`'s
    (kube-scheduler's: containers and sidecars summed, the larger init step,
    ``spec.overhead`` added, requests defaulting to limits). Shape:
    ``{"nvidia.com/gpu": 1.0, "cpu": 4.0, "memory": 34359738368.0}``.

    Raises:
        gpufleet.kube.quantity.GpuCountError: a fractional GPU count, naming the pod and value.
        ValueError: a value that is not a quantity, naming the pod.
    """
    return {k: float(v) for k, v in pod_resource_requests(pod).items()}


# ------------------------------------------------------------------------------- choice


@dataclass(frozen=True)
class Offer:
    """One provider's standing for a pod: what it has free now (``free`` as in :func:`pod_requests`)."""

    name: str
    gpu_product: str
    price_per_gpu_hour: float
    free: dict[str, float]


class NoProvider(ProviderError):
    """No provider fits the pod (GPU model or capacity); the message says which and why."""

    def __init__(self, message: str, *, retryable: bool):
        super().__init__(message, reason="NoProvider" if not retryable else "OutOfCapacity", retryable=retryable)


def choose(pod: Pod, offers: Iterable[Offer]) -> str:
    """The provider to run ``pod``: GPU model fit, then free capacity, then lowest price per GPU-hour.

    Args:
        pod: the source pod (its ``nodeSelector[nvidia.com/gpu.product]`` and requests matter).
        offers: one :class:`Offer` per provider.

    Returns:
        The chosen provider's name.

    Raises:
        NoProvider: no provider has the GPU model (not retryable: the pod
            cannot run here), or none has room right now (retryable).
    """
    offers = list(offers)
    wanted = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
    models = [o for o in offers if not wanted or o.gpu_product == wanted]
    if not models:
        have = ", ".join(sorted({o.gpu_product for o in offers})) or "none"
        raise NoProvider(f"no provider has GPU model {wanted} (nodeSelector {GPU_PRODUCT_LABEL}); available: {have}",
                         retryable=False)
    req = pod_requests(pod)
    fits = [o for o in models
            if all(o.free.get(k, 0.0) >= v for k, v in req.items() if k in (GPU_RESOURCE, "cpu", "memory", "pods"))]
    if not fits:
        short = "; ".join(f"{o.name}: {GPU_RESOURCE} free {o.free.get(GPU_RESOURCE, 0):g} of "
                          f"{req.get(GPU_RESOURCE, 0):g} asked" for o in models)
        raise NoProvider(f"no provider has room for the pod now ({short})", retryable=True)
    best = min(fits, key=lambda o: (o.price_per_gpu_hour, -o.free.get(GPU_RESOURCE, 0.0), o.name))
    return best.name
