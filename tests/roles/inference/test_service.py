"""The inference role declares a Service per Deployment (rendered through the real stack program)."""

from __future__ import annotations

import pytest

from gpufleet.kube.selectors import selector_matches
from gpufleet.names import SURGE_FOR_LABEL
from gpufleet_admin.stack.render import render
from roles.inference.manifests import service
from roles.registry import load


@pytest.mark.parametrize("env", ["local", "prod"])
def test_every_inference_deployment_has_a_service_selecting_its_pods_on_its_ports(env) -> None:
    objs = render(load(env)).objects
    deployments = [o for o in objs if o["kind"] == "Deployment" and o["metadata"].get("namespace") == "inference"]
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service" and o["metadata"].get("namespace") == "inference"}
    assert deployments and set(services) == {d["metadata"]["name"] for d in deployments}
    for d in deployments:
        svc = services[d["metadata"]["name"]]
        template = d["spec"]["template"]
        assert svc["spec"]["type"] == "ClusterIP"
        # Selector = the Deployment's pod labels (what it selects), which its pods carry; the Deployment
        # leaves out make-before-break surge pods (which the Service selects: they serve).
        assert svc["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
        assert d["spec"]["selector"]["matchExpressions"] == [{"key": SURGE_FOR_LABEL, "operator": "DoesNotExist"}]
        surge_labels = {**template["metadata"]["labels"], SURGE_FOR_LABEL: "victim-uid"}
        assert not selector_matches(d["spec"]["selector"], surge_labels)
        assert selector_matches({"matchLabels": svc["spec"]["selector"]}, surge_labels)
        assert selector_matches(d["spec"]["selector"], template["metadata"]["labels"])
        assert svc["spec"]["selector"].items() <= template["metadata"]["labels"].items()
        declared = [p for c in template["spec"]["containers"] for p in c.get("ports") or []]
        assert svc["spec"]["ports"] == [{"name": p["name"], "protocol": "TCP", "port": p["containerPort"],
                                         "targetPort": p["name"]} for p in declared]
        assert svc["spec"]["ports"] == [{"name": "http", "protocol": "TCP", "port": 8000, "targetPort": "http"}]


def test_a_service_port_needs_a_named_container_port() -> None:
    pod = {"containers": [{"name": "server", "ports": [{"containerPort": 8000}]}]}
    with pytest.raises(ValueError, match=r"inference Deployment chat: container 'server' port 8000 has no name"):
        service("chat", "inference", {"app": "chat"}, pod)
    two = {"containers": [{"name": "server", "ports": [{"name": "http", "containerPort": 8000},
                                                       {"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]}]}
    assert [p["port"] for p in service("chat", "inference", {"app": "chat"}, two)["spec"]["ports"]] == [8000, 9400]
