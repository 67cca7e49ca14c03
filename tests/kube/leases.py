"""An in-memory double of :class:`gpufleet.kube.Kube` for leader election: Leases, other writes, and requests that hang.

Behind the client's interface as :class:`~gpufleet.kube.leader.LeaderElector`
and :func:`gpufleet.controllers.runtime.run` use it: ``request`` (GET, POST,
PUT of Leases with resourceVersion preconditions: ``NotFound``,
``Conflict``, as the API server answers), ``create``/``patch`` of other
objects (recorded in :attr:`FakeLeaseApi.writes`), ``fence_writes`` with the
client's rule (a fenced write is admitted by the fence, its timeout cut to
the time left, sent once), ``timeout``.

:meth:`FakeLeaseApi.hang` makes every later request hang, as through a
half-open connection: until its timeout passes (``honour_timeouts``, what a
socket timeout does) or until :meth:`FakeLeaseApi.answer_again`.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.kube import Conflict, NotFound, Unreachable, api_path
from gpufleet.kube.fence import Fence



@dataclass
class Call:
    """One request: method, path, timeout (seconds; None: the client's), retry, clock at sending, body."""

    method: str
    path: str
    timeout: float | None
    retry: bool
    sent_at: float
    body: Any = None


class FakeLeaseApi:
    """Leases in memory behind ``Kube``'s interface (module docstring).

    Args:
        clock: what :attr:`Call.sent_at` and :attr:`writes` record (the elector's clock).
    """

    timeout = 30.0

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.leases: dict[str, dict] = {}
        self.rv = 0
        self.calls: list[Call] = []
        self.writes: list[tuple[float, str, str]] = []  # (clock, method, path) of writes that reached the "server"
        self.fence: Fence | None = None
        self.in_flight = 0
        self._hung = threading.Event()
        self._answer = threading.Event()
        self._honour_timeouts = True
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ faults

    def hang(self, *, honour_timeouts: bool = True) -> None:
        """Every later request hangs: until its timeout (``honour_timeouts``), else until :meth:`answer_again`."""
        self._honour_timeouts = honour_timeouts
        self._answer.clear()
        self._hung.set()

    def answer_again(self) -> None:
        """Hung requests fail (Unreachable) now; later ones are answered."""
        self._hung.clear()
        self._answer.set()

    # ------------------------------------------------------------------ the interface

    def fence_writes(self, fence: Fence) -> None:
        """As :meth:`gpufleet.kube.Kube.fence_writes`."""
        self.fence = fence

    def request(self, method: str, path: str, *, params: Any = None, body: Any = None, patch: str | None = None,
                content_type: str | None = None, accept: str | None = None, timeout: float | None = None,
                retry: bool = True) -> dict:
        """As :meth:`gpufleet.kube.Kube.request` for Leases; other writes are recorded and answered ``{}``."""
        if self.fence is not None:
            left = self.fence.admit(method, path)
            if left is not None:
                timeout = min(timeout if timeout is not None else self.timeout, left)
                retry = False
        with self._lock:
            self.calls.append(Call(method, path, timeout, retry, self.clock(), copy.deepcopy(body)))
        if self._hung.is_set():
            with self._lock:
                self.in_flight += 1
            try:
                wait = (timeout if timeout is not None else self.timeout) if self._honour_timeouts else None
                self._answer.wait(wait)
            finally:
                with self._lock:
                    self.in_flight -= 1
            raise Unreachable(f"fake: no answer to {method} {path}", path=f"{method} {path}")
        with self._lock:
            return self._serve(method, path, body)

    def _serve(self, method: str, path: str, body: Any) -> dict:
        if "/leases" not in path:
            if method != "GET":
                self.writes.append((self.clock(), method, path))
            return {}
        if method == "GET":
            if path not in self.leases:
                raise NotFound(404, "NotFound", f"lease {path} not found", path=f"GET {path}")
            return copy.deepcopy(self.leases[path])
        if method == "POST":
            obj = copy.deepcopy(body)
            meta = obj["metadata"]
            key = api_path("coordination.k8s.io/v1", "leases", meta["namespace"], meta["name"])
            if key in self.leases:
                raise Conflict(409, "AlreadyExists", f"lease {key} exists", path=f"POST {path}")
            return self._store(key, obj)
        if method == "PUT":
            current = self.leases.get(path)
            if current is None:
                raise NotFound(404, "NotFound", f"lease {path} not found", path=f"PUT {path}")
            if (body.get("metadata") or {}).get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise Conflict(409, "Conflict", "the object has been modified", path=f"PUT {path}")
            return self._store(path, copy.deepcopy(body))
        raise AssertionError(f"fake: {method} {path} not modelled")

    def _store(self, key: str, obj: dict) -> dict:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[key] = obj
        self.writes.append((self.clock(), "LEASE", key))
        return copy.deepcopy(obj)

    def create(self, api_version: str, plural: str, body: dict, namespace: str | None = None, **_: Any) -> dict:
        """As :meth:`gpufleet.kube.Kube.create`."""
        return self.request("POST", api_path(api_version, plural, namespace), body=body)

    def patch(self, api_version: str, plural: str, name: str, body: Any, namespace: str | None = None,
              **_: Any) -> dict:
        """As :meth:`gpufleet.kube.Kube.patch`."""
        return self.request("PATCH", api_path(api_version, plural, namespace, name), body=body)

    # ------------------------------------------------------------------ for tests

    def set_holder(self, name: str, namespace: str, holder: str, duration: int = 15) -> None:
        """Write the Lease's holder as another actor would (``kubectl edit``)."""
        key = api_path("coordination.k8s.io/v1", "leases", namespace, name)
        with self._lock:
            obj = copy.deepcopy(self.leases.get(key)) or {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace}, "spec": {}}
            obj["spec"].update(holderIdentity=holder, leaseDurationSeconds=duration,
                               renewTime=f"2030-01-01T00:00:{self.rv % 60:02d}.000000Z")
            self._store(key, obj)

    def holder(self, name: str, namespace: str) -> str:
        """The Lease's holder now ("" when none or no Lease)."""
        lease = self.leases.get(api_path("coordination.k8s.io/v1", "leases", namespace, name)) or {}
        return (lease.get("spec") or {}).get("holderIdentity") or ""
