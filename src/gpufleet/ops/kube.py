"""Talking to the API server for ops, quota sync and node health: clients, JSON reads, events, errors.

Reads return plain dicts (the API's JSON) through
``kubernetes.client.ApiClient`` with ``_preload_content=False``: no model
deserialisation, which matters at thousands of nodes. Writes that replace
lists (taints, ClusterQueue resource groups) carry the object's
``metadata.resourceVersion`` so a concurrent writer makes them fail with 409
instead of being overwritten; :func:`update_with_retry` re-reads and retries.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpufleet.fleet import nodes as nodeutil

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class OpsError(RuntimeError):
    """An operation cannot proceed; the message says why and what to do. Tasks exit 1 with it."""


class InputError(OpsError):
    """The command's input is wrong (unknown node, unreadable kubeconfig); tasks exit 2 with it."""


class NodeNotFound(InputError, LookupError):
    """No Node by that name; the message names it and lists near matches."""

    def __init__(self, node: str, candidates: list[str]):
        self.node = node
        self.candidates = candidates
        near = nodeutil.near_matches(node, candidates)
        hint = f"; near matches: {', '.join(near)}" if near else f"; the cluster has {len(candidates)} nodes"
        super().__init__(f"node {node!r} not found{hint}")


class Conflict(OpsError):
    """An optimistic-concurrency write still conflicted (HTTP 409) after every retry."""


def api_client(kubeconfig: str | None = None, context: str | None = None, *, env: str | None = None) -> client.ApiClient:
    """An ApiClient: in-cluster service account when no kubeconfig is given and one is mounted, else the kubeconfig.

    Args:
        kubeconfig: kubeconfig file (None: ``$KUBECONFIG`` or ``~/.kube/config``).
        context: kubeconfig context (None: the current one).
        env: inventory environment; for ``local`` with neither ``kubeconfig``
            nor ``$KUBECONFIG``, the admin kubeconfig of the local cluster
            (``invoke local.up``), as ``invoke up --env local`` uses.

    Raises:
        InputError: no usable configuration (names the file, or says where none was found).
    """
    import os
    from pathlib import Path

    # Read now: the client library reads $KUBECONFIG once, when it is imported.
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
    if kubeconfig is None and env == "local":
        from gpufleet.local.layout import DEFAULT_NAME, Layout

        if Layout(DEFAULT_NAME).kubeconfig.is_file():
            kubeconfig = str(Layout(DEFAULT_NAME).kubeconfig)
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    if kubeconfig is None:
        kubeconfig = "~/.kube/config"
        if not Path(kubeconfig).expanduser().is_file():
            raise InputError("no kubeconfig: --kubeconfig not given, $KUBECONFIG unset and ~/.kube/config "
                             "missing; give --kubeconfig FILE (for the local cluster: "
                             "export KUBECONFIG=$(invoke local.kubeconfig))")
    try:
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError, TypeError) as exc:
        raise InputError(f"--kubeconfig {kubeconfig}: {exc}") from None


#: Field manager of gpufleet's writes (server-side field ownership, ``metadata.managedFields``).
FIELD_MANAGER = "gpufleet"


def call_json(api: client.ApiClient, method: str, path: str, *, query: list[tuple[str, Any]] | None = None,
              body: Any = None, content_type: str = "application/json", timeout: float | None = 30.0) -> Obj:
    """One REST call returning the decoded JSON body.

    Args:
        method: GET, POST, PATCH, PUT or DELETE.
        path: API path, e.g. ``/api/v1/nodes``.
        query: query parameters.
        body: JSON-able request body.
        content_type: e.g. ``application/merge-patch+json`` for PATCH.
        timeout: seconds for the request.

    Writes carry ``fieldManager=gpufleet`` unless ``query`` names another.

    Raises:
        kubernetes.client.exceptions.ApiException: non-2xx answer (``.status``, ``.body``).
    """
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    query = list(query or [])
    if method in ("POST", "PUT", "PATCH") and not any(k == "fieldManager" for k, _ in query):
        query.append(("fieldManager", FIELD_MANAGER))  # managedFields name us, not the client library
    resp = _request(api, method, path, query, headers, body, timeout)
    data = resp.read()
    return json.loads(data) if data else {}


def _request(api: client.ApiClient, method: str, path: str, query: list[tuple[str, Any]] | None,
             headers: dict[str, str], body: Any, timeout: float | tuple[float, float] | None):
    """Send one request through ``api`` (auth, TLS, pool); raise ApiException on a non-2xx answer."""
    req = api.param_serialize(method, path, query_params=query or [], header_params=headers, body=body,
                              auth_settings=["BearerToken"])
    resp = api.call_api(*req, _request_timeout=timeout)
    if not 200 <= resp.status <= 299:
        resp.read()
        raise ApiException.from_response(http_resp=resp, body=None, data=None)
    return resp


def watch_json(api: client.ApiClient, path: str, *, resource_version: str, timeout_seconds: int = 300,
               label_selector: str | None = None, field_selector: str | None = None) -> Iterator[tuple[str, Obj]]:
    """Stream ``(type, object)`` watch events of a list endpoint from ``resource_version``.

    Types are ADDED, MODIFIED, DELETED, BOOKMARK (bookmarks are requested so
    the caller can resume from a recent resourceVersion) and ERROR (the
    object is a Status; 410 Gone means: list again). Ends when the server
    closes the watch (``timeout_seconds``).

    Raises:
        ApiException: the watch request itself failed.
    """
    query: list[tuple[str, Any]] = [("watch", "true"), ("resourceVersion", resource_version),
                                    ("allowWatchBookmarks", "true"), ("timeoutSeconds", timeout_seconds)]
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    resp = _request(api, "GET", path, query, {"Accept": "application/json"}, None, (10, timeout_seconds + 30))
    raw = resp.response
    buf = b""
    try:
        for chunk in raw.stream(65536, decode_content=True):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    ev = json.loads(line)
                    yield ev.get("type", ""), ev.get("object") or {}
    finally:
        raw.release_conn()


def list_items(api: client.ApiClient, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
               limit: int = 1000) -> tuple[list[Obj], str]:
    """All items of a list endpoint (paged with ``limit``/``continue``) and the list's resourceVersion."""
    items: list[Obj] = []
    cont: str | None = None
    rv = ""
    while True:
        query: list[tuple[str, Any]] = [("limit", limit)]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if cont:
            query.append(("continue", cont))
        page = call_json(api, "GET", path, query=query, timeout=120)
        items.extend(page.get("items") or [])
        meta = page.get("metadata") or {}
        rv = meta.get("resourceVersion", rv)
        cont = meta.get("continue")
        if not cont:
            return items, rv


def list_nodes(api: client.ApiClient, label_selector: str | None = None) -> list[Obj]:
    """Every Node (dicts)."""
    return list_items(api, "/api/v1/nodes", label_selector=label_selector)[0]


def get_node(api: client.ApiClient, node: str) -> Obj:
    """Node ``node`` as a dict.

    Raises:
        NodeNotFound: no such node; the message lists near matches.
    """
    try:
        return call_json(api, "GET", f"/api/v1/nodes/{node}")
    except ApiException as exc:
        if exc.status == 404:
            raise NodeNotFound(node, [nodeutil.name(n) for n in list_nodes(api)]) from None
        raise


def pods_on_node(api: client.ApiClient, node: str) -> list[Obj]:
    """Every pod bound to ``node`` (field selector ``spec.nodeName``), all namespaces."""
    return list_items(api, "/api/v1/pods", field_selector=f"spec.nodeName={node}")[0]


def patch(api: client.ApiClient, path: str, body: Obj, *, kind: str = "merge") -> Obj:
    """PATCH ``path`` with a JSON merge patch (``kind="merge"``) or JSON patch (``kind="json"``)."""
    ctype = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
             "strategic": "application/strategic-merge-patch+json"}[kind]
    return call_json(api, "PATCH", path, body=body, content_type=ctype)


def update_with_retry(api: client.ApiClient, path: str, change: Callable[[Obj], Obj | None], *,
                      attempts: int = 8, on_conflict: Callable[[int], None] | None = None) -> tuple[Obj, Obj | None]:
    """Read ``path``, compute a merge patch with ``change(obj)``, apply it with the read resourceVersion; retry on 409.

    ``change`` returns the merge patch (without ``metadata.resourceVersion``,
    which is added as the precondition) or None when nothing is to change.

    Returns:
        ``(object after, patch applied or None)``.

    Raises:
        Conflict: still 409 after ``attempts`` reads.
        ApiException: any other API error.
    """
    for attempt in range(attempts):
        obj = call_json(api, "GET", path)
        body = change(obj)
        if body is None:
            return obj, None
        body = dict(body)
        body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": obj["metadata"]["resourceVersion"]}
        try:
            return patch(api, path, body), body
        except ApiException as exc:
            if exc.status != 409:
                raise
            if on_conflict:
                on_conflict(attempt + 1)
            log.info("409 on %s (attempt %d): re-reading", path, attempt + 1)
            time.sleep(min(0.05 * 2**attempt, 1.0))
    raise Conflict(f"{path}: the object kept changing under us (409 Conflict {attempts} times); try again")


def object_ref(obj: Obj) -> Obj:
    """An ObjectReference (core/v1) for ``obj``: apiVersion, kind, name, namespace, uid, resourceVersion."""
    meta = obj.get("metadata", {})
    ref = {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Node"), "name": meta.get("name")}
    for k in ("namespace", "uid", "resourceVersion"):
        if meta.get(k):
            ref[k] = meta[k]
    return ref


def record_event(api: client.ApiClient, obj: Obj, reason: str, message: str, *, type_: str = "Normal",
                 component: str = "gpufleet", action: str | None = None) -> Obj | None:
    """Create a core/v1 Event about ``obj`` (what ``kubectl describe`` shows).

    Events of cluster-scoped objects (Nodes, ClusterQueues) go to namespace
    ``default``, as the kubelet does for Nodes. A failure to record is
    logged, never raised: an event is a record, not a step.

    Args:
        obj: the object (dict with apiVersion, kind, metadata).
        reason: CamelCase reason, e.g. ``NodeSwapRequested``.
        message: human text (truncated to 1 KiB).
        type_: ``Normal`` or ``Warning``.
        component: reporting component, e.g. ``gpufleet-node-health``.
        action: what was done, e.g. ``Swap``.

    Returns:
        The Event created, or None when it could not be.
    """
    ref = object_ref(obj)
    ns = ref.get("namespace") or "default"
    now = datetime.now(timezone.utc)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{ref['name']}.{uuid.uuid4().hex[:12]}", "namespace": ns},
        "involvedObject": ref, "reason": reason, "message": message[:1024], "type": type_,
        "source": {"component": component}, "reportingComponent": component, "reportingInstance": component,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "action": action or reason,
    }
    try:
        return call_json(api, "POST", f"/api/v1/namespaces/{ns}/events", body=event)
    except (ApiException, OSError) as exc:
        log.warning("could not record event %s on %s/%s: %s", reason, ref["kind"], ref["name"], exc)
        return None


def events_for(api: client.ApiClient, kind: str, name: str, namespace: str = "default") -> list[Obj]:
    """Events about ``kind/name`` in ``namespace`` (oldest first)."""
    items = list_items(api, f"/api/v1/namespaces/{namespace}/events",
                       field_selector=f"involvedObject.kind={kind},involvedObject.name={name}")[0]
    return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def ensure_namespace(api: client.ApiClient, namespace: str) -> None:
    """Create ``namespace`` if it does not exist (roles declare it; this covers a fresh local cluster)."""
    try:
        call_json(api, "GET", f"/api/v1/namespaces/{namespace}")
    except ApiException as exc:
        if exc.status != 404:
            raise
        try:
            call_json(api, "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                              "metadata": {"name": namespace}})
        except ApiException as exc2:
            if exc2.status == 403:
                raise OpsError(f"namespace {namespace} does not exist and may not be created here: "
                               "`pulumi up` declares it (node_health / kueue roles)") from None
            if exc2.status != 409:
                raise


def api_error(exc: ApiException) -> str:
    """The API's ``message`` of an error answer, else its reason."""
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError):
        return str(exc.reason)
