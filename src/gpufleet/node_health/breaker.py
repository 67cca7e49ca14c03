"""Node health's circuit breaker: never more than a share of the GPU fleet out of service at once.

A bad exporter rollout, a Prometheus glitch or a shared-cause event (a
cooling loop, a firmware push) can make every node look faulty at once;
acting on all of them would drain the cluster. NVSentinel stops cordoning
past 50% of the cluster for this reason; gpufleet's limit is
``node_health_max_unhealthy_share`` (default 0.5).

*Out of service* is what the one node classifier says
(:mod:`gpufleet.fleet.classify`): a GPU node (:func:`gpufleet.fleet.nodes.is_fleet_node`)
whose GPUs do not count for training, whoever took it out (swap or degraded
taint, a person's cordon, NotReady, withdrawn GPUs). Taking a node out is
allowed while the nodes out of service, that one included, are at most the
share of the fleet (:func:`allows`); a node already out of service (a
degraded node escalated to a swap) never changes the share.

Past the limit node health defers the action (``defer``, the breaker's
reason), records Event ``RemediationHeldByBreaker`` on each Node it held
and ``CircuitBreakerOpen`` / ``CircuitBreakerClosed`` on the breaker's
ConfigMap (:data:`gpufleet.names.BREAKER_CONFIGMAP` in the controller's
namespace), sets ``gpufleet_node_health_breaker_open`` (the
``GpufleetNodeHealthBreakerOpen`` alert of gpu_metrics reads it), and
writes its state to that ConfigMap, which ``invoke status`` shows. It
closes by itself at the first step where the share allows the actions
again, or while a person's resume is in force (``invoke health.breaker-resume``
writes ``resume-until`` into the ConfigMap: until then the limit is not
applied; 0 minutes withdraws it).

ConfigMap data keys (strings; times RFC 3339 UTC): ``state`` (``open`` or
``closed``), ``since`` (when it last changed), ``out`` / ``total`` (nodes
out of service and GPU nodes at that time), ``limit`` (the share),
``held`` (comma-separated nodes held), ``resume-until`` and ``resume-by``
(a person's resume).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.fleet import nodes as nodeutil
from gpufleet.fleet.classify import TRAINING, PodClass, classify, default_classes
from gpufleet.kube import Conflict, Kube
from gpufleet.kube.quantity import GpuCountError
from gpufleet.names import BREAKER_CONFIGMAP

Node = dict[str, Any]

#: ConfigMap data keys (module docstring).
STATE, SINCE, OUT, TOTAL, LIMIT, HELD, RESUME_UNTIL, RESUME_BY = (
    "state", "since", "out", "total", "limit", "held", "resume-until", "resume-by")
OPEN, CLOSED = "open", "closed"


@dataclass(frozen=True)
class FleetShare:
    """GPU nodes and those out of service among them.

    Attributes:
        total: GPU nodes (:func:`gpufleet.fleet.nodes.is_fleet_node`).
        out: names of those whose GPUs do not count for training.
    """

    total: int
    out: frozenset[str]

    @property
    def share(self) -> float:
        """Fraction out of service (0 for an empty fleet)."""
        return len(self.out) / self.total if self.total else 0.0


def fleet_share(nodes: Mapping[str, Node], classes: Sequence[PodClass] | None = None) -> FleetShare:
    """Count the GPU fleet and its nodes out of service with the node classifier (pure).

    A node whose GPU count is malformed is counted, and out of service
    (the classifier refuses it for every class).
    """
    classes = default_classes() if classes is None else classes
    total, out = 0, set()
    for name, obj in nodes.items():
        try:
            if not nodeutil.is_fleet_node(obj):
                continue
        except GpuCountError:
            pass
        total += 1
        if not classify(obj, classes).counts(TRAINING):
            out.add(name)
    return FleetShare(total, frozenset(out))


def allows(out: int, total: int, limit: float) -> bool:
    """Whether ``out`` nodes out of service of ``total`` keep within ``limit`` (a share in [0, 1]).

    An empty fleet allows anything. A small epsilon absorbs float error
    (``0.3 * 10`` is 3.0000000000000004).
    """
    return total == 0 or out <= limit * total + 1e-9


def max_out(total: int, limit: float) -> int:
    """Most nodes of ``total`` that may be out of service under ``limit``."""
    return int(math.floor(limit * total + 1e-9))


def resume_until(cm: Mapping[str, Any] | None) -> float | None:
    """Unix time until which a person's resume holds, from the breaker ConfigMap; None without one."""
    data = (cm or {}).get("data") or {}
    return nodeutil.recorded_time(data.get(RESUME_UNTIL), f"ConfigMap {BREAKER_CONFIGMAP} data.{RESUME_UNTIL}")


def resumed(cm: Mapping[str, Any] | None, now: float) -> bool:
    """Whether a person's resume is in force at ``now`` (Unix seconds)."""
    until = resume_until(cm)
    return until is not None and now < until


def read(kube: Kube, namespace: str) -> dict[str, Any] | None:
    """The breaker ConfigMap in ``namespace``, None when there is none.

    Raises:
        gpufleet.kube.KubeError: the API server refused or is unreachable.
    """
    return kube.get_or_none("v1", "configmaps", BREAKER_CONFIGMAP, namespace)


def write_state(kube: Kube, namespace: str, data: Mapping[str, str | None]) -> dict[str, Any]:
    """Create the breaker ConfigMap with ``data``, or merge ``data`` into it (a None value removes that key).

    Only the keys given change: node health's state keys and a person's
    resume keys are written by different hands.

    Raises:
        gpufleet.kube.KubeError: the API server refused (no such namespace, RBAC) or is unreachable.
    """
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": BREAKER_CONFIGMAP, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "gpufleet"}},
            "data": {k: v for k, v in data.items() if v is not None}}
    try:
        return kube.create("v1", "configmaps", body, namespace)
    except Conflict:
        pass
    return kube.patch("v1", "configmaps", BREAKER_CONFIGMAP, {"data": dict(data)}, namespace)


@dataclass(frozen=True)
class ResumePlan:
    """What :func:`resume` does.

    Attributes:
        namespace: node health's namespace.
        until: Unix seconds until which the limit is not applied; None withdraws a resume.
        data: the ConfigMap keys written (None removes).
        before: the ConfigMap's data before.
        changed: whether anything would change (False: already so).
    """

    namespace: str
    until: float | None
    data: Mapping[str, str | None]
    before: Mapping[str, str]
    changed: bool


def plan_resume(cm: Mapping[str, Any] | None, namespace: str, minutes: float, now: float, by: str) -> ResumePlan:
    """The resume that ``minutes`` asks for at ``now`` (pure): the limit lifted for that long; 0 withdraws it.

    Raises:
        ValueError: ``minutes`` negative or above a week (10080), naming ``--minutes``.
    """
    if not 0 <= minutes <= 7 * 24 * 60:
        raise ValueError(f"--minutes {minutes:g}: expected 0 (withdraw a resume) to 10080 (a week)")
    before = dict((cm or {}).get("data") or {})
    if minutes == 0:
        data: dict[str, str | None] = {RESUME_UNTIL: None, RESUME_BY: None}
        changed = RESUME_UNTIL in before or RESUME_BY in before
        return ResumePlan(namespace, None, data, before, changed)
    until = now + minutes * 60
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
    data = {RESUME_UNTIL: stamp, RESUME_BY: by}
    return ResumePlan(namespace, until, data, before, any(before.get(k) != v for k, v in data.items()))


def resume(kube: Kube, namespace: str, minutes: float, *, by: str, dry_run: bool = False,
           now: float | None = None) -> ResumePlan:
    """Lift the breaker's limit for ``minutes`` (0: withdraw a resume); idempotent; ``dry_run`` changes nothing.

    Node health reads it at its next step: while it holds, actions the
    breaker would hold go ahead (``max_nodes_out`` still applies).

    Raises:
        ValueError: bad ``minutes`` (:func:`plan_resume`).
        gpufleet.kube.KubeError: the API server refused or is unreachable.
    """
    plan = plan_resume(read(kube, namespace), namespace, minutes, time.time() if now is None else now, by)
    if plan.changed and not dry_run:
        write_state(kube, namespace, plan.data)
    return plan
