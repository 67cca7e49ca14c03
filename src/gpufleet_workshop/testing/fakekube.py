"""An in-memory API server behind :class:`gpufleet.kube.Kube`'s transport: unit tests of reconcile loops without a cluster.

:class:`FakeKube` is a :class:`~gpufleet.kube.client.Kube` whose lowest
seam, ``_send`` (one HTTP exchange), is answered from memory. Everything
above it is the real client: every verb, the fence of leader election,
``fieldManager``, ``Retry-After``, the mapping of Status answers to
:mod:`gpufleet.kube.errors`, the watch decoder, and so
:class:`~gpufleet.kube.informer.Informer`, work queues and every
controller run unchanged. Models: client-go ``dynamic/fake`` (an object
tracker, recorded actions, reactors) and controller-runtime
``pkg/client/fake`` (resourceVersion and conflicts like the server).

What it models as kube-apiserver 1.35 does (checked against a real one
by ``tests/integration/test_fake_parity.py``):

* **storage**: one resourceVersion counter for every object (etcd's
  revision); ``uid``, ``creationTimestamp``, ``generation`` (bumped when
  anything but metadata and status changes); a write that changes nothing
  keeps the resourceVersion and sends no event;
* **errors** as the server's Status objects: 404 ``NotFound``, 409
  ``AlreadyExists`` / ``Conflict`` (a stale ``resourceVersion`` on update
  or patch, a failed UID or resourceVersion precondition), 422
  ``Invalid``, 400 ``BadRequest`` (an unsupported field selector), 403 in
  a terminating namespace, 404 in a missing one (NamespaceLifecycle);
* **create**: ``generateName`` (5 random characters, as the server's
  ``names.SimpleNameGenerator``), a pod's ``status`` reset to Pending and
  its ``spec.priority`` taken from its PriorityClass (403 when it does not
  exist), ``status`` dropped for kinds with a status subresource (not for
  Nodes);
* **list and watch**: label selectors, the field selectors each kind
  supports (:mod:`~gpufleet_workshop.testing.selectors`), ``limit`` and
  ``continue``; watches from a resourceVersion replay what happened since
  (410 ``Expired`` when it is older than the kept history, or after
  :meth:`FakeKube.expire_watches`), send bookmarks every
  ``bookmark_seconds``, end after ``timeoutSeconds``, and turn an object
  that leaves (enters) a selector into DELETED (ADDED), as the watch cache
  does;
* **patches**: merge, JSON, strategic (for the built-in kinds' merge keys;
  refused with 415 for custom resources, as the server does) and
  server-side apply (:mod:`~gpufleet_workshop.testing.patches`); a
  ``metadata.resourceVersion`` in a patch is a precondition;
* **subresources**: ``status`` (the main resource then ignores status
  changes, the subresource everything else), pods' ``eviction``,
  ``binding`` and ``log``;
* **delete**: UID and resourceVersion preconditions, finalizers (the
  object stays with a ``deletionTimestamp`` until they are removed), pods'
  graceful deletion (a bound, non-terminal pod stays terminating for its
  grace period until :meth:`FakeKube.complete_deletions`, as until its
  kubelet confirms; unbound or terminal pods and grace 0 go at once),
  ``propagationPolicy`` with the garbage collector run synchronously
  (Background deletes dependents, Orphan removes their ownerReference,
  Foreground keeps the owner until its dependents are gone), namespaces
  emptied then removed;
* **PodDisruptionBudgets** (:mod:`~gpufleet_workshop.testing.disruption`):
  their status is computed as the disruption controller would, on every
  change of pods, budgets or controllers (``disruption_controller=False``:
  the status is whatever the test writes), and the Eviction API decides
  on it.

What it does not model, and refuses rather than guesses
(:class:`~gpufleet_workshop.testing.patches.Unmodelled`): strategic
merge directives beyond ``$patch``, field ownership of non-apply writes
(server-side apply conflicts only between appliers), admission webhooks,
validation beyond names, controllers other than the garbage collector
and the disruption controller (no scheduler, no ReplicaSet controller, no
kubelet: tests play them through :meth:`FakeKube.modify`).

Faults (:meth:`FakeKube.prepend_reactor`, :meth:`fail`, :meth:`hang`):
a reactor sees each request as an :class:`Action` (client-go's verbs:
get, list, watch, create, update, patch, delete; an eviction is a create
of ``pods`` subresource ``eviction``) and answers it, raises a
:class:`~gpufleet.kube.errors.KubeError`, or passes it on (returns None).
Every request is recorded in :attr:`FakeKube.actions`.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import queue
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from gpufleet.kube import Kube, KubeError, Unreachable
from gpufleet.kube.client import KNOWN_KINDS
from gpufleet.kube.times import parse_time
from gpufleet.names import FIELD_MANAGER, KUEUE_API, RESOURCE_API

from . import disruption, patches, selectors

Obj = dict[str, Any]

__all__ = ["Action", "FakeKube", "Kind", "KINDS", "Unmodelled"]

Unmodelled = patches.Unmodelled


@dataclass(frozen=True)
class Kind:
    """A resource the fake serves: ``apiVersion``, ``kind``, ``plural``, whether namespaced, whether it has a
    ``status`` subresource, whether it is a custom resource (no strategic merge patch)."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool
    status: bool = False
    custom: bool = False

    @property
    def group(self) -> str:
        """The API group ("" for core)."""
        return self.api_version.rsplit("/", 1)[0] if "/" in self.api_version else ""


_STATUS = {"pods", "nodes", "services", "namespaces", "deployments", "replicasets", "statefulsets", "daemonsets",
           "jobs", "poddisruptionbudgets", "horizontalpodautoscalers", "customresourcedefinitions"}

#: The kinds served without registration: those :data:`gpufleet.kube.client.KNOWN_KINDS` names, and the others
#: gpufleet reads or writes (ReplicaSets, EndpointSlices, Kueue's and JobSet's custom resources, DRA's kinds).
KINDS: list[Kind] = [Kind(av, kind, plural, ns, plural in _STATUS) for (av, kind), (plural, ns) in KNOWN_KINDS.items()] + [
    Kind("apps/v1", "ReplicaSet", "replicasets", True, True),
    Kind("apps/v1", "StatefulSet", "statefulsets", True, True),
    Kind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", True),
    Kind("events.k8s.io/v1", "Event", "events", True),
    Kind(KUEUE_API, "ClusterQueue", "clusterqueues", False, True, True),
    Kind(KUEUE_API, "LocalQueue", "localqueues", True, True, True),
    Kind(KUEUE_API, "Workload", "workloads", True, True, True),
    Kind(KUEUE_API, "ResourceFlavor", "resourceflavors", False, False, True),
    Kind(KUEUE_API, "WorkloadPriorityClass", "workloadpriorityclasses", False, False, True),
    Kind(KUEUE_API, "Topology", "topologies", False, False, True),
    Kind("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", True, True, True),
    # Dynamic Resource Allocation (GPUs published per device; one GPU out of service by a DeviceTaintRule).
    Kind(RESOURCE_API, "ResourceSlice", "resourceslices", False),
    Kind(RESOURCE_API, "DeviceClass", "deviceclasses", False),
    Kind(RESOURCE_API, "DeviceTaintRule", "devicetaintrules", False, True),
    Kind(RESOURCE_API, "ResourceClaim", "resourceclaims", True, True),
    Kind(RESOURCE_API, "ResourceClaimTemplate", "resourceclaimtemplates", True),
    # Reviews (create only, never stored): the fake has no authenticator or authorizer, a test answers them.
    Kind("authentication.k8s.io/v1", "TokenReview", "tokenreviews", False),
    Kind("authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews", False),
]
#: Kinds a test answers with a reactor (:meth:`FakeKube.prepend_reactor`); unanswered, the fake says 501.
REVIEWS = ("tokenreviews", "subjectaccessreviews")


@dataclass
class Action:
    """One request as the fake saw it (client-go ``testing.Action``).

    Attributes:
        verb: get, list, watch, create, update, patch or delete (an eviction: create, subresource ``eviction``).
        resource: the plural (``pods``); namespace, name, subresource: from the path (None when absent).
        body: the decoded request body; params: the query parameters; patch_type: merge, json, strategic, apply.
    """

    verb: str
    resource: str
    namespace: str | None
    name: str | None
    subresource: str | None
    body: Any
    params: dict[str, Any]
    patch_type: str | None
    method: str
    path: str


#: A reactor: an :class:`Action` -> an answer (dict), None (pass on), or raise a KubeError.
Reactor = Callable[[Action], Obj | None]

_PATCH_FLAVOURS = {"application/merge-patch+json": "merge", "application/json-patch+json": "json",
                   "application/strategic-merge-patch+json": "strategic", "application/apply-patch+yaml": "apply"}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphanums
#: Seconds an evicted pod stays in a budget's ``disruptedPods`` unless it goes (the disruption controller's
#: ``DeletionTimeout``).
DISRUPTED_POD_SECONDS = 120.0


class _Status(Exception):
    """An answer other than 2xx: becomes a Status object."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None, retry_after: int = 0):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details
        self.retry_after = retry_after


class _Response:
    """What ``Kube._send`` returns: ``status``, ``headers``, ``read()``; a watch's ``response`` streams."""

    def __init__(self, status: int, data: bytes, stream: "_WatchStream | None" = None):
        self.status, self._data, self.headers, self.response = status, data, {}, stream

    def read(self) -> bytes:
        return self._data


class _Watcher:
    def __init__(self, kind: Kind, namespace: str | None, labels, fields):
        self.kind, self.namespace, self.labels, self.fields = kind, namespace, labels, fields
        self.queue: queue.Queue = queue.Queue()

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        return ((self.namespace is None or meta.get("namespace") == self.namespace)
                and self.labels(meta.get("labels") or {}) and self.fields(obj))


class _WatchStream:
    """The watch's HTTP body: JSON lines from the watcher's queue, bookmarks between them, ended by a timeout."""

    def __init__(self, fake: "FakeKube", watcher: _Watcher, timeout: float, bookmarks: bool):
        self.fake, self.watcher, self.timeout, self.bookmarks = fake, watcher, timeout, bookmarks
        self.closed = False

    def stream(self, _amt: int = 65536, decode_content: bool = True) -> Iterator[bytes]:
        end = time.monotonic() + self.timeout
        try:
            while not self.closed and not self.fake._closed.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return
                try:
                    event = self.watcher.queue.get(timeout=min(self.fake.bookmark_seconds, left))
                except queue.Empty:
                    if self.bookmarks:
                        mark = self.fake._bookmark(self.watcher)
                        if mark is not None:
                            yield (json.dumps(mark) + "\n").encode()
                    continue
                if event is None:
                    return
                yield (json.dumps(event) + "\n").encode()
                if event["type"] == "ERROR":
                    return
        finally:
            self.fake._unwatch(self.watcher)

    def close(self) -> None:
        self.closed = True
        self.fake._unwatch(self.watcher)

    def release_conn(self) -> None:
        pass


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _status_body(code: int, reason: str, message: str, details: Obj | None = None) -> bytes:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return json.dumps(body).encode()


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


class FakeKube(Kube):
    """An in-memory API server behind the real client (module docstring).

    Args:
        objects: objects to start with (:meth:`add`).
        field_manager / user_agent / timeout: as :class:`~gpufleet.kube.client.Kube`'s.
        clock: Unix seconds, for timestamps (``creationTimestamp``, ``deletionTimestamp``).
        disruption_controller: compute PodDisruptionBudgets' status (False: the test writes it).
        kinds: further :class:`Kind` s to serve (custom resources).
        bookmark_seconds: seconds between watch bookmarks (the real server: about a minute).
        history: watch events kept for watches that resume from a resourceVersion (older: 410).

    Attributes:
        actions: every request, in order (:class:`Action`).
        logs: ``(namespace, pod)`` or ``(namespace, pod, container)`` -> the text ``pod_log`` answers.
    """

    def __init__(self, *objects: Obj, field_manager: str = FIELD_MANAGER, user_agent: str = "gpufleet-fake",
                 timeout: float = 30.0, clock: Callable[[], float] = time.time, disruption_controller: bool = True,
                 kinds: Iterable[Kind] = (), bookmark_seconds: float = 0.2, history: int = 10_000):
        # Kube.__init__ is not called: no configuration, no connection pools. These are the attributes the
        # client's own methods use.
        self.config = type("FakeConfig", (), {"server": "fake://kube-apiserver"})()
        self.timeout, self.user_agent, self.field_manager = timeout, user_agent, field_manager
        self.fence = None
        self._resources: dict[tuple[str, str], tuple[str, bool]] = dict(KNOWN_KINDS)
        self._resources_lock = threading.Lock()
        self.clock = clock
        self.disruption_controller = disruption_controller
        self.bookmark_seconds = bookmark_seconds
        self.kinds: dict[tuple[str, str], Kind] = {}
        for k in [*KINDS, *kinds]:
            self.register(k)
        self.actions: list[Action] = []
        self.logs: dict[tuple, str] = {}
        self._lock = threading.RLock()
        self._store: dict[tuple[str, str, str], Obj] = {}  # (group/plural, namespace or "", name) -> object
        self._applied: dict[tuple[str, str, str], dict[str, set]] = {}  # server-side apply: manager -> field paths
        self._rv = 0
        self._log: deque = deque(maxlen=history)  # (rv, group/plural, type, new, old)
        self._compacted = 0
        self._watchers: list[_Watcher] = []
        self._reactors: list[tuple[str, str, Reactor]] = []
        self._closed = threading.Event()
        with self._lock:  # the namespaces kube-apiserver creates at start (its system namespaces controller)
            for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
                self._ensure_namespace(ns)
        self.add(*objects)

    # ------------------------------------------------------------------ kinds

    def register(self, kind: Kind) -> None:
        """Serve ``kind`` too (a custom resource whose CRD the test would have installed)."""
        self.kinds[(kind.group, kind.plural)] = kind
        self.kinds.setdefault(("@" + kind.api_version, kind.kind), kind)

    def kind_of(self, obj_or_api_version: Obj | str, kind: str | None = None) -> Kind:
        """The :class:`Kind` of a manifest (or of ``apiVersion``, ``kind``).

        Raises:
            KeyError: not served (register it).
        """
        if isinstance(obj_or_api_version, dict):
            obj_or_api_version, kind = obj_or_api_version.get("apiVersion", ""), obj_or_api_version.get("kind", "")
        try:
            return self.kinds[("@" + obj_or_api_version, kind)]
        except KeyError:
            group = obj_or_api_version.rsplit("/", 1)[0] if "/" in obj_or_api_version else ""
            found = next((k for k in self.kinds.values() if k.group == group and k.kind == kind), None)
            if found is None:
                raise KeyError(f"the fake serves no {obj_or_api_version} {kind}: register a Kind for it") from None
            return found

    def _plural(self, plural: str, group: str | None = None) -> Kind:
        for (g, p), k in self.kinds.items():
            if p == plural and not g.startswith("@") and (group is None or g == group):
                return k
        raise KeyError(f"the fake serves no resource {plural!r}" + (f" in group {group!r}" if group else ""))

    # ------------------------------------------------------------------ the tracker (tests' side)

    def add(self, *objects: Obj) -> list[Obj]:
        """Store ``objects`` as they are (no admission, no defaults), as client-go's tracker ``Add`` does;
        namespaces they name are created. ``uid``, ``resourceVersion`` and ``creationTimestamp`` are filled
        when absent. Returns the stored copies."""
        out = []
        with self._lock:
            for obj in objects:
                obj = copy.deepcopy(obj)
                kind = self.kind_of(obj)
                meta = obj.setdefault("metadata", {})
                if kind.namespaced:
                    meta.setdefault("namespace", "default")
                    self._ensure_namespace(meta["namespace"])
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _rfc3339(self.clock()))
                if "spec" in obj or kind.plural == "pods":
                    meta.setdefault("generation", 1)
                key = self._key(kind, meta.get("namespace"), meta["name"])
                old = self._store.get(key)
                out.append(self._put(kind, key, obj, old))
            self._controllers()
        return out

    def add_one(self, obj: Obj) -> Obj:
        """:meth:`add` of one object; returns its stored copy (with its resourceVersion)."""
        return self.add(obj)[0]

    def remove(self, plural: str, name: str, namespace: str | None = None) -> Obj:
        """Remove a stored object at once (no finalizers, no grace, no garbage collection), as client-go's
        tracker ``Delete`` does; a DELETED event goes to watches. Returns the removed object.

        Raises:
            KeyError: no such object.
        """
        with self._lock:
            kind, key = self._stored(plural, name, namespace)
            out = self._remove(kind, key)
            self._controllers()
            return out

    def _stored(self, plural: str, name: str, namespace: str | None) -> tuple[Kind, tuple[str, str, str]]:
        """The kind and store key of a stored object (under the lock).

        Raises:
            KeyError: no such object.
        """
        kind = self._plural(plural)
        key = self._key(kind, namespace, name)
        if key not in self._store:
            raise KeyError(f"{plural} {namespace}/{name} is not stored")
        return kind, key

    def _ensure_namespace(self, name: str) -> None:
        kind = self._plural("namespaces")
        key = self._key(kind, None, name)
        if key not in self._store:
            self._put(kind, key, {"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": name, "uid": str(uuid.uuid4()),
                                               "creationTimestamp": _rfc3339(self.clock())},
                                  "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}, None)

    def object(self, plural: str, name: str, namespace: str | None = None) -> Obj | None:
        """A copy of the stored object, or None."""
        kind = self._plural(plural)
        with self._lock:
            obj = self._store.get(self._key(kind, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, plural: str, namespace: str | None = None) -> list[Obj]:
        """Copies of every stored object of ``plural`` (in ``namespace``), in the server's order."""
        kind = self._plural(plural)
        with self._lock:
            return [copy.deepcopy(o) for k, o in sorted(self._store.items())
                    if k[0] == self._kindkey(kind) and (namespace is None or k[1] == namespace)]

    def modify(self, plural: str, name: str, namespace: str | None, change: Callable[[Obj], None]) -> Obj:
        """Change a stored object in place as another controller would (a scheduler binding, a kubelet marking
        it Ready): a new resourceVersion and a MODIFIED event, no admission. Returns the new copy.

        Raises:
            KeyError: no such object.
        """
        with self._lock:
            kind, key = self._stored(plural, name, namespace)
            new = copy.deepcopy(self._store[key])
            change(new)
            out = self._put(kind, key, new, self._store[key])
            self._controllers()
            return out

    def complete_deletions(self, plural: str = "pods", namespace: str | None = None) -> list[str]:
        """Remove the terminating objects without finalizers (a kubelet confirming its pods' termination);
        returns their ``namespace/name``."""
        kind = self._plural(plural)
        gone = []
        with self._lock:
            for key, obj in sorted(self._store.items()):
                meta = obj["metadata"]
                if (key[0] == self._kindkey(kind) and (namespace is None or key[1] == namespace)
                        and meta.get("deletionTimestamp") and not meta.get("finalizers")):
                    self._remove(kind, key)
                    gone.append(f"{key[1]}/{key[2]}" if key[1] else key[2])
            self._controllers()
        return gone

    def expire_watches(self) -> None:
        """End every watch with 410 Gone and forget the history (etcd compacted): informers list again."""
        with self._lock:
            self._compacted = self._rv
            self._log.clear()
            for w in list(self._watchers):
                w.queue.put({"type": "ERROR", "object": json.loads(_status_body(
                    410, "Expired", f"too old resource version: {self._rv} ({self._rv})"))})

    @property
    def resource_version(self) -> str:
        """The store's resourceVersion now."""
        return str(self._rv)

    def writes(self) -> list[Action]:
        """The recorded requests that write (create, update, patch, delete)."""
        return [a for a in self.actions if a.verb in ("create", "update", "patch", "delete")]

    # ------------------------------------------------------------------ faults

    def prepend_reactor(self, verb: str, resource: str, reactor: Reactor) -> None:
        """Run ``reactor`` first for requests of ``verb`` on ``resource`` (``*`` for any)."""
        self._reactors.insert(0, (verb, resource, reactor))

    def remove_reactor(self, reactor: Reactor) -> None:
        """Stop running ``reactor``."""
        self._reactors = [r for r in self._reactors if r[2] is not reactor]

    def fail(self, verb: str, resource: str, error: KubeError, *, times: int | None = 1,
             name: str | None = None, subresource: str | None = None) -> Reactor:
        """Answer the next ``times`` (None: every) ``verb`` requests on ``resource`` (named ``name``, of
        ``subresource``) with ``error`` (a :class:`~gpufleet.kube.errors.KubeError`; status 0: no answer)."""
        left = itertools.count()

        def reactor(a: Action) -> Obj | None:
            if (name is not None and a.name != name) or a.subresource != subresource:
                return None
            if times is not None and next(left) >= times:
                return None
            raise error

        self.prepend_reactor(verb, resource, reactor)
        return reactor

    def hang(self, verb: str, resource: str, *, name: str | None = None) -> threading.Event:
        """Hold ``verb`` requests on ``resource`` until the returned event is set (then they proceed) or the
        request's timeout passes (then :class:`~gpufleet.kube.errors.Unreachable`, as a read timeout)."""
        release = threading.Event()

        def reactor(a: Action) -> Obj | None:
            if name is not None and a.name != name:
                return None
            if not release.wait(a.params.get("_timeout") or self.timeout):
                raise Unreachable(f"{self.server}: read timed out", path=f"{a.method} {a.path}")
            return None

        self.prepend_reactor(verb, resource, reactor)
        return release

    # ------------------------------------------------------------------ the client's seam

    def close(self) -> None:
        """End every watch (as closing the connection pools does)."""
        with self._lock:
            for w in list(self._watchers):
                w.queue.put(None)

    def _send(self, method: str, path: str, params: Mapping[str, Any] | None, body: Any, content_type: str | None,
              accept: str | None, timeout: Any, once: bool = False) -> _Response:
        params = {k: v for k, v in (params or {}).items() if v is not None}
        path, _, query = path.partition("?")
        try:
            route = self._route(path)
        except _Status as st:
            return _Response(st.code, _status_body(st.code, st.reason, st.message))
        if route is None:  # discovery and /version
            return self._discovery(path)
        kind, namespace, name, sub = route
        watch = _truthy(params.get("watch"))
        verb = {"GET": "watch" if watch else ("get" if name else "list"), "POST": "create", "PUT": "update",
                "PATCH": "patch", "DELETE": "delete"}[method]
        flavour = _PATCH_FLAVOURS.get(content_type or "", "merge") if method == "PATCH" else None
        request_timeout = timeout[1] if isinstance(timeout, tuple) else timeout
        action = Action(verb, kind.plural, namespace, name, sub, copy.deepcopy(body),
                        {**params, "_timeout": request_timeout}, flavour, method, path)
        with self._lock:
            self.actions.append(action)
        try:
            for v, r, reactor in list(self._reactors):
                if v in ("*", verb) and r in ("*", kind.plural):
                    answer = reactor(action)
                    if answer is not None:
                        return _Response(200, json.dumps(answer).encode())
            if watch:
                return self._watch(kind, namespace, params)
            if sub == "log":
                return self._log_of(namespace, name, params)
            code, answer = self._serve(action, kind, params)
            return _Response(code, json.dumps(answer).encode())
        except _Status as st:
            resp = _Response(st.code, _status_body(st.code, st.reason, st.message, st.details))
            if st.retry_after:  # the server's suggestion, which the client honours (gpufleet.kube.retry.retry_after)
                resp.headers["Retry-After"] = str(st.retry_after)
            return resp
        except KubeError as exc:
            if exc.status == 0:
                raise
            return _Response(exc.status, _status_body(exc.status, exc.reason, exc.message))

    def _route(self, path: str) -> tuple[Kind, str | None, str | None, str | None] | None:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, rest = parts[1], parts[3:]
        else:
            return None
        if not rest:
            return None
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        try:
            kind = self._plural(rest[0], group)
        except KeyError:
            raise _Status(404, "NotFound", f"the server could not find the requested resource ({path})") from None
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        return kind, namespace, name, sub

    def _discovery(self, path: str) -> _Response:
        parts = path.strip("/").split("/")
        if parts == ["version"]:
            return _Response(200, json.dumps({"major": "1", "minor": "35", "gitVersion": "v1.35.0-fake"}).encode())
        api_version = "v1" if parts[:2] == ["api", "v1"] and len(parts) == 2 else (
            "/".join(parts[1:3]) if parts[0] == "apis" and len(parts) == 3 else None)
        kinds = [k for key, k in self.kinds.items() if key[0].startswith("@") and k.api_version == api_version]
        if api_version is None or not kinds:
            return _Response(404, _status_body(404, "NotFound", f"the server could not find the requested resource ({path})"))
        resources = [{"name": k.plural, "namespaced": k.namespaced, "kind": k.kind,
                      "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]} for k in kinds]
        resources += [{"name": f"{k.plural}/status", "namespaced": k.namespaced, "kind": k.kind,
                       "verbs": ["get", "patch", "update"]} for k in kinds if k.status]
        return _Response(200, json.dumps({"kind": "APIResourceList", "groupVersion": api_version,
                                          "resources": resources}).encode())

    # ------------------------------------------------------------------ storage

    @staticmethod
    def _kindkey(kind: Kind) -> str:
        return f"{kind.group}/{kind.plural}"

    def _key(self, kind: Kind, namespace: str | None, name: str) -> tuple[str, str, str]:
        return self._kindkey(kind), (namespace or "") if kind.namespaced else "", name

    def _put(self, kind: Kind, key: tuple, obj: Obj, old: Obj | None) -> Obj:
        """Store ``obj`` with a new resourceVersion; emit ADDED or MODIFIED. Caller holds the lock."""
        self._rv += 1
        obj["apiVersion"], obj["kind"] = obj.get("apiVersion") or kind.api_version, kind.kind
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._store[key] = obj
        self._emit(kind, "MODIFIED" if old is not None else "ADDED", obj, old)
        return copy.deepcopy(obj)

    def _remove(self, kind: Kind, key: tuple) -> Obj:
        """Remove an object; emit DELETED (with a new resourceVersion, as etcd's delete revision). Lock held."""
        old = self._store.pop(key)
        self._applied.pop(key, None)
        self._rv += 1
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._emit(kind, "DELETED", gone, old)
        return gone

    def _emit(self, kind: Kind, type_: str, new: Obj, old: Obj | None) -> None:
        self._log.append((self._rv, self._kindkey(kind), type_, copy.deepcopy(new), copy.deepcopy(old)))
        if len(self._log) == self._log.maxlen:
            self._compacted = max(self._compacted, self._log[0][0] - 1)
        for w in self._watchers:
            if w.kind == kind:
                event = self._event_for(w, type_, new, old)
                if event is not None:
                    w.queue.put(event)

    @staticmethod
    def _event_for(w: _Watcher, type_: str, new: Obj, old: Obj | None) -> Obj | None:
        """The event watcher ``w`` sees: an object leaving its selector is DELETED, entering it ADDED."""
        now, before = w.matches(new), w.matches(old)
        if type_ == "DELETED":
            return {"type": "DELETED", "object": copy.deepcopy(new)} if before or now else None
        if type_ == "ADDED":
            return {"type": "ADDED", "object": copy.deepcopy(new)} if now else None
        if now and before:
            return {"type": "MODIFIED", "object": copy.deepcopy(new)}
        if now:
            return {"type": "ADDED", "object": copy.deepcopy(new)}
        if before:
            return {"type": "DELETED", "object": copy.deepcopy(new)}
        return None

    # ------------------------------------------------------------------ watch

    def _watch(self, kind: Kind, namespace: str | None, params: Mapping[str, Any]) -> _Response:
        labels, fields = self._selectors(kind, params)
        w = _Watcher(kind, namespace, labels, fields)
        rv = str(params.get("resourceVersion") or "")
        with self._lock:
            if rv in ("", "0"):
                for key, obj in sorted(self._store.items()):
                    if key[0] == self._kindkey(kind) and w.matches(obj):
                        w.queue.put({"type": "ADDED", "object": copy.deepcopy(obj)})
            else:
                since = int(rv)
                if since < self._compacted:
                    raise _Status(410, "Expired", f"too old resource version: {since} ({self._compacted})")
                for at, kk, type_, new, old in self._log:
                    if at > since and kk == self._kindkey(kind):
                        event = self._event_for(w, type_, new, old)
                        if event is not None:
                            w.queue.put(event)
            self._watchers.append(w)
        timeout = float(params.get("timeoutSeconds") or 1800)
        return _Response(200, b"", _WatchStream(self, w, timeout, _truthy(params.get("allowWatchBookmarks"))))

    def _bookmark(self, w: _Watcher) -> Obj | None:
        with self._lock:
            if not w.queue.empty():
                return None
            return {"type": "BOOKMARK", "object": {"kind": w.kind.kind, "apiVersion": w.kind.api_version,
                                                   "metadata": {"resourceVersion": str(self._rv)}}}

    def _unwatch(self, w: _Watcher) -> None:
        with self._lock:
            if w in self._watchers:
                self._watchers.remove(w)

    def sync(self, *informers: Any, timeout: float = 5.0) -> None:
        """Wait until every informer has seen the store's resourceVersion now (its events, or a bookmark past
        them): what a test does between a change and the controller's next look at its caches.

        Raises:
            gpufleet.wait.PollTimeout: an informer did not catch up within ``timeout`` seconds.
        """
        from gpufleet.wait import poll_until

        want = int(self.resource_version)
        for inf in informers:
            poll_until(lambda inf=inf: inf.synced.is_set() and int(inf.resource_version or 0) >= want,
                       what=f"informer {inf.name} at resourceVersion {want}", timeout=timeout,
                       interval=min(0.01, self.bookmark_seconds))

    def watchers(self) -> int:
        """Watches open now."""
        with self._lock:
            return len(self._watchers)

    # ------------------------------------------------------------------ verbs

    def _selectors(self, kind: Kind, params: Mapping[str, Any]):
        try:
            return (selectors.parse_labels(params.get("labelSelector")),
                    selectors.parse_fields(params.get("fieldSelector"), kind.plural))
        except selectors.SelectorError as exc:
            raise _Status(400, "BadRequest", str(exc)) from None

    def _serve(self, a: Action, kind: Kind, params: Mapping[str, Any]) -> tuple[int, Obj]:
        dry = params.get("dryRun") == "All"
        manager = params.get("fieldManager") or ""
        if kind.plural in REVIEWS:
            raise _Status(501, "NotImplemented", f"{kind.kind}: the fake API server has no authenticator or "
                          "authorizer; answer the review with a reactor")
        with self._lock:
            if a.verb == "list":
                return 200, self._list(kind, a.namespace, params)
            if a.subresource not in (None, "status", "eviction", "binding"):
                raise _Status(404, "NotFound", f"the server could not find the requested resource ({a.path})")
            if a.verb == "get":
                return 200, copy.deepcopy(self._live(kind, a.namespace, a.name))
            if a.verb == "create" and a.subresource == "eviction":
                out = self._evict(kind, a.namespace, a.name, a.body or {}, dry)
            elif a.verb == "create" and a.subresource == "binding":
                out = self._bind(kind, a.namespace, a.name, a.body or {})
            elif a.verb == "create":
                return 201, self._create(kind, a.namespace, a.body, manager, dry)
            elif a.verb == "update":
                out = self._update(kind, a.namespace, a.name, a.subresource, a.body, manager, dry)
            elif a.verb == "patch":
                out = self._patch(kind, a, manager, _truthy(params.get("force")), dry)
            else:
                out = self._delete(kind, a.namespace, a.name, a.body or {}, params, dry)
            if not dry:
                self._controllers()
            return (201 if a.subresource in ("eviction", "binding") else 200), out

    def _live(self, kind: Kind, namespace: str | None, name: str | None) -> Obj:
        obj = self._store.get(self._key(kind, namespace, name or ""))
        if obj is None:
            raise _Status(404, "NotFound", f'{kind.plural}{"." + kind.group if kind.group else ""} "{name}" not found',
                          {"name": name, "group": kind.group, "kind": kind.plural})
        return obj

    def _list(self, kind: Kind, namespace: str | None, params: Mapping[str, Any]) -> Obj:
        labels, fields = self._selectors(kind, params)
        items = [copy.deepcopy(o) for k, o in sorted(self._store.items())
                 if k[0] == self._kindkey(kind) and (namespace is None or k[1] == namespace)
                 and labels((o["metadata"].get("labels") or {})) and fields(o)]
        meta: Obj = {"resourceVersion": str(self._rv)}
        limit = int(params.get("limit") or 0)
        if limit and str(params.get("resourceVersion")) != "0":
            start = 0
            if params.get("continue"):
                after = json.loads(base64.b64decode(params["continue"]))
                start = next((i for i, o in enumerate(items)
                              if [o["metadata"].get("namespace", ""), o["metadata"]["name"]] > after), len(items))
            page = items[start:start + limit]
            if start + limit < len(items):
                last = page[-1]["metadata"]
                meta["continue"] = base64.b64encode(json.dumps([last.get("namespace", ""), last["name"]]).encode()).decode()
                meta["remainingItemCount"] = len(items) - start - limit
            items = page
        for o in items:
            o.pop("apiVersion", None), o.pop("kind", None)
            o.update(apiVersion=kind.api_version, kind=kind.kind)
        return {"apiVersion": kind.api_version, "kind": f"{kind.kind}List", "metadata": meta, "items": items}

    def _check_name(self, kind: Kind, name: str) -> None:
        import re

        if not name or len(name) > 253 or not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name):
            raise _Status(422, "Invalid", f'{kind.kind} "{name}" is invalid: metadata.name: Invalid value: "{name}": '
                          "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                          "'.', and must start and end with an alphanumeric character")

    def _create(self, kind: Kind, namespace: str | None, body: Any, manager: str, dry: bool,
                apply_paths: set | None = None) -> Obj:
        if not isinstance(body, dict):
            raise _Status(400, "BadRequest", "the body of the request was in an unknown format")
        obj = copy.deepcopy(body)
        if obj.get("kind") and obj["kind"] != kind.kind:
            raise _Status(400, "BadRequest", f"the kind {obj['kind']!r} of the body does not match {kind.kind!r}")
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise _Status(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                                 "sent on the request")
            meta["namespace"] = namespace
            ns = self._store.get(self._key(self._plural("namespaces"), None, namespace or ""))
            if ns is None:
                raise _Status(404, "NotFound", f'namespaces "{namespace}" not found',
                              {"name": namespace, "kind": "namespaces"})
            if ns["metadata"].get("deletionTimestamp"):
                raise _Status(403, "Forbidden", f"{kind.plural} \"{meta.get('name') or meta.get('generateName')}\" is "
                              f"forbidden: unable to create new content in namespace {namespace} because it is being "
                              "terminated")
        if meta.get("resourceVersion"):
            raise _Status(500, "InternalError", "resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _Status(422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value: name or "
                                              "generateName is required")
            meta["name"] = meta["generateName"] + "".join(random.choice(_NAME_CHARS) for _ in range(5))
        self._check_name(kind, meta["name"])
        key = self._key(kind, namespace, meta["name"])
        if key in self._store:
            raise _Status(409, "AlreadyExists",
                          f'{kind.plural}{"." + kind.group if kind.group else ""} "{meta["name"]}" already exists',
                          {"name": meta["name"], "group": kind.group, "kind": kind.plural})
        if kind.plural == "pods":
            obj["status"] = {"phase": "Pending"}
            spec = obj.setdefault("spec", {})
            pc = spec.get("priorityClassName")
            if pc:
                cls = self._store.get(self._key(self._plural("priorityclasses"), None, pc))
                if cls is None:
                    raise _Status(403, "Forbidden", f'pods "{meta["name"]}" is forbidden: no PriorityClass with name '
                                  f"{pc} was found")
                spec["priority"] = cls.get("value", 0)
                spec.setdefault("preemptionPolicy", cls.get("preemptionPolicy", "PreemptLowerPriority"))
            else:
                spec.setdefault("priority", 0)
        elif kind.status and kind.plural != "nodes":
            obj.pop("status", None)
        if kind.plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        now = _rfc3339(self.clock())
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now)
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(k, None)
        if "spec" in obj or kind.plural == "pods":
            meta["generation"] = 1
        self._manage(meta, manager, "Apply" if apply_paths is not None else "Update", kind)
        if dry:
            return obj
        if apply_paths is not None:
            self._applied[key] = {manager: apply_paths}
        return self._put(kind, key, obj, None)

    def _manage(self, meta: Obj, manager: str, operation: str, kind: Kind, sub: str | None = None) -> None:
        """One ``managedFields`` entry per manager and operation (fieldsV1 is not modelled)."""
        if not manager:
            return
        entries = [m for m in meta.get("managedFields") or []
                   if not (m.get("manager") == manager and m.get("operation") == operation
                           and m.get("subresource") == sub)]
        entry = {"manager": manager, "operation": operation, "apiVersion": kind.api_version,
                 "time": _rfc3339(self.clock()), "fieldsType": "FieldsV1", "fieldsV1": {}}
        if sub:
            entry["subresource"] = sub
        meta["managedFields"] = entries + [entry]

    def _write(self, kind: Kind, key: tuple, live: Obj, new: Obj, sub: str | None, manager: str, operation: str,
               dry: bool) -> Obj:
        """The update path every write shares: subresource rules, server-owned metadata kept, preconditions,
        generation, no-op detection, finalizers. Lock held."""
        name = live["metadata"]["name"]
        want_rv = (new.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != live["metadata"]["resourceVersion"]:
            raise _Status(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural}{"." + kind.group if kind.group else ""} '
                          f'"{name}": the object has been modified; please apply your changes to the latest version '
                          "and try again", {"name": name, "group": kind.group, "kind": kind.plural})
        want_uid = (new.get("metadata") or {}).get("uid")
        if want_uid and want_uid != live["metadata"]["uid"]:
            ns = live["metadata"].get("namespace")
            raise _Status(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural}{"." + kind.group if kind.group else ""} '
                          f'"{name}": StorageError: invalid object, Code: 4, Key: /registry/{kind.plural}/'
                          f'{ns + "/" if ns else ""}{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: '
                          f"UID in precondition: {want_uid}, UID in object meta: {live['metadata']['uid']}")
        if sub == "status":
            obj = copy.deepcopy(live)
            if "status" in new:
                obj["status"] = copy.deepcopy(new["status"])
            else:
                obj.pop("status", None)
            if kind.plural in ("pods", "nodes"):  # their status strategies reset the spec only (not ownerReferences)
                for k in ("labels", "annotations"):
                    value = (new.get("metadata") or {}).get(k)
                    if value is None:
                        obj["metadata"].pop(k, None)
                    else:
                        obj["metadata"][k] = copy.deepcopy(value)
        else:
            obj = copy.deepcopy(new)
            if kind.status:
                if "status" in live:
                    obj["status"] = copy.deepcopy(live["status"])
                else:
                    obj.pop("status", None)
        meta = obj.setdefault("metadata", {})
        for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "managedFields"):
            if k in live["metadata"]:
                meta[k] = copy.deepcopy(live["metadata"][k])
            else:
                meta.pop(k, None)
        if not kind.namespaced:
            meta.pop("namespace", None)
        obj["apiVersion"], obj["kind"] = live.get("apiVersion", kind.api_version), kind.kind
        meta["resourceVersion"] = live["metadata"]["resourceVersion"]
        if live["metadata"].get("deletionTimestamp") and set(meta.get("finalizers") or []) - set(
                live["metadata"].get("finalizers") or []):
            raise _Status(422, "Invalid", f'{kind.kind} "{name}" is invalid: metadata.finalizers: Forbidden: no new '
                                          "finalizers can be added if the object is being deleted")
        if obj == live:
            return copy.deepcopy(live)  # nothing changed: no new resourceVersion, no event
        strip = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
        if "generation" in meta and strip(obj) != strip(live):
            meta["generation"] = live["metadata"]["generation"] + 1
        self._manage(meta, manager, operation, kind, sub)
        if dry:
            return obj
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and kind.plural != "pods":
            self._store[key] = obj
            return self._remove(kind, key)
        return self._put(kind, key, obj, live)

    def _update(self, kind: Kind, namespace: str | None, name: str | None, sub: str | None, body: Any,
                manager: str, dry: bool) -> Obj:
        if not isinstance(body, dict):
            raise _Status(400, "BadRequest", "the body of the request was in an unknown format")
        live = self._live(kind, namespace, name)
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise _Status(400, "BadRequest", "the name of the object does not match the name on the URL")
        return self._write(kind, self._key(kind, namespace, name or ""), live, body, sub, manager, "Update", dry)

    def _patch(self, kind: Kind, a: Action, manager: str, force: bool, dry: bool) -> Obj:
        key = self._key(kind, a.namespace, a.name or "")
        live = self._store.get(key)
        if a.patch_type == "apply":
            return self._apply(kind, a, key, live, manager, force, dry)
        if live is None:
            self._live(kind, a.namespace, a.name)
        try:
            if a.patch_type == "merge":
                new = patches.merge_patch(live, a.body)
            elif a.patch_type == "json":
                new = patches.json_patch(live, a.body)
            elif a.patch_type == "strategic":
                if kind.custom:
                    raise _Status(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                  "accepted media types include: application/json-patch+json, "
                                  "application/merge-patch+json, application/apply-patch+yaml")
                new = patches.strategic_merge_patch(live, a.body, kind.plural)
            else:
                raise _Status(415, "UnsupportedMediaType", f"patch type {a.patch_type!r}")
        except patches.PatchError as exc:
            raise _Status(exc.status, "Invalid" if exc.status == 422 else "BadRequest", str(exc)) from None
        if not isinstance(new, dict):
            raise _Status(422, "Invalid", f"the patch of {a.name} does not leave an object")
        return self._write(kind, key, live, new, a.subresource, manager, "Update", dry)

    def _apply(self, kind: Kind, a: Action, key: tuple, live: Obj | None, manager: str, force: bool, dry: bool) -> Obj:
        body = copy.deepcopy(a.body)
        if not manager:
            raise _Status(400, "BadRequest", "PATCH, application/apply-patch+yaml: fieldManager is required")
        if not isinstance(body, dict) or (body.get("metadata") or {}).get("name") not in (None, a.name):
            raise _Status(400, "BadRequest", "the name of the object does not match the name on the URL")
        ignored = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"),
                   ("metadata", "resourceVersion"), ("metadata", "uid")}
        paths = {p for p in patches.leaf_paths(body, kind.plural) if p not in ignored}
        if live is None:  # created; a resourceVersion in the applied object is ignored then, as the server does
            body.setdefault("metadata", {})["name"] = a.name
            body["metadata"].pop("resourceVersion", None)
            return self._create(kind, a.namespace, body, manager, dry, apply_paths=paths)
        owners = {m: set(s) for m, s in self._applied.get(key, {}).items()}
        conflicts = []
        for other, owned in owners.items():
            if other == manager:
                continue
            for p in paths & owned:
                if patches.value_at(live, p) != patches.value_at(body, p):
                    conflicts.append((other, p))
        if conflicts and not force:
            what = "; ".join(f'conflict with "{m}": .{".".join(str(x) for x in p)}' for m, p in conflicts)
            raise _Status(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s): {what}")
        for other, p in conflicts:
            owners[other].discard(p)
        merged = copy.deepcopy(live)
        others = set().union(*(s for m, s in owners.items() if m != manager)) if len(owners) > 1 or (
            owners and manager not in owners) else set()
        for p in sorted(owners.get(manager, set()) - paths, key=len, reverse=True):
            if p not in others:
                patches.remove_path(merged, p)
        meta = body.get("metadata") or {}
        rv = meta.pop("resourceVersion", None)
        merged = patches.apply_merge(merged, body, kind.plural)
        merged["metadata"]["resourceVersion"] = rv or live["metadata"]["resourceVersion"]
        out = self._write(kind, key, live, merged, a.subresource, manager, "Apply", dry)
        if not dry:
            owners[manager] = paths
            self._applied[key] = owners
        return out

    def _bind(self, kind: Kind, namespace: str | None, name: str | None, body: Obj) -> Obj:
        live = self._live(kind, namespace, name)
        if live["spec"].get("nodeName"):
            raise _Status(409, "Conflict", f'pod {name} is already assigned to node "{live["spec"]["nodeName"]}"')
        new = copy.deepcopy(live)
        new["spec"]["nodeName"] = (body.get("target") or {}).get("name")
        conds = [c for c in (new.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
        new.setdefault("status", {})["conditions"] = conds + [{"type": "PodScheduled", "status": "True"}]
        self._put(kind, self._key(kind, namespace, name or ""), new, live)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    # ------------------------------------------------------------------ delete, garbage collection, eviction

    def _delete(self, kind: Kind, namespace: str | None, name: str | None, options: Obj, params: Mapping[str, Any],
                dry: bool) -> Obj:
        live = self._live(kind, namespace, name)
        self._preconditions(kind, live, options.get("preconditions") or {})
        if dry or params.get("dryRun") == "All":
            return copy.deepcopy(live)
        policy = options.get("propagationPolicy") or "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            raise _Status(422, "Invalid", f"DeleteOptions.propagationPolicy: Unsupported value: {policy!r}")
        return self._delete_obj(kind, self._key(kind, namespace, name or ""), options.get("gracePeriodSeconds"), policy)

    @staticmethod
    def _preconditions(kind: Kind, live: Obj, pre: Obj) -> None:
        """A delete's (or an eviction's) UID and resourceVersion preconditions, refused in the server's words."""
        meta = live["metadata"]
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise _Status(409, "Conflict", f'Operation cannot be fulfilled on {kind.kind} "{meta["name"]}": the UID in the '
                          f"precondition ({pre['uid']}) does not match the UID in record ({meta['uid']}). The object "
                          "might have been deleted and then recreated")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise _Status(409, "Conflict", f'Operation cannot be fulfilled on {kind.kind} "{meta["name"]}": the '
                          f"ResourceVersion in the precondition ({pre['resourceVersion']}) does not match the "
                          f"ResourceVersion in record ({meta['resourceVersion']}). The object might have been modified")

    def _delete_obj(self, kind: Kind, key: tuple, grace: int | None, policy: str) -> Obj:
        live = self._store[key]
        meta = live["metadata"]
        uid = meta["uid"]
        if policy == "Orphan":
            self._orphan(uid)
        elif policy == "Foreground" and self._dependents(uid):
            new = copy.deepcopy(live)
            nm = new["metadata"]
            nm.setdefault("deletionTimestamp", _rfc3339(self.clock()))
            nm.setdefault("deletionGracePeriodSeconds", 0)
            nm["finalizers"] = sorted(set(nm.get("finalizers") or []) | {"foregroundDeletion"})
            out = self._put(kind, key, new, live)
            for dk, dkind in self._dependents(uid):
                if dk in self._store:
                    self._delete_obj(dkind, dk, None, "Background")
            return out
        if kind.plural == "namespaces":
            return self._delete_namespace(kind, key)
        if kind.plural == "pods" and self._graceful(live, grace):
            seconds = grace if grace is not None else (live.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            if meta.get("deletionGracePeriodSeconds") is not None and meta["deletionGracePeriodSeconds"] <= seconds:
                return copy.deepcopy(live)
            new = copy.deepcopy(live)
            new["metadata"]["deletionTimestamp"] = _rfc3339(self.clock() + seconds)
            new["metadata"]["deletionGracePeriodSeconds"] = seconds
            out = self._put(kind, key, new, live)
        elif meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return copy.deepcopy(live)
            new = copy.deepcopy(live)
            new["metadata"]["deletionTimestamp"] = _rfc3339(self.clock())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            out = self._put(kind, key, new, live)
        else:
            out = self._remove(kind, key)
        if policy == "Background":
            for dk, dkind in self._dependents(uid):
                if dk in self._store:
                    self._delete_obj(dkind, dk, None, "Background")
        return out

    @staticmethod
    def _graceful(pod: Obj, grace: int | None) -> bool:
        """A pod is deleted gracefully when bound, not terminal, and the grace period is not 0 (pod strategy's
        ``CheckGracefulDelete``)."""
        if grace == 0 or not (pod.get("spec") or {}).get("nodeName"):
            return False
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return False
        return (grace if grace is not None else (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)) != 0

    def _dependents(self, uid: str) -> list[tuple[tuple, Kind]]:
        out = []
        for key, obj in sorted(self._store.items()):
            if any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or []):
                out.append((key, self._plural(key[0].split("/", 1)[1], key[0].split("/", 1)[0])))
        return out

    def _orphan(self, uid: str) -> None:
        for key, kind in self._dependents(uid):
            live = self._store[key]
            new = copy.deepcopy(live)
            refs = [o for o in new["metadata"]["ownerReferences"] if o.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences")
            self._put(kind, key, new, live)

    def _delete_namespace(self, kind: Kind, key: tuple) -> Obj:
        live = self._store[key]
        name = key[2]
        new = copy.deepcopy(live)
        new["metadata"].setdefault("deletionTimestamp", _rfc3339(self.clock()))
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        new["status"] = {"phase": "Terminating"}
        out = self._put(kind, key, new, live) if new != live else copy.deepcopy(live)
        for k in sorted(self._store):
            if k[1] == name and k in self._store:
                self._delete_obj(self._plural(k[0].split("/", 1)[1], k[0].split("/", 1)[0]), k, None, "Background")
        return out

    def _evict(self, kind: Kind, namespace: str | None, name: str | None, body: Obj, dry: bool) -> Obj:
        pod = self._live(kind, namespace, name)
        options = body.get("deleteOptions") or {}
        pdb_kind = self._plural("poddisruptionbudgets")
        pdbs = [o for k, o in sorted(self._store.items()) if k[0] == self._kindkey(pdb_kind) and k[1] == namespace]
        try:
            used = disruption.eviction_verdict(pod, pdbs)
        except disruption.EvictionRefused as exc:
            details: Obj = {"causes": [{"reason": "DisruptionBudget", "message": exc.cause}]}
            if exc.retry_after:
                details["retryAfterSeconds"] = exc.retry_after
            raise _Status(exc.status, exc.reason, exc.message, details, exc.retry_after) from None
        if dry or "All" in (options.get("dryRun") or []):
            self._preconditions(kind, pod, options.get("preconditions") or {})
            return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        # The budget is used up before the pod's delete checks its preconditions: an eviction refused for a
        # stale UID still costs a disruption until the disruption controller's next sync (as kube-apiserver does).
        if used is not None:
            key = self._key(pdb_kind, namespace, used["metadata"]["name"])
            new = copy.deepcopy(used)
            new["status"]["disruptionsAllowed"] -= 1
            new["status"].setdefault("disruptedPods", {})[name] = _rfc3339(self.clock())
            self._put(pdb_kind, key, new, used)
        self._preconditions(kind, pod, options.get("preconditions") or {})
        self._delete_obj(kind, self._key(kind, namespace, name or ""), options.get("gracePeriodSeconds"), "Background")
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    def _log_of(self, namespace: str | None, name: str | None, params: Mapping[str, Any]) -> _Response:
        with self._lock:
            self._live(self._plural("pods"), namespace, name)
        text = self.logs.get((namespace, name, params.get("container")), self.logs.get((namespace, name), ""))
        tail = params.get("tailLines")
        if tail is not None:
            text = "".join(text.splitlines(keepends=True)[-int(tail):])
        return _Response(200, text.encode())

    # ------------------------------------------------------------------ the controllers the fake runs

    def _controllers(self) -> None:
        """After a change: finish foreground deletions and emptied namespaces; PodDisruptionBudgets' status."""
        for key, obj in sorted(self._store.items()):
            meta = obj["metadata"]
            if key not in self._store or not meta.get("deletionTimestamp"):
                continue
            if "foregroundDeletion" in (meta.get("finalizers") or []) and not self._dependents(meta["uid"]):
                kind = self._plural(key[0].split("/", 1)[1], key[0].split("/", 1)[0])
                rest = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
                if rest:
                    new = copy.deepcopy(obj)
                    new["metadata"]["finalizers"] = rest
                    self._put(kind, key, new, obj)
                else:
                    self._remove(kind, key)
            elif key[0] == "/namespaces" and not any(k[1] == key[2] for k in self._store):
                self._remove(self._plural("namespaces"), key)
        if self.disruption_controller:
            pdb_kind = self._plural("poddisruptionbudgets")
            for key, pdb in sorted(self._store.items()):
                if key[0] != self._kindkey(pdb_kind):
                    continue
                pods = [o for k, o in self._store.items() if k[0] == "/pods" and k[1] == key[1]]
                live_names = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
                now = self.clock()
                kept = {n: t for n, t in ((pdb.get("status") or {}).get("disruptedPods") or {}).items()
                        if n in live_names and now - (parse_time(t) or 0.0) < DISRUPTED_POD_SECONDS}
                status = disruption.pdb_status(pdb, pods, self._scale, kept)
                if kept:
                    status["disruptedPods"] = kept
                if {**(pdb.get("status") or {})} != status:
                    new = copy.deepcopy(pdb)
                    new["status"] = status
                    self._put(pdb_kind, key, new, pdb)

    def _scale(self, pod: Obj) -> int | None:
        """The scale of a pod's controller (a ReplicaSet owned by a Deployment: the Deployment's), or None."""
        ref = next((o for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
        if ref is None:
            return None
        plural = {"ReplicaSet": "replicasets", "StatefulSet": "statefulsets", "Deployment": "deployments"}.get(ref["kind"])
        if plural is None:
            return None
        owner = self._store.get(self._key(self._plural(plural), pod["metadata"]["namespace"], ref["name"]))
        if owner is None:
            return None
        up = next((o for o in owner["metadata"].get("ownerReferences") or []
                   if o.get("controller") and o.get("kind") == "Deployment"), None)
        if up is not None:
            dep = self._store.get(self._key(self._plural("deployments"), pod["metadata"]["namespace"], up["name"]))
            if dep is not None:
                return (dep.get("spec") or {}).get("replicas", 1)
        return (owner.get("spec") or {}).get("replicas", 1)
