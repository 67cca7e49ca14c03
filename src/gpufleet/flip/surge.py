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
affinity ``type NotIn [virtual-kubelet]``): the flip-back releases or
evicts a pod outside only once its in-cluster replacement is Ready.

The victim is evicted (through the Eviction API, its PDB still in force)
once its surge pod is Ready, or once ``max_wait_seconds`` passed since the
reservation (training always wins; today's path). The surge ReplicaSet is
deleted when the Deployment is back to its available replicas after the
eviction (its own replacement runs), when the victim needs no eviction any
more (training ended, reservation gone), or ``cleanup_seconds`` after the
victim left. The user's Deployment is never changed: the HPA and GitOps
tools see the object they wrote.

The Kubernetes API has no "surge for eviction"; this module is gpufleet's own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from gpufleet.kube import Conflict, Forbidden, Kube, KubeError, NotFound, ServerError, TooManyRequests, Unreachable
from gpufleet.names import (SURGE_DIRECTION_LABEL, SURGE_FOR_LABEL, SURGE_OF_ANNOTATION, VIRTUAL_NODE_LABEL,
                            VIRTUAL_NODE_TAINT)

log = logging.getLogger(__name__)

SURGES = Counter("gpufleet_flip_out_surges_total",
                 "Make-before-break replacements, by event (created; removed; bound passed: given up, the pod "
                 "goes without a Ready replacement).", ["event"])

#: Label the Deployment controller puts on a ReplicaSet's pods and selector.
TEMPLATE_HASH_LABEL = "pod-template-hash"


def surge_name(victim_name: str, victim_uid: str) -> str:
    """The surge ReplicaSet's name: ``<victim name>-surge-<uid[:5]>``, at most 63 characters (a label value)."""
    suffix = f"-surge-{victim_uid[:5]}"
    return victim_name[: 63 - len(suffix)].rstrip("-.") + suffix


def owner_of(meta: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The controller ownerReference of kind ``kind`` in ``meta`` (None if none)."""
    return next((o for o in meta.get("ownerReferences") or []
                 if o.get("kind") == kind and o.get("controller")), None)


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


def surge_replicaset(victim: dict[str, Any], owner_rs: dict[str, Any], direction: str = "out") -> dict[str, Any]:
    """The surge ReplicaSet for ``victim`` (a pod's ``metadata``) from its ReplicaSet ``owner_rs``; pure.

    One replica of the ReplicaSet's pod template without ``pod-template-hash``,
    labelled :data:`SURGE_FOR_LABEL` = the victim's UID; ``direction``
    ``out``: on virtual nodes (their label selected, their taint tolerated),
    ``back``: off them (required node affinity).

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


class Surges:
    """Creates, watches and removes surge ReplicaSets (module docstring).

    Args:
        kube: client.
        pods: informer of pod views (:func:`gpufleet.flip.signal.pod_view`); surge pods are found there.
        direction: ``out`` (flip-out: replacements on virtual nodes) or ``back`` (flip-back: in-cluster).
        cleanup_seconds: after the victim left, the surge goes at the latest this long after (seconds).
        clock: monotonic seconds.
    """

    def __init__(self, kube: Kube, pods, *, direction: str = "out", cleanup_seconds: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        if direction not in DIRECTIONS:
            raise ValueError(f"surge direction {direction!r}: expected one of {', '.join(DIRECTIONS)}")
        self.direction = direction
        self.kube = kube
        self.pods = pods
        self.cleanup_seconds = cleanup_seconds
        self.clock = clock
        self.live: dict[str, Surge] = {}
        self.unsurgeable: set[str] = set()

    def recover(self) -> None:
        """Take over surges an earlier instance created (from their pods' labels and owners)."""
        for p in self.pods.items():
            labels = p["metadata"].get("labels") or {}
            uid = labels.get(SURGE_FOR_LABEL)
            rs = owner_of(p["metadata"], "ReplicaSet")
            if uid and rs and uid not in self.live and labels.get(SURGE_DIRECTION_LABEL, "out") == self.direction:
                self.live[uid] = Surge(uid, p["metadata"]["namespace"], rs["name"], "", self.clock())

    def ready(self, victim: dict[str, Any]) -> bool:
        """Whether ``victim`` (a pod view) may be evicted now: its surge pod is Ready, or it cannot have one.

        Creates the surge ReplicaSet on first call. A victim not owned by a
        Deployment's ReplicaSet, or whose surge the API server refuses for
        good (forbidden, invalid), gets no surge (True: evict as before); a
        passing failure (timeout, 5xx, 429) is tried again on the next call.
        """
        meta = victim["metadata"]
        uid = meta["uid"]
        if uid in self.unsurgeable:
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
        return self._surge_ready(uid)

    def _surge_ready(self, uid: str) -> bool:
        return any((p["metadata"].get("labels") or {}).get(SURGE_FOR_LABEL) == uid and p["ready"] and p["node"]
                   and not p["metadata"].get("deletionTimestamp") for p in self.pods.items())

    def give_up(self, victims: Iterable[dict[str, Any]]) -> None:
        """Past the bound: :meth:`abandon` every victim (pod views) whose surge is not Ready, before any eviction.

        All at once, because one pending surge left would keep the PDB from
        allowing the others' evictions.
        """
        for v in victims:
            uid = v["metadata"]["uid"]
            if uid not in self.unsurgeable and not (uid in self.live and self._surge_ready(uid)):
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
            owner_rs = self.kube.get("apps/v1", "replicasets", rs_ref["name"], ns)
            body = surge_replicaset(meta, owner_rs, self.direction)
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
        live_uids = {p["metadata"]["uid"] for p in self.pods.items() if not p["metadata"].get("deletionTimestamp")}
        now = self.clock()
        for uid, s in list(self.live.items()):
            if uid in live_uids:
                if uid not in wanted:
                    self._remove(s, "its pod needs no eviction any more")
                continue
            if s.victim_gone_at is None:
                s.victim_gone_at = now
            if now - s.victim_gone_at >= self.cleanup_seconds or self._deployment_available(s):
                self._remove(s, "the workload is back to its available replicas")
        self.unsurgeable &= live_uids

    def _deployment_available(self, s: Surge) -> bool:
        if not s.deployment:
            return True  # recovered without its owner: its replacement had time to start
        try:
            d = self.kube.get("apps/v1", "deployments", s.deployment, s.namespace)
        except NotFound:
            return True
        except KubeError:
            return False
        want = (d.get("spec") or {}).get("replicas", 1)
        if ((d.get("status") or {}).get("availableReplicas") or 0) < want:
            return False
        # The Deployment's status lags its pods: right after the victim's eviction it still counts the victim,
        # and removing the surge then would leave one replica short until the ReplicaSet's replacement is Ready.
        # So its own Ready pods are counted too, from the cache (surges excluded).
        selector = (d.get("spec") or {}).get("selector") or {}
        match = selector.get("matchLabels") or {}
        if selector.get("matchExpressions") or not match:
            return True
        ready = 0
        for p in self.pods.items():
            meta = p["metadata"]
            labels = meta.get("labels") or {}
            if (meta["namespace"] == s.namespace and SURGE_FOR_LABEL not in labels and p["ready"] and p["node"]
                    and not meta.get("deletionTimestamp") and all(labels.get(k) == v for k, v in match.items())):
                ready += 1
        return ready >= want

    def _remove(self, s: Surge, why: str) -> None:
        try:
            self.kube.delete("apps/v1", "replicasets", s.name, s.namespace, propagation="Background")
        except NotFound:
            pass
        except KubeError as exc:
            log.warning("flip-%s: removing surge %s/%s: %s", self.direction, s.namespace, s.name, exc)
            return
        self.live.pop(s.victim_uid, None)
        SURGES.labels("removed").inc()
        log.info("flip-%s: surge %s/%s removed: %s", self.direction, s.namespace, s.name, why)
