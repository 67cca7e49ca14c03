"""What the virtual_kubelet role declares: one virtual kubelet Deployment per pool.

Each runs ``gpufleet virtual-kubelet --pool NAME`` as a single replica (a
node has one kubelet; Recreate so two never overlap), with RBAC to own its
Node and Lease, to watch and update the pods bound to it, to publish them
into the Services selecting them (EndpointSlices), and to record events. The kubernetes provider reads the other cluster's kubeconfig from
the pool's Secret, mounted read-only. Pods outside take the ConfigMaps and
Secrets they reference with them (:mod:`gpufleet.virtual_kubelet.reflect`): the virtual
kubelet may get, list and watch those of the inference namespace only (a
Role there, when the inference role is enabled), never cluster-wide.

Each virtual kubelet's settings go in one file, ConfigMap ``vk-<pool>-config``
(key ``config.yaml``, mounted read-only at ``/etc/gpufleet/config``, passed as
``--config``): the configuration ``roles/virtual_kubelet/config.py`` builds
for its pool from the inventory and stack config. Where the taint controller
runs, the node registers closed: with its free-GPU taint (the file's
``register_with_taints``), so no inference goes outside before the taint
controller has decided the cluster is short of GPUs. Without a taint
controller nothing would ever open it, so the node registers open.

With ``virtual_kubelet_kubelet_port`` (default 10250) each virtual kubelet
serves the kubelet API for what its pods use
(:mod:`gpufleet.virtual_kubelet.kubelet_api`) on that container port: it may
create TokenReviews and SubjectAccessReviews (webhook authentication and
authorization of its callers) and read ConfigMap
``kube-system/extension-apiserver-authentication`` (the cluster's client CA),
nothing else in ``kube-system``.

Each pool's virtual kubelet runs the image its provider ships in
(``PoolVars.image_or``): gpufleet's image for ``kubernetes`` pools, gpufleet's
workshop image for the ``simulated`` rental, a plugin of the workshop.
"""

from __future__ import annotations

from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import EVENT_RULE, Obj, controller, namespace, namespaced_rbac, rule
from gpufleet.virtual_kubelet.config import dump
from gpufleet.virtual_kubelet.kubelet_api import CLIENT_CA_CONFIGMAP

from .config import configuration

#: Memory of the virtual kubelet itself (MiB).
MEMORY_MIB = 512
#: Memory per rental instance run as a local process in the virtual kubelet's pod (``instances: local_process``):
#: the inference stand-in's resident set is ~21 MiB (ps, 65 stand-ins); the rest is margin. They share the
#: pod's cgroup, so a pool of N GPUs (at most N one-GPU instances) needs N times this on top.
LOCAL_INSTANCE_MEMORY_MIB = 32


def objects(inv: Inventory) -> list[Obj]:
    """Namespace, and per pool: ServiceAccount, ClusterRole(Binding), Deployment."""
    v = inv.role("virtual_kubelet")
    if not v.virtual_kubelet_enabled or not v.virtual_kubelet_pools:
        return []
    ns = v.virtual_kubelet_namespace
    rules = [rule([""], ["nodes", "nodes/status"], ["get", "list", "watch", "create", "update", "patch"]),
             rule([""], ["pods"], ["get", "list", "watch", "update", "patch", "delete"]),
             rule([""], ["pods/status"], ["update", "patch"]),
             rule(["coordination.k8s.io"], ["leases"], ["get", "create", "update", "patch"]),
             # gpufleet.virtual_kubelet.endpoints: Services watched, its own EndpointSlices watched, applied, deleted.
             rule([""], ["services"], ["list", "watch"]),
             rule(["discovery.k8s.io"], ["endpointslices"], ["list", "watch", "create", "patch", "delete"]),
             EVENT_RULE]
    out: list[Obj] = [namespace(ns)]
    inference = inv.role("inference")
    # gpufleet.virtual_kubelet.reflect: the ConfigMaps and Secrets pods outside reference, where inference runs.
    reflect = ([rule([""], ["configmaps", "secrets"], ["get", "list", "watch"])]
               if inference.inference_enabled else [])
    kubelet_port = v.virtual_kubelet_kubelet_port
    if kubelet_port:
        # gpufleet.virtual_kubelet.kubelet_api: webhook authentication and authorization of its callers.
        rules = rules + [rule(["authentication.k8s.io"], ["tokenreviews"], ["create"]),
                         rule(["authorization.k8s.io"], ["subjectaccessreviews"], ["create"])]
    for pool in v.virtual_kubelet_pools:
        name = f"vk-{pool.name}"
        volumes = mounts = own = None
        if pool.kubeconfig_secret:
            # Its own pool's kubeconfig, nothing else of its own namespace.
            own = [rule([""], ["secrets"], ["get"], names=[pool.kubeconfig_secret])]
            volumes = [{"name": "remote", "secret": {"secretName": pool.kubeconfig_secret}}]
            mounts = [{"name": "remote", "mountPath": "/etc/gpufleet/remote", "readOnly": True}]
        memory = MEMORY_MIB + (pool.capacity_gpus * LOCAL_INSTANCE_MEMORY_MIB if pool.instances == "local_process" else 0)
        objs = controller(name, ns, ["virtual-kubelet", "--pool", pool.name], rules, fleet=inv.fleet,
                          config=dump(configuration(inv, pool.name)), memory=f"{memory}Mi", volumes=volumes,
                          mounts=mounts, namespaced_rules=own, image=pool.image_or(inv.fleet.gpufleet_image))
        deployment = objs[-1]
        # The pod's IP is the virtual node's InternalIP.
        deployment["spec"]["template"]["spec"]["containers"][0]["env"].append(
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        if kubelet_port:
            deployment["spec"]["template"]["spec"]["containers"][0]["ports"].append(
                {"name": "kubelet", "containerPort": kubelet_port})
            # The cluster's client CA (certificates of the API server and metrics-server), nothing else there.
            out += namespaced_rbac(name, CLIENT_CA_CONFIGMAP[0], [
                rule([""], ["configmaps"], ["get"], names=[CLIENT_CA_CONFIGMAP[1]])], account_namespace=ns)
        deployment["spec"]["replicas"] = 1
        deployment["spec"]["strategy"] = {"type": "Recreate"}
        out += objs[:-1]
        if reflect:
            out += namespaced_rbac(name, inference.inference_namespace, reflect, account_namespace=ns)
        out.append(deployment)
    return out
