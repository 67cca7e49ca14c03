"""A virtual node registers closed: no inference goes outside before the taint controller decides.

The virtual kubelet is started in-process with the taints the
virtual_kubelet role renders into its configuration file for the local
stack (read back through ``gpufleet virtual-kubelet``'s own parser and
reader), and no taint controller runs:
the new Node carries the free-GPU taint from its creation, and an inference
pod that tolerates the provider taint (as the inference role's pods do) is
not scheduled there. A virtual kubelet restarted on a Node the taint
controller has opened keeps it open: the decision stands.
"""

from __future__ import annotations

import time

import pytest

from gpufleet.cli import build_parser
from gpufleet.kube import Kube
from gpufleet.names import FREE_GPUS_TAINT
from gpufleet_admin.stack.render import render
from gpufleet.virtual_kubelet.main import VirtualKubelet
from roles.registry import load

from .helpers import wait
from .vk_helpers import close_virtual_kubelet, namespace, simulated_provider, start_virtual_kubelet

pytestmark = pytest.mark.cluster

POOL = "vkr-rental"
NODE = f"vk-{POOL}"


def role_register_taints(tmp_path) -> list[dict]:
    """The taints the local stack's virtual kubelet registers with: its ConfigMap's file, read as the command reads it."""
    from gpufleet.virtual_kubelet.main import configuration

    objs = render(load("local")).objects
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "vk-rental-config")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "vk-rental")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    args = [str(tmp_path / "config.yaml") if a.endswith("/config.yaml") else a for a in args]
    return [t.api() for t in configuration(build_parser("virtual-kubelet").parse_args(args)).register_with_taints]


def inference_pod() -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "server", "labels": {"app": "chat"}},
            "spec": {"nodeSelector": {"gpufleet.io/pool": POOL}, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                                     {"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "server", "image": "registry.invalid/inference:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def free_gpus_taint(kube: Kube) -> bool:
    return any(t["key"] == FREE_GPUS_TAINT for t in kube.get("v1", "nodes", NODE)["spec"].get("taints") or [])


def test_a_new_virtual_node_is_closed_until_the_taint_controller_opens_it(local_cluster, tmp_path):
    kube = Kube.from_kubeconfig(local_cluster.kubeconfig)
    taints = role_register_taints(tmp_path)
    assert [t["key"] for t in taints] == [FREE_GPUS_TAINT]
    prov = simulated_provider(POOL, NODE)

    def virtual_kubelet() -> VirtualKubelet:
        return start_virtual_kubelet(kube, POOL, prov, register_taints=taints)

    vk = virtual_kubelet()
    ns = namespace(kube, "vkr")
    try:
        assert free_gpus_taint(kube), f"{NODE} registered open: {kube.get('v1', 'nodes', NODE)['spec']}"
        kube.create("v1", "pods", inference_pod(), ns)
        time.sleep(5)  # the scheduler has had its chance
        pod = kube.get("v1", "pods", "server", ns)
        assert not pod["spec"].get("nodeName"), f"scheduled outside before any decision: {pod['spec']['nodeName']}"

        # the taint controller opens the node (as FlipOut/TaintController do: the taint removed)
        node = kube.get("v1", "nodes", NODE)
        node["spec"]["taints"] = [t for t in node["spec"]["taints"] if t["key"] != FREE_GPUS_TAINT]
        kube.replace("v1", "nodes", NODE, node)
        wait("the pod scheduled outside once the node is open",
             lambda: kube.get("v1", "pods", "server", ns)["spec"].get("nodeName") == NODE, timeout=30)

        vk.stop()  # restarted on the existing Node: the taint controller's decision stands
        vk = virtual_kubelet()
        assert not free_gpus_taint(kube), "a restarted virtual kubelet closed a node the taint controller had opened"
    finally:
        close_virtual_kubelet(kube, vk, ns, NODE)
        kube.close()
