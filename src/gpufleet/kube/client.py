"""The Kubernetes API client every gpufleet part uses: plain JSON dicts in and out, typed errors, watches.

Built on the official ``kubernetes`` client's configuration
(:mod:`gpufleet.kube.config`: kubeconfig with exec plugins, in-cluster
token refresh) and its REST layer (urllib3, one connection pool per
client, thread-safe). Objects are never turned into the generated model
classes: answers are decoded JSON (``dict``), as the API serves them,
which keeps the virtual kubelet's cache of 1,000 pods small and every
call free of (de)serialisation cost.

Shapes:

* objects are the API's JSON as ``dict``; paths are REST paths
  (:func:`api_path`: ``/api/v1/namespaces/ns/pods/p/status``);
* :meth:`Kube.watch` yields ``(event_type, object)`` with event types
  ``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK``;
* writes carry ``fieldManager`` (:data:`gpufleet.names.FIELD_MANAGER` unless
  the client was given another), so ``metadata.managedFields`` names
  gpufleet, and :meth:`Kube.apply` is server-side apply under that name.

Errors: :mod:`gpufleet.kube.errors` (``KubeError`` and its subclasses;
no answer at all is :class:`~gpufleet.kube.errors.Unreachable`).

A component under leader election fences its client
(:meth:`Kube.fence_writes`, :mod:`gpufleet.kube.fence`): every write is
refused with :class:`~gpufleet.kube.errors.LeadershipLost` unless the Lease
is held, and may take only the time left to the renew deadline.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes.client import rest
from urllib3.util.retry import Retry
from kubernetes.client.exceptions import ApiException

from gpufleet.names import FIELD_MANAGER

from . import retry as retries
from .config import ClusterConfig, load_config
from .errors import Conflict, KubeError, NotFound, Unreachable, error_from
from .fence import Fence

Obj = dict[str, Any]

#: Content types of the patch flavours the API server accepts (``apply``: server-side apply).
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}

#: ``(apiVersion, kind) -> (plural, namespaced)`` of kinds gpufleet touches; others come from API discovery.
KNOWN_KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "Node"): ("nodes", False),
    ("v1", "Pod"): ("pods", True),
    ("v1", "Service"): ("services", True),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Event"): ("events", True),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaims", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("apps/v1", "DaemonSet"): ("daemonsets", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("horizontalpodautoscalers", True),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    ("scheduling.k8s.io/v1", "PriorityClass"): ("priorityclasses", False),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): ("mutatingwebhookconfigurations", False),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): ("validatingwebhookconfigurations", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
}

_NETWORK_ERRORS = (urllib3.exceptions.HTTPError, OSError)


def api_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
    """The REST path of a collection or object: ``/api/v1/namespaces/ns/pods/name/status``."""
    parts = ["/api/v1" if api_version == "v1" else f"/apis/{api_version}"]
    if namespace:
        parts.append(f"namespaces/{quote(namespace)}")
    parts.append(plural)
    if name:
        parts.append(quote(name))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def _query(params: Mapping[str, Any] | None) -> str:
    items = []
    for k, v in (params or {}).items():
        if v is None:
            continue
        items.append((k, ("true" if v else "false") if isinstance(v, bool) else v))
    return urlencode(items, doseq=True)


class Kube:
    """A thread-safe client of one API server.

    Args:
        config: the cluster (:func:`gpufleet.kube.config.load_config`; None: load it with the defaults).
        timeout: seconds per ordinary request.
        max_connections: connection pool size (each watch holds one while it lasts).
        user_agent: ``User-Agent`` (shows in audit logs; also the default field manager of other clients).
        field_manager: ``fieldManager`` of writes and server-side applies.

    Attributes:
        config: the :class:`~gpufleet.kube.config.ClusterConfig`.
        server: the API server's base URL.
    """

    def __init__(self, config: ClusterConfig | None = None, *, timeout: float = 30.0, max_connections: int = 32,
                 user_agent: str = "gpufleet", field_manager: str = FIELD_MANAGER):
        self.config = config or load_config()
        self.timeout = timeout
        self.user_agent = user_agent
        self.field_manager = field_manager
        cfg = self.config.configuration
        cfg.connection_pool_maxsize = max_connections
        cfg.retries = retries.transport_retries()
        self._rest = rest.RESTClientObject(cfg)
        # Requests sent once (a deadline-bound write, a renewal): their own pool without transport retries,
        # since a retry would start a second attempt with the whole timeout again. A shallow copy: the TLS
        # settings are the same, the configuration others share is left alone.
        once = copy.copy(cfg)
        once.retries = Retry(total=0, redirect=0, status=0, other=0, raise_on_status=False,
                             respect_retry_after_header=False)
        self._rest_once = rest.RESTClientObject(once)
        self.fence: Fence | None = None
        self._resources: dict[tuple[str, str], tuple[str, bool]] = dict(KNOWN_KINDS)
        self._resources_lock = threading.Lock()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | os.PathLike | None = None, context: str | None = None,
                        **kwargs: Any) -> "Kube":
        """A client for :func:`~gpufleet.kube.config.load_config` (raises :class:`~gpufleet.kube.errors.ConfigError`)."""
        return cls(load_config(kubeconfig, context), **kwargs)

    @property
    def server(self) -> str:
        """The API server's base URL, e.g. ``https://127.0.0.1:6443``."""
        return self.config.server

    def close(self) -> None:
        """Close every pooled connection."""
        self._rest.close()
        self._rest_once.close()

    def fence_writes(self, fence: Fence) -> None:
        """From now on, admit writes only as ``fence`` says (:mod:`gpufleet.kube.fence`).

        Every POST, PUT, PATCH and DELETE of this client (create, patch,
        replace, delete, evict, apply, Events) raises
        :class:`~gpufleet.kube.errors.LeadershipLost` without being sent
        unless the fence is held, and is otherwise sent once with its timeout
        cut to the seconds the fence has left. When the fence trips, the
        pooled connections are closed.
        """
        self.fence = fence
        fence.on_trip(self.close)

    def __enter__(self) -> "Kube":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _send(self, method: str, path: str, params: Mapping[str, Any] | None, body: Any, content_type: str | None,
              accept: str | None, timeout: float | tuple[float, float] | None,
              once: bool = False) -> rest.RESTResponse:
        cfg = self.config.configuration
        headers = {"Accept": accept or "application/json", "User-Agent": self.user_agent}
        token = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        query = _query(params)
        url = f"{cfg.host}{path}" + (f"?{query}" if query else "")
        try:
            return (self._rest_once if once else self._rest).request(
                method, url, headers=headers, body=body, _request_timeout=timeout if timeout is not None else self.timeout)
        except ApiException as exc:  # the REST layer's wrapping of TLS failures
            raise Unreachable(f"{self.server}: {exc.reason}", path=f"{method} {path}") from None
        except _NETWORK_ERRORS as exc:
            raise Unreachable(f"{self.server}: {exc}", path=f"{method} {path}") from None

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, body: Any = None,
                patch: str | None = None, content_type: str | None = None, accept: str | None = None,
                timeout: float | None = None, retry: bool = True) -> Obj:
        """One API call; returns the decoded JSON answer (``{}`` when empty).

        Args:
            method: GET, POST, PUT, PATCH or DELETE.
            path: REST path (:func:`api_path`).
            params: query parameters (None values dropped, booleans as ``true``/``false``).
            body: JSON-serialisable request body.
            patch: for PATCH, one of :data:`PATCH_TYPES`' keys (default ``merge``).
            content_type: explicit Content-Type (overrides ``patch``).
            accept: Accept header (default ``application/json``).
            timeout: seconds, overriding the client's default.
            retry: False: sent exactly once, so that the call ends within ``timeout``
                (no transport retry, no ``Retry-After`` resend).

        Writes (POST, PUT, PATCH) carry ``fieldManager`` unless ``params`` names one.
        An answer with ``Retry-After`` is retried as :func:`gpufleet.kube.retry.retry_after` says.
        With a fence (:meth:`fence_writes`), a write is refused unless the fence
        is held, and is sent once within the seconds the fence has left.

        Raises:
            LeadershipLost: a fenced write while this process does not hold its Lease (nothing sent).
            KubeError: (a subclass) on any non-2xx status; Unreachable without an answer.
        """
        if self.fence is not None:
            left = self.fence.admit(method, path)
            if left is not None:
                timeout = min(timeout if timeout is not None else self.timeout, left)
                retry = False
        if method in ("POST", "PUT", "PATCH") and not (params and "fieldManager" in params):
            params = {**(params or {}), "fieldManager": self.field_manager}
        if method == "PATCH" and content_type is None:
            content_type = PATCH_TYPES[patch or "merge"]
        attempt = 0
        while True:
            resp = self._send(method, path, params, body, content_type, accept, timeout, once=not retry)
            try:
                data = resp.read()
            except _NETWORK_ERRORS as exc:
                raise Unreachable(f"{self.server}: {exc}", path=f"{method} {path}") from None
            if 200 <= resp.status < 300:
                return json.loads(data) if data else {}
            wait = retries.retry_after(resp.status, resp.headers.get("Retry-After"), attempt) if retry else None
            if wait is None:
                raise error_from(resp.status, data, f"{method} {path}")
            time.sleep(wait)  # not processed (throttled, storage initializing): the server says when to retry
            attempt += 1

    # ------------------------------------------------------------------ verbs

    def get(self, api_version: str, plural: str, name: str, namespace: str | None = None,
            subresource: str | None = None) -> Obj:
        """GET one object (raises :class:`~gpufleet.kube.errors.NotFound`)."""
        return self.request("GET", api_path(api_version, plural, namespace, name, subresource))

    def get_or_none(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> Obj | None:
        """GET one object, or None when it does not exist."""
        try:
            return self.get(api_version, plural, name, namespace)
        except NotFound:
            return None

    def list(self, api_version: str, plural: str, namespace: str | None = None, **params: Any) -> Obj:
        """LIST a collection (one request); returns the List object (``items``, ``metadata.resourceVersion``).

        ``params``: ``labelSelector``, ``fieldSelector``, ``resourceVersion`` ("0": from the watch cache), ``limit``.
        """
        return self.request("GET", api_path(api_version, plural, namespace), params=params)

    def list_all(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
                 limit: int = 1000, timeout: float = 120.0) -> tuple[list[Obj], str]:
        """Every item of the collection at ``path``, paged (``limit``/``continue``), and the list's resourceVersion."""
        items: list[Obj] = []
        cont: str | None = None
        rv = ""
        while True:
            page = self.request("GET", path, params={"limit": limit, "labelSelector": label_selector,
                                                     "fieldSelector": field_selector, "continue": cont},
                                timeout=timeout)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion", rv)
            cont = meta.get("continue")
            if not cont:
                return items, rv

    def create(self, api_version: str, plural: str, body: Obj, namespace: str | None = None,
               subresource: str | None = None, name: str | None = None, **params: Any) -> Obj:
        """POST an object (raises :class:`~gpufleet.kube.errors.Conflict` when it exists)."""
        return self.request("POST", api_path(api_version, plural, namespace, name, subresource), body=body,
                            params=params or None)

    def patch(self, api_version: str, plural: str, name: str, body: Any, namespace: str | None = None, *,
              subresource: str | None = None, patch: str = "merge", **params: Any) -> Obj:
        """PATCH an object with a ``merge``, ``strategic``, ``json`` or ``apply`` patch."""
        return self.request("PATCH", api_path(api_version, plural, namespace, name, subresource), body=body,
                            patch=patch, params=params or None)

    def replace(self, api_version: str, plural: str, name: str, body: Obj, namespace: str | None = None,
                subresource: str | None = None) -> Obj:
        """PUT an object (optimistic concurrency through its ``metadata.resourceVersion``: 409 when stale)."""
        return self.request("PUT", api_path(api_version, plural, namespace, name, subresource), body=body)

    def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None, *,
               grace_seconds: int | None = None, uid: str | None = None, resource_version: str | None = None,
               propagation: str | None = None, dry_run: bool = False) -> Obj:
        """DELETE an object, with optional grace period, UID/resourceVersion preconditions and propagation policy.

        Raises:
            NotFound: it does not exist; Conflict: a precondition failed (it is another object now).
        """
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        pre = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if pre:
            body["preconditions"] = pre
        if propagation:
            body["propagationPolicy"] = propagation
        if dry_run:
            body["dryRun"] = ["All"]
        return self.request("DELETE", api_path(api_version, plural, namespace, name), body=body,
                            params={"dryRun": "All"} if dry_run else None)

    def evict(self, namespace: str, name: str, *, grace_seconds: int | None = None, uid: str | None = None,
              dry_run: bool = False) -> Obj:
        """Evict a pod through the Eviction API (PodDisruptionBudgets apply).

        Raises:
            TooManyRequests: a PodDisruptionBudget does not allow it now.
            NotFound: the pod is gone; Conflict: ``uid`` is not the pod's (it was replaced).
        """
        body: Obj = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        options: Obj = {}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if dry_run:
            options["dryRun"] = ["All"]
        if options:
            body["deleteOptions"] = options
        return self.request("POST", api_path("v1", "pods", namespace, name, "eviction"), body=body,
                            params={"dryRun": "All"} if dry_run else None)

    # ------------------------------------------------------------------ kinds and server-side apply

    def pod_log(self, namespace: str, name: str, *, container: str | None = None,
                tail_lines: int | None = None, previous: bool = False) -> str:
        """A pod's log as text (the kubelet's, through the API server's ``log`` subresource).

        ``previous``: the log of the container's previous instance (before its last restart), as
        ``kubectl logs --previous``; the API answers 400 when there was none.

        Raises:
            KubeError: (a subclass) on any non-2xx status; Unreachable without an answer.
        """
        params = {"container": container, "tailLines": tail_lines, "previous": "true" if previous else None}
        return self._get_text(api_path("v1", "pods", namespace, name, "log"), params)

    def pod_proxy_text(self, namespace: str, name: str, port: int, path: str = "metrics", *,
                       timeout: float | None = None) -> str:
        """What ``GET http://POD:PORT/PATH`` answers, through the API server's pod proxy, as text (a
        Prometheus ``/metrics`` page, say); needs ``get`` on ``pods/proxy``.

        Raises:
            KubeError: (a subclass) on any non-2xx status (503 when the API server cannot reach the pod);
            Unreachable without an answer.
        """
        pod = f"{api_path('v1', 'pods', namespace)}/{quote(name)}:{int(port)}"
        return self._get_text(f"{pod}/proxy/{path.lstrip('/')}", None, timeout)

    def node_proxy_text(self, node: str, path: str, *, timeout: float | None = None) -> str:
        """What the node's kubelet API answers for ``GET /PATH`` (``metrics/resource``, ``stats/summary``) through
        the API server's node proxy, as text; needs ``get`` on ``nodes/proxy``.

        Raises:
            KubeError: (a subclass) on any non-2xx status (the kubelet's 401/403 pass through; 503 when the API
            server cannot reach it); Unreachable without an answer.
        """
        return self._get_text(f"{api_path('v1', 'nodes', None, node, 'proxy')}/{path.lstrip('/')}", None, timeout)

    def _get_text(self, path: str, params: Mapping[str, Any] | None, timeout: float | None = None) -> str:
        # Subresources that answer text refuse Accept: text/plain; they answer */* with text, as they do kubectl.
        resp = self._send("GET", path, params, None, None, "*/*", timeout)
        try:
            data = resp.read()
        except _NETWORK_ERRORS as exc:
            raise Unreachable(f"{self.server}: {exc}", path=f"GET {path}") from None
        if not 200 <= resp.status < 300:
            raise error_from(resp.status, data, f"GET {path}")
        return data.decode("utf-8", "replace")

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """``(plural, namespaced)`` of a kind, from :data:`KNOWN_KINDS` or API discovery (cached).

        Raises:
            NotFound: the group/version is not served, or serves no such kind.
        """
        key = (api_version, kind)
        with self._resources_lock:
            if key in self._resources:
                return self._resources[key]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            found = self.request("GET", base)
        except NotFound:
            raise NotFound(404, "NotFound", f"the cluster does not serve {api_version}", path=f"GET {base}") from None
        with self._resources_lock:
            for res in found.get("resources") or []:
                if "/" not in res["name"]:
                    self._resources[(api_version, res["kind"])] = (res["name"], bool(res["namespaced"]))
            if key not in self._resources:
                raise NotFound(404, "NotFound", f"{api_version} serves no kind {kind}", path=f"GET {base}")
            return self._resources[key]

    def path_of(self, obj: Obj, *, subresource: str | None = None, collection: bool = False) -> str:
        """REST path of a manifest ``obj`` (or of its collection): kind resolved by :meth:`resource`."""
        meta = obj.get("metadata") or {}
        plural, namespaced = self.resource(obj["apiVersion"], obj["kind"])
        ns = (meta.get("namespace") or "default") if namespaced else None
        return api_path(obj["apiVersion"], plural, ns, None if collection else meta["name"], subresource)

    def apply(self, obj: Obj, *, subresource: str | None = None, force: bool = True,
              field_manager: str | None = None, dry_run: bool = False) -> Obj:
        """Server-side apply ``obj`` under this client's field manager; returns the live object.

        ``force`` takes over fields another manager owns (as ``kubectl apply
        --server-side --force-conflicts``); without it that is a 409.

        Raises:
            KubeError: refused (validation, webhook, conflict without ``force``, unknown kind).
        """
        return self.request("PATCH", self.path_of(obj, subresource=subresource), body=obj, patch="apply",
                            params={"fieldManager": field_manager or self.field_manager, "force": force,
                                    "dryRun": "All" if dry_run else None})

    def create_object(self, obj: Obj) -> Obj:
        """POST manifest ``obj`` to its collection (kind resolved by :meth:`resource`).

        Raises:
            Conflict: it exists; NotFound: the kind is not served; KubeError: refused.
        """
        return self.request("POST", self.path_of(obj, collection=True), body=obj)

    def delete_object(self, obj: Obj, **options: Any) -> Obj:
        """DELETE manifest ``obj`` (``options`` as for :meth:`delete`)."""
        meta = obj.get("metadata") or {}
        plural, namespaced = self.resource(obj["apiVersion"], obj["kind"])
        return self.delete(obj["apiVersion"], plural, meta["name"],
                           (meta.get("namespace") or "default") if namespaced else None, **options)

    # ------------------------------------------------------------------ watches

    def watch(self, path: str, *, resource_version: str, params: Mapping[str, Any] | None = None,
              timeout_seconds: int = 300) -> Iterator[tuple[str, Obj]]:
        """Stream watch events of the collection at ``path`` from ``resource_version``.

        Ends normally when the server closes the watch (after about
        ``timeout_seconds``). Bookmarks are requested and yielded, so a
        caller can resume from a recent resourceVersion.

        Raises:
            Expired: the resourceVersion is too old (list again).
            KubeError: any other error status or ERROR event; Unreachable: connection lost.
        """
        query = {**(params or {}), "watch": "true", "resourceVersion": resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        resp = self._send("GET", path, query, None, None, None, (min(self.timeout, 10.0), timeout_seconds + 30))
        if not 200 <= resp.status < 300:
            raise error_from(resp.status, resp.read(), f"WATCH {path}")
        raw = resp.response
        finished = False
        try:
            buf = b""
            for chunk in raw.stream(65536, decode_content=True):
                buf += chunk
                if b"\n" not in chunk:
                    continue
                *lines, buf = buf.split(b"\n")  # one event per line; the last piece may be partial
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type", ""), event.get("object") or {}
                    if kind == "ERROR":
                        raise error_from(int(obj.get("code") or 500), obj, f"WATCH {path}")
                    yield kind, obj
            finished = True
        except _NETWORK_ERRORS as exc:
            raise Unreachable(f"{self.server}: watch interrupted: {exc}", path=f"WATCH {path}") from None
        finally:
            if not finished:
                raw.close()  # unread chunks must not reach the next request on this connection
            raw.release_conn()


