"""roles/goodput: one read-only accountant per team namespace, declared through the real stack program."""

from __future__ import annotations

from functools import cache

import pytest

from gpufleet_admin.stack.render import Rendered, render
from roles.registry import load


@cache
def stack(env: str, **overrides) -> Rendered:
    return render(load(env, overrides=overrides or None))


def of(r: Rendered, kind: str, namespace: str) -> dict:
    (obj,) = [o for o in r.objects if o["kind"] == kind and o["metadata"]["name"] == "gpufleet-goodput"
              and o["metadata"].get("namespace") == namespace]
    return obj


@pytest.mark.parametrize("namespace", ["team-pretrain", "team-research"])
def test_one_accountant_per_team_namespace_reading_only_its_namespace(namespace):
    r = stack("prod")
    assert ("gpufleet:training:Goodput", "goodput") in r.components
    role = of(r, "Role", namespace)
    assert {(tuple(x["apiGroups"]), tuple(x["resources"])) for x in role["rules"]} == {
        (("kueue.x-k8s.io",), ("workloads",)), (("",), ("pods",)), (("",), ("events",))}
    assert {v for x in role["rules"] for v in x["verbs"]} == {"get", "list", "watch"}
    assert of(r, "RoleBinding", namespace)["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpufleet-goodput", "namespace": namespace}]
    assert not [o for o in r.objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")
                and "goodput" in o["metadata"]["name"]]
    spec = of(r, "Deployment", namespace)["spec"]
    assert spec["replicas"] == 1
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][:3] == ["goodput", "--namespace", namespace]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["resources"]["requests"]["cpu"]
    assert c["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/mnt/checkpoints", "readOnly": True},
                                 {"name": "config", "mountPath": "/etc/gpufleet/config", "readOnly": True}]
    assert pod["volumes"] == [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "gpufleet-checkpoints",
                                                                                 "readOnly": True}},
                              {"name": "config", "configMap": {"name": "gpufleet-goodput-config"}}]
    assert c["args"][c["args"].index("--config") + 1] == "/etc/gpufleet/config/config.yaml"
    (cm,) = [o for o in r.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpufleet-goodput-config"
             and o["metadata"]["namespace"] == namespace]
    assert "interval_seconds: 15.0" in cm["data"]["config.yaml"]
    assert of(r, "ServiceMonitor", namespace)["spec"]["endpoints"][0]["port"] == "metrics"


def test_host_mounted_checkpoints_are_a_read_only_host_path():
    pod = of(stack("local"), "Deployment", "team-pretrain")["spec"]["template"]["spec"]
    assert pod["volumes"][0]["hostPath"]["path"] == pod["containers"][0]["volumeMounts"][0]["mountPath"]
    assert pod["containers"][0]["volumeMounts"][0]["readOnly"] is True


def test_switched_off():
    r = stack("staging", goodput_enabled=False)
    assert not [o for o in r.objects if o["metadata"]["name"] == "gpufleet-goodput"]
    assert "goodput" not in dict((n, t) for t, n in r.components)
