"""Watch-based caches and a work queue: the two primitives every gpufleet controller loop uses.

:class:`Informer` keeps an in-memory copy of one collection (list once, then
watch from that resourceVersion; relist only when the watch expires), the
way client-go's reflector does: no periodic full lists. :class:`WorkQueue`
is client-go's rate-less work queue: a key is queued at most once, never
processed by two workers at the same time, and can be re-queued after a
delay.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Hashable, TypeVar

import httpx

from .kube import Expired, Kube, KubeError

log = logging.getLogger(__name__)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

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
        path: collection path (``gpufleet.vk.kube.api_path``).
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

    def _list(self) -> None:
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

    def _run(self) -> None:
        backoff = 0.5
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                for kind, obj in self.kube.watch(self.path, resource_version=self.resource_version,
                                                 params=self.params, timeout_seconds=self.watch_timeout):
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.resource_version = rv
                    if kind == "BOOKMARK":
                        continue
                    key = object_key(obj)
                    value = self.transform(obj)
                    with self.lock:
                        old = self._items.get(key)
                        if kind == "DELETED":
                            self._items.pop(key, None)
                        else:
                            self._items[key] = value
                    self._emit(kind if kind != "ADDED" or old is None else "MODIFIED", value, old)
                    if self._stop.is_set():
                        return
                backoff = 0.5
            except Expired:
                need_list = True
            except (KubeError, httpx.HTTPError, ValueError) as exc:
                self.errors += 1
                log.warning("%s: watch failed (%s); retrying in %.1fs", self.name, exc, backoff)
                if isinstance(exc, KubeError) and exc.status in (401, 403):
                    backoff = max(backoff, 5.0)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                need_list = need_list or not self.resource_version


class WorkQueue(Generic[K]):
    """A de-duplicating work queue with delayed re-queueing (client-go's semantics).

    A key added while queued is not queued twice; a key added while a worker
    holds it is queued again once that worker calls :meth:`done`, so a key is
    never processed by two workers at once.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[K] = []
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []
        self._seq = 0
        self._shutdown = False

    def add(self, key: K) -> None:
        """Queue ``key`` now (no-op if already queued)."""
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds (now if ``delay`` <= 0)."""
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            self._seq += 1
            heapq.heappush(self._delayed, (time.monotonic() + delay, self._seq, key))
            self._cond.notify()

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to process (mark it done with :meth:`done`), or None on timeout/shutdown."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    _, _, key = heapq.heappop(self._delayed)
                    self._add_locked(key)
                if self._queue:
                    key = self._queue.pop(0)
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if self._shutdown:
                    return None
                wait = None if deadline is None else deadline - now
                if self._delayed:
                    due = self._delayed[0][0] - now
                    wait = due if wait is None else min(wait, due)
                if wait is not None and wait <= 0 and deadline is not None and now >= deadline:
                    return None
                self._cond.wait(wait if wait is None else max(wait, 0.001))

    def done(self, key: K) -> None:
        """Mark ``key`` processed; re-queue it if it was added meanwhile."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        """Wake every waiting worker; :meth:`get` returns None from now on."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._delayed)
