"""``sim.flip`` applies the inference role's Deployments over ones an earlier release created: an immutable
selector is kept as the live object has it (the stack keeps it too), not refused."""

from __future__ import annotations

from gpufleet_workshop.sim.flip import keep_live_selector
from gpufleet_workshop.testing import FakeKube

NEW = {"matchLabels": {"app.kubernetes.io/name": "chat"},
       "matchExpressions": [{"key": "gpufleet.io/surge-for", "operator": "DoesNotExist"}]}
OLD = {"matchLabels": {"app.kubernetes.io/name": "chat"}}


def deployment(selector: dict) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat", "namespace": "inference"},
            "spec": {"replicas": 1, "selector": selector,
                     "template": {"metadata": {"labels": {"app.kubernetes.io/name": "chat"}}, "spec": {}}}}


def test_a_live_deployments_selector_is_kept_and_nothing_else_changes(caplog):
    kube = FakeKube(deployment(OLD))
    try:
        want = deployment(NEW)
        got = keep_live_selector(kube, want)
        assert got["spec"]["selector"] == OLD
        # Said, with both selectors: the HPA of such a Deployment still counts surge pods.
        assert "Deployment inference/chat keeps its live selector" in caplog.text and "DoesNotExist" in caplog.text
        assert {**got["spec"], "selector": NEW} == want["spec"] and want["spec"]["selector"] == NEW  # input untouched
    finally:
        kube.close()


def test_without_a_live_object_or_for_other_kinds_the_object_is_applied_as_declared():
    kube = FakeKube()
    try:
        want = deployment(NEW)
        assert keep_live_selector(kube, want) is want
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": "inference"},
                   "spec": {"selector": {"app.kubernetes.io/name": "chat"}}}
        assert keep_live_selector(kube, service) is service
        assert not [a for a in kube.actions if a.resource == "services"]
    finally:
        kube.close()
