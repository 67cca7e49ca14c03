"""Make before break: a replacement of an inference pod starts outside, and is Ready, before the pod is evicted.

Why: evicting first drops serving capacity to the PodDisruptionBudget's
floor on every flip-out (a PDB is a floor for emergencies, not the service
level). kube-scheduler preemption, Kueue and the descheduler all evict
first; nothing in Kubernetes starts the replacement first.

How: for a victim owned by a ReplicaSet (a Deployment's), the flip-out
creates a *surge* ReplicaSet of one replica from the victim's own
ReplicaSet's pod template, placed on virtual nodes only:

- its pods keep the workload's labels but not ``pod-template-hash``, so the
  Deployment's ReplicaSet never adopts them (its selector carries the hash),
  while a Service selecting the workload's labels sends them requests;
- they carry :data:`gpufleet.names.SURGE_FOR_LABEL` = the victim's UID (the
  surge ReplicaSet's selector), and the ReplicaSet is owned (not
  controlled) by the Deployment, so deleting the Deployment removes it;
- a controller (the surge ReplicaSet) and a scale keep PodDisruptionBudgets
  with ``maxUnavailable`` or a percentage working: the disruption controller
  refuses to compute a budget over pods without a scalable controller.

The way back is the same with the surge placed in-cluster (required node
affinity ``type NotIn [virtual-kubelet]``).

A surge pod takes its victim's place once it is Ready *and published*: a
ready endpoint of every Service that selects it, at an address that
reaches it. Outside, its virtual kubelet says so on the pod
(:data:`gpufleet.names.PUBLISHED_CONDITION`, :mod:`gpufleet.virtual_kubelet.endpoints`;
a remote load balancer's address comes later than the pods' readiness, and
so does the condition); in-cluster, the flip-back reads the standard
controller's EndpointSlices (:mod:`gpufleet.taint_controller.published`). Whose test
applies is the caller's ``published``.

Taking the place (:meth:`Surges.hand_over`): the surge pod *becomes* the
victim's ReplicaSet's pod, and that ReplicaSet removes the victim, one
replica too many. In order: the victim is annotated
``controller.kubernetes.io/pod-deletion-cost`` = -2147483648 (the
ReplicaSet, with one pod too many, deletes the lowest cost among its
scheduled, Running, Ready pods: kube-controller-manager
``controller.ActivePodsWithRanks``); the surge ReplicaSet is deleted with
``propagationPolicy: Orphan`` (its pod stays, and no replacement is
started for it: a ReplicaSet being deleted manages no replicas); the surge
pod is relabelled and re-owned in one patch (:func:`adoption`): the surge
labels off, the victim's ``pod-template-hash`` on, the victim's ReplicaSet
its controller, as ``ReplicaSetController.claimPods`` would have adopted it
once the garbage collector had orphaned it. Why not evict the victim and
remove the surge once the Deployment's own replacement is Ready: that
replacement needs one more pod's worth of capacity, which a fleet at exact
capacity (every in-cluster GPU wanted back) or a short pool outside does not
have, so it would stay Pending, the surge would never be removed, and the
move would never end. Handed over, a move needs one pod's capacity, not two,
and no replacement starts after it. The Eviction API is not involved: the
victim's PodDisruptionBudget counts the adopted pod, Ready, among its
healthy ones before the victim goes, so serving never drops below what it
was; the Deployment's ``replicas`` are never changed (the HPA and GitOps
tools see the object they wrote). A victim whose ReplicaSet has no
``pod-template-hash`` (not a Deployment's) is evicted as before.

The victim is evicted (through the Eviction API, its PDB still in force)
when it can have no surge, or once ``max_wait_seconds`` passed since the
reservation without a Ready, published surge (training always wins;
today's path), or as soon as its surge ReplicaSet reports that it can
create no pod (``ReplicaFailure``: a ResourceQuota of the namespace, a
LimitRange or an admission webhook refused it; the surge is removed first):
waiting for the bound would only keep training waiting for a pod that
cannot exist. A surge ReplicaSet not handed over is deleted when the
Deployment is back to its available replicas after the eviction (its own
replacement runs), when the victim needs no eviction any more (training
ended, reservation gone), or ``cleanup_seconds`` after the victim left.

Per-tick work follows what changed, not the fleet's size: a victim's surge
pod is looked up in the pod cache's index by :data:`gpufleet.names.SURGE_FOR_LABEL`,
a victim by its UID, a workload's pods by namespace
(:data:`gpufleet.taint_controller.signal.POD_INDEXES`), and the Deployments
whose availability ends a surge are read from a watch cache of their
namespace (started with that namespace's first surge; a GET until it is
listed) instead of one GET per surge per tick; a victim's ReplicaSet is
read once for all the victims it owns (:meth:`Surges._replicaset`). Only
the sweep for ownerless surge pods (:meth:`Surges._sweep`) scans the pod
cache, once every :data:`ORPHAN_SWEEP_SECONDS`.

The Kubernetes API has no "surge for eviction"; this module is gpufleet's own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from gpufleet.kube import (Conflict, Forbidden, Kube, KubeError, NotFound, ServerError, TooManyRequests, Unreachable,
                          api_path)
from gpufleet.kube.informer import Informer
from gpufleet.kube.selectors import selector_matches
from gpufleet.names import (POD_DELETION_COST_ANNOTATION, SURGE_DIRECTION_LABEL, SURGE_FOR_LABEL, SURGE_OF_ANNOTATION,
                            VIRTUAL_NODE_LABEL, VIRTUAL_NODE_TAINT)

from .signal import BY_NAMESPACE, BY_SURGE_FOR, POD_INDEXES, pod_by_uid

log = logging.getLogger(__name__)

SURGES = Counter("gpufleet_flip_out_surges_total",
                 "Make-before-break replacements, by event (created; removed; bound passed: given up, the pod "
                 "goes without a Ready replacement; refused: its ReplicaSet can create no pod, the pod goes "
                 "without one; handed over: the surge pod took its victim's place).", ["event"])

#: Label the Deployment controller puts on a ReplicaSet's pods and selector.
TEMPLATE_HASH_LABEL = "pod-template-hash"
#: The lowest pod deletion cost (the annotation is an int32): a victim handed over goes first.
LOWEST_DELETION_COST = str(-2**31)
#: Seconds a handed-over victim is left to its ReplicaSet (which deletes it within a sync) before it counts
#: as a victim again (its ReplicaSet deleted another pod: one not Ready, say).
HANDED_OVER_SECONDS = 60.0
#: Seconds a victim's ReplicaSet, once read for its template, serves the surges of its other pods.
OWNER_TEMPLATE_SECONDS = 30.0
#: Seconds a surge may go without a pod before its ReplicaSet's status is read for a refused creation, and
#: between two reads (:meth:`Surges._refused`): the ReplicaSet controller creates a pod within a second when idle,
#: later under a flip's load, and a read every few seconds for each of hundreds of surges would add to an API
#: server that is then the flip's bottleneck. Far below the bound (``surge_max_wait_seconds``).
REFUSAL_CHECK_SECONDS = 15.0
#: Seconds between two sweeps of the pod cache for ownerless surge pods (:meth:`Surges._sweep`): a scan of every
#: cached pod, so not on every tick.
ORPHAN_SWEEP_SECONDS = 60.0
#: Seconds after a read that found ``ReplicaFailure`` before the read that confirms it: the ReplicaSet controller
#: clears the condition in the status write after a creation that succeeds, so one read can fall between a pod's
#: creation and that write.
REFUSAL_CONFIRM_SECONDS = 5.0


def slim_deployment(d: dict[str, Any]) -> dict[str, Any]:
    """What the Deployment cache keeps: name, namespace, ``spec.replicas``, ``spec.selector``, ``status.availableReplicas``."""
    meta, spec = d.get("metadata") or {}, d.get("spec") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
            "spec": {"replicas": spec.get("replicas", 1), "selector": spec.get("selector") or {}},
            "status": {"availableReplicas": (d.get("status") or {}).get("availableReplicas") or 0}}


class Deployments:
    """Deployments by namespace and name, from one watch cache per namespace a surge was made in.

    The surge Role grants get/list/watch on Deployments in each inference
    namespace only (``roles/taint_controller``), so the caches are per
    namespace, started on first use; until one is listed, :meth:`get` reads
    the object with a GET. A cache whose list is forbidden (a cluster still
    running an older surge Role that grants ``get`` alone, until the next
    ``pulumi up``) is stopped after one warning and the namespace stays on
    GETs for ``forbidden_retry_seconds`` before a cache is tried again.

    Args:
        kube: client.
        forbidden_retry_seconds: seconds a namespace whose list was forbidden stays on GETs.
        clock: monotonic seconds (tests).
    """

    def __init__(self, kube: Kube, forbidden_retry_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.caches: dict[str, Informer[dict[str, Any]]] = {}
        self.forbidden_retry_seconds = forbidden_retry_seconds
        self.clock = clock
        self.on_gets_until: dict[str, float] = {}  # namespace -> clock time its cache is tried again

    def _cache(self, namespace: str) -> Informer[dict[str, Any]] | None:
        """The namespace's cache, started on first use; None while the namespace is on GETs (class doc)."""
        if self.clock() < self.on_gets_until.get(namespace, float("-inf")):
            return None
        cache = self.caches.get(namespace)
        if cache is None:
            cache = self.caches[namespace] = Informer(
                self.kube, api_path("apps/v1", "deployments", namespace), transform=slim_deployment,
                name=f"deployments-{namespace}").start()
        elif not cache.synced.is_set() and isinstance(cache.last_error, Forbidden):
            cache.stop()
            del self.caches[namespace]
            self.on_gets_until[namespace] = self.clock() + self.forbidden_retry_seconds
            log.warning("Deployments in %s: list/watch forbidden (%s); reading them with GETs, trying a watch "
                        "again in %.0fs (the surge Role grants list and watch since this release: run `pulumi up`)",
                        namespace, cache.last_error, self.forbidden_retry_seconds)
            return None
        return cache

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Deployment (:func:`slim_deployment` once cached), or None when it does not exist.

        Raises:
            KubeError: only while the namespace's cache is not listed (the GET failed).
        """
        cache = self._cache(namespace)
        if cache is not None and cache.synced.is_set():
            return cache.get(f"{namespace}/{name}")
        try:
            return self.kube.get("apps/v1", "deployments", name, namespace)
        except NotFound:
            return None

    def stop(self) -> None:
        """Stop every cache's watch."""
        for cache in self.caches.values():
            cache.stop()


def surge_name(victim_name: str, victim_uid: str) -> str:
    """The surge ReplicaSet's name: ``<victim name>-surge-<uid[:5]>``, at most 63 characters (a label value)."""
    suffix = f"-surge-{victim_uid[:5]}"
    return victim_name[: 63 - len(suffix)].rstrip("-.") + suffix


def owner_of(meta: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The controller ownerReference of kind ``kind`` in ``meta`` (None if none)."""
    return next((o for o in meta.get("ownerReferences") or []
                 if o.get("kind") == kind and o.get("controller")), None)


def adoptable(victim: dict[str, Any]) -> bool:
    """Whether a surge pod can take the place of the pod of ``metadata`` ``victim``: the victim carries a
    ``pod-template-hash`` label and a controller ReplicaSet (what :func:`adoption` writes onto the surge pod)."""
    return bool((victim.get("labels") or {}).get(TEMPLATE_HASH_LABEL)) and owner_of(victim, "ReplicaSet") is not None


def adoption(victim: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that makes a surge pod its victim's ReplicaSet's pod (``victim``: the victim's ``metadata``,
    labelled ``pod-template-hash`` and controlled by a ReplicaSet); pure.

    The surge labels off, the victim's ``pod-template-hash`` on, and the
    victim's ReplicaSet as the pod's one controller ownerReference (the
    list is replaced: a merge patch replaces lists). The ReplicaSet
    controller would adopt a matching orphan itself
    (``ReplicaSetController.claimPods``), but only once the garbage collector
    has removed the surge ReplicaSet's reference, which it does from its own
    queue: at 1,024 nodes that took 10 to 30 s after the hand-over, during
    which the victim held its node. Written here, the ReplicaSet counts the
    pod on its next sync. ``blockOwnerDeletion`` is left unset: setting it
    needs ``update`` on ``replicasets/finalizers`` where the
    OwnerReferencesPermissionEnforcement admission plugin runs, and only
    makes a foreground deletion of the ReplicaSet wait for this pod.

    Raises:
        ValueError: the victim has no ``pod-template-hash`` label or no controller ReplicaSet.
    """
    if not adoptable(victim):
        raise ValueError(f"pod {victim.get('namespace')}/{victim.get('name')}: expected a {TEMPLATE_HASH_LABEL} "
                         "label and a controller ReplicaSet")
    rs = owner_of(victim, "ReplicaSet")
    return {"metadata": {
        "labels": {SURGE_FOR_LABEL: None, SURGE_DIRECTION_LABEL: None,
                   TEMPLATE_HASH_LABEL: victim["labels"][TEMPLATE_HASH_LABEL]},
        "ownerReferences": [{"apiVersion": rs.get("apiVersion", "apps/v1"), "kind": "ReplicaSet",
                             "name": rs["name"], "uid": rs["uid"], "controller": True}]}}


def _outside(spec: dict[str, Any]) -> None:
    """Place on virtual nodes: their label selected, their taint tolerated."""
    key, value = VIRTUAL_NODE_LABEL
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), key: value}
    tolerations = list(spec.get("tolerations") or [])
    if not any(t.get("key") == VIRTUAL_NODE_TAINT for t in tolerations):
        tolerations.append({"key": VIRTUAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"})
    spec["tolerations"] = tolerations


def _in_cluster(spec: dict[str, Any]) -> None:
    """Keep off virtual nodes: ``type NotIn [virtual-kubelet]`` added to every required node selector term
    (terms are ORed, so each needs it), or one term of its own."""
    key, value = VIRTUAL_NODE_LABEL
    expr = {"key": key, "operator": "NotIn", "values": [value]}
    affinity = dict(spec.get("affinity") or {})
    node = dict(affinity.get("nodeAffinity") or {})
    required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []] or [{}]
    for t in terms:
        t["matchExpressions"] = [*(t.get("matchExpressions") or []), expr]
    required["nodeSelectorTerms"] = terms
    node["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node
    spec["affinity"] = affinity


DIRECTIONS = ("out", "back")


def surge_replicaset(victim: dict[str, Any], owner_rs: dict[str, Any], direction: str = "out",
                     priority_class: str | None = None) -> dict[str, Any]:
    """The surge ReplicaSet for ``victim`` (a pod's ``metadata``) from its ReplicaSet ``owner_rs``; pure.

    One replica of the ReplicaSet's pod template without ``pod-template-hash``,
    labelled :data:`SURGE_FOR_LABEL` = the victim's UID; ``direction``
    ``out``: on virtual nodes (their label selected, their taint tolerated),
    ``back``: off them (required node affinity). ``priority_class`` (``out``
    only): the pods' ``priorityClassName`` instead of the template's (its
    ``priority`` and ``preemptionPolicy`` dropped: admission sets them from
    the class, and refuses a pod whose own differ from it), so that
    kube-scheduler places them before the training they make room for
    (:data:`gpufleet.names.SURGE_PRIORITY_CLASS`); the way back keeps the
    workload's own, which training must stay above in-cluster.

    Raises:
        ValueError: ``owner_rs`` has no template or is not owned by a Deployment; an unknown ``direction``.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"surge direction {direction!r}: expected one of {', '.join(DIRECTIONS)}")
    uid = victim["uid"]
    deployment = owner_of(owner_rs["metadata"], "Deployment")
    template = (owner_rs.get("spec") or {}).get("template")
    if not template or deployment is None:
        raise ValueError(f"ReplicaSet {owner_rs['metadata'].get('namespace')}/{owner_rs['metadata'].get('name')}: "
                         "expected a pod template and a Deployment owner")
    labels = {k: v for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()
              if k != TEMPLATE_HASH_LABEL}
    labels[SURGE_FOR_LABEL] = uid
    labels[SURGE_DIRECTION_LABEL] = direction
    spec = dict(template.get("spec") or {})
    (_outside if direction == "out" else _in_cluster)(spec)
    if priority_class and direction == "out":
        # Both come from the class at admission, which refuses a pod whose own differ from it.
        spec["priorityClassName"] = priority_class
        spec.pop("priority", None)
        spec.pop("preemptionPolicy", None)
    ns = victim["namespace"]
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": surge_name(victim["name"], uid), "namespace": ns,
                     "labels": {SURGE_FOR_LABEL: uid, SURGE_DIRECTION_LABEL: direction,
                                "app.kubernetes.io/managed-by": "gpufleet"},
                     "annotations": {SURGE_OF_ANNOTATION: f"{ns}/{victim['name']}"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["name"],
                                          "uid": deployment["uid"]}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {SURGE_FOR_LABEL: uid}},
                 "template": {"metadata": {"labels": labels, "annotations": dict((template.get("metadata") or {})
                                                                                  .get("annotations") or {})},
                              "spec": spec}},
    }


@dataclass
class Surge:
    """One surge in flight: the victim it replaces and where its ReplicaSet lives."""

    victim_uid: str
    namespace: str
    name: str
    deployment: str
    created: float
    victim_gone_at: float | None = None
    next_check: float = float("-inf")  # when its ReplicaSet's status may be read next (_refused)
    failing: bool = False  # the last read found ReplicaFailure (_refused)
    refused: str = ""  # ReplicaFailure confirmed: why; its removal is retried until it succeeds


class Surges:
    """Creates, watches and removes surge ReplicaSets (module docstring).

    Args:
        kube: client.
        pods: informer of pod views (:func:`gpufleet.taint_controller.signal.pod_view`); surge pods are found there
            (its :data:`~gpufleet.taint_controller.signal.POD_INDEXES` are added when missing).
        direction: ``out`` (flip-out: replacements on virtual nodes) or ``back`` (flip-back: in-cluster).
        published: pod view -> whether it is published (module docstring); default: the virtual kubelet's
            condition (``out``); ``back`` needs the EndpointSlices' test
            (:meth:`gpufleet.taint_controller.published.ServiceEndpoints.published`).
        cleanup_seconds: after the victim left, the surge goes at the latest this long after (seconds).
        deployments: the Deployment caches (shared by the flip-out's and flip-back's surges); default: its own.
        priority_class: ``out``: the surge pods' PriorityClass (:func:`surge_replicaset`); None: the workload's.
        clock: monotonic seconds.

    Raises:
        ValueError: an unknown ``direction``; ``back`` without ``published``.
    """

    def __init__(self, kube: Kube, pods, *, direction: str = "out", published: Callable[[dict], bool] | None = None,
                 cleanup_seconds: float = 300.0, deployments: Deployments | None = None,
                 priority_class: str | None = None, clock: Callable[[], float] = time.monotonic):
        if direction not in DIRECTIONS:
            raise ValueError(f"surge direction {direction!r}: expected one of {', '.join(DIRECTIONS)}")
        if published is None and direction == "back":
            raise ValueError("surge direction 'back': expected a test of in-cluster publication (published=)")
        self.published = published or (lambda p: p["published"])
        self.handed: dict[str, float] = {}  # victim UID -> when its surge pod took its place
        self.direction = direction
        self.priority_class = priority_class
        self.kube = kube
        pods.add_indexers(POD_INDEXES)
        self.pods = pods
        self.deployments = deployments or Deployments(kube)
        self.cleanup_seconds = cleanup_seconds
        self.clock = clock
        self.live: dict[str, Surge] = {}
        self._owners: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}  # _replicaset's reads
        self._owners_lock = threading.Lock()
        self.unsurgeable: set[str] = set()
        self._swept = clock()  # when the pod cache was last swept for orphaned surge pods (_sweep)

    def recover(self) -> None:
        """Take over surges an earlier instance created (from their pods' labels and owners), and finish the
        hand-overs it left half done.

        A surge pod without an owner was orphaned by a hand-over (:meth:`hand_over`: its ReplicaSet deleted
        with ``Orphan``) that stopped before the relabel, an instance gone between the two writes: nothing
        else would ever adopt or remove it. It is relabelled into its victim's ReplicaSet when the victim is
        still there, terminating or not (the hand-over's last step; the victim already carries the lowest
        deletion cost), and deleted when the victim is gone (its ReplicaSet replaced it: this pod is one too
        many, and outside it costs money while it runs). A running instance removes such a pod with its
        surge (:meth:`reconcile`), and finishes the orphans no surge of its own accounts for every
        :data:`ORPHAN_SWEEP_SECONDS` (:meth:`_sweep`).
        """
        for p, uid, rs in self._surge_pods():
            if rs is None:
                self._finish_orphan(p, uid)
            elif uid not in self.live:
                self.live[uid] = Surge(uid, p["metadata"]["namespace"], rs["name"], "", self.clock())
        self._swept = self.clock()

    def _surge_pods(self) -> Iterator[tuple[dict[str, Any], str, dict[str, Any] | None]]:
        """``(pod view, victim UID, controller ReplicaSet reference or None)`` of every cached surge pod of this
        direction that is not terminating: a scan of the pod cache."""
        for p in self.pods.items():
            meta = p["metadata"]
            labels = meta.get("labels") or {}
            uid = labels.get(SURGE_FOR_LABEL)
            if uid and labels.get(SURGE_DIRECTION_LABEL, "out") == self.direction and not meta.get("deletionTimestamp"):
                yield p, uid, owner_of(meta, "ReplicaSet")

    def _sweep(self) -> None:
        """Finish the ownerless surge pods no live surge accounts for (:meth:`_finish_orphan`).

        Besides an instance stopped mid-hand-over (:meth:`recover`), the ReplicaSet controller may see the
        surge pod leave its surge ReplicaSet (the hand-over's relabel) before that ReplicaSet's deletion, and
        start one more pod; the garbage collector then orphans it, and nothing else would ever remove it.
        """
        self._swept = self.clock()
        for p, uid, rs in self._surge_pods():
            if rs is None and uid not in self.live and self._still_orphaned(p):
                self._finish_orphan(p, uid)

    def _still_orphaned(self, pod: dict[str, Any]) -> bool:
        """Whether the API server's copy of ``pod`` (a pod view) is an ownerless surge pod, not terminating: the
        cache may still hold the moment between a hand-over's Orphan delete and its relabel (the garbage
        collector's removal of the reference is an event of its own), which the hand-over has already ended.
        One quorum read per candidate; candidates are rare."""
        meta = pod["metadata"]
        try:
            fresh = self.kube.get("v1", "pods", meta["name"], meta["namespace"])
        except KubeError:
            return False  # gone, or unreadable now: the next sweep looks again
        fmeta = fresh.get("metadata") or {}
        return (fmeta.get("uid") == meta["uid"] and not fmeta.get("deletionTimestamp")
                and (fmeta.get("labels") or {}).get(SURGE_FOR_LABEL) is not None
                and owner_of(fmeta, "ReplicaSet") is None)

    def _finish_orphan(self, pod: dict[str, Any], victim_uid: str) -> None:
        """Relabel or delete an ownerless surge pod (:meth:`recover`, :meth:`_sweep`): relabelled into its victim's
        ReplicaSet while the victim is there and was not handed over yet, deleted otherwise (one pod too many); a
        failed write is logged (the pod stays as it is until the next sweep)."""
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        victim = pod_by_uid(self.pods, victim_uid)
        vmeta = (victim or {}).get("metadata") or {}
        try:
            # A terminating victim still names the ReplicaSet to join: adopted, the pod stands in for the
            # replacement that ReplicaSet starts (it removes one of the two, the one not yet Ready first).
            if adoptable(vmeta) and victim_uid not in self.handed:
                self.kube.patch("v1", "pods", name, adoption(vmeta), ns)
                self.handed[victim_uid] = self.clock()
                SURGES.labels("handed over").inc()
                log.info("flip-%s: %s/%s, orphaned by an interrupted hand-over, took the place of %s",
                         self.direction, ns, name, victim["metadata"]["name"])
            else:
                self.kube.delete("v1", "pods", name, ns, uid=meta["uid"])
                SURGES.labels("removed").inc()
                log.info("flip-%s: %s/%s, an orphaned surge pod whose victim is gone or already replaced, removed",
                         self.direction, ns, name)
        except NotFound:
            pass
        except KubeError as exc:
            log.warning("flip-%s: finishing the hand-over of orphaned surge pod %s/%s: %s", self.direction, ns,
                        name, exc)

    def ready(self, victim: dict[str, Any]) -> bool:
        """Whether ``victim`` (a pod view) may go now: its surge pod is Ready and published (then
        :meth:`hand_over`), it was handed over, or it cannot have a surge.

        Creates the surge ReplicaSet on first call. A victim not owned by a
        Deployment's ReplicaSet, or whose surge the API server refuses for
        good (forbidden, invalid), gets no surge (True: evict as before); a
        passing failure (timeout, 5xx, 429) is tried again on the next call.
        A surge whose ReplicaSet can create no pod (:meth:`_refused`: may
        read the ReplicaSet) is removed, and then the victim may go (True).
        """
        meta = victim["metadata"]
        uid = meta["uid"]
        if uid in self.unsurgeable or uid in self.handed:
            return True
        if uid not in self.live:
            try:
                created = self._create(meta)
            except (Unreachable, ServerError, TooManyRequests) as exc:
                log.info("flip-%s: surge for %s/%s not created yet: %s", self.direction, meta["namespace"],
                         meta["name"], exc)
                return False
            if created is None:
                self.unsurgeable.add(uid)
                return True
            self.live[uid] = created
            return False
        if self._surge_ready(uid):
            return True
        s = self.live[uid]
        if not s.refused:
            s.refused = self._refused(s) or ""
            if not s.refused:
                return False
            log.warning("flip-%s: surge %s/%s can start no pod (%s): %s/%s goes without a replacement",
                        self.direction, meta["namespace"], s.name, s.refused, meta["namespace"], meta["name"])
            SURGES.labels("refused").inc()
        # Only once it is gone: a surge left would get a pod later, not Ready, counted against the PDB.
        if not self._remove(s, "its ReplicaSet can create no pod"):
            return False
        self.unsurgeable.add(uid)
        return True

    def _surge_ready(self, uid: str) -> bool:
        return self._surge_pod(uid) is not None

    def _refused(self, s: Surge) -> str | None:
        """``reason: message`` of ``s``'s ReplicaSet's ``ReplicaFailure`` condition (the ReplicaSet controller's
        pod creation failed: a quota, a LimitRange, an admission webhook), found on two reads
        :data:`REFUSAL_CONFIRM_SECONDS` apart while the surge has no pod; None otherwise. No request while it
        has a pod, or within :data:`REFUSAL_CHECK_SECONDS` of its creation or of the last read that found no
        failure. A ReplicaSet gone (deleted by someone else) is forgotten, so the next call creates it again."""
        now = self.clock()
        if now - s.created < REFUSAL_CHECK_SECONDS or now < s.next_check:
            return None
        if any((p["metadata"].get("labels") or {}).get(SURGE_DIRECTION_LABEL, "out") == self.direction
               for p in self.pods.by_index(BY_SURGE_FOR, s.victim_uid)):
            s.failing = False
            return None
        try:
            rs = self.kube.get("apps/v1", "replicasets", s.name, s.namespace)
        except NotFound:
            self.live.pop(s.victim_uid, None)
            return None
        except KubeError:
            s.next_check = now + REFUSAL_CHECK_SECONDS
            return None  # unreadable now: the bound still holds
        failure = next((c for c in (rs.get("status") or {}).get("conditions") or []
                        if c.get("type") == "ReplicaFailure" and c.get("status") == "True"), None)
        if failure is None or (rs.get("status") or {}).get("replicas"):
            s.failing, s.next_check = False, now + REFUSAL_CHECK_SECONDS
            return None
        if not s.failing:
            s.failing, s.next_check = True, now + REFUSAL_CONFIRM_SECONDS
            return None
        return f"{failure.get('reason', '')}: {failure.get('message', '')}"

    def _surge_pod(self, uid: str) -> dict[str, Any] | None:
        """The surge pod of victim ``uid`` that is bound, Ready, published and not terminating, or None."""
        return next((p for p in self.pods.by_index(BY_SURGE_FOR, uid)
                     if p["ready"] and p["node"] and not p["metadata"].get("deletionTimestamp") and self.published(p)),
                    None)

    def hand_over(self, victim: dict[str, Any]) -> bool | None:
        """Let ``victim``'s (a pod view's) Ready, published surge pod take its place (module docstring).

        Returns:
            True: handed over (now or earlier): the victim's ReplicaSet deletes
            the victim, nothing is to be evicted; False: no surge pod to hand
            over, or the victim's ReplicaSet has no ``pod-template-hash``
            (evict as before); None: a request failed, try again on the next call.
        """
        meta = victim["metadata"]
        uid, ns = meta["uid"], meta["namespace"]
        if uid in self.handed:
            return True
        surge, pod = self.live.get(uid), self._surge_pod(uid)
        if surge is None or pod is None or not adoptable(meta):
            return False
        try:
            self.kube.patch("v1", "pods", meta["name"],
                            {"metadata": {"annotations": {POD_DELETION_COST_ANNOTATION: LOWEST_DELETION_COST}}}, ns)
            try:
                self.kube.delete("apps/v1", "replicasets", surge.name, ns, propagation="Orphan")
            except NotFound:
                pass  # deleted by an earlier, interrupted hand-over
            self.kube.patch("v1", "pods", pod["metadata"]["name"], adoption(meta), ns)
        except NotFound:
            return False  # the victim or the surge pod left meanwhile
        except KubeError as exc:
            log.warning("flip-%s: handing %s/%s over to %s: %s; retrying", self.direction, ns, meta["name"],
                        pod["metadata"]["name"], exc)
            return None
        self.live.pop(uid, None)
        self.handed[uid] = self.clock()
        SURGES.labels("handed over").inc()
        log.info("flip-%s: %s/%s took the place of %s (Ready and published); its ReplicaSet removes it",
                 self.direction, ns, pod["metadata"]["name"], meta["name"])
        return True

    def give_up(self, victims: Iterable[dict[str, Any]]) -> None:
        """Past the bound: :meth:`abandon` every victim (pod views) whose surge is not Ready, before any eviction.

        All at once, because one pending surge left would keep the PDB from
        allowing the others' evictions.
        """
        for v in victims:
            uid = v["metadata"]["uid"]
            if uid in self.unsurgeable or uid in self.handed or (uid in self.live and self._surge_ready(uid)):
                continue
            self.abandon(v)

    def abandon(self, victim: dict[str, Any]) -> None:
        """Give up the surge of ``victim`` (a pod view) past the bound: remove it, then let the victim go without one.

        A surge pod that is not Ready still counts among a PodDisruptionBudget's
        expected pods (its ReplicaSet's scale) but not among the healthy ones,
        so with ``maxUnavailable`` it would block the very eviction it was for.
        """
        uid = victim["metadata"]["uid"]
        self.unsurgeable.add(uid)
        if uid in self.live:
            self._remove(self.live[uid], "no Ready replacement within the bound")
        SURGES.labels("bound passed").inc()

    def _replicaset(self, namespace: str, ref: dict[str, Any]) -> dict[str, Any]:
        """The victim's ReplicaSet named by ownerReference ``ref``: read once per :data:`OWNER_TEMPLATE_SECONDS`
        for all the victims it owns (a flip-out moves hundreds of one workload's pods; each read is a quorum
        read through the API server to etcd). A Deployment's ReplicaSet keeps its template (a new template is
        a new ReplicaSet), and the UID of the reference tells a ReplicaSet recreated under the same name.

        Raises:
            KubeError: the read failed.
        """
        key = (namespace, ref["name"], ref.get("uid", ""))
        now = self.clock()
        with self._owners_lock:  # the flip-out's workers create surges side by side
            cached = self._owners.get(key)
            if cached is not None and now - cached[0] < OWNER_TEMPLATE_SECONDS:
                return cached[1]
        rs = self.kube.get("apps/v1", "replicasets", ref["name"], namespace)
        if ref.get("uid") and rs["metadata"].get("uid") != ref["uid"]:
            return rs  # another ReplicaSet of that name now: used for this victim (as before), never cached
        with self._owners_lock:
            for k in [k for k, v in self._owners.items() if now - v[0] >= OWNER_TEMPLATE_SECONDS]:
                del self._owners[k]
            self._owners[key] = (now, rs)
        return rs

    def _create(self, meta: dict[str, Any]) -> Surge | None:
        """The surge started for ``meta``'s pod; None when it can have none.

        Raises:
            Unreachable, ServerError, TooManyRequests: a passing failure (try again).
        """
        rs_ref = owner_of(meta, "ReplicaSet")
        if rs_ref is None:
            return None
        ns = meta["namespace"]
        try:
            owner_rs = self._replicaset(ns, rs_ref)
            body = surge_replicaset(meta, owner_rs, self.direction, self.priority_class)
        except (Unreachable, ServerError, TooManyRequests):
            raise
        except Forbidden as exc:
            # Not a property of this pod but of the controller's RBAC: every flip in this namespace
            # loses make-before-break, so say it loudly (the taint_controller role grants the
            # surge Role only where the inference role is enabled).
            log.warning("flip-%s: no surge for %s/%s, forbidden (%s): evicting first; the taint controller "
                        "needs the surge Role in namespace %s", self.direction, ns, meta["name"], exc, ns)
            return None
        except (KubeError, ValueError) as exc:
            log.info("flip-%s: no surge for %s/%s (%s): evicting first", self.direction, ns, meta["name"], exc)
            return None
        try:
            self.kube.create("apps/v1", "replicasets", body, ns)
            SURGES.labels("created").inc()
            log.info("flip-%s: surge %s/%s started %s for %s before its eviction", self.direction, ns,
                     body["metadata"]["name"], "outside" if self.direction == "out" else "in-cluster", meta["name"])
        except Conflict:
            pass  # created by an earlier tick or instance
        except (Unreachable, ServerError, TooManyRequests):
            raise
        except KubeError as exc:
            log.warning("flip-%s: creating surge for %s/%s: %s: evicting first", self.direction, ns, meta["name"], exc)
            return None
        deployment = body["metadata"]["ownerReferences"][0]["name"]
        return Surge(meta["uid"], ns, body["metadata"]["name"], deployment, self.clock())

    def reconcile(self, wanted: Iterable[str]) -> None:
        """Remove surges no longer needed; ``wanted``: UIDs of victims a reservation still has to move."""
        wanted = set(wanted)
        now = self.clock()
        if now - self._swept >= ORPHAN_SWEEP_SECONDS:
            self._sweep()

        def alive(uid: str) -> bool:
            p = pod_by_uid(self.pods, uid)
            return p is not None and not p["metadata"].get("deletionTimestamp")

        for uid, s in list(self.live.items()):
            if alive(uid):
                if uid not in wanted:
                    self._remove(s, "its pod needs no eviction any more")
                continue
            if s.victim_gone_at is None:
                s.victim_gone_at = now
            if now - s.victim_gone_at >= self.cleanup_seconds or self._deployment_available(s):
                self._remove(s, "the workload is back to its available replicas")
        # A victim no reservation wants any more may have a surge next time (its quota may have room then).
        self.unsurgeable = {u for u in self.unsurgeable if alive(u) and u in wanted}
        self.handed = {u: t for u, t in self.handed.items() if alive(u) and now - t < HANDED_OVER_SECONDS}

    def _deployment_available(self, s: Surge) -> bool:
        if not s.deployment:
            return True  # recovered without its owner: its replacement had time to start
        try:
            d = self.deployments.get(s.namespace, s.deployment)
        except KubeError:
            return False
        if d is None:
            return True
        want = (d.get("spec") or {}).get("replicas", 1)
        if ((d.get("status") or {}).get("availableReplicas") or 0) < want:
            return False
        # The Deployment's status lags its pods: right after the victim's eviction it still counts the victim,
        # and removing the surge then would leave one replica short until the ReplicaSet's replacement is Ready.
        # So its own Ready pods are counted too, from the cache (surges excluded).
        selector = (d.get("spec") or {}).get("selector")
        if not selector:
            return True
        ready = 0
        for p in self.pods.by_index(BY_NAMESPACE, s.namespace):
            meta = p["metadata"]
            labels = meta.get("labels") or {}
            if (SURGE_FOR_LABEL not in labels and p["ready"] and p["node"]
                    and not meta.get("deletionTimestamp") and selector_matches(selector, labels)):
                ready += 1
        return ready >= want

    def _remove(self, s: Surge, why: str) -> bool:
        """Delete ``s``'s ReplicaSet (its pods with it) and forget it; False when a request failed (try again)."""
        try:
            self.kube.delete("apps/v1", "replicasets", s.name, s.namespace, propagation="Background")
        except NotFound:
            # Gone already: by an earlier removal (its pods go with it), or by a hand-over interrupted after
            # its Orphan delete, whose pod nothing else would ever remove: remove what still carries the label.
            if not self._remove_pods(s):
                return False
        except KubeError as exc:
            log.warning("flip-%s: removing surge %s/%s: %s", self.direction, s.namespace, s.name, exc)
            return False
        self.live.pop(s.victim_uid, None)
        SURGES.labels("removed").inc()
        log.info("flip-%s: surge %s/%s removed: %s", self.direction, s.namespace, s.name, why)
        return True

    def _remove_pods(self, s: Surge) -> bool:
        """Delete the pods still labelled as ``s``'s surge (UID-preconditioned); False when a delete failed
        (the next tick tries again)."""
        for p in self.pods.by_index(BY_SURGE_FOR, s.victim_uid):
            meta = p["metadata"]
            if ((meta.get("labels") or {}).get(SURGE_DIRECTION_LABEL, "out") != self.direction
                    or meta.get("deletionTimestamp")):
                continue
            try:
                self.kube.delete("v1", "pods", meta["name"], meta["namespace"], uid=meta["uid"])
            except NotFound:
                continue
            except KubeError as exc:
                log.warning("flip-%s: removing pod %s/%s of surge %s: %s", self.direction, meta["namespace"],
                            meta["name"], s.name, exc)
                return False
            log.info("flip-%s: pod %s/%s of surge %s (its ReplicaSet gone) removed", self.direction,
                     meta["namespace"], meta["name"], s.name)
        return True
