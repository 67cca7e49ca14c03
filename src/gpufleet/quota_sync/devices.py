"""Quota sync's view of GPUs allocated through DRA: the ResourceSlices and DeviceTaintRules, watched.

A DRA node's GPUs are the devices of NVIDIA's driver's ResourceSlices, and
a GPU taken out of service is a device taint (:mod:`gpufleet.fleet.devices`):
a GPU going out or coming back changes no Node, so quota sync watches both
collections and resyncs on their changes as on a Node's, within its
debounce. The classifier then counts each DRA node per device
(:func:`gpufleet.fleet.classify.classify`), and the partial-node policy
(``kueue_partial_gpu_nodes_count``) decides whether a node with a GPU out
still counts for training.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from gpufleet.fleet.devices import Gpu, gpus_by_node
from gpufleet.kube import Kube, api_path
from gpufleet.kube.informer import Informer
from gpufleet.names import GPU_DRIVER, RESOURCE_API

Obj = dict[str, Any]
#: Server-side timeout of one watch request (as the Node watch).
WATCH_SECONDS = 240


class Dirty(Protocol):
    """What is told of a change: the Node cache's ``_mark`` (one burst, one resync)."""

    def _mark(self) -> None: ...


def slim_slice(obj: Obj) -> Obj:
    """What is kept of a ResourceSlice: driver, node, pool, and per device its name, taints and identity attributes."""
    spec = obj.get("spec") or {}
    return {"metadata": {"name": (obj.get("metadata") or {}).get("name")},
            "spec": {"driver": spec.get("driver"), "nodeName": spec.get("nodeName"), "pool": spec.get("pool") or {},
                     "devices": [{k: d[k] for k in ("name", "attributes", "taints") if k in d}
                                 for d in spec.get("devices") or []]}}


def slim_rule(obj: Obj) -> Obj:
    """What is kept of a DeviceTaintRule: its name, selector and taint."""
    spec = obj.get("spec") or {}
    return {"metadata": {"name": (obj.get("metadata") or {}).get("name")},
            "spec": {"deviceSelector": spec.get("deviceSelector"), "taint": spec.get("taint") or {}}}


class DeviceWatch:
    """ResourceSlices of ``gpu.nvidia.com`` and DeviceTaintRules as last seen; a change marks ``dirty``.

    On a cluster that does not serve ``resource.k8s.io/v1`` the informers
    retry in the background and :meth:`gpus` stays empty: every node is then
    counted as a device-plugin node.
    """

    def __init__(self, kube: Kube | None, dirty: Dirty):
        self.dirty = dirty
        self.slices: Informer[Obj] = Informer(kube, api_path(RESOURCE_API, "resourceslices"),
                                              params={"fieldSelector": f"spec.driver={GPU_DRIVER}"},
                                              transform=slim_slice, handlers=[self._on_slice],
                                              name="quota-resourceslices", watch_timeout=WATCH_SECONDS)
        self.rules: Informer[Obj] = Informer(kube, api_path(RESOURCE_API, "devicetaintrules"), transform=slim_rule,
                                             handlers=[self._on_rule], name="quota-devicetaintrules",
                                             watch_timeout=WATCH_SECONDS)

    @property
    def informers(self) -> list[Informer[Obj]]:
        """Both informers (started and stopped with quota sync's others)."""
        return [self.slices, self.rules]

    def _changed(self, informer: Informer[Obj], kind: str, new: Obj, old: Obj | None) -> None:
        if informer.synced.is_set() and (kind != "MODIFIED" or json.dumps(new, sort_keys=True) != json.dumps(old, sort_keys=True)):
            self.dirty._mark()

    def _on_slice(self, kind: str, new: Obj, old: Obj | None) -> None:
        self._changed(self.slices, kind, new, old)

    def _on_rule(self, kind: str, new: Obj, old: Obj | None) -> None:
        self._changed(self.rules, kind, new, old)

    def gpus(self) -> dict[str, list[Gpu]]:
        """node -> its DRA GPUs with their taints, from the caches (:func:`gpufleet.fleet.devices.gpus_by_node`)."""
        return gpus_by_node(self.slices.items(), self.rules.items())
