"""Every API call of the goodput accountant (reads only) and of the fault replay, in one place.

Built on :class:`gpufleet.kube.Kube` (plain JSON dicts, typed errors). The
accountant's watches are :class:`gpufleet.kube.informer.Informer` s
(:func:`informers`): one list, then a watch from its resourceVersion, a new
list only when the watch's resourceVersion has expired (410 Gone). Each
informer keeps, per object, only the :class:`~gpufleet.goodput.tracker.Tracker`'s
compact record of it, so the accountant's memory stays that of its records
at 20,000 pods, not of 20,000 pod objects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from gpufleet.kube import Conflict, Kube, NotFound, api_path
from gpufleet.kube.informer import Informer
from gpufleet.names import KUEUE_API
from gpufleet.wait import poll_until

log = logging.getLogger(__name__)

Obj = dict[str, Any]



def workloads_path(namespace: str | None = None) -> str:
    """Kueue Workloads of ``namespace`` (None: all namespaces)."""
    return api_path(KUEUE_API, "workloads", namespace)


def pods_path(namespace: str | None = None) -> str:
    """Pods of ``namespace`` (None: all namespaces)."""
    return api_path("v1", "pods", namespace)


def list_workloads(kube: Kube, namespace: str | None = None) -> list[Obj]:
    """Every Workload of ``namespace`` (None: all)."""
    return kube.list_all(workloads_path(namespace))[0]


def list_pods(kube: Kube, namespace: str | None = None, label_selector: str | None = None) -> list[Obj]:
    """Pods of ``namespace`` (None: all) matching ``label_selector``."""
    return kube.list_all(pods_path(namespace), label_selector=label_selector)[0]


def workload_events(kube: Kube, namespace: str, name: str | None = None) -> list[Obj]:
    """Events about Workloads of ``namespace`` (only Workload ``name`` when given)."""
    selector = "involvedObject.kind=Workload" + (f",involvedObject.name={name}" if name else "")
    return kube.list_all(api_path("v1", "events", namespace), field_selector=selector)[0]


def node_events(kube: Kube) -> list[Obj]:
    """Events about Nodes (recorded in namespace ``default``, as the kubelet and node health do)."""
    return kube.list_all(api_path("v1", "events", "default"), field_selector="involvedObject.kind=Node")[0]


def list_nodes(kube: Kube) -> list[Obj]:
    """Every Node."""
    return kube.list_all(api_path("v1", "nodes"))[0]


def list_pages(kube: Kube, path: str, *, label_selector: str | None = None, limit: int = 500) -> Iterator[Obj]:
    """Every item of the collection at ``path``, one page (``limit``) in memory at a time.

    Raises:
        gpufleet.kube.KubeError: a page could not be read.
    """
    cont: str | None = None
    while True:
        page = kube.request("GET", path, params={"limit": limit, "labelSelector": label_selector, "continue": cont},
                            timeout=120)
        yield from page.get("items") or []
        cont = (page.get("metadata") or {}).get("continue")
        if not cont:
            return


def _uid(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("uid", "")


def informers(kube: Kube, tracker, namespace: str | None = None, *, watch_timeout: int = 300) -> list[Informer]:
    """The two watch caches that feed ``tracker``: Workloads and pods of ``namespace`` (None: all); not started.

    Every version an informer sees is folded into the tracker as it arrives
    (the informer keeps only the object's uid); a deletion, or an object
    absent from a relist, is the Workload forgotten or the pod ended at the
    time it is noticed, as :meth:`~gpufleet.goodput.tracker.Tracker.workloads_listed`
    and :meth:`~gpufleet.goodput.tracker.Tracker.pods_listed` treat an absent object.

    Args:
        kube: the client.
        tracker: a :class:`gpufleet.goodput.tracker.Tracker`.
        namespace: the jobs' namespace (None: every namespace).
        watch_timeout: seconds each watch request lasts before it is renewed.
    """

    def keep_workload(obj: Obj) -> str:
        tracker.observe_workload(obj)
        return _uid(obj)

    def on_workload(kind: str, uid: str, _old: Any) -> None:
        if kind == "DELETED":
            tracker.forget_workload({"metadata": {"uid": uid}})

    def keep_pod(obj: Obj) -> str:
        tracker.observe_pod(obj)
        return _uid(obj)

    def on_pod(kind: str, uid: str, _old: Any) -> None:
        if kind == "DELETED":
            tracker.pod_ended(uid, now())

    return [Informer(kube, workloads_path(namespace), transform=keep_workload, handlers=[on_workload],
                     name="goodput-workloads", watch_timeout=watch_timeout),
            Informer(kube, pods_path(namespace), transform=keep_pod, handlers=[on_pod],
                     name="goodput-pods", watch_timeout=watch_timeout)]


def forget_unlisted(tracker, workloads: Informer, timeout: float = 60.0) -> None:
    """Once the Workloads informer has listed, forget the jobs ``tracker`` knows from before it that are gone.

    The informer reports as DELETED only what it listed itself; Workloads an
    earlier read (:func:`gpufleet.goodput.main.snapshot`) folded in and
    deleted before the informer's first list would otherwise stay.
    """
    if not workloads.wait_synced(timeout):
        return
    listed = set(workloads.items())
    for rec in tracker.jobs():
        if rec.uid not in listed:
            tracker.forget_workload({"metadata": {"uid": rec.uid}})


# ------------------------------------------------------------------ the fault replay's writes

#: Kueue role kinds the replay needs present.
QUEUE_KINDS = ("Namespace", "PriorityClass", "WorkloadPriorityClass", "ResourceFlavor", "ClusterQueue", "LocalQueue")


def create(kube: Kube, obj: Obj) -> Obj | None:
    """Create manifest ``obj``; None when it exists already (409)."""
    try:
        return kube.create_object(obj)
    except Conflict:
        return None


def delete(kube: Kube, api_version: str, plural: str, name: str, namespace: str | None = None) -> None:
    """Delete an object (foreground: dependents first); absent is fine."""
    try:
        kube.delete(api_version, plural, name, namespace, propagation="Foreground")
    except NotFound:
        pass


def ensure_queues(kube: Kube, objects: list[Obj], timeout: float = 90.0) -> None:
    """Of ``objects`` (the kueue role's), the :data:`QUEUE_KINDS` ones created when absent; waits until
    their ClusterQueues are Active.

    Raises:
        TimeoutError: a ClusterQueue is not Active in ``timeout`` seconds.
    """
    wanted = [o for o in objects if o["kind"] in QUEUE_KINDS]
    for obj in wanted:
        create(kube, obj)
    deadline = time.monotonic() + timeout
    for obj in (o for o in wanted if o["kind"] == "ClusterQueue"):
        name = obj["metadata"]["name"]
        poll_until(lambda name=name: any(c.get("type") == "Active" and c.get("status") == "True"
                                         for c in ((kube.get_or_none(KUEUE_API, "clusterqueues", name) or {})
                                                   .get("status") or {}).get("conditions") or []),
                   what=f"ClusterQueue {name} Active", timeout=max(0.0, deadline - time.monotonic()), interval=0.5)


def label_node(kube: Kube, node: str, key: str, value: str | None) -> None:
    """Set (or remove, ``value`` None) one label of Node ``node``; absent nodes are fine."""
    try:
        kube.patch("v1", "nodes", node, {"metadata": {"labels": {key: value}}})
    except NotFound:
        pass


def annotate_pod(kube: Kube, namespace: str, pod: str, key: str, value: str) -> None:
    """Set one annotation of a pod (a simulated pod's run time ends it); absent pods are fine."""
    try:
        kube.patch("v1", "pods", pod, {"metadata": {"annotations": {key: value}}}, namespace)
    except NotFound:
        pass


def now() -> float:
    """Unix seconds (one place to read the clock)."""
    return time.time()
