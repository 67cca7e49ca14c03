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
retried with exponential backoff, as client-go's ``wait.Backoff`` does
(:func:`refusal_backoff`, the one :class:`gpufleet.kube.retry.Backoff`:
1 s doubling per refusal of the pod, ±10 % jitter, at most 60 s apart)
until ``timeout``: as replacement pods become Ready elsewhere, the budget
allows the next one, and a budget that stays shut costs about fifteen
requests in ten minutes, not six hundred. Pods still on the
node at the timeout are reported with why; the drain never deletes a pod
itself. ``dry_run`` sends the evictions with ``dryRun=All``: the API server
checks the budgets and changes nothing.

**Why a pod is blocked.** The drain reads the PodDisruptionBudgets of the
pods' namespaces (:func:`pdb_block`) and says, per pod:

* a budget that can **never** allow an eviction as configured (``maxUnavailable``
  0 or ``0%``; ``minAvailable`` at or above the pods it selects, e.g. equal to
  the replicas): *permanent*, listed in :attr:`DrainResult.permanent` and shown
  by the dry run before anything is cordoned;
* more than one budget selecting the pod (the Eviction API refuses those): permanent;
* a pod that is not Ready while its budget's ``unhealthyPodEvictionPolicy`` is
  ``IfHealthyBudget`` (the default) and the application is already below its
  desired healthy count;
* a budget that allows no disruption right now (healthy count at the minimum):
  retried as replacements become Ready;
* pods already terminating, waited for rather than evicted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.kube import (
    Conflict, Forbidden, Kube, KubeError, LeadershipLost, NotFound, TooManyRequests, Unreachable, api_path, intstr,
)
from gpufleet.kube.retry import Backoff
from gpufleet.kube.selectors import selector_matches
from gpufleet.ops.reads import pods_on_node

Pod = dict[str, Any]

#: Seconds between checks of pods already evicted (are they gone?).
POLL_SECONDS = 1.0


#: Delays between one pod's refused evictions, seconds: 1 s doubling per refusal, at most 60 s apart.
REFUSAL_BACKOFF = (1.0, 60.0)


def refusal_backoff() -> Backoff:
    """A fresh :class:`gpufleet.kube.retry.Backoff` for one pod's refused evictions (:data:`REFUSAL_BACKOFF`, ±10 % jitter)."""
    initial, cap = REFUSAL_BACKOFF
    return Backoff(initial=initial, cap=cap)


def _scaled(value: Any, total: int) -> int | None:
    """An IntOrString against ``total`` (:func:`gpufleet.kube.intstr.scaled`), or None when absent or malformed."""
    if value is None:
        return None
    try:
        return intstr.scaled(int(value) if isinstance(value, str) and value.isdigit() else value, total)
    except ValueError:
        return None


def _ready(pod: Pod) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


@dataclass(frozen=True)
class Block:
    """Why a budget keeps a pod: ``reason`` for people, ``permanent`` when no wait will change it."""

    reason: str
    permanent: bool


def pdb_block(pod: Pod, pdbs: Iterable[Mapping[str, Any]], selected: Mapping[str, int] | None = None) -> Block | None:
    """Why the PodDisruptionBudgets keep ``pod`` from being evicted now, or None when they let it go (pure).

    Args:
        pod: the Pod dict.
        pdbs: PodDisruptionBudget dicts (policy/v1) of the pod's namespace (others are ignored).
        selected: budget name -> pods it selects, used when a budget has no
            ``status.expectedPods`` yet (the disruption controller did not sync it).
    """
    meta = pod.get("metadata") or {}
    ns, labels = meta.get("namespace", "default"), meta.get("labels") or {}
    matching = [b for b in pdbs if (b.get("metadata") or {}).get("namespace", "default") == ns
                and selector_matches((b.get("spec") or {}).get("selector"), labels)]
    if not matching:
        return None
    if len(matching) > 1:
        names = ", ".join(sorted(b["metadata"]["name"] for b in matching))
        return Block(f"more than one PodDisruptionBudget selects it ({names}): the Eviction API refuses such pods", True)
    pdb = matching[0]
    name, spec, status = pdb["metadata"]["name"], pdb.get("spec") or {}, pdb.get("status") or {}
    expected = status.get("expectedPods")
    if expected is None:
        expected = (selected or {}).get(name, 0)
    expected = int(expected)
    max_unavailable, min_available = spec.get("maxUnavailable"), spec.get("minAvailable")
    if max_unavailable is not None and _scaled(max_unavailable, expected) == 0:
        return Block(f"PodDisruptionBudget {name} has maxUnavailable {max_unavailable}: it never allows an eviction "
                     "(raise maxUnavailable, or delete the budget for the swap)", True)
    need = _scaled(min_available, expected)
    if need is not None and expected > 0 and need >= expected:
        return Block(f"PodDisruptionBudget {name} has minAvailable {min_available} for {expected} pods: it can never "
                     "allow an eviction (a controller adds no pod until one is evicted); scale up first or lower "
                     "minAvailable", True)
    allowed = int(status.get("disruptionsAllowed") or 0)
    healthy, desired = status.get("currentHealthy"), status.get("desiredHealthy")
    policy = spec.get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
    if not _ready(pod):
        if policy == "AlwaysAllow":
            return None
        if healthy is not None and desired is not None and int(healthy) < int(desired):
            return Block(f"not Ready, and PodDisruptionBudget {name} has unhealthyPodEvictionPolicy {policy}: an "
                         f"unhealthy pod is only evicted while the application is healthy ({healthy} of {desired} "
                         "healthy now; AlwaysAllow would let it go)", False)
        return None
    if allowed <= 0:
        counts = f"{healthy} healthy, {desired} needed" if healthy is not None and desired is not None else "status not synced"
        return Block(f"PodDisruptionBudget {name} allows no disruption now ({counts}): retried as replacements "
                     "become Ready", False)
    return None


def read_pdbs(kube: Kube, namespaces: Iterable[str]) -> list[dict[str, Any]]:
    """The PodDisruptionBudgets (policy/v1) of ``namespaces``; none for a namespace that cannot be read."""
    out: list[dict[str, Any]] = []
    for ns in sorted(set(namespaces)):
        try:
            out += kube.list_all(api_path("policy/v1", "poddisruptionbudgets", ns))[0]
        except (Forbidden, NotFound):
            pass
    return out


def explain(pods: Iterable[Pod], pdbs: list[dict[str, Any]], all_pods: Iterable[Pod] = ()) -> dict["PodRef", Block]:
    """:func:`pdb_block` for each of ``pods``; ``all_pods`` (the namespaces' pods) size budgets without a status."""
    counts: dict[str, int] = {}
    for b in pdbs:
        ns = b["metadata"].get("namespace", "default")
        counts[f"{ns}/{b['metadata']['name']}"] = sum(
            1 for p in all_pods if (p.get("metadata") or {}).get("namespace") == ns
            and selector_matches((b.get("spec") or {}).get("selector"), (p.get("metadata") or {}).get("labels") or {}))
    out: dict[PodRef, Block] = {}
    for pod in pods:
        ns = pod["metadata"].get("namespace", "default")
        selected = {name.split("/", 1)[1]: n for name, n in counts.items() if name.startswith(f"{ns}/")}
        block = pdb_block(pod, pdbs, selected)
        if block is not None:
            out[ref(pod)] = block
    return out


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
        permanent: blocked pods no wait will free (a budget that never allows
            an eviction as configured, an unmanaged pod): say so before cordoning.
        timed_out: the timeout ended the drain with pods left.
        seconds: wall time of the drain.
        dry_run: evictions were only checked (``dryRun=All``).
        evictions_requested: Eviction API requests sent (refused ones included).
    """

    node: str
    evicted: list[PodRef] = field(default_factory=list)
    blocked: dict[PodRef, str] = field(default_factory=dict)
    skipped: dict[PodRef, str] = field(default_factory=dict)
    permanent: set[PodRef] = field(default_factory=set)
    timed_out: bool = False
    seconds: float = 0.0
    dry_run: bool = False
    evictions_requested: int = 0

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

    Raises:
        Unreachable: no answer.
        LeadershipLost: this process's writes are fenced and it no longer
            leads (the drain ends: the new leader takes over).
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
    except (Unreachable, LeadershipLost):
        raise
    except KubeError as exc:
        return False, f"HTTP {exc.status}: {exc.message}"


def _reasons(kube: Kube, refused: dict[PodRef, str], by_ref: dict[PodRef, Pod],
             result: DrainResult) -> dict[PodRef, str]:
    """The refusals, each explained by the budgets when they can say more (permanent ones recorded in ``result``)."""
    if not refused:
        return refused
    namespaces = {p.namespace for p in refused}
    pdbs = read_pdbs(kube, namespaces)
    # The pods a budget selects come from its status; only a budget not synced yet needs them counted here.
    unsynced = {b["metadata"].get("namespace", "default") for b in pdbs if (b.get("status") or {}).get("expectedPods") is None}
    ns_pods = [p for ns in sorted(unsynced) for p in kube.list_all(api_path("v1", "pods", ns))[0]]
    blocks = explain([by_ref[p] for p in refused if p in by_ref], pdbs, ns_pods)
    out = {}
    for p, msg in refused.items():
        block = blocks.get(p)
        if block is None:
            out[p] = msg
            continue
        out[p] = block.reason
        if block.permanent:
            result.permanent.add(p)
        else:
            result.permanent.discard(p)
    return out


def drain(kube: Kube, node: str, *, timeout: float, force: bool = False, dry_run: bool = False,
          poll: float = POLL_SECONDS, progress: Callable[[DrainProgress], None] | None = None,
          backoff: Callable[[], Backoff] | None = None) -> DrainResult:
    """Evict every evictable pod of ``node`` within ``timeout`` seconds (see the module docstring).

    Args:
        kube: API client.
        node: node name (should be cordoned first, or pods come back).
        timeout: seconds before giving up on the pods left.
        force: also evict pods no controller owns (they are not recreated).
        dry_run: check each eviction with ``dryRun=All``; one round, nothing changes.
        poll: seconds between checks that evicted pods are gone.
        progress: called after every round with a :class:`DrainProgress`.
        backoff: makes the backoff of one refused pod (default :func:`refusal_backoff`).

    Returns:
        A :class:`DrainResult`; ``blocked`` lists every pod left and why,
        ``permanent`` those no wait will free.
    """
    start = time.monotonic()
    backoff = backoff or refusal_backoff
    pods = pods_on_node(kube, node)
    by_ref = {ref(p): p for p in pods}
    dying = terminating_namespaces(kube, {p["metadata"].get("namespace", "default") for p in pods})
    going = [p for p in pods if going_away(p, dying) and not _finished(p)]
    to_evict, blocked, skipped = plan([p for p in pods if p not in going], force=force)
    result = DrainResult(node=node, skipped=skipped, dry_run=dry_run)
    result.permanent.update(p for p, why in blocked.items() if why.startswith("unmanaged"))
    total = len(to_evict) + len(going)
    if dry_run:
        skipped.update({ref(p): "already terminating (deletionTimestamp set, or its namespace is being deleted): "
                                 "waited for, not evicted" for p in going})
        refused: dict[PodRef, str] = {}
        for pod in to_evict:
            ok, msg = evict(kube, ref(pod), dry_run=True)
            result.evictions_requested += 1
            if ok:
                result.evicted.append(ref(pod))
            else:
                refused[ref(pod)] = msg
        blocked.update(_reasons(kube, refused, by_ref, result))
        result.blocked = blocked
        result.seconds = time.monotonic() - start
        return result

    pending: dict[PodRef, str] = {ref(p): "not tried yet" for p in to_evict}
    backoffs: dict[PodRef, Backoff] = {}
    next_try: dict[PodRef, float] = {p: start for p in pending}
    terminating: set[PodRef] = {ref(p) for p in going}
    gone: list[PodRef] = []
    deadline = start + timeout
    while True:
        now = time.monotonic()
        refused = {}
        for pod in [p for p in pending if next_try[p] <= now]:
            ok, msg = evict(kube, pod)
            result.evictions_requested += 1
            if ok:
                del pending[pod]
                terminating.add(pod)
                result.permanent.discard(pod)
            else:
                next_try[pod] = time.monotonic() + backoffs.setdefault(pod, backoff()).next()
                refused[pod] = msg
        pending.update(_reasons(kube, refused, by_ref, result))
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
        now = time.monotonic()
        if now >= deadline:
            result.timed_out = True
            break
        wake = min([next_try[p] for p in pending] + ([now + poll] if terminating else []))
        time.sleep(max(0.0, min(wake, deadline) - now))
    result.evicted = gone
    result.blocked = {**blocked, **pending,
                      **{p: "already terminating, still there at the timeout (waited for, not evicted)" for p in terminating}}
    result.seconds = time.monotonic() - start
    return result


def _finished(pod: Pod) -> bool:
    """Phase Succeeded or Failed."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
