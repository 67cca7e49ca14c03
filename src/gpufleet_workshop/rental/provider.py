"""The simulated provider: an in-process stand-in for a GPU rental API.

A pod created here is ``Pending`` (``ContainerCreating``) for
``start_latency_seconds``, then ``Running`` and Ready; a pod annotated
``gpufleet.io/simulated-duration-seconds`` then ``Succeeded`` that many
seconds later. Capacity (GPUs, CPU, memory, pods) is enforced: a create that
does not fit raises a retryable ``OutOfCapacity``. ``failure_rate`` is the
probability that a create fails (``ProviderFailed``, as a rental API
refusing or timing out), drawn from a seeded RNG so runs are reproducible.
Every rental is an instance with its own endpoint, as a rental API
reports it: a public IP (from 198.18.0.0/15, the range RFC 2544 sets aside
for benchmark tests, never routed on the internet) on which each container
port is exposed at a port of its own (:data:`PUBLIC_PORT_BASE` + its index
among the pod's ports, as rental APIs map ports); :meth:`pod_address`
reports it while the instance runs. Those addresses are never routed, so
the provider also stands in for the network in front of them:
:meth:`SimulatedProvider.dial` answers a TCP connect to one (the virtual
kubelet's endpoint health check, :mod:`gpufleet.virtual_kubelet.endpoint_health`) as the
instance would: accepted while it runs and its endpoint is up, refused
otherwise. Tests inject faults directly: :meth:`SimulatedProvider.fail_pod`
(the remote pod fails), :meth:`SimulatedProvider.lose_pod` (it vanishes)
and :meth:`SimulatedProvider.kill_endpoint` (its endpoint stops answering
while the rental API still reports the pod Running and Ready; as a crashed
server process behind a live container, or a broken port mapping;
:meth:`SimulatedProvider.revive_endpoint` undoes it).

ConfigMaps and Secrets (:meth:`put_object`) are kept in memory, as a
rental API keeps the files and environment of an instance: their payload
(:func:`gpufleet.virtual_kubelet.provider.object_payload`) and a version counter. As a
kubelet, an instance whose pod references a non-optional object the
provider does not hold does not start: it stays ``Pending``, its
containers waiting with reason ``CreateContainerConfigError``, until the
object is put (then it starts after ``start_latency_seconds``).

Time comes from an injected ``clock`` (seconds, monotonic) so unit tests
drive it by hand; status is computed from it on every read. With a
notifier registered (:meth:`notify_pods`) and :meth:`start` called, a
background thread calls it at each due transition (real time); tests with a
fake clock call :meth:`fire_due` instead.

Memory: one small record per pod (about 1 KiB), not the pod manifest.
"""

from __future__ import annotations

import errno
import heapq
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.virtual_kubelet.provider import (
    CPU_PER_GPU, MEMORY_PER_GPU, Address, Capacity, Notifier, ObjectRef, Pod, PodNotFound, ProviderError, RemotePod, SOURCE_UID, object_payload,
    pod_requests,
)
from gpufleet_workshop.rental.instances import LocalInstances, runs_standin
from gpufleet.virtual_kubelet.stats import ContainerStats, PodStats
from gpufleet.virtual_kubelet.translate import Reference, references, translate
from gpufleet.names import GPU_RESOURCE, SIMULATED_DURATION_ANNOTATION

#: An instance exposes its pod's n-th container port (in spec order) at this port + n on its endpoint.
PUBLIC_PORT_BASE = 40000


@dataclass
class _SimPod:
    uid: str
    namespace: str
    name: str
    requests: dict[str, float]
    containers: list[tuple[str, str]]  # (name, image)
    created: float
    created_wall: float
    start_at: float
    end_at: float | None
    ip: str
    endpoint: str = ""
    ports: list[tuple[str, int]] = field(default_factory=list)  # (protocol, containerPort), spec order
    failed: tuple[str, str] | None = None  # (reason, message)
    failed_at: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    endpoint_down: bool = False
    #: Non-optional objects it references that were not held at create: it starts once all are put.
    waiting_for: list[Reference] = field(default_factory=list)
    duration: float | None = None  # seconds from Running to Succeeded (the duration annotation)


def _rfc3339(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


class SimulatedProvider:
    """A GPU rental stand-in implementing :class:`gpufleet.virtual_kubelet.provider.Provider`.

    Args:
        name: provider (pool) name.
        gpus: GPUs it can rent out at most.
        gpu_product: the ``nvidia.com/gpu.product`` of its GPUs.
        price_per_gpu_hour: USD per GPU-hour.
        start_latency_seconds: seconds from create to Running.
        failure_rate: probability (0..1) that a create fails.
        max_pods: pods at most.
        node_name: the virtual node (tag on the pods it lists).
        clock: monotonic seconds (default ``time.monotonic``).
        wall: epoch seconds for timestamps (default ``time.time``).
        seed: RNG seed for failure injection.
        instances: run each rental's instance as a local process serving on a real address
            (:class:`~gpufleet_workshop.rental.instances.LocalInstances`); None: endpoints in 198.18.0.0/15 only.
    """

    def __init__(self, name: str, *, gpus: int, gpu_product: str, price_per_gpu_hour: float,
                 start_latency_seconds: float = 0.0, failure_rate: float = 0.0, max_pods: int = 1000,
                 node_name: str = "", cpu_per_gpu: int = CPU_PER_GPU, memory_per_gpu: int = MEMORY_PER_GPU,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time, seed: int = 0,
                 instances: LocalInstances | None = None):
        if gpus < 0 or not 0 <= failure_rate <= 1 or start_latency_seconds < 0:
            raise ValueError("gpus >= 0, 0 <= failure_rate <= 1, start_latency_seconds >= 0")
        self.name = name
        self.node_name = node_name
        self.instances = instances
        self.latency = start_latency_seconds
        self.failure_rate = failure_rate
        self._capacity = Capacity(gpus=gpus, cpu=gpus * cpu_per_gpu or cpu_per_gpu,
                                  memory_bytes=(gpus or 1) * memory_per_gpu, pods=max_pods,
                                  gpu_product=gpu_product, price_per_gpu_hour=price_per_gpu_hour)
        self.clock = clock
        self.wall = wall
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._pods: dict[str, _SimPod] = {}  # by source UID
        self._by_name: dict[tuple[str, str], str] = {}
        self._by_endpoint: dict[str, str] = {}  # public IP -> source UID
        self._ip = 0
        self._due: list[tuple[float, str]] = []
        self._ends: list[tuple[float, str]] = []
        self._active: dict[str, dict[str, float]] = {}
        self._used = {GPU_RESOURCE: 0.0, "cpu": 0.0, "memory": 0.0, "pods": 0.0}
        self._notifier: Notifier | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.creates = 0
        self.deletes = 0
        #: (kind, source namespace, name) -> {"payload": object_payload, "version": n}
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._object_version = 0

    # ------------------------------------------------------------------ protocol

    def capacity(self) -> Capacity:
        """The configured capacity (see :class:`Capacity`)."""
        return self._capacity

    def used(self) -> dict[str, float]:
        """Requests of the non-terminal pods: ``{"nvidia.com/gpu", "cpu", "memory", "pods"}`` (kept incrementally)."""
        now = self.clock()
        with self._lock:
            while self._ends and self._ends[0][0] <= now:
                _, uid = heapq.heappop(self._ends)
                self._release(uid)
            return dict(self._used)

    def _account(self, uid: str, req: dict[str, float]) -> None:
        self._active[uid] = {k: req.get(k, 0.0) for k in (GPU_RESOURCE, "cpu", "memory")}
        for k, v in self._active[uid].items():
            self._used[k] += v
        self._used["pods"] += 1

    def _release(self, uid: str) -> None:
        req = self._active.pop(uid, None)
        if req is not None:
            for k, v in req.items():
                self._used[k] -= v
            self._used["pods"] -= 1

    def create_pod(self, pod: Pod) -> None:
        """Start renting for ``pod`` (idempotent by source UID).

        Raises:
            ProviderError: ``OutOfCapacity`` (retryable) or ``ProviderFailed`` (injected failure).
            gpufleet.virtual_kubelet.translate.Refused: the pod cannot run remotely.
        """
        translate(pod, node_name=self.node_name)  # same refusals as a real remote
        meta = pod["metadata"]
        uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
        req = pod_requests(pod)
        with self._lock:
            if uid in self._pods:
                return
            stale = self._by_name.get((ns, name))
            if stale is not None and stale != uid:
                self._drop(stale)
            cap, used = self._capacity, self.used()
            if (used[GPU_RESOURCE] + req.get(GPU_RESOURCE, 0) > cap.gpus or used["cpu"] + req.get("cpu", 0) > cap.cpu
                    or used["memory"] + req.get("memory", 0) > cap.memory_bytes or used["pods"] + 1 > cap.pods):
                raise ProviderError(f"{self.name}: out of capacity ({used[GPU_RESOURCE]:g}/{cap.gpus} GPUs in use, "
                                    f"{req.get(GPU_RESOURCE, 0):g} asked)", reason="OutOfCapacity", retryable=True)
            if self.failure_rate and self._rng.random() < self.failure_rate:
                raise ProviderError(f"{self.name}: the rental API refused the pod (injected failure, "
                                    f"rate {self.failure_rate:g})", reason="ProviderFailed")
            now = self.clock()
            duration = (meta.get("annotations") or {}).get(SIMULATED_DURATION_ANNOTATION)
            waiting = [r for r in references(pod) if not r.optional and (r.kind, ns, r.name) not in self._objects]
            start_at = now + self.latency if not waiting else float("inf")
            run_for = float(duration) if duration not in (None, "") else None
            end_at = start_at + run_for if run_for is not None and not waiting else None
            self._ip += 1
            sp = _SimPod(uid=uid, namespace=ns, name=name, requests=req,
                         containers=[(c.get("name", ""), c.get("image", "")) for c in pod["spec"].get("containers") or []],
                         created=now, created_wall=self.wall(), start_at=start_at, end_at=end_at,
                         ip=f"100.64.{(self._ip >> 8) & 255}.{self._ip & 255}",
                         endpoint=f"198.{18 + ((self._ip >> 16) & 1)}.{(self._ip >> 8) & 255}.{self._ip & 255}",
                         ports=[(p.get("protocol", "TCP"), int(p["containerPort"]))
                                for c in pod["spec"].get("containers") or [] for p in c.get("ports") or []],
                         labels=dict(meta.get("labels") or {}), waiting_for=waiting,
                         duration=run_for)
            first = (pod["spec"].get("containers") or [{}])[0]
            args = list(first.get("args") or [])
            if self.instances is not None and runs_standin(first):
                try:
                    self.instances.start(uid, name, len(sp.ports), args)
                except OSError as exc:
                    raise ProviderError(f"{self.name}: the instance did not start: {exc}",
                                        reason="ProviderFailed", retryable=True) from None
                sp.endpoint = self.instances.address
            self._pods[uid] = sp
            self._by_name[(ns, name)] = uid
            self._by_endpoint[sp.endpoint] = uid
            self.creates += 1
            self._account(uid, req)
            if not waiting:
                self._schedule(start_at, uid)
            if end_at is not None:
                self._schedule(end_at, uid)
                heapq.heappush(self._ends, (end_at, uid))
        self._notify(ns, name)

    def update_pod(self, pod: Pod) -> None:
        """Record new labels (nothing else changes on a running rental)."""
        with self._lock:
            sp = self._pods.get(pod["metadata"]["uid"])
            if sp is None:
                raise PodNotFound(f"{self.name}: no pod for {pod['metadata']['namespace']}/{pod['metadata']['name']}")
            sp.labels = dict(pod["metadata"].get("labels") or {})

    def delete_pod(self, pod: Pod) -> None:
        """Stop renting for ``pod`` at once (no error if it is gone).

        By identity, as a real rental API's delete by rental id: only the
        rental of the source pod's UID goes, never one that reuses its name;
        a request without a UID deletes nothing.
        """
        uid = pod["metadata"].get("uid")
        with self._lock:
            if uid and uid in self._pods:
                self._drop(uid)
                self.deletes += 1

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        """A pod manifest of the rental for source pod ``namespace/name`` (with status), or None."""
        with self._lock:
            uid = self._by_name.get((namespace, name))
            sp = self._pods.get(uid) if uid else None
            if sp is None:
                return None
            return {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"namespace": namespace, "name": name, "labels": dict(sp.labels),
                                 "annotations": {SOURCE_UID: sp.uid}},
                    "spec": {"containers": [{"name": n, "image": i} for n, i in sp.containers]},
                    "status": self._status(sp, self.clock())}

    def get_pod_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The rental's pod status now (see the module docstring), or None if it is gone."""
        with self._lock:
            uid = self._by_name.get((namespace, name))
            sp = self._pods.get(uid) if uid else None
            return None if sp is None else self._status(sp, self.clock())

    def get_pods(self) -> list[RemotePod]:
        """Every rental this provider holds, with its source UID and status."""
        now = self.clock()
        with self._lock:
            return [RemotePod(sp.uid, sp.namespace, sp.name, self._status(sp, now)) for sp in self._pods.values()]

    def pod_stats(self) -> list[PodStats]:
        """What each running rental's instance uses, as the rental's instance statistics report it: the instance's
        processes (:meth:`LocalInstances.usage`) for its first container; rentals without a process report none."""
        if self.instances is None:
            return []
        now = self.clock()
        with self._lock:
            running = [sp for sp in self._pods.values() if self._phase(sp, now) == "Running" and sp.containers]
        out = []
        for sp in running:
            usage = self.instances.usage(sp.uid)
            if usage is None:
                continue
            cpu, rss, started = usage
            out.append(PodStats(sp.namespace, sp.name, sp.uid, (
                ContainerStats(sp.containers[0][0], cpu, rss, started, self.wall()),)))
        return out

    def pod_address(self, namespace: str, name: str) -> Address | None:
        """The instance's endpoint while it runs: its public IP and each container port's public port; else None."""
        with self._lock:
            uid = self._by_name.get((namespace, name))
            sp = self._pods.get(uid) if uid else None
            if sp is None or self._phase(sp, self.clock()) != "Running":
                return None
            real = self.instances.ports(uid) if self.instances is not None else None
            if real is not None:
                return Address(self.instances.address, {port: real[i] for i, port in enumerate(sp.ports)})
            return Address(sp.endpoint, {port: PUBLIC_PORT_BASE + i for i, port in enumerate(sp.ports)})

    def dial(self, ip: str, port: int, timeout: float) -> None:
        """A TCP connect to ``ip:port`` on the simulated network in front of the instances; returns once accepted.

        Accepted when ``ip`` is a running instance's endpoint, ``port`` one of
        its public ports and the endpoint is up (:meth:`kill_endpoint`);
        otherwise refused at once, as a host answers a connect to a port
        nothing listens on (RST). ``timeout`` (seconds) is not spent: nothing
        here is slow.

        Raises:
            ConnectionRefusedError: nothing answers at ``ip:port``.
        """
        if self.instances is not None and ip == self.instances.address:
            # A real instance: the network in front of it is real too.
            socket.create_connection((ip, port), timeout=timeout).close()
            return
        with self._lock:
            uid = self._by_endpoint.get(ip)
            sp = self._pods.get(uid) if uid else None
            up = (sp is not None and not sp.endpoint_down and self._phase(sp, self.clock()) == "Running"
                  and port in range(PUBLIC_PORT_BASE, PUBLIC_PORT_BASE + len(sp.ports)))
        if not up:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"Connection refused ({ip}:{port})")

    def notify_pods(self, callback: Notifier) -> None:
        """Register ``callback(namespace, name)``, called on every status transition."""
        self._notifier = callback

    # ------------------------------------------------------------------ objects

    def put_object(self, kind: str, namespace: str, obj: dict[str, Any]) -> None:
        """Keep ConfigMap/Secret ``obj`` of ``namespace`` (its payload); start the instances that waited for it."""
        name = obj["metadata"]["name"]
        started = []
        with self._lock:
            self._object_version += 1
            self._objects[(kind, namespace, name)] = {"payload": object_payload(obj), "version": self._object_version}
            now = self.clock()
            for sp in self._pods.values():
                if sp.namespace != namespace or not sp.waiting_for:
                    continue
                sp.waiting_for = [r for r in sp.waiting_for if (r.kind, namespace, r.name) not in self._objects]
                if not sp.waiting_for and sp.start_at == float("inf"):
                    sp.start_at = now + self.latency
                    if sp.duration is not None:
                        sp.end_at = sp.start_at + sp.duration
                        heapq.heappush(self._ends, (sp.end_at, sp.uid))
                        self._schedule(sp.end_at, sp.uid)
                    self._schedule(sp.start_at, sp.uid)
                    started.append((sp.namespace, sp.name))
        for ns, n in started:
            self._notify(ns, n)

    def delete_object(self, kind: str, namespace: str, name: str) -> None:
        """Forget ``kind`` ``namespace/name`` (no error if unknown; running instances keep what they started with)."""
        with self._lock:
            self._objects.pop((kind, namespace, name), None)

    def get_objects(self) -> list[ObjectRef]:
        """Every ConfigMap and Secret held."""
        with self._lock:
            return [ObjectRef(*k) for k in sorted(self._objects)]

    def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """What is held of ``kind`` ``namespace/name``: ``{"payload": ..., "version": n}``, or None (tests, sim)."""
        with self._lock:
            held = self._objects.get((kind, namespace, name))
            return None if held is None else {"payload": dict(held["payload"]), "version": held["version"]}

    # ------------------------------------------------------------------ faults (tests, sim)

    def fail_pod(self, namespace: str, name: str, reason: str = "HardwareFailure",
                 message: str = "the rented GPU failed") -> None:
        """Make the remote pod of ``namespace/name`` fail now (raises PodNotFound)."""
        with self._lock:
            uid = self._by_name.get((namespace, name))
            if uid is None or uid not in self._pods:
                raise PodNotFound(f"{self.name}: no pod for {namespace}/{name}")
            sp = self._pods[uid]
            sp.failed, sp.failed_at = (reason, message), self.clock()
            self._release(uid)
            if self.instances is not None:
                self.instances.stop(uid)
        self._notify(namespace, name)

    def kill_endpoint(self, namespace: str, name: str) -> None:
        """Make the endpoint of ``namespace/name``'s instance refuse connections; the pod stays Running and Ready.

        Raises:
            PodNotFound: no instance for that pod.
        """
        self._set_endpoint(namespace, name, down=True)

    def revive_endpoint(self, namespace: str, name: str) -> None:
        """Make the endpoint of ``namespace/name``'s instance answer again (raises PodNotFound)."""
        self._set_endpoint(namespace, name, down=False)

    def _set_endpoint(self, namespace: str, name: str, *, down: bool) -> None:
        with self._lock:
            uid = self._by_name.get((namespace, name))
            if uid is None or uid not in self._pods:
                raise PodNotFound(f"{self.name}: no pod for {namespace}/{name}")
            self._pods[uid].endpoint_down = down
            if self.instances is not None:
                if down:
                    self.instances.kill(uid)
                else:
                    self.instances.revive(uid)

    def lose_pod(self, namespace: str, name: str) -> None:
        """Make the remote pod of ``namespace/name`` vanish, as if the provider lost it."""
        with self._lock:
            uid = self._by_name.get((namespace, name))
            if uid is not None:
                self._drop(uid)
        self._notify(namespace, name)

    # ------------------------------------------------------------------ time

    def start(self) -> "SimulatedProvider":
        """Start the notifier thread (real time); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name=f"sim-{self.name}")
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the notifier thread (and every local instance)."""
        self._stop.set()
        self._wake.set()
        if self.instances is not None:
            self.instances.close()

    def fire_due(self) -> int:
        """Notify every transition due by ``clock()``; returns how many (for fake-clock tests)."""
        fired = []
        now = self.clock()
        with self._lock:
            while self._due and self._due[0][0] <= now:
                _, uid = heapq.heappop(self._due)
                sp = self._pods.get(uid)
                if sp is not None:
                    fired.append((sp.namespace, sp.name))
        for ns, name in fired:
            self._notify(ns, name)
        return len(fired)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.fire_due()
            with self._lock:
                wait = (self._due[0][0] - self.clock()) if self._due else 1.0
            self._wake.wait(min(max(wait, 0.005), 1.0))
            self._wake.clear()

    def _schedule(self, at: float, uid: str) -> None:
        heapq.heappush(self._due, (at, uid))
        self._wake.set()

    def _notify(self, namespace: str, name: str) -> None:
        if self._notifier is not None:
            self._notifier(namespace, name)

    def _drop(self, uid: str) -> None:
        self._release(uid)
        if self.instances is not None:
            self.instances.stop(uid)
        sp = self._pods.pop(uid, None)
        if sp is not None and self._by_name.get((sp.namespace, sp.name)) == uid:
            del self._by_name[(sp.namespace, sp.name)]
        if sp is not None and self._by_endpoint.get(sp.endpoint) == uid:
            del self._by_endpoint[sp.endpoint]

    # ------------------------------------------------------------------ status

    def _phase(self, sp: _SimPod, now: float) -> str:
        if sp.failed is not None:
            return "Failed"
        if now < sp.start_at:
            return "Pending"
        if sp.end_at is not None and now >= sp.end_at:
            return "Succeeded"
        return "Running"

    def _status(self, sp: _SimPod, now: float) -> dict[str, Any]:
        phase = self._phase(sp, now)
        created = _rfc3339(sp.created_wall)
        started = _rfc3339(sp.created_wall + (sp.start_at - sp.created)) if not sp.waiting_for else created
        running = phase == "Running"

        def cond(kind: str, ok: bool, at: str) -> dict:
            return {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None, "lastTransitionTime": at}

        if phase == "Pending":
            states = [{"waiting": {"reason": "ContainerCreating"}}] * len(sp.containers)
            if sp.waiting_for:  # as a kubelet says it
                ref = sp.waiting_for[0]
                states = [{"waiting": {"reason": "CreateContainerConfigError",
                                       "message": f'{ref.kind.lower()} "{ref.name}" not found'}}] * len(sp.containers)
        elif phase == "Running":
            states = [{"running": {"startedAt": started}}] * len(sp.containers)
        else:
            code, reason = (0, "Completed") if phase == "Succeeded" else (1, sp.failed[0] if sp.failed else "Error")
            states = [{"terminated": {"exitCode": code, "reason": reason, "startedAt": started,
                                      "finishedAt": _rfc3339(sp.created_wall + (now - sp.created))}}] * len(sp.containers)
        at = started if phase != "Pending" else created
        status: dict[str, Any] = {
            "phase": phase,
            "startTime": created,
            "podIP": sp.ip,
            "podIPs": [{"ip": sp.ip}],
            "conditions": [cond("Initialized", True, created), cond("PodReadyToStartContainers", phase != "Pending", at),
                           cond("ContainersReady", running, at), cond("Ready", running, at)],
            "containerStatuses": [
                {"name": n, "image": i, "imageID": f"sim://{i}", "containerID": f"sim://{sp.uid[:8]}-{n}",
                 "ready": running, "started": running, "restartCount": 0, "state": st}
                for (n, i), st in zip(sp.containers, states)
            ],
        }
        if sp.failed is not None:
            status["reason"], status["message"] = sp.failed
        return status


def from_pool(pool: Any, *, node_name: str, start: bool = True, **kwargs: Any) -> SimulatedProvider:
    """The ``simulated`` provider plugin (entry point ``gpufleet.providers``): a pool's rental.

    ``pool`` carries ``name``, ``start_latency_seconds``, ``failure_rate`` and
    ``instances`` (``local_process``: each rental is a local stand-in process on
    the virtual kubelet's own address, ``$POD_IP`` in its pod); ``kwargs`` are
    the capacity the virtual kubelet computed (gpus, gpu_product,
    price_per_gpu_hour, max_pods) and test overrides (clock, seed, instances).
    """
    if getattr(pool, "instances", "none") == "local_process" and "instances" not in kwargs:
        import os

        kwargs["instances"] = LocalInstances(os.environ.get("POD_IP") or "127.0.0.1", node_name)
    prov = SimulatedProvider(pool.name, start_latency_seconds=pool.start_latency_seconds,
                             failure_rate=pool.failure_rate, node_name=node_name, **kwargs)
    return prov.start() if start else prov
