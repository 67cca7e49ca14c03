"""What gpufleet's pods get to run in a cluster as they do in production: endpoint, placement, their configuration."""

from __future__ import annotations

import pytest

from gpufleet import names
from gpufleet_admin.inventory import InventoryError
from gpufleet.componentconfig import checksum
from gpufleet.kube.config import API_SERVER_ENV
from gpufleet_admin.manifests import CONFIG_DIR, CONFIG_FILE
from gpufleet_admin.stack.render import render
from roles.registry import load

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


def test_each_controller_reads_its_own_configuration_file_and_no_inventory():
    from roles.registry import COMPONENTS

    inv = load("local")
    objs = render(inv).objects
    for comp in COMPONENTS:
        for instance in comp.instances(inv):
            dep = next(o for o in objs if o["kind"] == "Deployment"
                       and o["spec"]["template"]["spec"]["containers"][0].get("args", [""])[0] == comp.command
                       and (not instance or instance in o["spec"]["template"]["spec"]["containers"][0]["args"]))
            pod = dep["spec"]["template"]["spec"]
            container = pod["containers"][0]
            args = container["args"]
            assert args[args.index("--config") + 1] == f"{CONFIG_DIR}/{CONFIG_FILE}", comp.command
            assert "--env" not in args and not {e["name"] for e in container["env"]} & {"GPUFLEET_INVENTORIES"}
            mount = next(m for m in container["volumeMounts"] if m["mountPath"] == CONFIG_DIR)
            assert mount["readOnly"] is True
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]
                      and o["metadata"]["namespace"] == dep["metadata"]["namespace"])
            assert set(cm["data"]) == {CONFIG_FILE}  # one file, nothing of the inventory
            text = cm["data"][CONFIG_FILE]
            assert dep["spec"]["template"]["metadata"]["annotations"][names.CONFIG_CHECKSUM_ANNOTATION] == checksum(text)
            assert comp.dump(comp.build(inv, instance)) == text
    assert not [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-inventory")]


def test_a_changed_configuration_changes_the_pod_template_so_the_pods_roll():
    def template(**overrides) -> dict:
        return _deployment(_objects(**overrides), "taint-controller")["spec"]["template"]

    plain, changed = template(), template(descheduler_migration_pods_per_minute=5)
    assert plain != changed and plain["spec"] == changed["spec"]  # the checksum annotation is what changed
    assert template() == plain  # and only when the configuration does


def test_every_controller_has_a_writable_tmp_on_its_read_only_root():
    # The Kubernetes client writes a kubeconfig's embedded certificates (a kubernetes pool's) to temporary files.
    objs = _objects()
    for name in CONTROLLERS:
        pod = _deployment(objs, name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], name
        assert next(v for v in pod["volumes"] if v["name"] == "tmp")["emptyDir"], name


def _exporter(objs: list[dict]) -> dict:
    return next(o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpufleet-fabric-exporter")


def test_the_exporter_stays_off_virtual_nodes():
    pod = _exporter(_objects())["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    key, value = names.VIRTUAL_NODE_LABEL
    assert terms == [{"matchExpressions": [{"key": key, "operator": "NotIn", "values": [value]}]}]


def test_a_fixture_node_replaces_the_hosts_sys_and_nvml_for_the_exporter():
    plain = _exporter(_objects())["spec"]["template"]["spec"]
    assert plain["volumes"] == [{"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}}]
    assert "--nvml-fake" not in plain["containers"][0]["args"]
    pod = _exporter(_objects(gpu_metrics_exporter_fixture_node="/state/c/node/fixture"))["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "sys", "hostPath": {"path": "/state/c/node/fixture", "type": "Directory"}}]
    args = pod["containers"][0]["args"]
    assert args[args.index("--sysfs-root") + 1] == "/host/fixture/sys"
    assert args[args.index("--nvml-fake") + 1] == "/host/fixture/node.json"
    assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == "/host/fixture"
    with pytest.raises(InventoryError, match="gpu_metrics_exporter_fixture_node"):
        load("local", overrides={"gpu_metrics_exporter_fixture_node": "relative/path"})


def test_the_local_inventory_places_gpufleet_on_the_real_node():
    assert load("local").fleet.gpufleet_node_selector == dict([names.SYSTEM_NODE_LABEL])


def test_what_gpufleet_runs_in_its_image_needs_no_pulumi_and_no_roles():
    # The image carries the runtime dependencies and the gpufleet package only: each command imports without
    # Pulumi, the roles or gpufleet_admin (tests/controllers/test_imports.py lists what they load).
    import subprocess
    import sys

    from gpufleet.cli import COMMANDS

    modules = [m for c, (m, _) in COMMANDS.items() if c != "inference-standin"]
    code = ("import sys\nfor m in ('pulumi', 'pulumi_kubernetes', 'roles', 'gpufleet_admin'): sys.modules[m] = None\n"
            + "".join(f"import {m}\n" for m in modules))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
