"""ConfigMaps and Secrets go outside with the pods that reference them: the kubernetes provider against a second
real cluster.

A pod mounting a ConfigMap, taking env from a Secret key and ``envFrom`` a
ConfigMap runs in the other cluster with copies of the three in its remote
namespace; a change to the ConfigMap reaches the copy; a pod referencing a
Secret that does not exist stays Pending with an Event naming it (and runs
once it exists); deleting the pods removes the copies. The Secret's value
appears in no log line, Event or pod status.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest

from gpufleet.inventory import node_specs
from gpufleet.kube import Kube, NotFound
from gpufleet.local import cluster as local
from gpufleet.names import REFLECTED_LABEL
from gpufleet.vk.main import VirtualKubelet
from gpufleet.vk.providers.kubernetes import KubernetesProvider

from .helpers import wait
from .vk_helpers import H100, delete_namespace, keep, namespace, ready

pytestmark = pytest.mark.cluster

POOL = "vkr-other"
NODE = f"vk-{POOL}"
TOKEN = "tok-9f2c41d7e8b3a6"


@pytest.fixture(scope="module")
def other(local_cluster):
    """The second cluster (2 kwok nodes), the kubernetes provider's remote side (left running if it was)."""
    name = f"{local_cluster.name}-other"
    was_up = bool(local.main_pids(name))
    c = local.up(name, specs=node_specs("local", 2), fresh=not was_up)
    yield c
    if not was_up and not keep():
        local.down(name)


def pod(name: str, *, secret: str = "api") -> dict:
    """A 1-GPU pod for the virtual node: a ConfigMap volume, env from a Secret key, envFrom a ConfigMap."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"gpufleet.io/pool": POOL}, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                                     {"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "volumes": [{"name": "model", "configMap": {"name": "model-config"}}],
                     "containers": [{"name": "server", "image": "registry.invalid/inference:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                     "env": [{"name": "API_TOKEN",
                                              "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}],
                                     "envFrom": [{"configMapRef": {"name": "settings"}}],
                                     "volumeMounts": [{"name": "model", "mountPath": "/etc/model"}]}]}}


def test_referenced_objects_follow_the_pod_outside_stay_in_sync_and_leave_with_it(local_cluster, other, caplog):
    caplog.set_level(logging.DEBUG)
    kube = Kube.from_kubeconfig(local_cluster.kubeconfig)
    remote = Kube.from_kubeconfig(other.kubeconfig)
    prov = KubernetesProvider(POOL, Kube.from_kubeconfig(other.kubeconfig), node_name=NODE, gpus=8, gpu_product=H100,
                              price_per_gpu_hour=2.1).start()
    vk = VirtualKubelet(Kube(kube.config), POOL, "kubernetes", {POOL: prov}, resync_seconds=2.0).start()
    ns = namespace(kube, "vkr")
    token64 = base64.b64encode(TOKEN.encode()).decode()
    try:
        kube.create("v1", "configmaps", {"metadata": {"name": "model-config"}, "data": {"config.json": '{"layers": 80}'}}, ns)
        kube.create("v1", "configmaps", {"metadata": {"name": "settings"}, "data": {"MODE": "fast"}}, ns)
        kube.create("v1", "secrets", {"metadata": {"name": "api"}, "data": {"token": token64}}, ns)
        kube.create("v1", "pods", pod("server"), ns)
        kube.create("v1", "pods", pod("waiting", secret="absent"), ns)

        wait("the pod Ready outside", lambda: ready(kube.get("v1", "pods", "server", ns)), timeout=60)
        copies = {(kind, o["metadata"]["name"]): o for kind, plural in (("ConfigMap", "configmaps"), ("Secret", "secrets"))
                  for o in remote.list("v1", plural, ns, labelSelector=f"{REFLECTED_LABEL}={NODE}")["items"]}
        assert set(copies) == {("ConfigMap", "model-config"), ("ConfigMap", "settings"), ("Secret", "api")}
        assert copies[("Secret", "api")]["data"] == {"token": token64} and copies[("Secret", "api")]["type"] == "Opaque"
        assert copies[("ConfigMap", "settings")]["data"] == {"MODE": "fast"}
        assert any(m.get("manager") == "gpufleet" for m in copies[("ConfigMap", "settings")]["metadata"]["managedFields"])
        rpod = remote.get("v1", "pods", "server", ns)
        assert rpod["spec"]["containers"][0]["envFrom"] == [{"configMapRef": {"name": "settings"}}]

        # A change here reaches the copy while the pod runs outside.
        kube.patch("v1", "configmaps", "model-config", {"data": {"config.json": '{"layers": 96}'}}, ns)
        wait("the change reflected", lambda: remote.get("v1", "configmaps", "model-config", ns)["data"]
             == {"config.json": '{"layers": 96}'}, timeout=30)

        # A missing Secret: Pending (not Failed), an Event naming it, no remote pod; it runs once the Secret exists.
        def waiting_event():
            return [e for e in kube.list("v1", "events", ns)["items"]
                    if e["involvedObject"]["name"] == "waiting" and e["reason"] == "CreateContainerConfigError"]
        (event,) = wait("an Event naming the missing Secret", waiting_event, timeout=30)
        assert 'secret "absent" not found' in event["message"]
        waiting = kube.get("v1", "pods", "waiting", ns)
        assert waiting["status"]["phase"] == "Pending"
        assert waiting["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        assert remote.get_or_none("v1", "pods", "waiting", ns) is None
        kube.create("v1", "secrets", {"metadata": {"name": "absent"}, "data": {"token": token64}}, ns)
        wait("the waiting pod Ready once its Secret exists", lambda: ready(kube.get("v1", "pods", "waiting", ns)),
             timeout=60)

        # The Secret's value shows nowhere here (logs of this process, Events, pod statuses).
        seen = caplog.text + json.dumps(kube.list("v1", "events", ns)["items"]) + json.dumps(
            [p["status"] for p in kube.list("v1", "pods", ns)["items"]])
        assert TOKEN not in seen and token64 not in seen

        # The pods go: so do the copies.
        for name in ("server", "waiting"):
            kube.delete("v1", "pods", name, ns)
        wait("no copy left outside", lambda: not remote.list("v1", "configmaps", ns, labelSelector=f"{REFLECTED_LABEL}={NODE}")
             ["items"] and not remote.list("v1", "secrets", ns, labelSelector=f"{REFLECTED_LABEL}={NODE}")["items"],
             timeout=60)
    finally:
        vk.close()
        delete_namespace(kube, ns)
        delete_namespace(remote, ns)
        try:
            kube.delete("v1", "nodes", NODE)
        except NotFound:
            pass
        remote.close()
        kube.close()
