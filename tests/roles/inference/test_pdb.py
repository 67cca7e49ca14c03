"""The inference PodDisruptionBudget: minAvailable or maxUnavailable (pods or a percentage), exactly one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from roles.inference.manifests import objects
from roles.inference.vars import DeploymentVars

BASE = {"name": "chat", "image": "example.invalid/chat:1", "replicas": 64, "min_replicas": 64, "max_replicas": 128}


def test_max_unavailable_as_a_percentage_keeps_as_many_ready_as_the_disruption_controller():
    d = DeploymentVars(**BASE, pdb_max_unavailable="10%")
    # 10% of 64 rounded up is 7: 57 Ready at least.
    assert d.pdb_spec() == {"maxUnavailable": "10%"} and d.pdb_floor(64) == 57
    assert DeploymentVars(**BASE, pdb_min_available=60).pdb_floor(64) == 60


@pytest.mark.parametrize("budget, message", [
    ({}, "set exactly one of pdb_min_available and pdb_max_unavailable"),
    ({"pdb_min_available": 3, "pdb_max_unavailable": 1}, "set exactly one"),
    ({"pdb_max_unavailable": "0%"}, "allows no eviction at min_replicas 64"),
    ({"pdb_max_unavailable": 0}, "allows no eviction"),
    ({"pdb_max_unavailable": "12.5%"}, "'12.5%' is not a number of pods or a percentage"),
    ({"pdb_max_unavailable": -1}, "-1 is negative"),
])
def test_a_budget_that_is_missing_doubled_or_never_allows_an_eviction_is_refused(budget, message):
    with pytest.raises(ValidationError, match=message):
        DeploymentVars(**BASE, **budget)


def test_the_rendered_budget_carries_max_unavailable_only(monkeypatch):
    from roles.registry import load

    inv = load("local")
    role = inv.role("inference")
    dep = role.inference_deployments[0].model_copy(update={"pdb_min_available": None, "pdb_max_unavailable": "10%"})
    inv.roles["inference"] = role.model_copy(update={"inference_deployments": [dep]})
    (pdb,) = [o for o in objects(inv) if o["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == "10%" and "minAvailable" not in pdb["spec"]
