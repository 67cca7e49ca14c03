"""ConfigMaps and Secrets that pods outside reference, reflected to their provider (Liqo reflects the same kinds).

A pod on a virtual node may mount ConfigMaps and Secrets, or take
environment from them (:func:`gpufleet.virtual_kubelet.translate.references` lists
which). Before its provider creates it, :meth:`Reflector.ensure` reads
each referenced object from this cluster and hands it to the provider
(:meth:`gpufleet.virtual_kubelet.provider.Provider.put_object`); while a pod
referencing an object runs there, a change of the object here reaches the
provider's copy (the pods referencing it are queued and
:meth:`Reflector.ensure` puts the new version); once no pod at a provider
references it any more (:meth:`Reflector.release`), the copy is deleted
there. A copy whose source object is deleted here is deleted there too.

A non-optional object that does not exist (or that the virtual kubelet may
not read) keeps the pod from starting: :class:`MissingObjects`, and the pod
side leaves the pod Pending with reason ``CreateContainerConfigError``, as
a kubelet does; the object's creation queues the pod again. An optional one
that does not exist is left out, as a kubelet leaves it out (an empty
volume, no variables from it); one the virtual kubelet may not read is left
out too, where a kubelet (which may read every object its pods reference)
would have put it in if it exists. Both are :class:`Unresolved` answers of
:meth:`Reflector.ensure`, and the pod side records a Warning Event on the
pod saying which object and why.

Watches: one :class:`~gpufleet.kube.informer.Informer` per kind and
namespace in which a pod outside references objects, started with the first
such pod and stopped with the last; they keep each object's name and
resourceVersion only (never its data), so memory stays a few hundred bytes
per object of those namespaces. The data is read (GET) only to be put, and
only when the resourceVersion differs from the one the provider has. Where
the informer cannot list (RBAC allows ``get`` only), every check reads the
object instead.

After a restart nothing is known of earlier puts: each referenced object is
put once again (idempotent), and :meth:`Reflector.sweep` (on the pod
side's resync) deletes copies a provider holds that no pod references.

Secrets: their data goes from the GET to the provider and nowhere else; log
lines, Events, exceptions and statuses name objects by kind and name only,
and provider errors are redacted (:func:`gpufleet.virtual_kubelet.provider.redact`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpufleet.kube import Forbidden, Kube, KubeError, NotFound, api_path
from gpufleet.kube.informer import Informer

from .provider import ObjectRef, Pod, Provider, ProviderError, supports_objects
from .translate import Reference, Refused, references

log = logging.getLogger(__name__)

PLURALS = {"ConfigMap": "configmaps", "Secret": "secrets"}
#: Locks striping the puts and deletes of objects (one object's put and delete never overlap).
STRIPES = 64
_UNKNOWN = object()


class MissingObjects(RuntimeError):
    """Non-optional objects a pod references do not exist here or cannot be read; the pod cannot start yet.

    Attributes:
        reason: ``CreateContainerConfigError`` (the kubelet's reason for a container waiting on them).
        missing: ``[(reference, why)]``, ``why`` e.g. ``not found``.
    """

    reason = "CreateContainerConfigError"

    def __init__(self, namespace: str, missing: list[tuple[Reference, str]]):
        self.namespace = namespace
        self.missing = missing
        super().__init__("; ".join(f'{ref.kind.lower()} "{ref.name}" {why}' for ref, why in missing))


@dataclass(frozen=True)
class Unresolved:
    """An optional object a pod starts without: it does not exist here, or the virtual kubelet may not read it.

    Attributes:
        ref: the reference (``optional``).
        namespace: the pod's namespace.
        why: ``not found``, or ``cannot be read: ...`` (names the RBAC it lacks).
        forbidden: the virtual kubelet may not read it (403), rather than it being absent.
    """

    ref: Reference
    namespace: str
    why: str
    forbidden: bool = False

    @property
    def reason(self) -> str:
        """The Event reason: ``OptionalObjectForbidden`` or ``OptionalObjectNotFound``."""
        return "OptionalObjectForbidden" if self.forbidden else "OptionalObjectNotFound"

    @property
    def message(self) -> str:
        """What the Event says (names only, never data)."""
        what = f'optional {self.ref.kind.lower()} "{self.ref.name}" {self.why}'
        if self.forbidden:
            return (f"{what}; the pod starts without it, where a kubelet, which may read the objects its pods "
                    "reference, would have put it in if it exists")
        return f"{what} in namespace {self.namespace}: the pod starts without it, as it would under a kubelet"


@dataclass(frozen=True)
class _Registration:
    key: str  # the source pod's namespace/name
    provider: str
    namespace: str
    refs: tuple[Reference, ...]


def _slim(obj: dict) -> dict:
    """What the informers keep of an object: its name, namespace and resourceVersion (never its data)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta}}


class Reflector:
    """Keeps each provider's copies of the ConfigMaps and Secrets its pods reference (module docstring).

    Args:
        kube: client of the cluster the pods are in (reads the objects).
        node_name: the virtual node (for logs and informer names).
        providers: ``{name: Provider}`` (the pod side's).
        on_pod: called with a pod's ``namespace/name`` when an object it references changed (the pod side queues it).
        watch: watch the namespaces (False: every check reads the objects; for tests without a cluster).
    """

    def __init__(self, kube: Kube, node_name: str, providers: dict[str, Provider], *,
                 on_pod: Callable[[str], None] | None = None, watch: bool = True):
        self.kube = kube
        self.node = node_name
        self.providers = providers
        self.on_pod = on_pod
        self.watch = watch
        self._lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(STRIPES)]
        self._pods: dict[str, _Registration] = {}  # source pod UID -> what it references, at which provider
        self._by_object: dict[tuple[str, str, str], set[str]] = {}  # (kind, namespace, name) -> pod UIDs
        self._put: dict[tuple[str, str, str, str], str] = {}  # (provider, kind, namespace, name) -> resourceVersion
        self._informers: dict[tuple[str, str], Informer[dict]] = {}  # (kind, namespace) -> informer

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Stop every watch."""
        with self._lock:
            informers, self._informers = list(self._informers.values()), {}
        for inf in informers:
            inf.stop()

    def _stripe(self, provider: str, kind: str, namespace: str, name: str) -> threading.Lock:
        return self._stripes[hash((provider, kind, namespace, name)) % STRIPES]

    def _watch_namespaces(self) -> None:
        """Start the informers of (kind, namespace) pairs now referenced, stop the others. Caller holds no lock."""
        if not self.watch:
            return
        with self._lock:
            wanted = {(ref.kind, reg.namespace) for reg in self._pods.values() for ref in reg.refs}
            start = [k for k in wanted if k not in self._informers]
            stop = [self._informers.pop(k) for k in list(self._informers) if k not in wanted]
            for kind, ns in start:
                self._informers[(kind, ns)] = Informer(
                    self.kube, api_path("v1", PLURALS[kind], ns), transform=_slim, handlers=[self._handler(kind)],
                    name=f"reflect-{PLURALS[kind]}-{ns}-{self.node}")
            new = [self._informers[k] for k in start]
        for inf in new:
            inf.start()
        for inf in stop:
            inf.stop()

    def _handler(self, kind: str) -> Callable[[str, Any, Any], None]:
        def on_change(event: str, new: Any, old: Any) -> None:
            meta = (new or old or {}).get("metadata") or {}
            if event == "MODIFIED" and old is not None and (old.get("metadata") or {}).get(
                    "resourceVersion") == meta.get("resourceVersion"):
                return  # a relist's replay
            with self._lock:
                keys = {self._pods[u].key for u in self._by_object.get((kind, meta.get("namespace"), meta.get("name")), ())
                        if u in self._pods}
            if self.on_pod is not None:
                for key in sorted(keys):
                    self.on_pod(key)
        return on_change

    # ------------------------------------------------------------------ bookkeeping

    def _register(self, uid: str, reg: _Registration) -> None:
        with self._lock:
            old = self._pods.get(uid)
            if old == reg:
                return
        if old is not None:
            self.release(uid)  # it was to go to another provider
        with self._lock:
            self._pods[uid] = reg
            for ref in reg.refs:
                self._by_object.setdefault((ref.kind, reg.namespace, ref.name), set()).add(uid)
        self._watch_namespaces()

    def referenced(self, provider: str) -> set[ObjectRef]:
        """The objects pods registered at ``provider`` reference (being started there, or running there)."""
        with self._lock:
            return {ObjectRef(ref.kind, reg.namespace, ref.name) for reg in self._pods.values()
                    if reg.provider == provider for ref in reg.refs}

    def _cached_version(self, kind: str, namespace: str, name: str) -> Any:
        """The informer's resourceVersion of the object, None if it does not exist, ``_UNKNOWN`` without a synced informer."""
        with self._lock:
            inf = self._informers.get((kind, namespace))
        if inf is None or not inf.synced.is_set():
            return _UNKNOWN
        obj = inf.get(f"{namespace}/{name}")
        return None if obj is None else obj["metadata"].get("resourceVersion")

    def _read(self, ref: Reference, namespace: str) -> tuple[dict | None, str]:
        """The object (None if it cannot be had) and, when None, why (``not found``, ``cannot be read: ...``).

        Raises:
            KubeError: the API server failed otherwise (the caller retries).
        """
        try:
            return self.kube.get("v1", PLURALS[ref.kind], ref.name, namespace), ""
        except NotFound:
            return None, "not found"
        except Forbidden:
            return None, (f"cannot be read: the virtual kubelet may not get {PLURALS[ref.kind]} in namespace "
                          f"{namespace} (its role's RBAC)")

    # ------------------------------------------------------------------ the work

    def ensure(self, pod: Pod, provider: Provider, *, starting: bool) -> list[Unresolved]:
        """Make ``provider`` hold the current version of every object ``pod`` references.

        ``starting``: the pod is about to be created there; a missing
        non-optional object then raises and nothing is put. Otherwise (the pod
        runs there) a copy whose source object is gone is deleted.

        Returns:
            (``starting``) the optional objects the pod starts without, and
            why (absent, or not readable by the virtual kubelet), in the
            order of :func:`gpufleet.virtual_kubelet.translate.references`; otherwise ``[]``.

        Raises:
            MissingObjects: (``starting``) a non-optional object does not exist or cannot be read.
            Refused: the pod references objects and the provider carries none.
            ProviderError: the provider failed (message redacted); KubeError: reading failed (retry).
        """
        refs = references(pod)
        if not refs:
            return []
        meta = pod["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        if not supports_objects(provider):
            raise Refused(f"{refs[0].kind} {refs[0].name!r} is referenced, and provider {provider.name} carries no "
                          "ConfigMaps or Secrets")
        self._register(uid, _Registration(f"{ns}/{meta['name']}", provider.name, ns, tuple(refs)))
        todo: list[tuple[Reference, dict | None]] = []
        missing: list[tuple[Reference, str]] = []
        unresolved: list[Unresolved] = []
        for ref in refs:
            with self._lock:
                done = self._put.get((provider.name, ref.kind, ns, ref.name))
            cached = self._cached_version(ref.kind, ns, ref.name)
            if cached is not _UNKNOWN and cached is not None and cached == done:
                continue  # the provider has this version
            if cached is None and done is None and not starting:
                continue  # absent here and there
            obj, why = self._read(ref, ns)
            if obj is not None and obj["metadata"].get("resourceVersion") == done:
                continue
            if obj is None and not ref.optional and starting:
                missing.append((ref, why))
                continue
            if obj is None and starting and done is None:
                unresolved.append(Unresolved(ref, ns, why, forbidden=why != "not found"))
            if obj is None and why != "not found":
                continue  # unreadable, not known to be gone: a copy there stays
            todo.append((ref, obj))
        if missing:
            raise MissingObjects(ns, missing)
        for ref, obj in todo:
            self._apply(provider, ns, ref, obj)
        return unresolved

    def _apply(self, provider: Provider, namespace: str, ref: Reference, obj: dict | None) -> None:
        """Put ``obj`` at ``provider`` (None: delete its copy, if one was put)."""
        pkey = (provider.name, ref.kind, namespace, ref.name)
        with self._stripe(*pkey):
            with self._lock:
                done = self._put.get(pkey)
            if obj is None:
                if done is not None:
                    provider.delete_object(ref.kind, namespace, ref.name)
                    log.info("%s: %s %s/%s deleted here: its copy at %s removed", self.node, ref.kind, namespace,
                             ref.name, provider.name)
                    with self._lock:
                        self._put.pop(pkey, None)
                return
            rv = obj["metadata"].get("resourceVersion", "")
            if done == rv:
                return
            provider.put_object(ref.kind, namespace, obj)
            log.info("%s: %s %s/%s (resourceVersion %s) reflected to %s", self.node, ref.kind, namespace, ref.name, rv,
                     provider.name)
            with self._lock:
                self._put[pkey] = rv

    def release(self, uid: str) -> None:
        """Pod ``uid`` no longer runs at its provider: delete the copies no other pod there references. Never raises
        for a provider failure (logged; :meth:`sweep` deletes the copy later)."""
        with self._lock:
            reg = self._pods.pop(uid, None)
            if reg is None:
                return
            for ref in reg.refs:
                uids = self._by_object.get((ref.kind, reg.namespace, ref.name))
                if uids is not None:
                    uids.discard(uid)
                    if not uids:
                        del self._by_object[(ref.kind, reg.namespace, ref.name)]
        provider = self.providers.get(reg.provider)
        for ref in reg.refs:
            pkey = (reg.provider, ref.kind, reg.namespace, ref.name)
            with self._stripe(*pkey):
                with self._lock:
                    if any(self._pods[u].provider == reg.provider
                           for u in self._by_object.get((ref.kind, reg.namespace, ref.name), ()) if u in self._pods):
                        continue
                    done = self._put.pop(pkey, None)
                if done is None or provider is None:
                    continue
                try:
                    provider.delete_object(ref.kind, reg.namespace, ref.name)
                    log.info("%s: %s %s/%s no longer referenced at %s: its copy removed", self.node, ref.kind,
                             reg.namespace, ref.name, reg.provider)
                except ProviderError as exc:
                    log.warning("%s: %s %s/%s: copy at %s not removed (%s); the next sweep retries", self.node,
                                ref.kind, reg.namespace, ref.name, reg.provider, exc)
        self._watch_namespaces()

    def sweep(self, provider: Provider, live: Iterable[ObjectRef] = ()) -> int:
        """Delete the copies ``provider`` holds that no pod references (registered here, or in ``live``:
        the objects its pods known here reference); returns how many. Raises ProviderError (listing failed)."""
        if not supports_objects(provider):
            return 0
        held = provider.get_objects()  # before reading what is referenced: a put after this is not in it
        keep = set(live) | self.referenced(provider.name)
        gone = 0
        for o in held:
            if o in keep:
                continue
            pkey = (provider.name, o.kind, o.namespace, o.name)
            with self._stripe(*pkey):
                if o in self.referenced(provider.name):
                    continue  # a pod referencing it was registered meanwhile
                try:
                    provider.delete_object(o.kind, o.namespace, o.name)
                except ProviderError as exc:
                    log.warning("%s: sweep: %s %s/%s at %s not removed: %s", self.node, o.kind, o.namespace, o.name,
                                provider.name, exc)
                    continue
                with self._lock:
                    self._put.pop(pkey, None)
            log.info("%s: sweep: %s %s/%s at %s referenced by no pod: removed", self.node, o.kind, o.namespace, o.name,
                     provider.name)
            gone += 1
        return gone


def live_references(pods: Iterable[Pod]) -> set[ObjectRef]:
    """The objects ``pods`` reference, as :class:`ObjectRef` (namespace: each pod's)."""
    return {ObjectRef(ref.kind, p["metadata"]["namespace"], ref.name) for p in pods for ref in references(p)}
