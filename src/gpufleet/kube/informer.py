"""The one watch cache of gpufleet: an in-memory copy of a collection, kept by list + watch.

:class:`Informer` lists once, then watches from that resourceVersion and
relists only when the watch expires (410), the way client-go's reflector
does: no periodic full lists. Every controller loop that needs to see a
collection uses it (the virtual kubelet's pods, the taint controller's
nodes and pods, quota sync's nodes and ClusterQueues); its work queue is
:class:`gpufleet.kube.workqueue.RateLimitingQueue`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
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

    Attributes:
        synced: set once the first list is in the cache.
    """

    def __init__(self, kube: Kube, path: str, *, params: dict[str, Any] | None = None,
                 transform: Callable[[dict], T] | None = None, handlers: list[Handler] | None = None,
                 name: str = "informer", watch_timeout: int = 300):
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resource_version = ""
        self.relists = 0
        self.errors = 0

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
            else:
                self._items[key] = value
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
            except Expired:
                need_list = True
            except (KubeError, ValueError) as exc:
                self.errors += 1
                wait = backoff.next()
                if isinstance(exc, (Unauthorized, Forbidden)):
                    wait = max(wait, 5.0)  # RBAC or credentials: someone has to act; do not hammer
                log.warning("%s: watch failed (%s); retrying in %.1fs", self.name, exc, wait)
                self._stop.wait(wait)
                need_list = need_list or not self.resource_version
