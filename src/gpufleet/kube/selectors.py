"""Matching a ``metav1.LabelSelector`` (matchLabels and matchExpressions) against an object's labels.

What apimachinery's ``metav1.LabelSelectorAsSelector`` and ``Matches`` do
for the selectors gpufleet reads from objects (a PodDisruptionBudget's, a
Deployment's, node health's telemetry node selector): the one place the
product matches them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["selector_matches"]


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
