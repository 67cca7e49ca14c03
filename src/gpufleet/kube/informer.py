"""The one watch cache of gpufleet: an in-memory copy of a collection, kept by list + watch.

:class:`Informer` lists once, then watches from that resourceVersion and
relists only when the watch expires (410), the way client-go's reflector
does: no periodic full lists. Every controller loop that needs to see a
collection uses it (the virtual kubelet's pods, the taint controller's
nodes and pods, quota sync's nodes and ClusterQueues); its work queue is
:class:`gpufleet.kube.workqueue.RateLimitingQueue`.

**Indexes.** A loop that asks "the pods on node N" or "the surge pod of
victim U" on every tick must not scan the whole cache for it: at a
thousand nodes that is tens of thousands of pods per question. An
informer keeps named indexes, as client-go's ``cache.Indexer`` does: an
index function maps each cached value to the keys it is filed under
(none, one or several), the informer updates every index under its lock
with each event and relist, and :meth:`Informer.by_index` answers in the
size of the answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from .client import Kube
from .errors import Expired, Forbidden, KubeError, Unauthorized
from .retry import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What a handler receives: ``(event_type, new_value, old_value)``; event
#: types ``ADDED``, ``MODIFIED``, ``DELETED``; values as returned by the
#: informer's ``transform``; ``old_value`` is None for ADDED.
Handler = Callable[[str, Any, Any], None]

#: An index function (client-go's ``IndexFunc``): a cached value (after ``transform``) -> the index
#: keys it is filed under; an empty iterable files it nowhere.
IndexFunc = Callable[[Any], Iterable[str]]


def object_key(obj: dict) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Informer(Generic[T]):
    """An in-memory, watch-maintained cache of one collection.

    Args:
        kube: the client.
        path: collection path (:func:`gpufleet.kube.client.api_path`).
        params: list/watch parameters (``labelSelector``, ``fieldSelector``).
        transform: object -> what to keep (default: the object itself); lets
            callers keep a few fields instead of whole objects.
        handlers: called for every change, after the cache is updated, in the
            informer's thread (keep them short: queue work elsewhere).
        name: for logs and thread names.
        watch_timeout: seconds each watch request lasts before it is renewed.
        indexers: index name -> :data:`IndexFunc` (module docstring); more can be added
            later with :meth:`add_indexers`.

    Attributes:
        synced: set once the first list is in the cache.
        last_error: the last list or watch error (None once a watch ran to its end).
    """

    def __init__(self, kube: Kube, path: str, *, params: dict[str, Any] | None = None,
                 transform: Callable[[dict], T] | None = None, handlers: list[Handler] | None = None,
                 name: str = "informer", watch_timeout: int = 300, indexers: dict[str, IndexFunc] | None = None):
        self.kube = kube
        self.path = path
        self.params = dict(params or {})
        self.transform: Callable[[dict], Any] = transform or (lambda o: o)
        self.handlers = list(handlers or [])
        self.name = name
        self.watch_timeout = watch_timeout
        self.synced = threading.Event()
        self.lock = threading.RLock()
        self._items: dict[str, T] = {}
        self._indexers: dict[str, IndexFunc] = {}
        self._indices: dict[str, dict[str, set[str]]] = {}  # index name -> index key -> cache keys
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resource_version = ""
        self.relists = 0
        self.errors = 0
        self.last_error: KubeError | ValueError | None = None
        self.add_indexers(indexers or {})

    # ---------------------------------------------------------------- indexes

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Add named indexes, filled at once from what is cached; adding the same function again is a no-op.

        Raises:
            ValueError: a name already indexes with another function.
        """
        with self.lock:
            for name, fn in indexers.items():
                have = self._indexers.get(name)
                if have is fn:
                    continue
                if have is not None:
                    raise ValueError(f"informer {self.name}: index {name!r} exists with another function")
                self._indexers[name] = fn
                index: dict[str, set[str]] = {}
                for key, value in self._items.items():
                    for k in fn(value):
                        index.setdefault(k, set()).add(key)
                self._indices[name] = index

    def by_index(self, name: str, key: str) -> list[T]:
        """The cached values filed under ``key`` in index ``name`` (empty when none), in no particular order.

        Raises:
            KeyError: no index called ``name``.
        """
        with self.lock:
            try:
                keys = self._indices[name].get(key, ())
            except KeyError:
                raise KeyError(f"informer {self.name}: no index {name!r} (have: {', '.join(self._indices) or 'none'})") \
                    from None
            return [self._items[k] for k in keys]

    def _reindex(self, key: str, new: Any, old: Any) -> None:
        """Move cache key ``key`` from ``old``'s index keys to ``new``'s (either may be None); under the lock."""
        for name, fn in self._indexers.items():
            index = self._indices[name]
            before = set(fn(old)) if old is not None else set()
            after = set(fn(new)) if new is not None else set()
            for k in before - after:
                keys = index.get(k)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[k]
            for k in after - before:
                index.setdefault(k, set()).add(key)

    # ---------------------------------------------------------------- reading

    def get(self, key: str) -> T | None:
        """The cached value of ``namespace/name`` (or ``name``), or None."""
        with self.lock:
            return self._items.get(key)

    def items(self) -> list[T]:
        """A snapshot of every cached value."""
        with self.lock:
            return list(self._items.values())

    def keys(self) -> list[str]:
        """A snapshot of every cached key."""
        with self.lock:
            return list(self._items)

    def __len__(self) -> int:
        with self.lock:
            return len(self._items)

    # ---------------------------------------------------------------- running

    def start(self) -> "Informer[T]":
        """Start the list/watch thread (daemon); returns self."""
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"informer-{self.name}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the thread to stop (it ends at the next event or watch renewal)."""
        self._stop.set()

    def wait_synced(self, timeout: float = 60.0) -> bool:
        """Block until the first list is cached; False on timeout."""
        return self.synced.wait(timeout)

    def _emit(self, kind: str, new: Any, old: Any) -> None:
        for handler in self.handlers:
            try:
                handler(kind, new, old)
            except Exception:  # a handler bug must not kill the cache
                log.exception("%s: handler failed on %s", self.name, kind)

    def relist(self) -> None:
        """List the collection now and replace the cache (emitting ADDED/MODIFIED/DELETED); the watch thread's first step.

        Raises:
            KubeError: the list failed.
        """
        listed = self.kube.request("GET", self.path, params={**self.params, "resourceVersion": "0"}
                                   if not self.synced.is_set() else self.params)
        fresh = {object_key(o): self.transform(o) for o in listed.get("items") or []}
        with self.lock:
            old = self._items
            self._items = fresh
            self._indices = {name: {} for name in self._indexers}
            for key, value in fresh.items():
                self._reindex(key, value, None)
            self.resource_version = listed.get("metadata", {}).get("resourceVersion", "")
        for key, value in fresh.items():
            self._emit("MODIFIED" if key in old else "ADDED", value, old.get(key))
        for key, value in old.items():
            if key not in fresh:
                self._emit("DELETED", value, value)
        self.relists += 1
        self.synced.set()

    def apply(self, kind: str, obj: dict) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED) to the cache, then call the handlers.

        An ADDED for a key already cached is reported as MODIFIED (a watch
        restarted from an older resourceVersion replays objects).
        """
        key = object_key(obj)
        value = self.transform(obj)
        with self.lock:
            old = self._items.get(key)
            if kind == "DELETED":
                self._items.pop(key, None)
                self._reindex(key, None, old)
            else:
                self._items[key] = value
                self._reindex(key, value, old)
        self._emit(kind if kind != "ADDED" or old is None else "MODIFIED", value, old)

    def _run(self) -> None:
        backoff = Backoff(initial=0.5, cap=10.0)
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                for kind, obj in self.kube.watch(self.path, resource_version=self.resource_version,
                                                 params=self.params, timeout_seconds=self.watch_timeout):
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.resource_version = rv
                    if kind != "BOOKMARK":
                        self.apply(kind, obj)
                    if self._stop.is_set():
                        return
                backoff.reset()
                self.last_error = None
            except Expired:
                need_list = True
            except (KubeError, ValueError) as exc:
                self.errors += 1
                self.last_error = exc
                wait = backoff.next()
                if isinstance(exc, (Unauthorized, Forbidden)):
                    wait = max(wait, 5.0)  # RBAC or credentials: someone has to act; do not hammer
                log.warning("%s: watch failed (%s); retrying in %.1fs", self.name, exc, wait)
                self._stop.wait(wait)
                need_list = need_list or not self.resource_version
