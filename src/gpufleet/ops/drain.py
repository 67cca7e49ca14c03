"""Drain a node through the Eviction API: PodDisruptionBudgets respected, nothing deleted silently.

What is evicted (``policy/v1`` Eviction, the API ``kubectl drain`` uses):
every pod bound to the node except

* DaemonSet pods (they belong to the node; the DaemonSet controller
  tolerates the cordon and would recreate them at once),
* mirror (static) pods (the API cannot remove them),
* finished pods (phase Succeeded/Failed: they hold no resources),
* pods no controller owns, unless ``force``: evicting them deletes them for
  good, so by default they are reported as blocked, never removed,
* pods already going away (``deletionTimestamp`` set, or their namespace is
  terminating, where the API refuses evictions with 403): they are waited
  for like evicted ones, as ``kubectl drain`` waits for deletions.

An eviction the API refuses with 429 (a PDB allows no disruption now) is
retried every ``poll`` seconds until ``timeout``: as replacement pods become
Ready elsewhere, the budget allows the next one. Pods still on the node at
the timeout are reported with the API's last answer; the drain never
deletes a pod itself. ``dry_run`` sends the evictions with ``dryRun=All``:
the API server checks the budgets and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.kube import Conflict, Kube, KubeError, NotFound, TooManyRequests, Unreachable
from gpufleet.ops.kube import pods_on_node

Pod = dict[str, Any]

#: Seconds between eviction rounds (a PDB-blocked pod is retried this often).
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class PodRef:
    """A pod by ``namespace/name`` (and uid, so a same-named replacement is not mistaken for it)."""

    namespace: str
    name: str
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class DrainProgress:
    """Where a drain stands: ``done`` of ``total`` pods gone, ``blocked`` pod -> last refusal."""

    total: int
    done: int
    blocked: dict[PodRef, str]
    elapsed: float


@dataclass
class DrainResult:
    """What a drain did.

    Attributes:
        node: node name.
        evicted: pods evicted and gone (dry run: pods the API would evict now).
        blocked: pods still on the node, with why (PDB refusal, unmanaged pod,
            still terminating at the timeout, an API error).
        skipped: pods left alone on purpose, with why (DaemonSet, mirror, finished).
        timed_out: the timeout ended the drain with pods left.
        seconds: wall time of the drain.
        dry_run: evictions were only checked (``dryRun=All``).
    """

    node: str
    evicted: list[PodRef] = field(default_factory=list)
    blocked: dict[PodRef, str] = field(default_factory=dict)
    skipped: dict[PodRef, str] = field(default_factory=dict)
    timed_out: bool = False
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def complete(self) -> bool:
        """Nothing that should leave is left."""
        return not self.blocked


def ref(pod: Pod) -> PodRef:
    """The :class:`PodRef` of a pod dict."""
    m = pod["metadata"]
    return PodRef(m.get("namespace", "default"), m["name"], m.get("uid", ""))


def skip_reason(pod: Pod, *, force: bool = False) -> str | None:
    """Why a pod is not evicted, or None when it is (see the module docstring). Pure.

    Returns a reason for: DaemonSet pods, mirror pods, finished pods, and
    (unless ``force``) pods without a controller owner — the last is a
    *blocking* reason (``"unmanaged: ..."``), the others are skips.
    """
    meta = pod.get("metadata", {})
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return "mirror pod (static, managed by the kubelet)"
    owners = meta.get("ownerReferences") or []
    controller = next((o for o in owners if o.get("controller")), None)
    if controller and controller.get("kind") == "DaemonSet":
        return "DaemonSet pod"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return f"finished ({pod['status']['phase']})"
    if controller is None and not force:
        return "unmanaged: no controller owns it, evicting would delete it for good (use --force to evict)"
    return None


def going_away(pod: Pod, terminating_namespaces: set[str]) -> bool:
    """True when a pod is already being deleted, or its namespace is (the namespace controller deletes it). Pure."""
    meta = pod.get("metadata", {})
    return bool(meta.get("deletionTimestamp")) or meta.get("namespace", "default") in terminating_namespaces


def terminating_namespaces(kube: Kube, names: set[str]) -> set[str]:
    """Those of ``names`` whose Namespace is in phase Terminating (or already gone)."""
    out = set()
    for ns in names:
        try:
            phase = (kube.get("v1", "namespaces", ns).get("status") or {}).get("phase")
        except NotFound:
            phase = "Terminating"
        if phase == "Terminating":
            out.add(ns)
    return out


def plan(pods: list[Pod], *, force: bool = False) -> tuple[list[Pod], dict[PodRef, str], dict[PodRef, str]]:
    """Split a node's pods into ``(to evict, blocked before trying, skipped)``. Pure."""
    evict: list[Pod] = []
    blocked: dict[PodRef, str] = {}
    skipped: dict[PodRef, str] = {}
    for pod in pods:
        why = skip_reason(pod, force=force)
        if why is None:
            evict.append(pod)
        elif why.startswith("unmanaged"):
            blocked[ref(pod)] = why
        else:
            skipped[ref(pod)] = why
    return evict, blocked, skipped


def evict(kube: Kube, pod: PodRef, *, dry_run: bool = False, grace_seconds: int | None = None) -> tuple[bool, str]:
    """POST one Eviction. Returns ``(accepted, message)``; 404 counts as accepted (already gone).

    429 (a PodDisruptionBudget allows no disruption now) and other refusals
    return ``(False, the API's message)``.
    """
    try:
        kube.evict(pod.namespace, pod.name, grace_seconds=grace_seconds, uid=pod.uid or None, dry_run=dry_run)
        return True, "evicted"
    except NotFound:
        return True, "already gone"
    except Conflict as exc:
        if pod.uid:  # uid precondition failed: it is another pod now
            return True, "already gone (replaced)"
        return False, f"HTTP {exc.status}: {exc.message}"
    except TooManyRequests as exc:
        return False, f"PodDisruptionBudget: {exc.message}"
    except Unreachable:
        raise
    except KubeError as exc:
        return False, f"HTTP {exc.status}: {exc.message}"


def drain(kube: Kube, node: str, *, timeout: float, force: bool = False, dry_run: bool = False,
          poll: float = POLL_SECONDS, progress: Callable[[DrainProgress], None] | None = None) -> DrainResult:
    """Evict every evictable pod of ``node`` within ``timeout`` seconds (see the module docstring).

    Args:
        kube: API client.
        node: node name (should be cordoned first, or pods come back).
        timeout: seconds before giving up on the pods left.
        force: also evict pods no controller owns (they are not recreated).
        dry_run: check each eviction with ``dryRun=All``; one round, nothing changes.
        poll: seconds between rounds.
        progress: called after every round with a :class:`DrainProgress`.

    Returns:
        A :class:`DrainResult`; ``blocked`` lists every pod left and why.
    """
    start = time.monotonic()
    pods = pods_on_node(kube, node)
    dying = terminating_namespaces(kube, {p["metadata"].get("namespace", "default") for p in pods})
    going = [p for p in pods if going_away(p, dying) and not _finished(p)]
    to_evict, blocked, skipped = plan([p for p in pods if p not in going], force=force)
    result = DrainResult(node=node, skipped=skipped, dry_run=dry_run)
    total = len(to_evict) + len(going)
    if dry_run:
        skipped.update({ref(p): "already being deleted (waited for, not evicted)" for p in going})
        for pod in to_evict:
            ok, msg = evict(kube, ref(pod), dry_run=True)
            if ok:
                result.evicted.append(ref(pod))
            else:
                blocked[ref(pod)] = msg
        result.blocked = blocked
        result.seconds = time.monotonic() - start
        return result

    pending: dict[PodRef, str] = {ref(p): "not tried yet" for p in to_evict}
    terminating: set[PodRef] = {ref(p) for p in going}
    gone: list[PodRef] = []
    deadline = start + timeout
    while True:
        for pod in list(pending):
            ok, msg = evict(kube, pod)
            if ok:
                del pending[pod]
                terminating.add(pod)
            else:
                pending[pod] = msg
        if terminating:
            present = {ref(p) for p in pods_on_node(kube, node) if not _finished(p)}
            for pod in list(terminating):
                if pod not in present:
                    terminating.discard(pod)
                    gone.append(pod)
        if progress:
            progress(DrainProgress(total, len(gone), dict(pending), time.monotonic() - start))
        if not pending and not terminating:
            break
        if time.monotonic() >= deadline:
            result.timed_out = True
            break
        time.sleep(poll)
    result.evicted = gone
    result.blocked = {**blocked, **pending, **{p: "being deleted, still terminating at the timeout" for p in terminating}}
    result.seconds = time.monotonic() - start
    return result


def _finished(pod: Pod) -> bool:
    """Phase Succeeded or Failed."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
