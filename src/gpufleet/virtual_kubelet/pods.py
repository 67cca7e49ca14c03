"""The pod side of the virtual kubelet: one reconcile loop over the pods bound to the node.

Inputs: a watch on pods with ``fieldSelector=spec.nodeName=<node>`` (only
this node's pods, never a full list of the cluster), the providers'
notifiers, and a resync every ``resync_seconds`` (provider ``get_pods``:
placement, orphans). Every change queues the pod's ``namespace/name`` in a
:class:`~gpufleet.kube.workqueue.RateLimitingQueue`; ``workers`` threads
reconcile them, never two on the same pod.

Retries: a pod whose reconcile fails or is not done yet (an error, a
create to retry, objects to wait for, a remote pod still stopping) comes
back at its own pace: 0.5 s after the first failure, doubling to at most
10 s, with a bucket of 10 retries a second over all pods after a burst of
100 (:mod:`gpufleet.kube.ratelimit`); a pod done is forgotten and starts
over. A pod has one pending entry in the queue, whatever queues it (watch
events, notifiers, resyncs, retries): a resync makes it ready now instead
of adding a second retry, so a pod that waits forever is tried at most
every 10 s plus once per resync.

Per pod (:meth:`PodController.reconcile`):

1. **Deleted here** (``deletionTimestamp`` set): delete the remote pod;
   once it is gone, delete the pod object with grace 0 and a UID
   precondition (there is no real kubelet to finish the graceful deletion).
2. **Terminal here** (Succeeded/Failed): delete the remote pod, if any.
3. **No remote pod yet** and never started here (no ``status.startTime``):
   choose a provider (:func:`gpufleet.virtual_kubelet.provider.choose`), create it there
   (the provider translates: :mod:`gpufleet.virtual_kubelet.translate`), write
   ``startTime`` and the first status. Refusals, "no provider has this GPU
   model", and non-retryable provider errors mark the pod **Failed** with
   the reason and an Event; retryable ones (capacity, network) are retried
   (Retries above) for ``create_retry_seconds``, then Failed. Retries leave one
   Event per attempt class (the provider's reason, e.g. ``OutOfCapacity``),
   updated in place with the attempt count (``count``, ``lastTimestamp`` and
   ``attempt N`` in the message), so a pod retried a hundred times has one
   Event, not a hundred; the final failure always records its own Event.
   Before the create, the ConfigMaps and Secrets the pod references are
   put at the provider (:mod:`gpufleet.virtual_kubelet.reflect`); while a non-optional
   one is missing the pod stays **Pending** (its containers waiting with
   reason ``CreateContainerConfigError``, an Event naming the object, as a
   kubelet does), retried without a deadline (Retries above) and at once
   when it appears. An optional one that is absent, or that the virtual
   kubelet may not read, is left out and named in a Warning Event on the
   pod (``OptionalObjectNotFound``: as a kubelet, the pod starts without
   it; ``OptionalObjectForbidden``: the virtual kubelet may not read it,
   where a kubelet would have put it in).
4. **No remote pod, but started** (``startTime`` set; a pod created by
   this process counts once its remote pod was seen, or after
   ``lost_grace_seconds``): the provider lost it → **Failed**,
   reason ``ProviderLost``; the ReplicaSet replaces the pod. No heroics.
5. **Remote pod exists**: mirror its status (phase, conditions,
   containerStatuses, startTime; not its IP:
   :func:`gpufleet.virtual_kubelet.translate.mirror_status`) when it changed; copy label
   changes (``update_pod``); keep the provider's copies of the objects it
   references in sync (:mod:`gpufleet.virtual_kubelet.reflect`); when the remote pod is
   terminal, mirror it and then delete the remote pod. Once the pod is gone
   there, the copies no other pod there references are deleted.

Endpoints (:mod:`gpufleet.virtual_kubelet.endpoints`): after every reconcile the
Services selecting the pod are queued for publishing at the address the
provider reports; a deleted pod is published as terminating, not ready,
*before* its remote pod is stopped (rule 1), so requests leave it first.

Cost (:mod:`gpufleet.virtual_kubelet.ledger`): a pod's GPUs count outside, at its
pool's price, from the first mirror of its remote pod Running until the
remote pod is terminal or gone (or the loop stops).

Restarts: nothing is kept on disk. Remote pods carry the source pod UID;
on start the loop lists every provider's pods, adopts those whose source
pod exists (no duplicate create), fails those that were started and are
gone (rule 4), creates those never started (rule 3), and deletes remote
pods whose source pod no longer exists (orphans), once the local cache is
synced. Each resync also sweeps every provider of its own leftovers (its
optional ``sweep()``), and every ``object_sweep_seconds`` of copies of
objects no pod references (:meth:`gpufleet.virtual_kubelet.reflect.Reflector.sweep`:
after a restart, or a failed delete).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpufleet.kube import Conflict, Kube, KubeError, NotFound, api_path
from gpufleet.kube.events import record_event
from gpufleet.kube.informer import Informer
from gpufleet.kube.times import now_rfc3339
from gpufleet.kube.workqueue import BACKOFF, RateLimitingQueue, Requeue
from gpufleet.names import GPU_PRODUCT_LABEL, PUBLISHED_CONDITION

from . import metrics
from .endpoints import EndpointPublisher
from .endpoint_health import HealthSettings
from .ledger import Ledger
from .provider import (
    SOURCE_UID, TAG_LABELS, Address, NoProvider, Offer, Pod, Provider, ProviderError, choose,
)
from .reflect import MissingObjects, Reflector, live_references
from .translate import Refused, mirror_status

log = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")


def _slim(pod: dict) -> dict:
    """The cached form of a pod: the object without ``managedFields`` (a third of its size)."""
    pod.get("metadata", {}).pop("managedFields", None)
    return pod


def _state_kind(state: dict | None) -> str:
    return next((k for k in ("running", "waiting", "terminated") if (state or {}).get(k) is not None), "")


def _normalize_states(status: dict) -> dict:
    """Spell out the other container states as null, so a strategic merge replaces the state."""
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or []:
            for field in ("state", "lastState"):
                st = cs.get(field)
                if isinstance(st, dict) and st:
                    for k in ("running", "waiting", "terminated"):
                        st.setdefault(k, None)
    return status


#: Pod-level status fields the remote side writes whole or not at all: one it no longer has is cleared here too.
STATUS_WHOLE = ("reason", "message")


def status_digest(status: dict) -> tuple:
    """What decides whether a status write is needed: phase, IP, start, conditions, container states.

    ``PodScheduled`` is the scheduler's and :data:`~gpufleet.names.PUBLISHED_CONDITION` the endpoint
    publisher's (:meth:`gpufleet.virtual_kubelet.endpoints.EndpointPublisher.mark`): a remote pod has neither.
    """
    conds = tuple(sorted((c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []
                         if c.get("type") not in ("PodScheduled", PUBLISHED_CONDITION)))
    containers = tuple(sorted((c.get("name"), bool(c.get("ready")), _state_kind(c.get("state")), c.get("restartCount", 0))
                              for c in status.get("containerStatuses") or []))
    return (status.get("phase"), status.get("podIP"), bool(status.get("startTime")), status.get("reason"), conds,
            containers)


class PodController:
    """Reconciles the pods bound to one virtual node with its providers.

    Args:
        kube: client of the cluster the node is in.
        node_name: the virtual node.
        providers: ``{name: Provider}`` the node can place pods on.
        host_ip: written as the pods' ``hostIP``.
        workers: reconcile threads.
        resync_seconds: how often every pod is re-checked and orphans collected.
        create_retry_seconds: how long retryable create errors are retried before the pod fails.
        lost_grace_seconds: how long after a create a remote pod never seen yet is not "lost"
            (a remote watch may lag the create); once seen, a missing remote pod is lost at once.
        publish_endpoints: publish the pods into the Services selecting them (:mod:`gpufleet.virtual_kubelet.endpoints`).
        endpoint_health: check the published addresses (:mod:`gpufleet.virtual_kubelet.endpoint_health`); None: no check.
        object_sweep_seconds: how often the providers' copies of ConfigMaps and Secrets no pod references are
            looked for (a list at each provider), at the first resync and then at most this often.
        clock: monotonic seconds.
    """

    def __init__(self, kube: Kube, node_name: str, providers: dict[str, Provider], *, host_ip: str = "127.0.0.1",
                 workers: int = 8, resync_seconds: float = 10.0, create_retry_seconds: float = 60.0,
                 lost_grace_seconds: float = 30.0, publish_endpoints: bool = True, object_sweep_seconds: float = 60.0,
                 endpoint_health: HealthSettings | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.node = node_name
        self.providers = providers
        self.host_ip = host_ip
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.create_retry_seconds = create_retry_seconds
        self.lost_grace_seconds = lost_grace_seconds
        self.clock = clock
        #: One pending entry per pod; failures come back at the pod's own pace (:mod:`gpufleet.kube.ratelimit`).
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(clock=clock)
        self.pods: Informer[dict] = Informer(kube, api_path("v1", "pods"),
                                             params={"fieldSelector": f"spec.nodeName={node_name}"},
                                             transform=_slim, handlers=[self._on_pod], name=f"pods-{node_name}")
        self._lock = threading.Lock()
        self.placement: dict[str, str] = {}  # source UID -> provider name
        self._uid_by_key: dict[str, str] = {}
        self._created_at: dict[str, float] = {}
        self._observed: set[str] = set()
        self._seen_at: dict[str, float] = {}
        self._attempts: dict[str, tuple[float, int]] = {}
        self._events_sent: dict[str, set[str]] = {}
        #: source UID -> attempt class (reason) -> (Event name, count): one Event per class, updated in place.
        self._retry_events: dict[str, dict[str, tuple[str, int]]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.running_since: dict[str, float] = {}
        #: GPU-seconds and cost outside, by pool (:mod:`gpufleet.virtual_kubelet.ledger`): opened when a remote pod is seen Running.
        self.ledger = Ledger((p.name for p in providers.values()), clock=clock)
        self.endpoints = EndpointPublisher(kube, node_name, self.pods, self.address, health=endpoint_health,
                                           dial_of=self.dial) if publish_endpoints else None
        self.reflector = Reflector(kube, node_name, providers, on_pod=self.queue.add)
        self.object_sweep_seconds = object_sweep_seconds
        self._objects_swept_at: float | None = None
        for prov in providers.values():
            if callable(getattr(prov, "notify_pods", None)):
                prov.notify_pods(lambda ns, name: self.queue.add(f"{ns}/{name}"))

    # ------------------------------------------------------------------ lifecycle

    def start(self, sync_timeout: float = 60.0) -> "PodController":
        """Start the watch, wait for its first list, adopt remote pods, start workers and resync.

        Raises:
            TimeoutError: the API server did not list the node's pods in ``sync_timeout`` s.
        """
        self.pods.start()
        if not self.pods.wait_synced(sync_timeout):
            raise TimeoutError(f"{self.node}: pods not listed within {sync_timeout:.0f}s")
        self.resync()
        if self.endpoints is not None:
            self.endpoints.start(sync_timeout)
        for i in range(self.workers):
            t = threading.Thread(target=self._work, daemon=True, name=f"vk-{self.node}-{i}")
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._resync_loop, daemon=True, name=f"vk-{self.node}-resync")
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        """Stop watching and working (remote pods are left as they are, to be adopted on restart)."""
        self._stop.set()
        self.ledger.close()
        self.pods.stop()
        self.reflector.stop()
        self.queue.shutdown()
        if self.endpoints is not None:
            self.endpoints.stop()

    def _on_pod(self, kind: str, new: Any, old: Any) -> None:
        self.queue.add(f"{new['metadata']['namespace']}/{new['metadata']['name']}")

    def _work(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout=1.0)
            if key is not None:
                self.process(key)

    def process(self, key: str) -> None:
        """One worker step for a key :meth:`queue` handed out: reconcile it, then queue it again as the outcome says
        (a failure or :data:`~gpufleet.kube.workqueue.BACKOFF`: at the pod's rate-limited pace; a delay: after
        it; done: its failures forgotten), and mark it done. Never raises."""
        started = time.perf_counter()
        try:
            self.queue.process(key, self.reconcile, what=f"{self.node}: {key}", retry_on=(KubeError, ProviderError),
                               quiet=(Conflict,), logger=log)
        finally:
            metrics.RECONCILE_SECONDS.labels(self.node).observe(time.perf_counter() - started)

    def _resync_loop(self) -> None:
        while not self._stop.wait(self.resync_seconds):
            try:
                self.resync()
            except Exception:
                log.exception("%s: resync failed", self.node)

    def resync(self) -> None:
        """Refresh placement from every provider, collect orphans, queue every pod, update gauges."""
        local = {p["metadata"]["uid"]: p for p in self.pods.items()}
        for name, prov in self.providers.items():
            remote = prov.get_pods()
            metrics.PROVIDER_PODS.labels(self.node, name).set(len(remote))
            for rp in remote:
                if rp.source_uid in local:
                    with self._lock:
                        self.placement.setdefault(rp.source_uid, name)
                elif self.pods.synced.is_set():
                    log.info("%s: deleting orphan remote pod %s/%s (source UID %s gone)", self.node, rp.namespace,
                             rp.name, rp.source_uid)
                    prov.delete_pod({"metadata": {"namespace": rp.namespace, "name": rp.name, "uid": rp.source_uid}})
                    metrics.DELETES.labels(self.node, "orphan").inc()
                    with self._lock:
                        self.placement.pop(rp.source_uid, None)
        phases: dict[str, int] = {}
        for p in local.values():
            phase = (p.get("status") or {}).get("phase") or "Pending"
            phases[phase] = phases.get(phase, 0) + 1
            self.queue.add(f"{p['metadata']['namespace']}/{p['metadata']['name']}")
        for phase in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
            metrics.PODS.labels(self.node, phase).set(phases.get(phase, 0))
        if self.pods.synced.is_set():
            self._sweep(local)

    def _sweep(self, local: dict[str, Pod]) -> None:
        """Each provider's sweeps: its own leftovers, and (every ``object_sweep_seconds``) copies of objects no pod
        there references."""
        now = self.clock()
        objects = self._objects_swept_at is None or now - self._objects_swept_at >= self.object_sweep_seconds
        if objects:
            self._objects_swept_at = now
        with self._lock:
            placed = dict(self.placement)
        for name, prov in self.providers.items():
            try:
                if callable(getattr(prov, "sweep", None)):
                    prov.sweep()
                if objects:
                    self.reflector.sweep(prov, live_references(
                        p for uid, p in local.items()
                        if placed.get(uid) == name and (p.get("status") or {}).get("phase") not in TERMINAL))
            except (ProviderError, KubeError) as exc:
                log.warning("%s: sweep of %s failed: %s", self.node, name, exc)

    # ------------------------------------------------------------------ reconcile

    def _remote(self, pod: Pod) -> tuple[Provider | None, dict | None]:
        meta = pod["metadata"]
        with self._lock:
            name = self.placement.get(meta["uid"])
        prov = self.providers.get(name) if name else None
        if prov is None:
            return None, None
        remote = prov.get_pod(meta["namespace"], meta["name"])
        if remote is not None and ((remote.get("metadata") or {}).get("annotations") or {}).get(SOURCE_UID) not in (
                None, meta["uid"]):
            remote = None  # a leftover of an earlier pod with the same name
        return prov, remote

    def _forget(self, uid: str) -> None:
        self.ledger.stopped(uid)
        self.reflector.release(uid)
        with self._lock:
            self.placement.pop(uid, None)
        self._created_at.pop(uid, None)
        self._observed.discard(uid)
        self._attempts.pop(uid, None)
        self._seen_at.pop(uid, None)
        self.running_since.pop(uid, None)
        self._events_sent.pop(uid, None)
        self._retry_events.pop(uid, None)

    def address(self, pod: Pod) -> Address | None:
        """Where the main cluster reaches ``pod``'s remote pod (its provider's :meth:`pod_address`), or None."""
        prov, remote = self._remote(pod)
        if prov is None or remote is None:
            return None
        return prov.pod_address(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def dial(self, pod: Pod):
        """``pod``'s provider's own connect (``dial(ip, port, timeout)``, :mod:`gpufleet.virtual_kubelet.endpoint_health`), or None."""
        with self._lock:
            name = self.placement.get(pod["metadata"]["uid"])
        dial = getattr(self.providers.get(name) if name else None, "dial", None)
        return dial if callable(dial) else None

    def reconcile(self, key: str) -> float | Requeue | None:
        """Bring one pod (``namespace/name``) and its remote pod in line.

        Then queue its Services for publishing (module docstring: Endpoints).

        Returns:
            None when done; seconds after which to look again; or
            :data:`~gpufleet.kube.workqueue.BACKOFF`: not done, try again at the pod's rate-limited pace.

        Raises:
            KubeError / ProviderError: transient failures (the worker retries).
        """
        try:
            return self._reconcile(key)
        finally:
            if self.endpoints is not None:
                self.endpoints.pod_changed(key, self.pods.get(key))

    def _reconcile(self, key: str) -> float | Requeue | None:
        pod = self.pods.get(key)
        old_uid = self._uid_by_key.get(key)
        if pod is None:
            if old_uid:
                self._delete_remote_of(key, old_uid, "deleted")
                self._uid_by_key.pop(key, None)
            return None
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        if old_uid and old_uid != uid:
            self._delete_remote_of(key, old_uid, "deleted")
        self._uid_by_key[key] = uid
        self._seen_at.setdefault(uid, self.clock())
        prov, remote = self._remote(pod)

        if meta.get("deletionTimestamp"):
            if remote is not None:
                if self.endpoints is not None:
                    self.endpoints.sync_pod(pod)  # terminating, not ready, before the remote pod stops
                prov.delete_pod(pod)
                metrics.DELETES.labels(self.node, "deleted").inc()
                _, remote = self._remote(pod)
                if remote is not None:
                    return BACKOFF  # still stopping there (its provider's notifier queues the pod when it is gone)
            try:
                self.kube.delete("v1", "pods", meta["name"], meta["namespace"], grace_seconds=0, uid=uid)
            except (NotFound, Conflict):
                pass
            self._forget(uid)
            self._uid_by_key.pop(key, None)
            return None

        phase = status.get("phase")
        if phase in TERMINAL:
            if remote is not None:
                prov.delete_pod(pod)
                metrics.DELETES.labels(self.node, "finished").inc()
            self._forget(uid)
            return None

        if remote is None:
            created = self._created_at.get(uid)
            if (created is not None and uid not in self._observed
                    and self.clock() - created < self.lost_grace_seconds):
                return 0.5  # the provider's view (a remote watch) may lag its own create
            if status.get("startTime") or prov is not None:
                # The cache may lag our own terminal status write (the remote pod is deleted right after
                # it): decide on the live pod, so a mirrored Failed/Succeeded is never overwritten.
                try:
                    pod = self.kube.get("v1", "pods", meta["name"], meta["namespace"])
                except NotFound:
                    return None
                if pod["metadata"]["uid"] != uid or (pod.get("status") or {}).get("phase") in TERMINAL:
                    return None
                where = prov.name if prov is not None else "the provider"
                self._fail(pod, "ProviderLost", f"{where} no longer has this pod's remote pod; the pod's controller "
                                                "replaces it")
                return None
            return self._create(pod)

        # Mirror remote status.
        self._observed.add(uid)
        if prov is not None:
            rlabels = (remote.get("metadata") or {}).get("labels") or {}
            if {k: v for k, v in rlabels.items() if k not in TAG_LABELS} != (meta.get("labels") or {}):
                try:
                    prov.update_pod(pod)
                except ProviderError as exc:
                    log.info("%s: %s: label update not applied: %s", self.node, key, exc)
        rstatus = remote.get("status") or {}
        self.ledger.observe(uid, prov, pod, rstatus.get("phase"))
        if rstatus.get("phase") == "Failed" and status.get("phase") != "Failed":
            self._event(pod, "ProviderFailed", f"the remote pod on {prov.name} failed: {rstatus.get('reason', '')} "
                                               f"{rstatus.get('message', '')}".strip())
            metrics.FAILED.labels(self.node, "ProviderFailed").inc()
        self._write_status(pod, rstatus)
        if rstatus.get("phase") in TERMINAL:
            prov.delete_pod(pod)
            metrics.DELETES.labels(self.node, "finished").inc()
            return None
        if prov is not None:
            try:
                self.reflector.ensure(pod, prov, starting=False)
            except (ProviderError, KubeError, Refused) as exc:
                log.warning("%s: %s: referenced objects not synced to %s: %s; retrying", self.node, key, prov.name, exc)
                return BACKOFF
        return None

    def _delete_remote_of(self, key: str, uid: str, cause: str) -> None:
        with self._lock:
            name = self.placement.get(uid)
        if name and name in self.providers:
            ns, pname = key.split("/", 1)
            self.providers[name].delete_pod({"metadata": {"namespace": ns, "name": pname, "uid": uid}})
            metrics.DELETES.labels(self.node, cause).inc()
        self._forget(uid)

    def _offers(self) -> list[Offer]:
        out = []
        for name, prov in self.providers.items():
            cap, used = prov.capacity(), prov.used()
            free = {"nvidia.com/gpu": cap.gpus - used.get("nvidia.com/gpu", 0.0), "cpu": cap.cpu - used.get("cpu", 0.0),
                    "memory": cap.memory_bytes - used.get("memory", 0.0), "pods": cap.pods - used.get("pods", 0.0)}
            out.append(Offer(name, cap.gpu_product, cap.price_per_gpu_hour, free))
        return out

    def _create(self, pod: Pod) -> Requeue | None:
        meta = pod["metadata"]
        uid = meta["uid"]
        first, attempts = self._attempts.get(uid, (self.clock(), 0))
        self._attempts[uid] = (first, attempts + 1)
        try:
            # One provider: it enforces its own capacity; only the GPU model needs checking here.
            name = choose(pod, self._offers()) if len(self.providers) > 1 else self._only_provider(pod)
            unresolved = self.reflector.ensure(pod, self.providers[name], starting=True)
            self.providers[name].create_pod(pod)
        except MissingObjects as exc:
            metrics.CREATES.labels(self.node, "waiting").inc()
            # Waiting for objects is no failed create: it has no deadline, and a later create error gets its full window.
            self._attempts[uid] = (self.clock(), attempts + 1)
            self._wait_for_objects(pod, exc, attempts + 1)
            return BACKOFF
        except Refused as exc:
            metrics.CREATES.labels(self.node, "refused").inc()
            self._fail(pod, "Refused", f"the pod cannot run on a virtual node: {exc}")
            return None
        except ProviderError as exc:
            if exc.retryable and self.clock() - first < self.create_retry_seconds:
                metrics.CREATES.labels(self.node, "retry").inc()
                self._retry_event(pod, exc.reason, str(exc), attempts + 1)
                return BACKOFF
            metrics.CREATES.labels(self.node, "failed").inc()
            why = str(exc)
            if attempts:
                why = f"gave up after {attempts + 1} attempts in {self.clock() - first:.0f}s: {why}"
            self._fail(pod, exc.reason if not isinstance(exc, NoProvider) or not exc.retryable else "OutOfCapacity", why)
            return None
        metrics.CREATES.labels(self.node, "ok").inc()
        for u in unresolved:  # started without them: say which and why, once per pod and object
            self._event(pod, u.reason, u.message, key=f"{u.reason}:{u.ref.kind}/{u.ref.name}")
        with self._lock:
            self.placement[uid] = name
        self._created_at[uid] = self.clock()
        self._attempts.pop(uid, None)
        _, remote = self._remote(pod)
        rstatus = (remote or {}).get("status") or {"phase": "Pending"}
        self._write_status(pod, rstatus)
        return None

    def _only_provider(self, pod: Pod) -> str:
        """The single provider's name; raises NoProvider if the pod asks for another GPU model."""
        ((name, prov),) = self.providers.items()
        wanted = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
        have = prov.capacity().gpu_product
        if wanted and wanted != have:
            raise NoProvider(f"no provider has GPU model {wanted} (nodeSelector {GPU_PRODUCT_LABEL}); available: {have}",
                             retryable=False)
        return name

    def _write_status(self, pod: Pod, rstatus: dict) -> None:
        meta, current = pod["metadata"], pod.get("status") or {}
        new = mirror_status(rstatus, host_ip=self.host_ip)
        new["startTime"] = current.get("startTime") or new.get("startTime") or now_rfc3339()
        new.setdefault("phase", "Pending")
        if current.get("podIP") or current.get("podIPs"):  # mirrored by an earlier version: unpublish it
            new["podIP"], new["podIPs"] = None, None
        # The remote kubelet writes its pod-level reason and message, and each condition, whole: what it
        # left out is gone, not kept. A strategic merge keeps what a patch leaves out (per condition, by its
        # merge key type), so a Ready condition turned True would keep the reason and message it had while
        # False ("ContainersNotReady"), and the status would never match the remote one: null them.
        for key in STATUS_WHOLE:
            if key not in new and current.get(key) is not None:
                new[key] = None
        before = {c.get("type"): c for c in current.get("conditions") or []}
        for c in new.get("conditions") or []:
            for key in before.get(c.get("type"), {}):
                c.setdefault(key, None)
        merged = {**current, **new}
        if status_digest(merged) == status_digest(current):
            return
        body = _normalize_states(copy.deepcopy(new))
        if "hostIPs" in body:
            # A strategic merge would add to the list (merge key ip): a virtual kubelet restarted on another
            # address would write two IPs of one family, which the API server refuses.
            body["hostIPs"] = [{"$patch": "replace"}, *body["hostIPs"]]
        self.kube.patch("v1", "pods", meta["name"], {"status": body}, meta["namespace"], subresource="status",
                        patch="strategic")
        metrics.STATUS_WRITES.labels(self.node).inc()
        uid = meta["uid"]
        if new.get("phase") == "Running" and uid not in self.running_since:
            self.running_since[uid] = self.clock()
            seen = self._seen_at.get(uid)
            if seen is not None:
                metrics.CREATE_TO_RUNNING.labels(self.node).observe(self.running_since[uid] - seen)

    def _wait_for_objects(self, pod: Pod, exc: MissingObjects, attempt: int) -> None:
        """Leave ``pod`` Pending, its containers waiting with reason ``CreateContainerConfigError`` (as a kubelet
        does), and record an Event naming the missing objects (names only, never data)."""
        meta = pod["metadata"]
        message = f"{exc} in namespace {meta['namespace']}: the pod starts once it exists"
        self._retry_event(pod, exc.reason, message, attempt)
        waiting = {"reason": exc.reason, "message": message[:1024]}
        current = (pod.get("status") or {}).get("containerStatuses") or []
        if current and all((c.get("state") or {}).get("waiting") == waiting for c in current):
            return
        containers = [{"name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": False,
                       "restartCount": 0, "started": False,
                       "state": {"waiting": waiting, "running": None, "terminated": None}}
                      for c in (pod.get("spec") or {}).get("containers") or []]
        try:
            self.kube.patch("v1", "pods", meta["name"], {"status": {"phase": "Pending", "containerStatuses": containers}},
                            meta["namespace"], subresource="status", patch="strategic")
            metrics.STATUS_WRITES.labels(self.node).inc()
        except NotFound:
            pass

    def _fail(self, pod: Pod, reason: str, message: str) -> None:
        """Mark the source pod Failed (phase, reason, message, Ready False) and record a Warning Event."""
        meta = pod["metadata"]
        now = now_rfc3339()
        containers = [{"name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": False,
                       "restartCount": 0, "started": False,
                       "state": {"terminated": {"exitCode": 137, "reason": reason, "message": message[:1024],
                                                "startedAt": None, "finishedAt": now}, "running": None, "waiting": None}}
                      for c in (pod.get("spec") or {}).get("containers") or []]
        status = {"phase": "Failed", "reason": reason, "message": message[:1024],
                  "startTime": (pod.get("status") or {}).get("startTime") or now,
                  "conditions": [{"type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": now},
                                 {"type": "ContainersReady", "status": "False", "reason": reason,
                                  "lastTransitionTime": now}],
                  "containerStatuses": containers}
        # First, so whoever sees the Failed pod finds it; its own Event, whatever retries of the same reason left.
        self._event(pod, reason, message, key=f"failed:{reason}")
        # resourceVersion is a precondition: a write based on a stale view gets 409 and the worker retries.
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        try:
            self.kube.patch("v1", "pods", meta["name"], body, meta["namespace"], subresource="status",
                            patch="strategic")
        except NotFound:
            return
        metrics.FAILED.labels(self.node, reason).inc()
        log.info("%s: pod %s/%s Failed: %s: %s", self.node, meta["namespace"], meta["name"], reason, message)

    def _retry_event(self, pod: Pod, reason: str, message: str, attempt: int) -> None:
        """One Event per pod and attempt class (``reason``), its count and message updated on every attempt; never raises."""
        uid = pod["metadata"]["uid"]
        text = f"{message} (attempt {attempt}, retrying)"
        known = self._retry_events.setdefault(uid, {}).get(reason)
        if known is not None:
            name, _ = known
            try:
                self.kube.patch("v1", "events", name, {"count": attempt, "lastTimestamp": now_rfc3339(),
                                                       "message": text[:1024]}, pod["metadata"]["namespace"])
                self._retry_events[uid][reason] = (name, attempt)
                return
            except NotFound:
                pass  # expired (events have a TTL): record a new one
            except KubeError as exc:
                log.info("%s: event %s on %s not updated: %s", self.node, reason, pod["metadata"]["name"], exc)
                return
        name = self._event(pod, reason, text, once=False, count=attempt)
        if name is not None:
            self._retry_events[uid][reason] = (name, attempt)

    def _event(self, pod: Pod, reason: str, message: str, *, kind: str = "Warning", once: bool = True,
               key: str | None = None, count: int = 1) -> str | None:
        """Record a core/v1 Event on the pod; returns its name (None when not recorded). Never raises.

        With ``once``, at most one Event per pod and ``key`` (default: the reason).
        """
        meta = pod["metadata"]
        if once:
            sent = self._events_sent.setdefault(meta["uid"], set())
            if (key or reason) in sent:
                return None
            sent.add(key or reason)
        # Listed pods carry no kind: name it, or the Event would not point at the pod.
        event = record_event(self.kube, {"apiVersion": "v1", "kind": "Pod", "metadata": meta}, reason, message,
                             type_=kind, component="gpufleet-virtual-kubelet", instance=self.node, host=self.node,
                             count=count)
        return None if event is None else event["metadata"]["name"]
