"""Endpoint health: the virtual kubelet checks the addresses it publishes, as a load balancer checks its targets.

Why: a provider may report a pod Running and Ready while nothing answers
at its published address (the server process died behind a live
container, a rental's port mapping broke, a remote load balancer lost its
backends). The pod's mirrored readiness cannot see that; requests would
keep going there. So the virtual kubelet checks every address it
publishes itself, the way a cloud load balancer health-checks its targets:
a TCP connect to each published ``address:port`` every
``interval_seconds``, given up after ``timeout_seconds``;
``unhealthy_threshold`` consecutive failures mark the address unreachable,
one success marks it reachable again.

Where the numbers come from: Google Cloud load-balancer health checks
(``gcloud compute health-checks create tcp``) default to a 5 s interval, a
5 s timeout and 2 consecutive failures to mark a backend unhealthy
(healthy again after 2 successes); AWS Network Load Balancer target groups
also mark a TCP target unhealthy after 2 failures (Elastic Load Balancing
API ``CreateTargetGroup``: ``UnhealthyThresholdCount`` defaults to 2). Requests must leave a dead
endpoint within seconds here, so the defaults are shorter: every 2 s, 1 s
timeout, 2 failures (a dead endpoint is out in 2-4 s plus one EndpointSlice
write and the data plane's reaction). One success brings it back at once:
the pod's own readiness still gates it, and a flapping endpoint costs a
few requests, not a pod.

What it changes (:func:`gpufleet.virtual_kubelet.endpoints.build_slices`): an
unreachable address is published with ``serving`` and ``ready`` false
(``ready`` stays true under ``publishNotReadyAddresses``, which asks for
every address whatever its state, as the standard controller does). An
address is unreachable when any of its published TCP ports is; UDP and
SCTP ports are not checked (a connect proves nothing there). Addresses of
terminating pods are not checked (they are not ready already). A new
address starts reachable: the pod's readiness admitted it.

It is mirrored on the pods behind the address: one Event per transition,
``EndpointUnreachable`` (Warning, naming ``address:port`` and the error)
and ``EndpointReachable`` (Normal). Nothing else changes on the pod: its
status stays the provider's.

How connects are made: providers whose addresses this process reaches
through the network are checked by real non-blocking TCP connects, all
of a round in parallel (:func:`tcp_probe`). A provider whose addresses
exist only in a simulation (the simulated rental's never-routed
198.18.0.0/15 endpoints) offers ``dial(ip, port, timeout)`` instead
(:data:`Dial`), and is asked.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.kube.events import record_event
from gpufleet.names import SERVICE_NAME_LABEL

from . import metrics
from .config import HealthSettings

log = logging.getLogger(__name__)

#: ``(ip, port)`` of a published TCP endpoint.
Target = tuple[str, int]
#: A provider's own connect: ``dial(ip, port, timeout_seconds)`` returns once accepted, raises OSError otherwise.
Dial = Callable[[str, int, float], None]
#: Sockets open at once in one round of :func:`tcp_probe` (well under the default 1024 open files).
MAX_PARALLEL = 256

Obj = dict[str, Any]


# ------------------------------------------------------------------------------- pure


@dataclass(frozen=True)
class Transition:
    """A target that changed state: ``reachable`` now or not, and the error of its last failed connect."""

    target: Target
    reachable: bool
    error: str


class HealthTable:
    """Consecutive failures per target and the targets now unreachable; pure (no I/O, no clock).

    Args:
        unhealthy_threshold: consecutive failures that make a target unreachable.
    """

    def __init__(self, unhealthy_threshold: int):
        self.threshold = unhealthy_threshold
        self._failures: dict[Target, int] = {}
        self._errors: dict[Target, str] = {}
        self._down: set[Target] = set()

    def observe(self, target: Target, error: str | None) -> Transition | None:
        """Record one check of ``target`` (``error`` None: it answered); the transition it caused, if any."""
        if error is None:
            self._failures.pop(target, None)
            if target in self._down:
                self._down.discard(target)
                return Transition(target, True, self._errors.pop(target, ""))
            self._errors.pop(target, None)
            return None
        self._failures[target] = self._failures.get(target, 0) + 1
        self._errors[target] = error
        if target not in self._down and self._failures[target] >= self.threshold:
            self._down.add(target)
            return Transition(target, False, error)
        return None

    def keep(self, targets: Iterable[Target]) -> None:
        """Forget every target not in ``targets`` (no longer published)."""
        keep = set(targets)
        for d in (self._failures, self._errors):
            for t in [t for t in d if t not in keep]:
                del d[t]
        self._down &= keep

    def unreachable(self) -> frozenset[str]:
        """Addresses (IPs) with at least one unreachable target."""
        return frozenset(ip for ip, _ in self._down)

    def down(self) -> frozenset[Target]:
        """Targets now unreachable."""
        return frozenset(self._down)

    def error(self, target: Target) -> str:
        """The last failed connect's error of ``target`` ("" if it answered last)."""
        return self._errors.get(target, "")


def published_targets(slices: Iterable[Obj]) -> dict[str, dict[int, set[str]]]:
    """What the slices publish to check: ``{ip: {TCP port: {Service keys "namespace/name"}}}``.

    Terminating endpoints are left out (module docstring).
    """
    out: dict[str, dict[int, set[str]]] = {}
    for s in slices:
        meta = s.get("metadata") or {}
        key = f"{meta.get('namespace')}/{(meta.get('labels') or {}).get(SERVICE_NAME_LABEL, '')}"
        ports = [p["port"] for p in s.get("ports") or [] if p.get("protocol", "TCP") == "TCP" and p.get("port")]
        for e in s.get("endpoints") or []:
            if (e.get("conditions") or {}).get("terminating"):
                continue
            for ip in e.get("addresses") or []:
                for port in ports:
                    out.setdefault(ip, {}).setdefault(port, set()).add(key)
    return out


# ------------------------------------------------------------------------------- connects


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno and not exc.strerror:
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__


def tcp_probe(targets: Iterable[Target], timeout: float, *, max_parallel: int = MAX_PARALLEL) -> dict[Target, str | None]:
    """TCP-connect to every target, ``max_parallel`` at a time, each within ``timeout`` seconds.

    Non-blocking sockets and one selector: a round of N targets takes about
    ``timeout * ceil(N / max_parallel)`` seconds at worst, in one thread.

    Returns:
        ``{target: None}`` where the connect was accepted (then closed at
        once), else the error (``"Connection refused"``, ``"timed out after
        1s"``, ``"Network is unreachable"``...).
    """
    todo = list(dict.fromkeys(targets))
    out: dict[Target, str | None] = {}
    for start in range(0, len(todo), max_parallel):
        sel = selectors.DefaultSelector()
        try:
            for target in todo[start:start + max_parallel]:
                ip, port = target
                try:
                    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
                    sock = socket.socket(family, socket.SOCK_STREAM)
                except OSError as exc:
                    out[target] = _describe(exc)
                    continue
                sock.setblocking(False)
                code = sock.connect_ex((ip, port))
                if code == 0:
                    out[target] = None
                    sock.close()
                elif code in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
                    sel.register(sock, selectors.EVENT_WRITE, target)
                else:
                    out[target] = os.strerror(code)
                    sock.close()
            deadline = time.monotonic() + timeout
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in sel.select(left):
                    sock, target = key.fileobj, key.data
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    out[target] = None if code == 0 else os.strerror(code)
                    sel.unregister(sock)
                    sock.close()
            for key in list(sel.get_map().values()):
                out[key.data] = f"timed out after {timeout:g}s"
                key.fileobj.close()
        finally:
            sel.close()
    return out


def probe(targets: Mapping[Target, Dial | None], timeout: float) -> dict[Target, str | None]:
    """Check every target: by its provider's :data:`Dial` where it has one, else by :func:`tcp_probe`."""
    out = tcp_probe([t for t, dial in targets.items() if dial is None], timeout)
    for target, dial in targets.items():
        if dial is None:
            continue
        try:
            dial(target[0], target[1], timeout)
            out[target] = None
        except OSError as exc:
            out[target] = _describe(exc)
    return out


# ------------------------------------------------------------------------------- checker


class EndpointHealthChecker:
    """Checks the addresses one virtual node publishes, every ``settings.interval_seconds`` (module docstring).

    Args:
        kube: client (Events on the pods).
        node_name: the virtual node.
        slices: the publisher's informer of this node's EndpointSlices (what is published).
        pods: the pod side's informer of the node's pods.
        address_of: source pod -> its :class:`~gpufleet.virtual_kubelet.provider.Address`, or None.
        dial_of: source pod -> its provider's :data:`Dial`, or None (a real TCP connect).
        on_change: called with the Service keys whose slices must be rewritten after a transition.
        settings: interval, timeout, threshold.
    """

    def __init__(self, kube, node_name: str, slices, pods, address_of: Callable[[Obj], Any],
                 dial_of: Callable[[Obj], Dial | None], on_change: Callable[[Iterable[str]], None],
                 settings: HealthSettings):
        self.kube = kube
        self.node = node_name
        self.slices = slices
        self.pods = pods
        self.address_of = address_of
        self.dial_of = dial_of
        self.on_change = on_change
        self.settings = settings
        self.table = HealthTable(settings.unhealthy_threshold)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0

    def unreachable(self) -> frozenset[str]:
        """Addresses now unreachable (read by the publisher when it builds slices)."""
        with self._lock:
            return self.table.unreachable()

    def start(self) -> "EndpointHealthChecker":
        """Start the checking thread."""
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"endpoint-health-{self.node}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop checking (the slices keep what was published)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.interval_seconds):
            try:
                self.check_once()
            except Exception:  # never let one round stop the checks
                log.exception("%s: endpoint health check failed", self.node)

    def check_once(self) -> list[Transition]:
        """One round: check every published address of a live pod, apply the transitions; returns them."""
        published = published_targets(self.slices.items())
        behind: dict[str, list[Obj]] = {}
        targets: dict[Target, Dial | None] = {}
        for pod in self.pods.items():
            if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
                    "Succeeded", "Failed"):
                continue
            address = self.address_of(pod)
            if address is None or address.ip not in published:
                continue
            behind.setdefault(address.ip, []).append(pod)
            dial = self.dial_of(pod)
            for port in published[address.ip]:
                targets.setdefault((address.ip, port), dial)
        results = probe(targets, self.settings.timeout_seconds)
        with self._lock:
            before = self.table.unreachable()
            changes = [t for target, error in sorted(results.items()) if (t := self.table.observe(target, error))]
            self.table.keep(targets)
            after = self.table.unreachable()
            down = self.table.down()
            errors = {t: self.table.error(t) for t in down}
        self.rounds += 1
        metrics.ENDPOINTS_UNREACHABLE.labels(self.node).set(len(after))
        flipped = (before ^ after) & set(behind)
        if flipped:
            self.on_change(sorted({svc for ip in flipped for svcs in published[ip].values() for svc in svcs}))
        for ip in sorted(flipped):
            if ip in after:
                failing = sorted(t for t in down if t[0] == ip)
                what = "; ".join(f"{a}:{p}: {errors[(a, p)]}" for a, p in failing)
                message = (f"endpoint {what} ({self.settings.unhealthy_threshold} consecutive failed TCP connects, "
                           f"every {self.settings.interval_seconds:g}s, timeout {self.settings.timeout_seconds:g}s); "
                           "published not ready, while the provider still reports the pod running")
                log.warning("%s: %s", self.node, message)
                self._events(behind[ip], "EndpointUnreachable", message, "Warning")
            else:
                ports = ", ".join(f"{ip}:{p}" for p in sorted(published[ip]))
                self._events(behind[ip], "EndpointReachable", f"endpoint {ports} answers TCP connects again; "
                                                              "published ready", "Normal")
        return changes

    def _events(self, pods: list[Obj], reason: str, message: str, kind: str) -> None:
        for pod in pods:
            # Listed pods carry no kind: name it, or the Event would not point at the pod.
            record_event(self.kube, {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}, reason,
                         message, type_=kind, component="gpufleet-virtual-kubelet", instance=self.node,
                         host=self.node)
