"""Where the flip-out's surge pods go outside: a virtual node with room, chosen as the kubelet would admit them.

Why: kube-scheduler takes pods in priority order (its PrioritySort queue),
and a surge pod carries inference's priority, below training's. While a
gang of a thousand training pods makes its first pass through the
scheduler (about 20 pods a second on 2 cores: each pinned pod's filter
visits every node), the surges that would make room for it wait behind
it, so the gang waits for its own pass *plus* the providers' start
latency. The flip-out binds its own surge pods (the ``pods/binding``
subresource, as any scheduler does) the tick after they are created, so
the replacements start outside while the gang is still being scheduled.

What it checks is what decides a pod's fit on one node (the kubelet's
admission checks the same): the node is virtual, Ready and not cordoned;
its labels match the pod's ``nodeSelector`` and its required node affinity;
every ``NoSchedule`` and ``NoExecute`` taint is tolerated; and each
resource the pod requests fits in ``status.allocatable`` less what the
node's unfinished pods request (terminating ones still hold theirs),
``pods`` counted one each. A pod whose fit depends on other pods or objects
(a required pod affinity or anti-affinity, a ``DoNotSchedule`` topology
spread, a scheduling gate, a resource claim, another scheduler:
``constrained`` in :func:`gpufleet.taint_controller.signal.pod_view`) is
left to kube-scheduler, and so is every pod this finds no room for.
Preferences (preferred affinities, ``ScheduleAnyway`` spreads) only weigh
the scheduler's scores; a surge is a stand-in for the minutes training
runs, and goes where there is most room.

kube-scheduler stays the placement of last resort: the surge pods keep the
default scheduler, and a pod bound by one of the two is refused to the other
(the API server answers 409 to a second binding; the Binding carries the
pod's UID). Both count the other's bindings from their watches, so two
pods can be bound to a node's last room at once only inside a watch's
latency; the virtual kubelet's provider then refuses one (``OutOfCapacity``),
and its ReplicaSet starts another.

Among the nodes that fit, a pod goes to the one with the most GPUs free,
then the most free of every other resource it asks for, then by name:
kube-scheduler's default scoring (``NodeResourcesFit`` ``LeastAllocated``)
spreads the same way, so a pool that is slow to start costs fewer
replicas.

kube-scheduler's plugins are not a library outside Go; this is the
smallest part of them the flip-out needs, written here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from gpufleet.fleet.classify import tolerated
from gpufleet.kube.selectors import node_selector_matches
from gpufleet.names import GPU_RESOURCE

#: The resource every pod takes one of (``status.allocatable.pods``).
PODS_RESOURCE = "pods"


def free_resources(node: dict[str, Any], bound: Iterable[dict[str, Any]]) -> dict[str, Decimal]:
    """What ``node`` (a node view) has left: ``allocatable`` less the requests of ``bound`` (pod views bound to
    it; finished ones hold nothing), ``pods`` less one per pod. Shape: ``{"nvidia.com/gpu": Decimal(6), ...}``;
    may go negative when the node is over-committed."""
    free = dict(node["allocatable"])
    for p in bound:
        if p["phase"] in ("Succeeded", "Failed"):
            continue
        for res, qty in p["requests"].items():
            free[res] = free.get(res, Decimal(0)) - qty
        free[PODS_RESOURCE] = free.get(PODS_RESOURCE, Decimal(0)) - 1
    return free


def admits(pod: dict[str, Any], node: dict[str, Any], excused: Callable[[dict[str, Any]], bool] | None = None) -> bool:
    """Whether ``node``'s labels match ``pod``'s ``nodeSelector`` and ``pod`` tolerates every ``NoSchedule`` and
    ``NoExecute`` taint on it (as the scheduler's NodeAffinity and TaintToleration filters read them), taints
    ``excused`` returns True for aside (views of both)."""
    if any(node["labels"].get(k) != v for k, v in pod["nodeSelector"].items()):
        return False
    return all(t.get("effect") not in ("NoSchedule", "NoExecute") or (excused is not None and excused(t))
               or tolerated(pod["tolerations"], t) for t in node["taints"])


def fits(pod: dict[str, Any], node: dict[str, Any], free: dict[str, Decimal]) -> bool:
    """Whether ``pod`` (a pod view) may be bound to ``node`` (a virtual node view) with ``free`` left (module
    docstring: Ready, not cordoned, node selector, taints, every requested resource and one pod's slot)."""
    if not node["virtual"] or not node["ready"] or node["unschedulable"] or not admits(pod, node):
        return False
    if not node_selector_matches(pod["nodeAffinity"], node["labels"], node["name"]):
        return False
    if free.get(PODS_RESOURCE, Decimal(0)) < 1:
        return False
    return all(qty <= 0 or free.get(res, Decimal(0)) >= qty for res, qty in pod["requests"].items())


def place(pending: Iterable[dict[str, Any]], nodes: Iterable[dict[str, Any]],
          bound: Callable[[str], Iterable[dict[str, Any]]]) -> list[tuple[dict[str, Any], str]]:
    """Virtual nodes for ``pending`` pods (pod views, unbound); pure.

    Args:
        pending: the surge pods to place; ``constrained`` ones are skipped (module docstring).
        nodes: node views; only virtual ones are used.
        bound: node name -> the pod views bound to it.

    Returns:
        ``[(pod view, node name)]`` in the order to bind them: highest priority, then oldest, then name;
        each pod's requests counted against its node for the pods after it. Pods with no room are absent.
    """
    virtual = sorted((n for n in nodes if n["virtual"]), key=lambda n: n["name"])
    free = {n["name"]: free_resources(n, bound(n["name"])) for n in virtual}
    out = []
    for pod in sorted((p for p in pending if not p["constrained"]),
                      key=lambda p: (-p["priority"], p["created"], p["metadata"]["name"])):
        room = [n for n in virtual if fits(pod, n, free[n["name"]])]
        if not room:
            continue
        asked = [r for r in pod["requests"] if r != GPU_RESOURCE]
        # max() keeps the first of equals: the nodes are in name order.
        best = max(room, key=lambda n: (free[n["name"]].get(GPU_RESOURCE, Decimal(0)),
                                        tuple(free[n["name"]].get(r, Decimal(0)) for r in asked)))
        left = free[best["name"]]
        for res, qty in pod["requests"].items():
            left[res] = left.get(res, Decimal(0)) - qty
        left[PODS_RESOURCE] = left.get(PODS_RESOURCE, Decimal(0)) - 1
        out.append((pod, best["name"]))
    return out
