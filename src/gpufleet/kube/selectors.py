"""Matching a ``metav1.LabelSelector`` (matchLabels and matchExpressions) against an object's labels, and a
pod's required node affinity (``v1.NodeSelector``) against a node.

What apimachinery's ``metav1.LabelSelectorAsSelector`` and ``Matches`` do
for the selectors gpufleet reads from objects (a PodDisruptionBudget's, a
Deployment's, node health's telemetry node selector), and what
``k8s.io/component-helpers/scheduling/corev1/nodeaffinity`` does for a
``NodeSelector``: the one place the product matches them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["IMMUTABLE_SELECTOR_KINDS", "node_selector_matches", "selector_matches"]

#: ``(apiVersion, kind)`` of the workloads whose ``spec.selector`` the API server refuses to change
#: (apps/v1 validation: "field is immutable").
IMMUTABLE_SELECTOR_KINDS = frozenset({("apps/v1", "Deployment"), ("apps/v1", "ReplicaSet"),
                                      ("apps/v1", "StatefulSet"), ("apps/v1", "DaemonSet")})


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a ``metav1.LabelSelector`` selects ``labels`` (matchLabels and matchExpressions).

    A PodDisruptionBudget's empty selector (``{}``) selects every pod of its
    namespace (policy/v1); a missing (null) one selects none.
    """
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    """One ``NodeSelectorRequirement`` against the node's value of its key (None: the node has no such key)."""
    op, values = req.get("operator"), req.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def node_selector_matches(node_selector: Mapping[str, Any] | None, labels: Mapping[str, str], name: str) -> bool:
    """Whether a ``v1.NodeSelector`` (a pod's ``requiredDuringSchedulingIgnoredDuringExecution`` node affinity)
    selects the node ``name`` with ``labels``.

    The terms are ORed; in a term, ``matchExpressions`` (on labels) and ``matchFields`` (``metadata.name``
    only, the one field the API allows) are ANDed; an empty term selects nothing, and so does a selector with
    no terms; None (no required affinity) selects every node. Operators In, NotIn, Exists, DoesNotExist, Gt and
    Lt (integers; a value that is not one selects nothing), as ``nodeaffinity.NewNodeSelector`` reads them.
    """
    if node_selector is None:
        return True
    for term in node_selector.get("nodeSelectorTerms") or []:
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if (all(_requirement_matches(e, labels.get(e.get("key", ""))) for e in exprs)
                and all(f.get("key") == "metadata.name" and _requirement_matches(f, name) for f in fields)):
            return True
    return False
