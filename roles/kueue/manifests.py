"""What the kueue role declares, as plain manifests (pure functions of the inventory).

Kueue API: ``kueue.x-k8s.io/v1beta2`` (the storage version of the pinned
Kueue, src/gpufleet_admin/versions.yaml). Quota: every flavor's capacity split
over the ClusterQueues by the policy in gpufleet.fleet.quota_policy (by
share; cpu and memory follow each queue's GPU quota), taken from quota
sync's configuration (``roles/kueue/config.py``). Quota sync recomputes it
from what the nodes can schedule (gpufleet.fleet.capacity).
"""

from __future__ import annotations

import yaml

from gpufleet_admin.inventory import Inventory
from gpufleet_admin.inventory.inventory import GPU_RESOURCE, GPU_TAINT, LABEL_FLAVOR
from gpufleet.kube.quantity import canonical
from gpufleet.fleet.quota_policy import quotas
from gpufleet.quota_sync.config import dump
from gpufleet.names import GPU_DEVICE_CLASS, KUEUE_API
from gpufleet_admin.manifests import HelmRelease, Obj, meta, namespace
from gpufleet_admin.versions import pin

from . import config as quota_sync

#: Job kinds Kueue manages (its `integrations.frameworks`).
FRAMEWORKS = ["batch/job", "jobset.x-k8s.io/jobset", "kubeflow.org/pytorchjob"]


#: Kueue's DRA integration (Kueue v0.19, KEP-2941): ResourceClaimTemplates of NVIDIA's DeviceClass count as
#: ``nvidia.com/gpu`` quota, the same resource the device plugin's nodes are counted in.
DEVICE_CLASS_MAPPINGS = [{"name": GPU_RESOURCE, "deviceClassNames": [GPU_DEVICE_CLASS]}]
#: Its feature gates, set explicitly: quota accounting of DRA devices (beta, on by default since v0.18), and the
#: rejection of DRA workloads were it off (so a gate flipped off refuses jobs instead of admitting them unquoted).
DRA_FEATURE_GATES = {"KueueDRAIntegration": True, "KueueDRARejectWorkloadsWhenDRADisabled": True}


def configuration(inv: Inventory) -> Obj:
    """Kueue's controller Configuration: waitForPodsReady (all-or-nothing gangs), integrations, and DRA
    quota accounting where a flavor's GPUs are allocated through DRA."""
    v = inv.role("kueue")
    out = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": v.kueue_namespace,
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {
            "timeout": f"{v.kueue_wait_for_pods_ready_timeout_seconds}s",
            "blockAdmission": True,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600},
        },
        "integrations": {"frameworks": FRAMEWORKS},
    }
    if any(f.dra for f in inv.flavors().values()):
        out["resources"] = {"deviceClassMappings": DEVICE_CLASS_MAPPINGS}
        out["featureGates"] = dict(DRA_FEATURE_GATES)
    return out


def cluster_queue(inv: Inventory, name: str, quota: dict[str, dict[str, int]]) -> Obj:
    """One ClusterQueue in the cohort, one resource group covering cpu, memory and GPUs."""
    v = inv.role("kueue")
    q = next(q for q in v.kueue_cluster_queues if q.name == name)
    flavors = []
    for flavor, res in quota.items():
        # Canonical quantity strings: what Kueue's webhook stores (21000 -> "21k"), so previews show no false diff.
        gpu: Obj = {"name": GPU_RESOURCE, "nominalQuota": canonical(res["gpu"])}
        if q.borrowing_limit_gpus is not None:
            gpu["borrowingLimit"] = canonical(q.borrowing_limit_gpus)
        flavors.append({"name": flavor, "resources": [
            {"name": "cpu", "nominalQuota": canonical(res["cpu"])},
            {"name": "memory", "nominalQuota": canonical(res["memory"], binary=True)},
            gpu,
        ]})
    metadata = meta(name, component="kueue")
    # quota-sync rewrites nominalQuota to the schedulable capacity, which makes it a co-owner of those
    # fields; without force, the next `pulumi up` that changes this queue fails on a server-side apply
    # conflict. Pulumi's value wins on apply and quota-sync corrects it at its next resync.
    metadata.setdefault("annotations", {})["pulumi.com/patchForce"] = "true"
    return {
        "apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": metadata,
        "spec": {
            "cohortName": v.kueue_cohort,
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any",
                           "borrowWithinCohort": {"policy": "LowerPriority"}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU_RESOURCE], "flavors": flavors}],
        },
    }


def topology(inv: Inventory) -> Obj | None:
    """The Kueue ``Topology`` of the fabric: levels coarse to fine, node labels of each (None when disabled).

    Levels: ``gpufleet.io/block`` (where the inventory's hosts carry
    ``node_block``), ``gpufleet.io/rack``, then ``kubernetes.io/hostname``
    (Kueue requires the hostname level last; with it Kueue assigns pods to
    nodes itself and can replace one failed node of a running gang).
    Every GPU node carries these labels (``Inventory.node_spec``).
    """
    v = inv.role("kueue")
    if not v.kueue_topology_enabled:
        return None
    return {"apiVersion": KUEUE_API, "kind": "Topology", "metadata": meta(v.kueue_topology_name, component="kueue"),
            "spec": {"levels": [{"nodeLabel": lv.label} for lv in inv.topology_levels()]}}


def resource_flavor(inv: Inventory, flavor: str) -> Obj:
    """One ResourceFlavor per GPU model: its nodes (label ``gpufleet.io/flavor``), the GPU taint, the Topology."""
    v = inv.role("kueue")
    spec: Obj = {"nodeLabels": {LABEL_FLAVOR: flavor},
                 "tolerations": [{"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}]}
    # Kueue's topology-aware scheduling does not place pods asking for DRA devices (v0.19, KEP-2941 non-goals).
    if v.kueue_topology_enabled and not inv.flavors()[flavor].dra:
        spec["topologyName"] = v.kueue_topology_name
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": meta(flavor, component="kueue"), "spec": spec}


def objects(inv: Inventory) -> list[Obj]:
    """Namespaces, Topology, ResourceFlavors, ClusterQueues, LocalQueues and both kinds of priority class."""
    v = inv.role("kueue")
    if not v.kueue_enabled:
        return []
    out: list[Obj] = []
    for ns in dict.fromkeys(lq.namespace for lq in v.kueue_local_queues):
        out.append(namespace(ns))
    for pc in v.kueue_priority_classes:
        out.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": meta(pc.name, component="kueue"),
                    "value": pc.value, "description": pc.description, "preemptionPolicy": pc.preemption_policy,
                    "globalDefault": False})
    for wpc in v.kueue_workload_priority_classes:
        out.append({"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass", "metadata": meta(wpc.name, component="kueue"),
                    "value": wpc.value, "description": wpc.description})
    topo = topology(inv)
    if topo is not None:
        out.append(topo)
    for flavor in inv.flavors():
        out.append(resource_flavor(inv, flavor))
    for name, quota in quotas(quota_sync.configuration(inv), quota_sync.inventory_capacity(inv)).items():
        out.append(cluster_queue(inv, name, quota))
    for lq in v.kueue_local_queues:
        out.append({"apiVersion": KUEUE_API, "kind": "LocalQueue", "metadata": meta(lq.name, lq.namespace, component="kueue"),
                    "spec": {"clusterQueue": lq.cluster_queue}})
    if v.kueue_quota_sync_enabled:
        out += quota_sync_controller(inv)
    return out


def releases(inv: Inventory) -> list[HelmRelease]:
    """The Kueue Helm chart (pinned) with gpufleet's controller configuration."""
    v = inv.role("kueue")
    if not (v.kueue_enabled and v.kueue_install):
        return []
    return [HelmRelease(
        name="kueue", namespace=v.kueue_namespace, chart=pin("kueue", "helm_chart"),
        version=pin("kueue", "helm_chart_version"),
        values={"managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(configuration(inv), sort_keys=False)}},
    )]


def quota_sync_controller(inv: Inventory) -> list[Obj]:
    """The ``gpufleet quota-sync`` controller: reads Nodes and Pods, patches ClusterQueues.

    Its settings go in one file, ConfigMap ``quota-sync-config`` (mounted read-only at
    ``/etc/gpufleet/config``, passed as ``--config``): :func:`roles.kueue.config.configuration`.
    """
    from gpufleet_admin.manifests import EVENT_RULE, LEASE_RULE, controller, rule

    v = inv.role("kueue")
    rules = [
        rule([""], ["nodes", "pods"], ["get", "list", "watch"]),
        rule(["kueue.x-k8s.io"], ["clusterqueues"], ["get", "list", "watch", "patch", "update"]),
        rule(["kueue.x-k8s.io"], ["workloads", "resourceflavors", "localqueues"], ["get", "list", "watch"]),
        # GPUs allocated through DRA: the devices and their taints count per GPU (gpufleet.quota_sync.devices).
        rule(["resource.k8s.io"], ["resourceslices", "devicetaintrules"], ["get", "list", "watch"]),
        LEASE_RULE, EVENT_RULE,
    ]
    return [namespace(v.kueue_quota_sync_namespace),
            *controller("quota-sync", v.kueue_quota_sync_namespace, ["quota-sync"], rules, fleet=inv.fleet,
                        config=dump(quota_sync.configuration(inv)))]

