"""Take one GPU out of service, and return it: a ``DeviceTaintRule`` per GPU (Kubernetes 1.37, DRA device taints).

Where a node's GPUs are allocated through DRA (:mod:`gpufleet.fleet.devices`),
a GPU goes out of service by a device taint on it alone; the node and its
other GPUs stay in service. gpufleet writes one ``DeviceTaintRule`` per
GPU it takes out (:func:`rule_name`), selecting exactly that device
(driver, pool, device), labelled ``gpufleet.io/gpu-node=<node>`` so it owns
it: it never writes or deletes a rule without that label (another
controller's or a person's ``kubectl`` rule is left alone, and reported).

The taint:

* key ``gpufleet.io/gpu-unhealthy`` (a fault that makes the GPU unfit) or
  ``gpufleet.io/gpu-degraded`` (unfit for training, fit to serve: inference
  claims tolerate it), value the fault kind (``gpu_temp``, ``xid``...) or
  ``manual``;
* effect ``NoSchedule`` (the pod using it keeps running; no new claim gets
  it) or ``NoExecute`` (the fault kills what runs there: the scheduler's
  device-taint eviction deletes the pods whose claims do not tolerate it).

What happened to a GPU is recorded on its Node (annotation
``gpufleet.io/gpu-health-history``: JSON ``{device: [{"time", "fault",
"action", "detail"}]}``, the last entries per GPU), so a GPU that fails
again soon after a return is recognized as a lemon (node health), and a
returned GPU's old evidence is never counted again (``return`` entries).
The rule's annotations say why it is there: ``gpufleet.io/gpu-fault``
(detail), ``gpufleet.io/gpu-removed-by`` (``node-health`` or ``person``),
``gpufleet.io/gpu-lemon`` (a person returns it), and node health's
``gpufleet.io/gpu-healthy-since`` (the hold time's start).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.fleet.devices import Gpu, find
from gpufleet.kube import Conflict, Kube, NotFound, api_path
from gpufleet.kube.retry import update_with_retry
from gpufleet.kube.times import now_rfc3339, parse_time
from gpufleet.names import (
    ANN_GPU_FAULT,
    ANN_GPU_HEALTH_HISTORY,
    ANN_GPU_HEALTHY_SINCE,
    ANN_GPU_LEMON,
    ANN_GPU_REMOVED_AT,
    ANN_GPU_REMOVED_BY,
    DEVICE_TAINT_RULE_LABEL,
    GPU_DEGRADED_TAINT,
    GPU_UNHEALTHY_TAINT,
    RESOURCE_API,
)
from gpufleet.ops.reads import InputError, OpsError, get_node, list_gpus

Obj = dict[str, Any]
RULES_PATH = api_path(RESOURCE_API, "devicetaintrules")
#: Who removed a GPU: node health, or a person (``invoke gpu.remove``; node health never returns it).
BY_NODE_HEALTH = "node-health"
BY_PERSON = "person"
EFFECTS = ("NoSchedule", "NoExecute")
#: History entries kept per GPU on the Node.
HISTORY_PER_GPU = 20
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class UnknownGpuInput(InputError):
    """The GPU named is not one of the node's DRA GPUs (the message lists them)."""


class LemonGpu(OpsError):
    """A lemon GPU returns only with ``clear_lemon`` (a person's decision)."""


class ForeignRule(OpsError):
    """A DeviceTaintRule of that name exists and is not gpufleet's: it is left alone."""


def rule_name(node: str, device: str) -> str:
    """``gpufleet-<node>-<device>`` (a DNS subdomain of at most 253 characters; a digest replaces a long tail)."""
    name = f"gpufleet-{node}-{device}".lower()
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:242]}-{digest}"


def owned(rule: Mapping[str, Any] | None) -> bool:
    """Whether a DeviceTaintRule is gpufleet's (label ``gpufleet.io/gpu-node``)."""
    return bool(rule) and DEVICE_TAINT_RULE_LABEL in ((rule.get("metadata") or {}).get("labels") or {})


def taint_of(kind: str, effect: str, *, degraded: bool) -> dict[str, str]:
    """The device taint for fault ``kind`` (module docstring).

    Raises:
        InputError: ``effect`` not NoSchedule/NoExecute, or ``kind`` not a label value.
    """
    if effect not in EFFECTS:
        raise InputError(f"--effect {effect!r}: expected one of {', '.join(EFFECTS)}")
    if not _LABEL_VALUE.match(kind) or len(kind) > 63:
        raise InputError(f"taint value {kind!r}: expected a label value (letters, digits, '-', '_', '.'; at most 63)")
    return {"key": GPU_DEGRADED_TAINT if degraded else GPU_UNHEALTHY_TAINT, "value": kind, "effect": effect}


def rule_object(gpu: Gpu, taint: Mapping[str, str], *, detail: str, by: str, lemon: str = "",
                at: str | None = None) -> Obj:
    """The DeviceTaintRule that takes ``gpu`` out with ``taint`` (selector: its driver, pool and device)."""
    ann = {ANN_GPU_FAULT: detail[:1000], ANN_GPU_REMOVED_BY: by, ANN_GPU_REMOVED_AT: at or now_rfc3339()}
    if lemon:
        ann[ANN_GPU_LEMON] = lemon[:1000]
    return {"apiVersion": RESOURCE_API, "kind": "DeviceTaintRule",
            "metadata": {"name": rule_name(gpu.node, gpu.device), "labels": {DEVICE_TAINT_RULE_LABEL: gpu.node},
                         "annotations": ann},
            "spec": {"deviceSelector": {"driver": gpu.driver, "pool": gpu.pool, "device": gpu.device},
                     "taint": dict(taint)}}


def history(node: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The Node's GPU history annotation: device -> entries (oldest first); ``{}`` when absent or unreadable."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANN_GPU_HEALTH_HISTORY)
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return {k: [e for e in v if isinstance(e, dict)] for k, v in data.items() if isinstance(v, list)} \
        if isinstance(data, dict) else {}


def record(kube: Kube, node: str, device: str, entry: Mapping[str, Any]) -> None:
    """Append ``entry`` to the GPU's history on the Node (the last :data:`HISTORY_PER_GPU` kept; 409s retried)."""
    def change(obj: Obj) -> Obj:
        hist = history(obj)
        hist[device] = (hist.get(device, []) + [dict(entry)])[-HISTORY_PER_GPU:]
        return {"metadata": {"annotations": {ANN_GPU_HEALTH_HISTORY: json.dumps(hist, sort_keys=True)}}}

    update_with_retry(kube, api_path("v1", "nodes", name=node), change)


def last_return(node: Mapping[str, Any], device: str) -> float | None:
    """Unix time of the GPU's last return (its ``return`` history entry), None if never returned."""
    times = [parse_time(e.get("time")) for e in history(node).get(device, []) if e.get("action") == "return"]
    times = [t for t in times if t is not None]
    return max(times) if times else None


def rules(kube: Kube) -> list[Obj]:
    """Every DeviceTaintRule of the cluster ([] where ``resource.k8s.io/v1`` is not served)."""
    try:
        return kube.list_all(RULES_PATH)[0]
    except NotFound:
        return []


def resolve(kube: Kube, node: str, which: str) -> Gpu:
    """The DRA GPU ``which`` (device name, index, UUID or bus id) of Node ``node``.

    Raises:
        gpufleet.ops.reads.NodeNotFound: no such node.
        UnknownGpuInput: no such GPU on it (the message lists its GPUs), or the node has no DRA GPUs.
    """
    from gpufleet.fleet.devices import UnknownGpu

    get_node(kube, node)
    try:
        return find(list_gpus(kube, node).get(node, []), node, which)
    except UnknownGpu as exc:
        raise UnknownGpuInput(str(exc)) from None


@dataclass
class GpuResult:
    """What :func:`remove` or :func:`give_back` did (or would do): the rule, and whether it changed."""

    gpu: Gpu
    rule: Obj | None
    changed: bool
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)


def remove(kube: Kube, gpu: Gpu, taint: Mapping[str, str], *, detail: str, by: str = BY_PERSON, lemon: str = "",
           dry_run: bool = False, history_entry: Mapping[str, Any] | None = None) -> GpuResult:
    """Take ``gpu`` out of service with ``taint`` (create or update its rule); idempotent.

    An existing gpufleet rule keeps its ``removed-by`` unless a person
    removes it now (a person's removal is never returned by node health),
    and a lemon mark once set stays. ``history_entry`` is appended to the
    Node's GPU history when something changed (default: a ``remove`` entry
    naming ``detail``).

    Raises:
        ForeignRule: a rule of that name exists without gpufleet's label.
        gpufleet.kube.KubeError: the API server refused the rule.
    """
    name = rule_name(gpu.node, gpu.device)
    live = kube.get_or_none(RESOURCE_API, "devicetaintrules", name)
    if live is not None and not owned(live):
        raise ForeignRule(f"DeviceTaintRule {name} exists and is not gpufleet's (no label {DEVICE_TAINT_RULE_LABEL}): "
                          "left alone; delete or rename it first")
    ann = ((live or {}).get("metadata") or {}).get("annotations") or {}
    by = BY_PERSON if by == BY_PERSON or ann.get(ANN_GPU_REMOVED_BY) == BY_PERSON else by
    lemon = lemon or ann.get(ANN_GPU_LEMON, "")
    want = rule_object(gpu, taint, detail=detail, by=by, lemon=lemon, at=ann.get(ANN_GPU_REMOVED_AT))
    same = (live is not None and (live.get("spec") or {}).get("taint", {}).get("key") == taint["key"]
            and live["spec"]["taint"].get("value") == taint.get("value")
            and live["spec"]["taint"].get("effect") == taint["effect"]
            and ann.get(ANN_GPU_REMOVED_BY) == by and ann.get(ANN_GPU_LEMON, "") == lemon
            and ANN_GPU_HEALTHY_SINCE not in ann)
    if same or dry_run:
        return GpuResult(gpu, live if same else want, changed=not same, dry_run=dry_run)
    if live is None:
        try:
            out = kube.create(RESOURCE_API, "devicetaintrules", want)
        except Conflict:
            return remove(kube, gpu, taint, detail=detail, by=by, lemon=lemon, history_entry=history_entry)
    else:
        meta = {"labels": want["metadata"]["labels"],
                "annotations": {**want["metadata"]["annotations"], ANN_GPU_HEALTHY_SINCE: None}}
        out = kube.patch(RESOURCE_API, "devicetaintrules", name, {"metadata": meta, "spec": want["spec"]})
    record(kube, gpu.node, gpu.device, history_entry or {
        "time": now_rfc3339(), "fault": taint.get("value", ""), "action": "remove", "by": by, "detail": detail[:300]})
    return GpuResult(gpu, out, changed=True)


def give_back(kube: Kube, gpu: Gpu, *, clear_lemon: bool = False, dry_run: bool = False,
              checks: Callable[[Gpu], Sequence[str]] | None = None, by: str = BY_PERSON) -> GpuResult:
    """Return ``gpu`` to service: run ``checks`` (failed check ids; empty: passed), then delete its gpufleet rule.

    Idempotent: a GPU without a gpufleet rule is already in service
    (``changed`` False; other taints on it, the driver's or another rule's,
    are named in ``notes`` and left alone).

    Raises:
        LemonGpu: the rule marks a lemon and ``clear_lemon`` is false.
        ChecksRefused: ``checks`` reported failures (nothing changed).
        gpufleet.kube.KubeError: the delete was refused.
    """
    name = rule_name(gpu.node, gpu.device)
    live = kube.get_or_none(RESOURCE_API, "devicetaintrules", name)
    ours = f"rule:{name}" if owned(live) else None  # a rule of that name without gpufleet's label is another's
    others = [f"{t.get('key')}={t.get('value', '')}:{t.get('effect')} ({src})" for t, src in gpu.taints
              if src != ours]
    notes = [f"{gpu.device} keeps taints gpufleet does not own: {', '.join(others)}"] if others else []
    if live is None or not owned(live):
        return GpuResult(gpu, None, changed=False, dry_run=dry_run, notes=notes + [f"{gpu.device} is not out (no rule {name})"])
    lemon = ((live.get("metadata") or {}).get("annotations") or {}).get(ANN_GPU_LEMON)
    if lemon and not clear_lemon:
        raise LemonGpu(f"GPU {gpu.device} of {gpu.node} is a lemon ({lemon}): a person returns it with --clear-lemon, "
                       "after its hardware was replaced or checked")
    if dry_run:
        return GpuResult(gpu, live, changed=True, dry_run=True, notes=notes)
    if checks is not None:
        failed = list(checks(gpu))
        if failed:
            raise ChecksRefused(gpu, failed)
    try:
        kube.delete(RESOURCE_API, "devicetaintrules", name)
    except NotFound:
        pass
    record(kube, gpu.node, gpu.device, {"time": now_rfc3339(), "fault": (live["spec"].get("taint") or {}).get("value", ""),
                                        "action": "return", "by": by})
    return GpuResult(gpu, None, changed=True, notes=notes)


class ChecksRefused(OpsError):
    """The GPU's node checks failed: it stays out (the failed check ids are named)."""

    def __init__(self, gpu: Gpu, failed: Sequence[str]):
        self.gpu, self.failed = gpu, list(failed)
        super().__init__(f"GPU {gpu.device} of {gpu.node} stays out: its node checks failed: {', '.join(self.failed[:8])}")


def gpu_check_ids(gpu: Gpu, test_ids: Sequence[str]) -> list[str]:
    """The node-check test ids about ``gpu``: parametrized ``...-gpu<index>]`` or naming its bus id.

    The GPU checks of ``tests/nodes/gpu`` are parametrized one id per GPU
    (``test_gpu_temperature[<host>-gpu3]``); node-wide checks are not the GPU's.
    """
    marks = [f"-gpu{gpu.index}]"] if gpu.index is not None else []
    if gpu.pci_bus_id:
        marks.append(gpu.pci_bus_id)
    return [t for t in test_ids if any(m in t.lower() for m in marks)]
