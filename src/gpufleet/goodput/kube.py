"""Every API call of the goodput accountant (reads only) and of the fault replay, in one place.

Built on :mod:`gpufleet.ops.kube` (plain JSON dicts, paged lists, watch
streams). :class:`Watched` keeps a collection current the way an informer
does: one list, then a watch from its resourceVersion, a new list only when
the watch's resourceVersion has expired (410 Gone).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpufleet.names import KUEUE_GROUP, KUEUE_VERSION
from gpufleet.ops.kube import call_json, list_items, patch, watch_json

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def workloads_path(namespace: str | None = None) -> str:
    """Kueue Workloads of ``namespace`` (None: all namespaces)."""
    base = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}"
    return f"{base}/namespaces/{namespace}/workloads" if namespace else f"{base}/workloads"


def pods_path(namespace: str | None = None) -> str:
    """Pods of ``namespace`` (None: all namespaces)."""
    return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"


def list_workloads(api, namespace: str | None = None) -> list[Obj]:
    """Every Workload of ``namespace`` (None: all)."""
    return list_items(api, workloads_path(namespace))[0]


def list_pods(api, namespace: str | None = None, label_selector: str | None = None) -> list[Obj]:
    """Pods of ``namespace`` (None: all) matching ``label_selector``."""
    return list_items(api, pods_path(namespace), label_selector=label_selector)[0]


def workload_events(api, namespace: str, name: str | None = None) -> list[Obj]:
    """Events about Workloads of ``namespace`` (only Workload ``name`` when given)."""
    selector = "involvedObject.kind=Workload" + (f",involvedObject.name={name}" if name else "")
    return list_items(api, f"/api/v1/namespaces/{namespace}/events", field_selector=selector)[0]


def node_events(api) -> list[Obj]:
    """Events about Nodes (recorded in namespace ``default``, as the kubelet and node health do)."""
    return list_items(api, "/api/v1/namespaces/default/events", field_selector="involvedObject.kind=Node")[0]


def list_nodes(api) -> list[Obj]:
    """Every Node."""
    return list_items(api, "/api/v1/nodes")[0]


def get(api, path: str) -> Obj | None:
    """The object at ``path``, None when it does not exist."""
    try:
        return call_json(api, "GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def list_pages(api, path: str, *, label_selector: str | None = None, limit: int = 500,
               version: list[str] | None = None) -> Iterator[Obj]:
    """Every item of a list endpoint, one page (``limit``) in memory at a time.

    ``version``, when given, receives the list's resourceVersion once the last page is read.
    """
    cont: str | None = None
    while True:
        query: list[tuple[str, Any]] = [("limit", limit)]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if cont:
            query.append(("continue", cont))
        page = call_json(api, "GET", path, query=query, timeout=120)
        yield from page.get("items") or []
        meta = page.get("metadata") or {}
        cont = meta.get("continue")
        if not cont:
            if version is not None:
                version.append(meta.get("resourceVersion", ""))
            return


class Watched:
    """One collection kept current: ``on_list(items)`` after each list, ``on_event(type, obj)`` per change.

    Args:
        api: the client.
        path: the collection (e.g. :func:`pods_path`).
        on_list: called with an iterable of every item at each (re)list, read page by page
            (consume it once).
        on_event: called with ``ADDED``/``MODIFIED``/``DELETED`` and the object.
        label_selector: optional.
        watch_seconds: how long each watch request lasts before it is renewed.
    """

    def __init__(self, api, path: str, on_list: Callable[[Iterable[Obj]], None], on_event: Callable[[str, Obj], None], *,
                 label_selector: str | None = None, watch_seconds: int = 300):
        self.api, self.path, self.on_list, self.on_event = api, path, on_list, on_event
        self.label_selector, self.watch_seconds = label_selector, watch_seconds
        self.synced = threading.Event()

    def run(self, stop: threading.Event) -> None:
        """List and watch until ``stop`` is set (errors are logged and retried with a back-off)."""
        rv, backoff = None, 1.0
        while not stop.is_set():
            try:
                if rv is None:
                    version: list[str] = []
                    self.on_list(list_pages(self.api, self.path, label_selector=self.label_selector, version=version))
                    rv = version[-1] if version else None
                    if rv is None:
                        raise RuntimeError("the list ended without a resourceVersion")
                    self.synced.set()
                for kind, obj in watch_json(self.api, self.path, resource_version=rv, timeout_seconds=self.watch_seconds,
                                            label_selector=self.label_selector):
                    if stop.is_set():
                        return
                    if kind == "ERROR":
                        rv = None  # 410 Gone (or another error status): list again
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind != "BOOKMARK":
                        self.on_event(kind, obj)
                backoff = 1.0
            except Exception as exc:  # noqa: BLE001 - a watch loop logs, backs off and retries
                log.warning("watching %s: %s; retrying in %.0fs", self.path, exc, backoff)
                rv = None
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def start(self, stop: threading.Event) -> threading.Thread:
        """Run in a daemon thread."""
        t = threading.Thread(target=self.run, args=(stop,), daemon=True, name=f"watch{self.path}")
        t.start()
        return t


# ------------------------------------------------------------------ the fault replay's writes

#: Kueue role kinds the replay needs present, with their collection (plural, namespaced).
QUEUE_KINDS = {"Namespace": ("namespaces", False), "PriorityClass": ("priorityclasses", False),
               "WorkloadPriorityClass": ("workloadpriorityclasses", False),
               "ResourceFlavor": ("resourceflavors", False), "ClusterQueue": ("clusterqueues", False),
               "LocalQueue": ("localqueues", True)}


def _collection(obj: Obj, plural: str, namespaced: bool) -> str:
    api_version = obj["apiVersion"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return f"{base}/namespaces/{obj['metadata']['namespace']}/{plural}" if namespaced else f"{base}/{plural}"


def create(api, path: str, body: Obj) -> Obj | None:
    """POST ``body`` to collection ``path``; None when it exists already (409)."""
    try:
        return call_json(api, "POST", path, body=body)
    except ApiException as exc:
        if exc.status == 409:
            return None
        raise


def delete(api, path: str) -> None:
    """DELETE ``path`` (foreground: dependents first); absent is fine."""
    try:
        call_json(api, "DELETE", path, body={"propagationPolicy": "Foreground"})
    except ApiException as exc:
        if exc.status != 404:
            raise


def ensure_queues(api, objects: list[Obj], timeout: float = 90.0) -> None:
    """Of ``objects`` (the kueue role's), the :data:`QUEUE_KINDS` ones created when absent; waits until
    their ClusterQueues are Active.

    Raises:
        TimeoutError: a ClusterQueue is not Active in ``timeout`` seconds.
    """
    wanted = [o for o in objects if o["kind"] in QUEUE_KINDS]
    for obj in wanted:
        create(api, _collection(obj, *QUEUE_KINDS[obj["kind"]]), obj)
    deadline = time.monotonic() + timeout
    for obj in (o for o in wanted if o["kind"] == "ClusterQueue"):
        path = f"{_collection(obj, 'clusterqueues', False)}/{obj['metadata']['name']}"
        while not any(c.get("type") == "Active" and c.get("status") == "True"
                      for c in ((get(api, path) or {}).get("status") or {}).get("conditions") or []):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ClusterQueue {obj['metadata']['name']} not Active after {timeout:.0f}s")
            time.sleep(0.5)


def label_node(api, node: str, key: str, value: str | None) -> None:
    """Set (or remove, ``value`` None) one label of Node ``node``; absent nodes are fine."""
    try:
        patch(api, f"/api/v1/nodes/{node}", {"metadata": {"labels": {key: value}}})
    except ApiException as exc:
        if exc.status != 404:
            raise


def annotate_pod(api, namespace: str, pod: str, key: str, value: str) -> None:
    """Set one annotation of a pod (a simulated pod's run time ends it); absent pods are fine."""
    try:
        patch(api, f"/api/v1/namespaces/{namespace}/pods/{pod}", {"metadata": {"annotations": {key: value}}})
    except ApiException as exc:
        if exc.status != 404:
            raise


def now() -> float:
    """Unix seconds (one place to read the clock)."""
    return time.time()
