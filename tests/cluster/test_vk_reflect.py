"""ConfigMaps and Secrets go outside with the pods that reference them: the kubernetes provider against a second
real cluster.

A pod mounting a ConfigMap, taking env from a Secret key and ``envFrom`` a
ConfigMap runs in the other cluster with copies of the three in its remote
namespace; a change to the ConfigMap reaches the copy; a pod referencing a
Secret that does not exist stays Pending with an Event naming it (and runs
once it exists); deleting the pods removes the copies. The Secret's value
appears in no log line, Event or pod status.

Copies go under the pool's own names (``gf-<pool>.<name>``): a foreign
ConfigMap of the source name (and the remote cluster's own
``kube-root-ca.crt``) is left as it was while the pod runs with its copy;
a foreign object at a copy's name fails the pod with the reason and is
left as it was; two pools sharing a remote namespace keep their own copies
and never delete each other's.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest

from gpufleet.kube import Kube, NotFound
from gpufleet.names import FOREIGN_OBJECT_REASON, REFLECTED_LABEL
from gpufleet.virtual_kubelet.main import VirtualKubelet
from gpufleet.virtual_kubelet.providers.kubernetes import KubernetesProvider, copy_name

from .helpers import wait
from .vk_helpers import H100, delete_namespace, namespace, ready

pytestmark = pytest.mark.cluster

POOL = "vkr-other"
NODE = f"vk-{POOL}"
TOKEN = "tok-9f2c41d7e8b3a6"


@pytest.fixture(scope="module")
def other(other_cluster):
    """The second cluster (the session's, :func:`conftest.other_cluster`), the kubernetes provider's remote side."""
    return other_cluster


def pod(name: str, *, secret: str = "api", pool: str = POOL, config: str = "model-config", ca: bool = False) -> dict:
    """A 1-GPU pod for the virtual node: a ConfigMap volume, env from a Secret key, envFrom a ConfigMap
    (``ca``: also a projected volume of this cluster's ``kube-root-ca.crt``)."""
    volumes = [{"name": "model", "configMap": {"name": config}}]
    if ca:
        volumes.append({"name": "ca", "projected": {"sources": [{"configMap": {"name": "kube-root-ca.crt"}}]}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"gpufleet.io/pool": pool}, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                                     {"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "volumes": volumes,
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
        c = lambda name: copy_name(POOL, name)  # noqa: E731
        assert set(copies) == {("ConfigMap", c("model-config")), ("ConfigMap", c("settings")), ("Secret", c("api"))}
        assert copies[("Secret", c("api"))]["data"] == {"token": token64}
        assert copies[("Secret", c("api"))]["type"] == "Opaque"
        assert copies[("ConfigMap", c("settings"))]["data"] == {"MODE": "fast"}
        assert any(m.get("manager") == "gpufleet" for m in copies[("ConfigMap", c("settings"))]["metadata"]["managedFields"])
        rpod = remote.get("v1", "pods", "server", ns)
        assert rpod["spec"]["containers"][0]["envFrom"] == [{"configMapRef": {"name": c("settings")}}]

        # A change here reaches the copy while the pod runs outside.
        kube.patch("v1", "configmaps", "model-config", {"data": {"config.json": '{"layers": 96}'}}, ns)
        wait("the change reflected", lambda: remote.get("v1", "configmaps", c("model-config"), ns)["data"]
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


def _fingerprint(obj: dict | None) -> tuple | None:
    """What must not change of an object gpufleet does not own: its UID, resourceVersion, labels and data."""
    if obj is None:
        return None
    meta = obj["metadata"]
    return meta["uid"], meta["resourceVersion"], meta.get("labels"), obj.get("data")


def test_foreign_objects_stay_untouched_and_two_pools_sharing_a_namespace_keep_their_own_copies(local_cluster, other):
    pools = ("vkr-a", "vkr-b")
    kube = Kube.from_kubeconfig(local_cluster.kubeconfig)
    remote = Kube.from_kubeconfig(other.kubeconfig)
    vks = []
    ns = namespace(kube, "vkf")
    try:
        for p in pools:  # the same remote namespace for both (no prefix)
            prov = KubernetesProvider(p, Kube.from_kubeconfig(other.kubeconfig), node_name=f"vk-{p}", gpus=8,
                                      gpu_product=H100, price_per_gpu_hour=2.1).start()
            vks.append(VirtualKubelet(Kube(kube.config), p, "kubernetes", {p: prov}, resync_seconds=2.0).start())
        remote.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        token64 = base64.b64encode(TOKEN.encode()).decode()
        for name, data in (("model-config", {"config.json": "{}"}), ("settings", {"MODE": "fast"}),
                           ("guarded", {"k": "ours"})):
            kube.create("v1", "configmaps", {"metadata": {"name": name}, "data": data}, ns)
        kube.create("v1", "secrets", {"metadata": {"name": "api"}, "data": {"token": token64}}, ns)
        # Someone else's objects in the remote namespace: one of a source name, one at pool a's copy of "guarded".
        remote.create("v1", "configmaps", {"metadata": {"name": "settings"}, "data": {"MODE": "theirs"}}, ns)
        remote.create("v1", "configmaps", {"metadata": {"name": copy_name("vkr-a", "guarded")},
                                           "data": {"k": "theirs"}}, ns)
        wait("the remote cluster's own kube-root-ca.crt", lambda: remote.get_or_none("v1", "configmaps",
                                                                                     "kube-root-ca.crt", ns), timeout=30)
        before = {name: _fingerprint(remote.get("v1", "configmaps", name, ns))
                  for name in ("settings", copy_name("vkr-a", "guarded"), "kube-root-ca.crt")}

        kube.create("v1", "pods", pod("a-server", pool="vkr-a", ca=True), ns)
        kube.create("v1", "pods", pod("b-server", pool="vkr-b"), ns)
        kube.create("v1", "pods", pod("blocked", pool="vkr-a", config="guarded"), ns)
        for name in ("a-server", "b-server"):
            wait(f"{name} Ready outside", lambda name=name: ready(kube.get("v1", "pods", name, ns)), timeout=60)
        blocked = wait("the blocked pod Failed", lambda: (lambda p: p if p["status"].get("phase") == "Failed" else None)(
            kube.get("v1", "pods", "blocked", ns)), timeout=60)
        assert blocked["status"]["reason"] == FOREIGN_OBJECT_REASON
        assert f"ConfigMap {ns}/{copy_name('vkr-a', 'guarded')}" in blocked["status"]["message"]
        (event,) = [e for e in kube.list("v1", "events", ns)["items"]
                    if e["involvedObject"]["name"] == "blocked" and e["reason"] == FOREIGN_OBJECT_REASON]
        assert event["type"] == "Warning" and "left untouched" in event["message"]
        assert remote.get_or_none("v1", "pods", "blocked", ns) is None

        # Each pool has its own copies; the pod mounting kube-root-ca.crt got this cluster's CA, under a's name.
        def copies(pool: str) -> dict[str, dict]:
            return {o["metadata"]["name"]: o for o in remote.list(
                "v1", "configmaps", ns, labelSelector=f"{REFLECTED_LABEL}=vk-{pool}")["items"]}
        a, b = copies("vkr-a"), copies("vkr-b")
        assert set(a) == {copy_name("vkr-a", n) for n in ("model-config", "settings", "kube-root-ca.crt")}
        assert set(b) == {copy_name("vkr-b", n) for n in ("model-config", "settings")}
        assert a[copy_name("vkr-a", "kube-root-ca.crt")]["data"] == kube.get("v1", "configmaps", "kube-root-ca.crt",
                                                                             ns)["data"]
        b_before = {name: _fingerprint(o) for name, o in b.items()}

        # Pool a's pods go: its copies go, b's stay as they were, and so does everything of someone else.
        for name in ("a-server", "blocked"):
            kube.delete("v1", "pods", name, ns)
        wait("pool a's copies removed", lambda: not copies("vkr-a"), timeout=60)
        for vk in vks:  # a resync and its sweep, both pools, after a's copies went
            vk.pods.resync()
        assert {name: _fingerprint(o) for name, o in copies("vkr-b").items()} == b_before
        assert {name: _fingerprint(remote.get_or_none("v1", "configmaps", name, ns)) for name in before} == before
        assert remote.get("v1", "configmaps", "settings", ns)["data"] == {"MODE": "theirs"}
    finally:
        for vk in vks:
            vk.close()
        delete_namespace(kube, ns)
        delete_namespace(remote, ns)
        for p in pools:
            try:
                kube.delete("v1", "nodes", f"vk-{p}")
            except NotFound:
                pass
        remote.close()
        kube.close()
