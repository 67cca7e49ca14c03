"""Taints and tolerations: Kubernetes' matching rules, on plain dicts (pure)."""

from __future__ import annotations

from collections.abc import Iterable


def tolerates(tolerations: Iterable[dict], taint: dict) -> bool:
    """Whether any toleration tolerates ``taint`` (Kubernetes' matching rules, ``k8s.io/api/core/v1`` ``ToleratesTaint``).

    A toleration without an effect matches every effect; one without a key
    and with ``operator: Exists`` matches every taint; ``Exists`` ignores the
    value, ``Equal`` (the default) compares it.
    """
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
