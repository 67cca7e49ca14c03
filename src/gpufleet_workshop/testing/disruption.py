"""PodDisruptionBudgets for the in-memory fake: their status as the disruption controller computes it, and the
Eviction API's decision.

Status (:func:`pdb_status`, kube-controller-manager ``pkg/controller/disruption``):
``expectedPods`` is the number of selected pods for an integer
``minAvailable``, else the sum of the scales of the selected pods'
controllers (a Deployment's ``replicas`` for its ReplicaSets' pods, a
ReplicaSet's or StatefulSet's own); a pod without a controller then
leaves the budget at 0 disruptions (the controller's "found no
controllers"). ``currentHealthy`` counts selected pods that are Ready, not
terminating and not evicted within the last 2 minutes (``disruptedPods``,
the controller's ``DeletionTimeout``); ``desiredHealthy`` is ``minAvailable`` (a percentage of
``expectedPods``, rounded up) or ``expectedPods - maxUnavailable`` (a
percentage rounded up); ``disruptionsAllowed = max(0, currentHealthy -
desiredHealthy)``. The fake computes it synchronously whenever it is read
or an eviction consults it, where the real controller lags by a sync.

Eviction (:func:`eviction_verdict`, ``pkg/registry/core/pod/storage/eviction.go``):
a pod that is Pending, Succeeded, Failed or terminating is deleted
without consulting a budget; more than one budget selecting the pod is a
500; a budget whose ``observedGeneration`` lags its ``generation`` is a
429 with ``Retry-After: 10`` (the same message as any refusal, the reason in its cause); a not-Ready pod under ``unhealthyPodEvictionPolicy: AlwaysAllow``, or
under ``IfHealthyBudget`` (the default) while ``currentHealthy >=
desiredHealthy``, is deleted without using the budget; otherwise
``disruptionsAllowed == 0`` is a 429 ("Cannot evict pod as it would
violate the pod's disruption budget.") and a positive one is used up by
one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gpufleet.kube.intstr import scaled
from gpufleet.kube.selectors import selector_matches

Obj = dict[str, Any]


def pod_ready(pod: Obj) -> bool:
    """Ready condition True and not terminating."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def pdb_status(pdb: Obj, pods: Iterable[Obj], controller_scale: Callable[[Obj], int | None],
               disrupted: Iterable[str] = ()) -> Obj:
    """The ``status`` the disruption controller writes for ``pdb`` over ``pods`` (its namespace's); pods named in
    ``disrupted`` (evicted, not yet gone) do not count as healthy."""
    spec = pdb.get("spec") or {}
    disrupted = set(disrupted)
    selected = [p for p in pods if selector_matches(spec.get("selector"), (p.get("metadata") or {}).get("labels") or {})
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    healthy = sum(1 for p in selected if pod_ready(p) and p["metadata"]["name"] not in disrupted)
    generation = (pdb.get("metadata") or {}).get("generation", 1)
    expected: int | None
    if "minAvailable" in spec and isinstance(spec["minAvailable"], int):
        expected = len(selected)
        desired = spec["minAvailable"]
    else:
        expected, seen = 0, set()
        for p in selected:
            ref = next((o for o in (p.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")), None)
            scale = controller_scale(p) if ref else None
            if scale is None:
                expected = None
                break
            if ref["uid"] not in seen:
                seen.add(ref["uid"])
                expected += scale
        if expected is None:
            return {"observedGeneration": generation, "disruptionsAllowed": 0, "currentHealthy": healthy,
                    "desiredHealthy": 0, "expectedPods": 0}
        if "minAvailable" in spec:
            desired = scaled(spec["minAvailable"], expected)
        else:
            desired = max(0, expected - scaled(spec.get("maxUnavailable", 0), expected))
    return {"observedGeneration": generation, "disruptionsAllowed": max(0, healthy - desired),
            "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected}


#: The Eviction API's message when a budget refuses (its cause says why).
REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


class EvictionRefused(Exception):
    """The Eviction API refuses: ``status`` (429, 500) and the server's ``message``."""

    def __init__(self, status: int, message: str, reason: str, cause: str = "", retry_after: int = 0):
        super().__init__(message)
        self.status, self.message, self.reason, self.cause = status, message, reason, cause
        self.retry_after = retry_after


def eviction_verdict(pod: Obj, pdbs: list[Obj]) -> Obj | None:
    """The budget an eviction of ``pod`` uses up (mutate its ``status.disruptionsAllowed``), or None when the
    pod may go without one (module docstring).

    Raises:
        EvictionRefused: the eviction is not allowed now.
    """
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase in ("Pending", "Succeeded", "Failed") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    labels = (pod.get("metadata") or {}).get("labels") or {}
    matching = [b for b in pdbs if selector_matches((b.get("spec") or {}).get("selector"), labels)]
    if not matching:
        return None
    if len(matching) > 1:
        raise EvictionRefused(500, "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                                   "does not support.", "InternalError")
    pdb = matching[0]
    status = pdb.get("status") or {}
    name = pdb["metadata"]["name"]
    if status.get("observedGeneration", 0) < (pdb["metadata"].get("generation") or 1):
        raise EvictionRefused(429, REFUSED, "TooManyRequests",
                              f"The disruption budget {name} is still being processed by the server.", retry_after=10)
    if not pod_ready(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if policy == "AlwaysAllow" or status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0):
            return None
    if status.get("disruptionsAllowed", 0) <= 0:
        raise EvictionRefused(429, REFUSED, "TooManyRequests",
                              f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods and "
                              f"has {status.get('currentHealthy', 0)} currently")
    return pdb
