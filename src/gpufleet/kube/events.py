"""core/v1 Events: what ``kubectl describe`` shows about an object, recorded and read the same way everywhere."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .client import api_path
from .errors import KubeError

if TYPE_CHECKING:
    from .client import Kube

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def object_ref(obj: Obj) -> Obj:
    """An ObjectReference (core/v1) for ``obj``: apiVersion, kind, name, namespace, uid, resourceVersion."""
    meta = obj.get("metadata", {})
    ref = {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Node"), "name": meta.get("name")}
    for k in ("namespace", "uid", "resourceVersion"):
        if meta.get(k):
            ref[k] = meta[k]
    return ref


def record_event(kube: "Kube", obj: Obj, reason: str, message: str, *, type_: str = "Normal",
                 component: str = "gpufleet", action: str | None = None, instance: str | None = None,
                 host: str | None = None, count: int = 1) -> Obj | None:
    """Create a core/v1 Event about ``obj``; a failure to record is logged, never raised.

    Events of cluster-scoped objects (Nodes, ClusterQueues) go to namespace
    ``default``, as the kubelet does for Nodes. An event is a record, not a
    step: the caller's work never fails because of one.

    Args:
        obj: the object (dict with apiVersion, kind, metadata).
        reason: CamelCase reason, e.g. ``NodeSwapRequested``.
        message: human text (truncated to 1 KiB).
        type_: ``Normal`` or ``Warning``.
        component: reporting component, e.g. ``gpufleet-node-health``.
        action: what was done, e.g. ``Swap`` (default: the reason).
        instance: reporting instance (default: the component).
        host: ``source.host`` (the node, for events a node agent records).
        count: how many times it happened (a retried step's attempts, recorded in one Event).

    Returns:
        The Event created, or None when it could not be.
    """
    ref = object_ref(obj)
    ns = ref.get("namespace") or "default"
    now = datetime.now(timezone.utc)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    source = {"component": component, **({"host": host} if host else {})}
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{ref['name']}.{uuid.uuid4().hex[:12]}", "namespace": ns},
        "involvedObject": ref, "reason": reason, "message": message[:1024], "type": type_,
        "source": source, "reportingComponent": component, "reportingInstance": instance or component,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": count,
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "action": action or reason,
    }
    try:
        return kube.create("v1", "events", event, ns)
    except KubeError as exc:
        log.warning("could not record event %s on %s/%s: %s", reason, ref["kind"], ref["name"], exc)
        return None


def events_for(kube: "Kube", kind: str, name: str, namespace: str = "default") -> list[Obj]:
    """Events about ``kind/name`` in ``namespace``, oldest first."""
    items = kube.list_all(api_path("v1", "events", namespace),
                          field_selector=f"involvedObject.kind={kind},involvedObject.name={name}")[0]
    return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
