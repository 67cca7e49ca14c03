"""Builders of Node, Pod, ClusterQueue and Workload dicts (API JSON shapes) for the pure tests."""

from __future__ import annotations

from typing import Any

FLAVOR = "h100-sxm-80gb"


def node(name: str, *, gpus: int = 8, flavor: str | None = FLAVOR, ready: bool = True, cordoned: bool = False,
         taints: list[dict[str, str]] | None = None, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node dict as the API returns it."""
    lab = {"kubernetes.io/hostname": name, **({"gpufleet.io/flavor": flavor} if flavor else {}), **(labels or {})}
    spec: dict[str, Any] = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] + (taints or [])}
    if cordoned:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": lab, "annotations": dict(annotations or {}), "resourceVersion": "1"},
            "spec": spec,
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "224", "memory": "2Ti"},
                       "capacity": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name: str, node_name: str | None, *, gpus: int = 0, ns: str = "default", owner: str | None = "ReplicaSet",
        phase: str = "Running", priority_class: str | None = None, labels: dict[str, str] | None = None,
        cpu: str | None = None, memory: str | None = None, priority: int | None = None) -> dict[str, Any]:
    """A Pod dict (one container requesting ``gpus``, ``cpu`` and ``memory`` where given)."""
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": dict(labels or {})}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "x", "controller": True, "uid": "o"}]
    requests = {k: v for k, v in (("nvidia.com/gpu", str(gpus) if gpus else None), ("cpu", cpu), ("memory", memory)) if v}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests} if requests else {}}]}
    if priority is not None:
        spec["priority"] = priority
    if node_name:
        spec["nodeName"] = node_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def cluster_queue(name: str, gpu: int | str, *, flavor: str = FLAVOR, cohort: str | None = "gpufleet",
                  reserved: int | None = None, borrowing_limit: int | None = None) -> dict[str, Any]:
    """A ClusterQueue dict with one resource group (cpu, memory, GPUs)."""
    gpu_res: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": str(gpu)}
    if borrowing_limit is not None:
        gpu_res["borrowingLimit"] = str(borrowing_limit)
    spec: dict[str, Any] = {"resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
        {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "1000"}, {"name": "memory", "nominalQuota": "10Ti"},
                                       gpu_res]}]}]}
    if cohort:
        spec["cohortName"] = cohort
    status: dict[str, Any] = {}
    if reserved is not None:
        status["flavorsReservation"] = [{"name": flavor, "resources": [{"name": "nvidia.com/gpu", "total": str(reserved)}]}]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name, "resourceVersion": "7"}, "spec": spec, "status": status}


def workload(name: str, queue: str, *, pods: int, gpus_per_pod: int = 8, ns: str = "team-pretrain",
             admitted_cq: str | None = None, flavor: str = FLAVOR) -> dict[str, Any]:
    """A Workload dict: pending, or admitted to ``admitted_cq``."""
    wl: dict[str, Any] = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": name, "namespace": ns},
                          "spec": {"queueName": queue, "podSets": [{"name": "workers", "count": pods, "template": {"spec": {
                              "containers": [{"name": "t", "resources": {"requests": {"nvidia.com/gpu": str(gpus_per_pod)}}}]}}}]},
                          "status": {"conditions": []}}
    if admitted_cq:
        wl["status"] = {"conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
                        "admission": {"clusterQueue": admitted_cq, "podSetAssignments": [
                            {"name": "workers", "flavors": {"nvidia.com/gpu": flavor}}]}}
    return wl


def local_queue(ns: str, name: str, cq: str) -> dict[str, Any]:
    """A LocalQueue dict."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"namespace": ns, "name": name},
            "spec": {"clusterQueue": cq}}


