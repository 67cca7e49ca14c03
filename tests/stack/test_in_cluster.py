"""What gpufleet's pods get to run in a cluster as they do in production: endpoint, placement, their inventory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import names
from gpufleet.inventory import InventoryError, load
from gpufleet.kube.config import API_SERVER_ENV
from gpufleet.stack.objects import INVENTORY_MOUNT
from gpufleet.stack.render import render

CONTROLLERS = ("taint-controller", "quota-sync", "node-health", "vk-rental")


def _objects(**overrides) -> list[dict]:
    return render(load("local", overrides=overrides or None)).objects


def _deployment(objs: list[dict], name: str) -> dict:
    return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name)


def test_api_server_endpoint_reaches_every_controller_as_the_in_cluster_env():
    objs = _objects(gpufleet_api_server="https://10.244.3.1:6443")
    for name in CONTROLLERS:
        env = {e["name"]: e.get("value") for e in _deployment(objs, name)["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env[API_SERVER_ENV] == "https://10.244.3.1:6443", name  # read by gpufleet.kube.config
        assert "KUBERNETES_SERVICE_HOST" not in env, name  # the kubelet's stays: one override, not two
    plain = _deployment(_objects(), "taint-controller")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert API_SERVER_ENV not in {e["name"] for e in plain}  # default: the kubernetes Service


@pytest.mark.parametrize("bad", ["http://10.0.0.1:6443", "https://10.0.0.1", "https://10.0.0.1:6443/api", "10.0.0.1:6443"])
def test_bad_api_server_endpoints_are_refused(bad):
    with pytest.raises(InventoryError, match="gpufleet_api_server.*https://HOST:PORT"):
        load("local", overrides={"gpufleet_api_server": bad})


def test_controllers_tolerate_the_system_node_and_follow_the_node_selector():
    objs = _objects(gpufleet_node_selector={"gpufleet.io/node-role": "system"})
    key, value, effect = names.SYSTEM_NODE_TAINT
    for name in CONTROLLERS:
        spec = _deployment(objs, name)["spec"]["template"]["spec"]
        assert {"key": key, "operator": "Equal", "value": value, "effect": effect} in spec["tolerations"]
        assert spec["nodeSelector"] == {"gpufleet.io/node-role": "system"}


def test_the_inventory_travels_with_the_controllers_and_loads_the_same(tmp_path: Path):
    objs = _objects()
    dep = _deployment(objs, "taint-controller")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert {"name": "GPUFLEET_INVENTORIES", "value": INVENTORY_MOUNT} in container["env"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "inventory")
    assert mount["mountPath"] == f"{INVENTORY_MOUNT}/local"
    volume = next(v for v in pod["volumes"] if v["name"] == "inventory")
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"])
    root = tmp_path / "local"
    for item in volume["configMap"]["items"]:  # what the kubelet lays out
        (root / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (root / item["path"]).write_text(cm["data"][item["key"]])
    mounted, original = load("local", root=root), load("local")
    assert mounted.hosts == original.hosts
    assert mounted.role("taint_controller") == original.role("taint_controller")
