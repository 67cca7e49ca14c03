"""Take a node out for replacement, bring it back, or move it to the degraded tier.

Swap (``invoke node.swap``, and the remediation controller for hardware faults):

1. one Node patch, guarded by its resourceVersion (retried on 409): cordon,
   taint ``gpufleet.io/swap=<reason>:NoSchedule``, label
   ``gpufleet.io/replacement-requested=true``, annotations with the full
   reason, source and time;
2. the swap request (below) in state ``draining``;
3. drain through the Eviction API (:mod:`gpufleet.ops.drain`: PDBs
   respected, pods that cannot leave are reported, never deleted);
4. the swap request updated to ``requested`` (drained) or
   ``drain-incomplete`` (pods left, listed), and an Event on the Node.

The taint's value must be a label value (63 characters of
``[A-Za-z0-9_.-]``), so free-text reasons are slugged there
(``"GPU 3 hot"`` -> ``GPU-3-hot``); the annotation and the swap request keep
the text as given.

**The swap request is a ConfigMap**, ``<namespace>/swap-<node>`` labelled
``gpufleet.io/swap-request=true``, ``gpufleet.io/node=<node>`` and
``gpufleet.io/swap-state=<state>``. Why not a CRD: a provider integration
only lists and reads a few flat fields; a ConfigMap needs no CRD to install
and version in every environment before the first swap can be recorded,
the node_health role's RBAC already covers it, ``kubectl get cm -l
gpufleet.io/swap-state=requested`` is the whole integration API, and
nothing here needs a status subresource or schema validation beyond what
this module writes. Data keys (all strings; JSON where noted):
``node, reason, source, requested_at, state, flavor, gpus, lemon,
evicted`` (JSON list of ``ns/name``), ``blocked`` (JSON object ``ns/name`` ->
why), ``history`` (JSON list, the node's failure history), ``returned_at``.

Degrade (the remediation controller, for faults that leave a node fit for
inference): taint ``gpufleet.io/degraded=<fault>:NoSchedule``, no cordon,
no drain; pods that do not tolerate the taint (training) are evicted once,
so a gang that had a pod there is rebuilt on a healthy node.

Return (``invoke node.return``) first runs the node checks on the node
(``tests/nodes`` through :class:`gpufleet.ops.nodechecks.NodeChecks`,
limited to that host) and refuses, naming the failed test ids, unless a
person skips them; then it undoes all of it: the swap and degraded
taints and the replacement label go, the node is uncordoned if the swap
cordoned it, the request goes to state ``returned`` (kept as a record). A
lemon node (label ``gpufleet.io/lemon=true``, see gpufleet.node_health) is only
returned with ``clear_lemon``, by a person.

Both are idempotent: a swap of a node already out resumes what is missing
(a drain that timed out, a missing request) and raises
:class:`AlreadyOut` when nothing is; a return of a node in service marks
its swap request (in the namespace given) returned when that still says
otherwise, and raises :class:`NotOut` when there is nothing to do.

Input is checked before anything is written: the node name must be a DNS
subdomain and the namespace a DNS label that exists (:func:`check_namespace`;
only the default :data:`~gpufleet.names.SYSTEM_NAMESPACE` may be
missing, it is created with the first request, as on a fresh cluster). ``dry_run`` computes the same plan and checks each eviction
with ``dryRun=All``, writing nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.kube.validation import dns_label
from gpufleet.ops import drain as drainer
from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet.classify import tolerated as tolerates
from gpufleet.kube import Conflict, Forbidden, Kube, KubeError, NotFound, Unauthorized, api_path
from gpufleet.kube.events import record_event
from gpufleet.kube.retry import update_with_retry
from gpufleet.kube.times import now_rfc3339
from gpufleet.ops.reads import InputError, OpsError, ensure_namespace, get_node
from gpufleet.ops.nodechecks import CheckResult, NodeChecks
from gpufleet.names import (
    ANN_CORDONED_BY_SWAP,
    ANN_DEGRADED_AT,
    ANN_HEALTH_HISTORY,
    ANN_LEMON_REASON,
    ANN_RETURNED_AT,
    ANN_SWAP_REASON,
    ANN_SWAP_SOURCE,
    ANN_SWAPPED_AT,
    DEGRADED_TAINT,
    LEMON_LABEL,
    REPLACEMENT_LABEL,
    SWAP_NODE_LABEL,
    SWAP_REQUEST_LABEL,
    SWAP_STATE_LABEL,
    SWAP_TAINT,
    SYSTEM_NAMESPACE,
)

Node = dict[str, Any]
EVENT_COMPONENT = "gpufleet-ops"
_SLUG_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class AlreadyOut(OpsError):
    """The node is already out for swap and nothing is left to do."""


class NotOut(OpsError):
    """``return`` of a node that is in service."""


class LemonNode(OpsError):
    """``return`` of a lemon node without ``clear_lemon``."""


@dataclass(frozen=True)
class Change:
    """One field a plan changes: ``what`` (e.g. ``taint gpufleet.io/swap``), ``before`` and ``after`` as text."""

    what: str
    before: str
    after: str


@dataclass
class NodePlan:
    """Changes to one Node and the merge patch that makes them.

    Attributes:
        node: node name.
        changes: the diff, for display.
        patch: JSON merge patch (no resourceVersion; the apply adds it).
        resume: the node was already out for swap (this run completes it).
    """

    node: str
    changes: list[Change]
    patch: dict[str, Any]
    resume: bool = False


@dataclass
class SwapResult:
    """What :func:`swap` did (or would do, ``dry_run``).

    Attributes:
        plan: the node diff.
        drain: the drain (dry run: the eviction check), None when not drained.
        request: ``namespace/name`` of the swap-request ConfigMap.
        state: the request's state after the run.
        dry_run: nothing was written.
    """

    plan: NodePlan
    drain: drainer.DrainResult | None
    request: str
    state: str
    dry_run: bool = False


@dataclass
class ReturnResult:
    """What :func:`return_node` did (or would do).

    Attributes:
        plan: the node changes.
        request: ``namespace/name`` of the swap request, None when there is none.
        dry_run: nothing was changed.
        notes: lines for the person (requests marked, a cordon kept, checks skipped...).
        checks: the node checks that passed before the return (None: not run, see ``notes``).
    """

    plan: NodePlan
    request: str | None
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)
    checks: list[CheckResult] | None = None


def slug(text: str, fallback: str = "manual") -> str:
    """``text`` as a Kubernetes label/taint value: ``[A-Za-z0-9_.-]``, 63 characters, alphanumeric ends."""
    s = _SLUG_BAD.sub("-", text.strip())[:63]
    s = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", s)
    return s or fallback


def _taint_str(t: dict[str, str] | None) -> str:
    """A taint as ``key=value:effect`` (``-`` for none)."""
    if t is None:
        return "-"
    return f"{t['key']}={t.get('value', '')}:{t.get('effect', '')}"


def _without(taints: list[dict[str, str]], *keys: str) -> list[dict[str, str]]:
    """``taints`` without those whose key is in ``keys``."""
    return [t for t in taints if t.get("key") not in keys]


def plan_swap(node: Node, reason: str, *, source: str = "manual", now: str | None = None,
              taint_value: str | None = None) -> NodePlan:
    """The Node changes of a swap (pure).

    Args:
        node: the Node as read (dict).
        reason: free text; slugged into the taint value unless ``taint_value``.
        source: ``manual`` or ``node-health``.
        now: RFC 3339 time to record (default: now).
        taint_value: the taint's value (slugged), e.g. the fault kind; default: the reason.

    Returns:
        A :class:`NodePlan`. A node already out keeps its original reason and
        time; only what is missing is planned (``resume=True``).

    Raises:
        OpsError: empty reason.
    """
    if not reason.strip():
        raise OpsError("--reason is empty: say why the node goes out (it is recorded for the replacement)")
    now = now or now_rfc3339()
    name = nodeutil.name(node)
    ann = nodeutil.annotations(node)
    lab = nodeutil.labels(node)
    existing = nodeutil.taint(node, SWAP_TAINT)
    changes: list[Change] = []
    patch: dict[str, Any] = {}
    meta_ann: dict[str, str | None] = {}
    meta_lab: dict[str, str | None] = {}
    spec: dict[str, Any] = {}

    if not nodeutil.is_cordoned(node):
        changes.append(Change("spec.unschedulable (cordon)", "false", "true"))
        spec["unschedulable"] = True
        meta_ann[ANN_CORDONED_BY_SWAP] = "true"
    elif existing is None and ANN_CORDONED_BY_SWAP not in ann:
        meta_ann[ANN_CORDONED_BY_SWAP] = "false"  # cordoned by someone else: return leaves it cordoned
    if existing is None:
        want = {"key": SWAP_TAINT, "value": slug(taint_value or reason), "effect": "NoSchedule"}
        taints = _without(nodeutil.taints(node), SWAP_TAINT, DEGRADED_TAINT) + [want]
        spec["taints"] = taints
        changes.append(Change(f"taint {SWAP_TAINT}", "-", _taint_str(want)))
        degraded = nodeutil.taint(node, DEGRADED_TAINT)
        if degraded is not None:
            changes.append(Change(f"taint {DEGRADED_TAINT}", _taint_str(degraded), "- (superseded by the swap)"))
        meta_ann.update({ANN_SWAP_REASON: reason, ANN_SWAP_SOURCE: source, ANN_SWAPPED_AT: now})
        changes.append(Change(f"annotation {ANN_SWAP_REASON}", ann.get(ANN_SWAP_REASON, "-"), reason))
        if ANN_RETURNED_AT in ann:  # from the previous swap's return: this swap has not returned
            meta_ann[ANN_RETURNED_AT] = None
            changes.append(Change(f"annotation {ANN_RETURNED_AT}", ann[ANN_RETURNED_AT], "-"))
    if lab.get(REPLACEMENT_LABEL) != "true":
        meta_lab[REPLACEMENT_LABEL] = "true"
        changes.append(Change(f"label {REPLACEMENT_LABEL}", lab.get(REPLACEMENT_LABEL, "-"), "true"))
    if spec:
        patch["spec"] = spec
    if meta_ann or meta_lab:
        patch["metadata"] = {k: v for k, v in (("annotations", meta_ann), ("labels", meta_lab)) if v}
    return NodePlan(name, changes, patch, resume=existing is not None)


def plan_return(node: Node, *, clear_lemon: bool = False, now: str | None = None) -> NodePlan:
    """The Node changes of a return (pure).

    Raises:
        NotOut: no swap or degraded taint, no replacement label, not a lemon.
        LemonNode: a lemon and not ``clear_lemon`` (the message gives its history).
    """
    name = nodeutil.name(node)
    ann = nodeutil.annotations(node)
    lab = nodeutil.labels(node)
    swap_t, degr_t = nodeutil.taint(node, SWAP_TAINT), nodeutil.taint(node, DEGRADED_TAINT)
    lemon = nodeutil.is_lemon(node)
    if swap_t is None and degr_t is None and lab.get(REPLACEMENT_LABEL) is None and not lemon:
        why = "; it is cordoned by someone else (kubectl uncordon)" if nodeutil.is_cordoned(node) else ""
        raise NotOut(f"node {name} is not out (no {SWAP_TAINT} or {DEGRADED_TAINT} taint, no replacement "
                     f"requested): nothing to return{why}")
    if lemon and not clear_lemon:
        hist = nodeutil.health_history(node)
        last = "; ".join(f"{e.get('time', '?')} {e.get('fault', '?')}" for e in hist[-5:]) or "no history recorded"
        raise LemonNode(f"node {name} is a lemon ({ann.get(ANN_LEMON_REASON, 'repeated failures')}; recent: {last}). "
                        "It stays out until a person returns it: once its hardware is replaced or checked, run "
                        f"`invoke node.return {name} --clear-lemon`")
    now = now or now_rfc3339()
    changes: list[Change] = []
    spec: dict[str, Any] = {}
    meta_ann: dict[str, str | None] = {}
    meta_lab: dict[str, str | None] = {}
    if swap_t is not None or degr_t is not None:
        spec["taints"] = _without(nodeutil.taints(node), SWAP_TAINT, DEGRADED_TAINT) or None
        for t in (swap_t, degr_t):
            if t is not None:
                changes.append(Change(f"taint {t['key']}", _taint_str(t), "-"))
    if nodeutil.is_cordoned(node):
        if ann.get(ANN_CORDONED_BY_SWAP) == "true":
            spec["unschedulable"] = None
            changes.append(Change("spec.unschedulable (cordon)", "true", "false"))
        else:
            changes.append(Change("spec.unschedulable (cordon)", "true", "true (cordoned before the swap: left as is)"))
    if lab.get(REPLACEMENT_LABEL) is not None:
        meta_lab[REPLACEMENT_LABEL] = None
        changes.append(Change(f"label {REPLACEMENT_LABEL}", lab[REPLACEMENT_LABEL], "-"))
    if lemon:
        meta_lab[LEMON_LABEL] = None
        meta_ann[ANN_LEMON_REASON] = None
        meta_ann[ANN_HEALTH_HISTORY] = "[]"
        changes.append(Change(f"label {LEMON_LABEL}", "true", "- (cleared by a person; history archived in the swap request)"))
    for key in (ANN_SWAP_REASON, ANN_SWAP_SOURCE, ANN_SWAPPED_AT, ANN_CORDONED_BY_SWAP, ANN_DEGRADED_AT):
        if key in ann:
            meta_ann[key] = None
    meta_ann[ANN_RETURNED_AT] = now
    changes.append(Change(f"annotation {ANN_RETURNED_AT}", ann.get(ANN_RETURNED_AT, "-"), now))
    patch: dict[str, Any] = {"metadata": {k: v for k, v in (("annotations", meta_ann), ("labels", meta_lab)) if v}}
    if spec:
        patch["spec"] = spec
    return NodePlan(name, changes, patch)


def plan_degrade(node: Node, fault: str, *, now: str | None = None) -> NodePlan | None:
    """Taint ``gpufleet.io/degraded=<fault>:NoSchedule`` (pure); None when the node already carries it or is out for swap."""
    if nodeutil.taint(node, SWAP_TAINT) is not None or nodeutil.taint(node, DEGRADED_TAINT) is not None:
        return None
    now = now or now_rfc3339()
    want = {"key": DEGRADED_TAINT, "value": slug(fault, "fault"), "effect": "NoSchedule"}
    patch = {"spec": {"taints": nodeutil.taints(node) + [want]},
             "metadata": {"annotations": {ANN_DEGRADED_AT: now}}}
    return NodePlan(nodeutil.name(node), [Change(f"taint {DEGRADED_TAINT}", "-", _taint_str(want))], patch)


# --------------------------------------------------------------------------- input checks


def check_node_name(node: str) -> None:
    """Raise :class:`InputError` unless ``node`` is a DNS subdomain, as Kubernetes node names are."""
    if len(node) > 253 or not _DNS_SUBDOMAIN.fullmatch(node):
        raise InputError(f"NODE {node!r}: expected a node name (a DNS subdomain: lowercase letters, digits, '-' and '.', "
                         "at most 253 characters, starting and ending with a letter or digit; kubectl get nodes)")


def check_namespace(kube: Kube, namespace: str) -> None:
    """Raise :class:`InputError` unless ``namespace`` is a DNS label naming a namespace that exists.

    The default :data:`SYSTEM_NAMESPACE` may be missing (the stack declares
    it; on a fresh cluster the first swap request creates it). When the
    caller may not read namespaces (the node-health controller's RBAC), the
    existence check is skipped.
    """
    try:
        dns_label(namespace)
    except ValueError:
        raise InputError(f"--namespace {namespace!r}: expected a namespace name (a DNS label: at most 63 lowercase "
                         "letters, digits and '-', starting and ending with a letter or digit)") from None
    if namespace == SYSTEM_NAMESPACE:
        return
    try:
        kube.get("v1", "namespaces", namespace)
        return
    except (Unauthorized, Forbidden):
        return
    except NotFound:
        pass
    try:
        names = [n["metadata"]["name"] for n in kube.list_all(api_path("v1", "namespaces"))[0]]
        near = nodeutil.near_matches(namespace, names)
    except KubeError:
        near = []
    raise InputError(f"--namespace {namespace!r}: no such namespace"
                     + (f" (near matches: {', '.join(near)})" if near else "")
                     + f"; swap requests live in node_health_namespace (default {SYSTEM_NAMESPACE}), "
                     "which is not created on demand")


# --------------------------------------------------------------------------- swap requests


def request_name(node: str) -> str:
    """Name of the swap-request ConfigMap of ``node``."""
    return f"swap-{node}"[:253]


def get_request(kube: Kube, node: str, namespace: str = SYSTEM_NAMESPACE) -> dict[str, Any] | None:
    """The swap-request ConfigMap of ``node``, None when there is none."""
    return kube.get_or_none("v1", "configmaps", request_name(node), namespace)


def write_request(kube: Kube, node: Node, namespace: str, data: dict[str, str | None]) -> dict[str, Any]:
    """Create or update (merge) the swap-request ConfigMap of ``node`` with ``data``; its state label follows ``data["state"]``.

    A ``None`` value removes that key from an existing request.
    """
    name = nodeutil.name(node)
    labels = {SWAP_REQUEST_LABEL: "true", SWAP_NODE_LABEL: name[:63], SWAP_STATE_LABEL: data.get("state", "requested")}
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": request_name(name), "namespace": namespace, "labels": labels},
            "data": {k: v for k, v in data.items() if v is not None}}
    try:
        return kube.create("v1", "configmaps", body, namespace)
    except NotFound:
        if namespace != SYSTEM_NAMESPACE:  # only the default is created on demand (check_namespace)
            raise InputError(f"--namespace {namespace!r}: no such namespace") from None
        ensure_namespace(kube, namespace)
        return kube.create("v1", "configmaps", body, namespace)
    except Conflict:
        pass
    return kube.patch("v1", "configmaps", request_name(name), {"metadata": {"labels": labels}, "data": data},
                      namespace)


def _request_data(node: Node, reason: str, source: str, state: str, when: str) -> dict[str, str | None]:
    """The swap request's data keys (module docstring) for ``node``; ``returned_at`` of an earlier swap is removed."""
    return {"node": nodeutil.name(node), "reason": reason, "source": source, "requested_at": when, "state": state,
            "returned_at": None,
            "flavor": nodeutil.flavor(node) or "", "gpus": str(nodeutil.gpus(node, "capacity")),
            "lemon": "true" if nodeutil.is_lemon(node) else "false",
            "history": json.dumps(nodeutil.health_history(node))}


def _apply_plan(kube: Kube, name: str, replan: Callable[[Node], NodePlan | None]) -> tuple[Node, NodePlan | None]:
    """Apply the plan recomputed on each (re-)read, guarded by resourceVersion."""
    box: dict[str, NodePlan | None] = {}

    def change(obj: Node) -> dict[str, Any] | None:
        p = replan(obj)
        box["plan"] = p
        return p.patch if p and p.patch else None

    after, _ = update_with_retry(kube, f"/api/v1/nodes/{name}", change)
    return after, box.get("plan")


# --------------------------------------------------------------------------- operations


def swap(kube: Kube, node_name: str, reason: str, *, source: str = "manual", timeout: float = 600.0,
         dry_run: bool = False, force: bool = False, namespace: str = SYSTEM_NAMESPACE,
         progress: Callable[[drainer.DrainProgress], None] | None = None,
         on_tainted: Callable[[Node], None] | None = None, extra_history: dict[str, Any] | None = None,
         taint_value: str | None = None) -> SwapResult:
    """Cordon, taint, drain and request a replacement for ``node_name`` (module docstring).

    Args:
        kube: API client.
        node_name: the node.
        reason: why (free text).
        source: ``manual`` (a person) or ``node-health`` (the controller).
        timeout: seconds the drain may take.
        dry_run: plan and check evictions (``dryRun=All``), write nothing.
        force: also evict pods no controller owns.
        namespace: where swap requests live (node_health_namespace).
        progress: drain progress callback.
        on_tainted: called with the Node right after the taint is applied
            (before the drain): the controller measures its latency there.
        extra_history: an entry to append to the node's failure history in
            the same patch (the controller's attributable failure).
        taint_value: the swap taint's value (default: the reason, slugged).

    Returns:
        A :class:`SwapResult`.

    Raises:
        InputError: not a node name; bad or missing namespace (checked before anything is written).
        NodeNotFound: unknown node (near matches listed).
        AlreadyOut: already out for swap, drained and recorded.
        OpsError: empty reason; Conflict when the node kept changing.
    """
    check_node_name(node_name)
    check_namespace(kube, namespace)
    node = get_node(kube, node_name)
    plan = plan_swap(node, reason, source=source, taint_value=taint_value)
    req_ns_name = f"{namespace}/{request_name(node_name)}"
    if plan.resume and not plan.changes:
        request = get_request(kube, node_name, namespace)
        evictable, unmanaged, _ = drainer.plan(_pods(kube, node_name), force=force)
        if request is not None and not evictable and request["data"].get("state") != "draining":
            ann = nodeutil.annotations(node)
            raise AlreadyOut(
                f"node {node_name} is already out: {SWAP_TAINT}={nodeutil.taint(node, SWAP_TAINT).get('value')} "
                f"since {ann.get(ANN_SWAPPED_AT, '?')} ({ann.get(ANN_SWAP_SOURCE, '?')}: {ann.get(ANN_SWAP_REASON, '?')}); "
                f"swap request {req_ns_name} is {request['data'].get('state')!r}"
                + (f", {len(unmanaged)} unmanaged pods left on it" if unmanaged else "")
                + f". Nothing to do; `invoke node.return {node_name}` brings it back")
    if dry_run:
        check = drainer.drain(kube, node_name, timeout=timeout, force=force, dry_run=True)
        return SwapResult(plan, check, req_ns_name, "dry-run", dry_run=True)

    def replan(obj: Node) -> NodePlan:
        p = plan_swap(obj, reason, source=source, taint_value=taint_value)
        if extra_history is not None:
            hist = nodeutil.health_history(obj) + [extra_history]
            p.patch.setdefault("metadata", {}).setdefault("annotations", {})[ANN_HEALTH_HISTORY] = json.dumps(hist)
        return p

    node, applied = _apply_plan(kube, node_name, replan)
    if applied is not None:
        plan = applied
    if on_tainted:
        on_tainted(node)
    ann = nodeutil.annotations(node)
    when, why, src = ann.get(ANN_SWAPPED_AT, now_rfc3339()), ann.get(ANN_SWAP_REASON, reason), ann.get(ANN_SWAP_SOURCE, source)
    if not plan.resume:
        record_event(kube, node, "NodeSwapRequested", f"cordoned and tainted {SWAP_TAINT} ({src}): {why}; draining",
                     type_="Warning", component=f"gpufleet-{src}", action="Swap")
    write_request(kube, node, namespace, _request_data(node, why, src, "draining", when))
    result = drainer.drain(kube, node_name, timeout=timeout, force=force, progress=progress)
    state = "requested" if result.complete else "drain-incomplete"
    data = _request_data(node, why, src, state, when)
    data["evicted"] = json.dumps(sorted(str(p) for p in result.evicted))
    data["blocked"] = json.dumps({str(p): r for p, r in sorted(result.blocked.items(), key=lambda kv: str(kv[0]))})
    write_request(kube, node, namespace, data)
    if result.complete:
        record_event(kube, node, "NodeDrained", f"{len(result.evicted)} pods evicted in {result.seconds:.0f}s; "
                     f"replacement requested ({req_ns_name})", component=f"gpufleet-{src}", action="Drain")
    else:
        left = ", ".join(f"{p}: {r}" for p, r in list(result.blocked.items())[:5])
        record_event(kube, node, "NodeDrainIncomplete", f"{len(result.blocked)} pods could not be evicted: {left}",
                     type_="Warning", component=f"gpufleet-{src}", action="Drain")
    return SwapResult(plan, result, req_ns_name, state)


def _requests_elsewhere(kube: Kube, node: str, namespace: str) -> list[str]:
    """``namespace/name`` of open (not returned) swap requests of ``node`` outside ``namespace``; [] when none or unreadable."""
    try:
        items = kube.list_all(api_path("v1", "configmaps"),
                              label_selector=f"{SWAP_REQUEST_LABEL}=true,{SWAP_NODE_LABEL}={node[:63]}")[0]
    except KubeError:
        return []
    return sorted(f"{cm['metadata']['namespace']}/{cm['metadata']['name']}" for cm in items
                  if cm["metadata"].get("namespace") != namespace and cm.get("data", {}).get("node") == node
                  and cm.get("data", {}).get("state") != "returned")


def return_node(kube: Kube, node_name: str, *, checks: NodeChecks | None, clear_lemon: bool = False,
                dry_run: bool = False, namespace: str = SYSTEM_NAMESPACE,
                on_checks: Callable[[str], None] | None = None) -> ReturnResult:
    """Bring a swapped or degraded node back into service (module docstring), once its node checks pass.

    ``checks`` (the testinfra node checks of that node, :class:`~gpufleet.ops.nodechecks.NodeChecks`)
    run after the node is read and found out, before anything is written:
    a failure, a run that broke or one that checked nothing refuses the
    return (:class:`~gpufleet.ops.nodechecks.ChecksFailed`, naming the failed
    test ids) and leaves the node as it was. ``checks=None`` returns the node
    without them (``--skip-checks``: a person's decision), with a note and
    the Event saying so. A dry run runs no check; its notes say which would run.
    ``on_checks`` is called with the check command right before the checks start.

    The swap request ``<namespace>/swap-<node>`` is marked returned when it
    is not already. A node out for swap without a request in ``namespace``
    is still returned, with a note saying so (and naming open requests
    found elsewhere). A node already in service whose request still is not
    returned (an earlier return given the wrong namespace) only has its
    request marked returned: re-running with the right namespace completes
    the return.

    Raises:
        InputError: not a node name; bad or missing namespace.
        NodeNotFound: unknown node.
        NotOut: the node is in service and its request (if any) is returned.
        LemonNode: a lemon and not ``clear_lemon``.
        gpufleet.ops.nodechecks.ChecksFailed: the node checks failed or could not run.
    """
    check_node_name(node_name)
    check_namespace(kube, namespace)
    node = get_node(kube, node_name)
    request = get_request(kube, node_name, namespace)
    req_name = f"{namespace}/{request_name(node_name)}"
    state = (request or {}).get("data", {}).get("state")
    open_request = request is not None and state != "returned"
    try:
        plan = plan_return(node, clear_lemon=clear_lemon)
    except NotOut:
        if not open_request:
            raise
        # Completion: the node came back earlier (e.g. a return given the wrong namespace).
        note = (f"node {node_name} is already in service; swap request {req_name} still said {state!r}: "
                + ("would be marked returned" if dry_run else "marked returned"))
        plan = NodePlan(node_name, [], {})
        if not dry_run:
            when = nodeutil.annotations(node).get(ANN_RETURNED_AT) or now_rfc3339()
            write_request(kube, node, namespace, {**request.get("data", {}), "state": "returned", "returned_at": when})
        return ReturnResult(plan, req_name, dry_run=dry_run, notes=[note])
    notes = []
    swapped = nodeutil.taint(node, SWAP_TAINT) is not None or nodeutil.labels(node).get(REPLACEMENT_LABEL) is not None
    if request is None and swapped:
        elsewhere = _requests_elsewhere(kube, node_name, namespace)
        notes.append(f"no swap request {req_name}: the node is returned, but no request is marked returned"
                     + (f"; open requests elsewhere: {', '.join(elsewhere)} (re-run with --namespace "
                        f"{elsewhere[0].split('/')[0]} to mark it returned)" if elsewhere else ""))
    if dry_run:
        if open_request:
            notes.insert(0, f"swap request {req_name} would be marked returned")
        notes.append(f"the node checks would run first: {checks.command(node_name)}" if checks is not None
                     else "the node checks would be skipped (--skip-checks)")
        return ReturnResult(plan, req_name if request is not None else None, dry_run=True, notes=notes)
    if checks is not None and on_checks is not None:
        on_checks(checks.command(node_name))
    passed = checks.check(node_name) if checks is not None else None
    if passed is None:
        notes.append(f"warning: returned without running the node checks (--skip-checks) on {node_name}")
    else:
        notes.append(f"node checks passed: {sum(r.outcome == 'passed' for r in passed)} passed, "
                     f"{sum(r.outcome == 'skipped' for r in passed)} skipped")
    before = node
    node, applied = _apply_plan(kube, node_name, lambda obj: plan_return(obj, clear_lemon=clear_lemon))
    plan = applied or plan
    if open_request or (request is not None and clear_lemon and nodeutil.is_lemon(before)):
        data = {"state": "returned", "returned_at": nodeutil.annotations(node).get(ANN_RETURNED_AT, now_rfc3339())}
        if clear_lemon and nodeutil.is_lemon(before):
            data["history"] = json.dumps(nodeutil.health_history(before))
            data["lemon"] = "cleared"
        write_request(kube, before, namespace, {**request.get("data", {}), **data})
        notes.insert(0, f"swap request {req_name} marked returned")
    if nodeutil.is_cordoned(node):
        notes.append("still cordoned: it was cordoned before the swap (kubectl uncordon when ready)")
    record_event(kube, node, "NodeReturned", "returned to service" + (" (lemon cleared by a person)" if clear_lemon else "")
                 + (f"; node checks passed ({len(passed)})" if passed is not None else "; node checks skipped"),
                 type_="Normal" if passed is not None else "Warning", component=EVENT_COMPONENT, action="Return")
    return ReturnResult(plan, req_name if request is not None else None, notes=notes, checks=passed)


def degrade(kube: Kube, node_name: str, fault: str, detail: str, *, source: str = "node-health",
            extra_history: dict[str, Any] | None = None) -> NodePlan | None:
    """Move a node to the degraded tier: taint ``gpufleet.io/degraded=<fault>:NoSchedule``; no cordon, no drain.

    Inference tolerates the taint and stays. Pods that do not (training) are
    evicted through the Eviction API, once, without waiting
    (:func:`move_off_untolerated`): a gang that loses a pod is rebuilt
    elsewhere (Kueue replaces the node of a topology-aware gang once the pod
    on it has terminated). Returns the plan applied, None when the node was
    already degraded or out.
    """

    def replan(obj: Node) -> NodePlan | None:
        p = plan_degrade(obj, fault)
        if p is not None and extra_history is not None:
            p.patch["metadata"]["annotations"][ANN_HEALTH_HISTORY] = json.dumps(nodeutil.health_history(obj) + [extra_history])
        return p

    node, plan = _apply_plan(kube, node_name, replan)
    if plan is not None:
        taint = {"key": DEGRADED_TAINT, "value": slug(fault, "fault"), "effect": "NoSchedule"}
        moved, refused = move_off_untolerated(kube, node_name, taint)
        outcome = f"; evicted {len(moved)} pod(s) that do not tolerate it" if moved else ""
        if refused:
            outcome += "; refused: " + ", ".join(f"{p} ({why})" for p, why in sorted(refused.items()))
        record_event(kube, node, "NodeDegraded", f"tainted {DEGRADED_TAINT}={slug(fault, 'fault')}: {detail} "
                     f"(inference only; training pods move off){outcome}", type_="Warning",
                     component=f"gpufleet-{source}", action="Degrade")
    return plan


def move_off_untolerated(kube: Kube, node_name: str, taint: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Evict, once and without waiting, the pods of ``node_name`` that do not tolerate ``taint``.

    DaemonSet, mirror, finished and unowned pods are left alone (as a drain
    does, :func:`gpufleet.ops.drain.skip_reason`); a PodDisruptionBudget
    refusal is reported, not retried. Returns ``(evicted "ns/name", refused
    "ns/name" -> the API's answer)``.
    """
    moved: list[str] = []
    refused: dict[str, str] = {}
    for pod in _pods(kube, node_name):
        if drainer.skip_reason(pod) is not None or tolerates((pod.get("spec") or {}).get("tolerations") or [], taint):
            continue
        ref = drainer.ref(pod)
        accepted, why = drainer.evict(kube, ref)
        if accepted:
            moved.append(str(ref))
        else:
            refused[str(ref)] = why
    return moved, refused


def _pods(kube: Kube, node: str) -> list[dict[str, Any]]:
    """Pods bound to ``node`` (dicts)."""
    from gpufleet.ops.reads import pods_on_node

    return pods_on_node(kube, node)
