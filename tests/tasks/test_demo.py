"""The demo's stack config keeps make before break: what the flip needs in the inference namespace is declared."""

from __future__ import annotations

from gpufleet_admin.stack.program import _decode
from gpufleet_admin.stack.render import render
from gpufleet_workshop.tasks.demo import DEMO_CONFIG
from roles.registry import load


def test_the_demo_stack_grants_the_surge_and_reflection_rights_but_deploys_no_inference() -> None:
    inv = load("local", overrides=_decode(DEMO_CONFIG))
    ns = inv.role("inference").inference_namespace
    objs = render(inv).objects
    here = [o for o in objs if o["metadata"].get("namespace") == ns]
    assert not [o for o in here if o["kind"] in ("Deployment", "HorizontalPodAutoscaler", "ScaledObject", "PodDisruptionBudget")]
    assert any(o["kind"] == "Namespace" and o["metadata"]["name"] == ns for o in objs)
    roles = {o["metadata"]["name"]: o for o in here if o["kind"] == "Role"}
    surge = [r for r in roles.values() if any("replicasets" in rule.get("resources", []) and "create" in rule["verbs"]
                                              for rule in r["rules"])]
    assert surge, f"no Role in {ns} lets the taint controller create surge ReplicaSets; Roles: {sorted(roles)}"
    reflect = [r for r in roles.values() if any("secrets" in rule.get("resources", []) for rule in r["rules"])]
    assert reflect, f"no Role in {ns} lets the virtual kubelets reflect Secrets; Roles: {sorted(roles)}"
