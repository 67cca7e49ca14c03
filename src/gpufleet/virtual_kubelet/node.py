"""The node side of the virtual kubelet: the Node object and its status.

The Node is named ``vk-<pool>`` and carries:

* labels ``type=virtual-kubelet`` and ``gpufleet.io/pool=<pool>`` (the names
  every gpufleet part shares), ``gpufleet.io/provider=<provider>``,
  ``kubernetes.io/role=agent``, ``kubernetes.io/hostname``,
  ``kubernetes.io/os=linux`` and ``nvidia.com/gpu.product`` (so pods asking
  for another GPU model are never scheduled here). No ``gpufleet.io/flavor``:
  Kueue's ResourceFlavors never select virtual nodes.
* taint ``virtual-kubelet.io/provider=<provider>:NoSchedule`` (only pods
  that tolerate it, i.e. inference, come here). Other taints on the Node
  (the taint controller's) are left as they are: taints are updated by
  read-modify-write with the resourceVersion, never overwritten.
* at creation only, the ``register_taints`` (the kubelet's
  ``--register-with-taints``): the virtual_kubelet role registers the node
  with the taint controller's free-GPU taint, so a new virtual node is
  closed until the taint controller decides to open it, instead of taking
  inference before any decision (a rental bill at the first ``pulumi up``).
  A node that already exists keeps the taints it has: the taint
  controller's decision stands across virtual kubelet restarts.
* ``status.capacity`` = ``status.allocatable`` = the provider's capacity
  (``nvidia.com/gpu``, ``cpu``, ``memory``, ``pods``), conditions
  ``Ready=True`` (``KubeletReady``) and no pressure, ``nodeInfo`` naming
  gpufleet, and an ``InternalIP`` address.

Liveness is the Lease (:mod:`gpufleet.virtual_kubelet.lease`); the status is refreshed
every ``status_interval`` seconds (kubelet: 5 minutes when unchanged) and
whenever the capacity changes.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gpufleet.kube import Conflict, Kube, KubeError, NotFound, api_path
from gpufleet.kube.retry import update_with_retry
from gpufleet.kube.times import now_rfc3339

from .provider import Capacity
from gpufleet.names import (GPU_PRODUCT_LABEL, POOL_LABEL, PRICE_ANNOTATION, PROVIDER_LABEL, VIRTUAL_NODE_LABEL,
                            VIRTUAL_NODE_TAINT)

log = logging.getLogger(__name__)

STATUS_INTERVAL = 60.0
VERSION = "gpufleet-vk/0.1.0"


def node_name_for(pool: str) -> str:
    """The virtual node's name for ``pool`` (``vk-<pool>``; the taint controller's PromQL excludes ``vk-.*``)."""
    return f"vk-{pool}"


def labels(pool: str, provider: str, gpu_product: str, node_name: str) -> dict[str, str]:
    """The virtual node's labels (see the module docstring)."""
    return {
        VIRTUAL_NODE_LABEL[0]: VIRTUAL_NODE_LABEL[1],
        POOL_LABEL: pool,
        PROVIDER_LABEL: provider,
        "kubernetes.io/role": "agent",
        "kubernetes.io/hostname": node_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        GPU_PRODUCT_LABEL: gpu_product,
    }


def provider_taint(provider: str) -> dict[str, str]:
    """``virtual-kubelet.io/provider=<provider>:NoSchedule``."""
    return {"key": VIRTUAL_NODE_TAINT, "value": provider, "effect": "NoSchedule"}


def conditions(ready: bool = True, message: str = "") -> list[dict[str, Any]]:
    """Node conditions: Ready plus the three pressure conditions (False), heartbeat now."""
    now = now_rfc3339()

    def c(kind: str, status: str, reason: str, msg: str) -> dict:
        return {"type": kind, "status": status, "reason": reason, "message": msg,
                "lastHeartbeatTime": now, "lastTransitionTime": now}

    return [
        c("Ready", "True" if ready else "False", "KubeletReady" if ready else "ProviderNotReady",
          message or ("gpufleet virtual kubelet is ready" if ready else "the provider is not ready")),
        c("MemoryPressure", "False", "KubeletHasSufficientMemory", "no memory pressure on a virtual node"),
        c("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure on a virtual node"),
        c("PIDPressure", "False", "KubeletHasSufficientPID", "no PID pressure on a virtual node"),
    ]


def node_status(capacity: Capacity, internal_ip: str, ready: bool = True, kubelet_port: int = 0) -> dict[str, Any]:
    """The Node ``status`` for ``capacity`` (capacity = allocatable); ``kubelet_port``: where the kubelet API
    answers on ``internal_ip`` (:mod:`gpufleet.virtual_kubelet.kubelet_api`; 0: not served)."""
    res = capacity.resources()
    return {
        "capacity": res,
        "allocatable": dict(res),
        "conditions": conditions(ready),
        "addresses": [{"type": "InternalIP", "address": internal_ip}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {"kubeletVersion": VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                     "architecture": "amd64", "containerRuntimeVersion": "gpufleet://provider",
                     "osImage": "gpufleet virtual node", "kernelVersion": "", "machineID": "", "systemUUID": "",
                     "bootID": ""},
    }


def node_manifest(pool: str, provider: str, capacity: Capacity, internal_ip: str = "127.0.0.1",
                  register_taints: list[dict[str, str]] | tuple = (), kubelet_port: int = 0) -> dict[str, Any]:
    """The whole Node object a virtual kubelet registers for ``pool`` (``register_taints`` after the provider's)."""
    name = node_name_for(pool)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels(pool, provider, capacity.gpu_product, name),
                     "annotations": {PRICE_ANNOTATION: f"{capacity.price_per_gpu_hour:g}"}},
        "spec": {"taints": [provider_taint(provider),
                            *(dict(t) for t in register_taints if t.get("key") != VIRTUAL_NODE_TAINT)]},
        "status": node_status(capacity, internal_ip, kubelet_port=kubelet_port),
    }


class NodeController:
    """Registers the virtual node and keeps its status fresh.

    Args:
        kube: client of the cluster.
        pool / provider_kind: pool name and provider kind (``kubernetes``, ``simulated``).
        capacity: callable returning the provider's current :class:`Capacity`.
        internal_ip: the node's InternalIP (the pod IP of the virtual kubelet in-cluster).
        status_interval: seconds between status refreshes.
        register_taints: taints the Node is created with besides the provider's (module docstring).
        kubelet_port: the kubelet API's port on ``internal_ip`` (0: not served).

    Attributes:
        name: the Node name; uid: its UID once registered.
    """

    def __init__(self, kube: Kube, pool: str, provider_kind: str, capacity, *, internal_ip: str = "127.0.0.1",
                 status_interval: float = STATUS_INTERVAL, register_taints: list[dict[str, str]] | tuple = (),
                 kubelet_port: int = 0):
        self.kube = kube
        self.kubelet_port = kubelet_port
        self.register_taints = list(register_taints)
        self.pool = pool
        self.provider_kind = provider_kind
        self.capacity = capacity
        self.internal_ip = internal_ip
        self.status_interval = status_interval
        self.name = node_name_for(pool)
        self.uid: str | None = None
        self._last_capacity: Capacity | None = None
        self._stop = threading.Event()

    def register(self) -> dict:
        """Create the Node, or bring an existing one up to date (labels, provider taint, status).

        Returns:
            The Node as stored.

        Raises:
            KubeError: the API server refused or is unreachable.
        """
        cap = self.capacity()
        want = node_manifest(self.pool, self.provider_kind, cap, self.internal_ip, self.register_taints,
                             self.kubelet_port)
        try:
            node = self.kube.create("v1", "nodes", want)
        except Conflict:
            node = self.kube.patch("v1", "nodes", self.name, {"metadata": {"labels": want["metadata"]["labels"],
                                                                          "annotations": want["metadata"]["annotations"]}})
            self._ensure_taint()
            node = self.update_status(cap)
        self.uid = node["metadata"]["uid"]
        self._last_capacity = cap
        return node

    def _ensure_taint(self) -> dict:
        """Add our provider taint if missing, leaving other taints alone (resourceVersion-guarded, re-read on conflicts)."""
        want = provider_taint(self.provider_kind)

        def change(live: dict) -> dict | None:
            taints = (live.get("spec") or {}).get("taints") or []
            if want in taints:
                return None
            return {"spec": {"taints": [t for t in taints if t.get("key") != VIRTUAL_NODE_TAINT] + [want]}}

        return update_with_retry(self.kube, api_path("v1", "nodes", name=self.name), change)[0]

    def update_status(self, cap: Capacity | None = None, ready: bool = True) -> dict:
        """Patch the Node status (conditions heartbeat, capacity, allocatable).

        Raises:
            NotFound: the Node was deleted (call :meth:`register` again).
        """
        cap = cap or self.capacity()
        body = {"status": node_status(cap, self.internal_ip, ready, self.kubelet_port)}
        node = self.kube.patch("v1", "nodes", self.name, body, subresource="status", patch="strategic")
        self._last_capacity = cap
        return node

    def run(self) -> None:
        """Refresh the status every ``status_interval`` s (sooner when capacity changes); re-register if deleted."""
        waited = 0.0
        while not self._stop.wait(1.0):
            waited += 1.0
            try:
                cap = self.capacity()
                if waited >= self.status_interval or cap != self._last_capacity:
                    waited = 0.0
                    self.update_status(cap)
            except NotFound:
                log.warning("node %s was deleted; registering it again", self.name)
                try:
                    self.register()
                except KubeError as exc:
                    log.warning("node %s: registration failed: %s", self.name, exc)
            except KubeError as exc:
                log.warning("node %s: status update failed: %s", self.name, exc)

    def start(self) -> "NodeController":
        """Run :meth:`run` in a daemon thread; returns self."""
        threading.Thread(target=self.run, daemon=True, name=f"node-{self.name}").start()
        return self

    def stop(self) -> None:
        """Stop refreshing."""
        self._stop.set()
