"""Kueue on the local cluster: quota holds a JobSet gang suspended; more quota admits it whole.

Also checks the webhooks are really reached (Kueue's Job webhook suspends
a queued Job on create) and that simulated training pods finish after
their ``gpufleet.io/simulated-duration-seconds``.
"""

from __future__ import annotations

import time
import uuid

import pytest
from kubernetes import client

from .helpers import wait

pytestmark = pytest.mark.cluster

KUEUE = ("kueue.x-k8s.io", "v1beta2")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
FLAVOR_LABEL = ("gpufleet.io/flavor", "h100-sxm-80gb")



@pytest.fixture
def queue(local_cluster):
    """A namespace with a LocalQueue on a fresh ClusterQueue of 8 GPUs (one node's worth)."""
    api = local_cluster.api_client
    co = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    suffix = uuid.uuid4().hex[:6]
    ns, flavor, cq, lq = f"gang-{suffix}", f"h100-{suffix}", f"cq-{suffix}", "research"
    core.create_namespace({"metadata": {"name": ns}})
    co.create_cluster_custom_object(*KUEUE, "resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor},
        "spec": {
            "nodeLabels": {FLAVOR_LABEL[0]: FLAVOR_LABEL[1]},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    })
    co.create_cluster_custom_object(*KUEUE, "clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": flavor, "resources": [
                    {"name": "cpu", "nominalQuota": "1000"},
                    {"name": "memory", "nominalQuota": "10Ti"},
                    {"name": "nvidia.com/gpu", "nominalQuota": "8"},
                ]}],
            }],
        },
    })
    co.create_namespaced_custom_object(*KUEUE, ns, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": lq, "namespace": ns},
        "spec": {"clusterQueue": cq},
    })
    wait("ClusterQueue active", lambda: any(
        c["type"] == "Active" and c["status"] == "True"
        for c in co.get_cluster_custom_object(*KUEUE, "clusterqueues", cq).get("status", {}).get("conditions", [])
    ))
    yield {"ns": ns, "cq": cq, "lq": lq, "flavor": flavor}
    core.delete_namespace(ns)
    wait("namespace gone", lambda: ns not in {n.metadata.name for n in core.list_namespace().items}, timeout=60)
    co.delete_cluster_custom_object(*KUEUE, "clusterqueues", cq)
    co.delete_cluster_custom_object(*KUEUE, "resourceflavors", flavor)


def jobset(name: str, queue: str, replicas: int, duration_s: int | None = None) -> dict:
    """A JobSet of ``replicas`` one-pod Jobs, each pod asking for a whole 8-GPU node."""
    annotations = {"gpufleet.io/simulated-duration-seconds": str(duration_s)} if duration_s else {}
    pod = {
        "metadata": {"annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "trainer", "image": "registry.invalid/trainer:1",
                "resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "8", "memory": "64Gi"},
                              "limits": {"nvidia.com/gpu": "8"}},
            }],
        },
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"replicatedJobs": [{
            "name": "workers", "replicas": replicas,
            "template": {"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": pod}},
        }]},
    }


def test_jobset_gang_waits_for_quota_then_runs_whole(local_cluster, queue):
    co = client.CustomObjectsApi(local_cluster.api_client)
    core = client.CoreV1Api(local_cluster.api_client)
    ns = queue["ns"]
    co.create_namespaced_custom_object(*JOBSET, ns, "jobsets", jobset("gang", queue["lq"], replicas=2, duration_s=20))

    # Short quota (8 GPUs for a 16-GPU gang): Kueue keeps the whole JobSet suspended, no pod exists.
    wl = wait("a Workload for the JobSet", lambda: co.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"])[0]
    time.sleep(3)
    js = co.get_namespaced_custom_object(*JOBSET, ns, "jobsets", "gang")
    assert js["spec"].get("suspend") is True
    wl = co.get_namespaced_custom_object(*KUEUE, ns, "workloads", wl["metadata"]["name"])
    assert not any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in wl.get("status", {}).get("conditions", []))
    assert core.list_namespaced_pod(ns).items == []

    # Raise the quota: the gang is admitted as a whole and both pods run on simulated GPU nodes.
    co.patch_cluster_custom_object(*KUEUE, "clusterqueues", queue["cq"], {"spec": {"resourceGroups": [{
        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
        "flavors": [{"name": queue["flavor"], "resources": [
            {"name": "cpu", "nominalQuota": "1000"},
            {"name": "memory", "nominalQuota": "10Ti"},
            {"name": "nvidia.com/gpu", "nominalQuota": "16"},
        ]}],
    }]}})
    running = wait("2 pods Running", lambda: [
        p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"
    ] if len([p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"]) == 2 else None, timeout=90)
    nodes = {n.metadata.name: n for n in core.list_node(label_selector="type=kwok").items}
    for pod in running:
        node = nodes[pod.spec.node_name]
        assert node.metadata.labels[FLAVOR_LABEL[0]] == FLAVOR_LABEL[1]
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert pod.status.pod_ip
    assert len({p.spec.node_name for p in running}) == 2
    js = co.get_namespaced_custom_object(*JOBSET, ns, "jobsets", "gang")
    assert js["spec"].get("suspend") is False
    wl = co.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"][0]
    conds = {c["type"]: c["status"] for c in wl["status"]["conditions"]}
    assert conds.get("Admitted") == "True"

    # The simulated run ends after its duration: pods Succeed and the JobSet completes.
    wait("JobSet Completed", lambda: any(
        c["type"] == "Completed" and c["status"] == "True"
        for c in co.get_namespaced_custom_object(*JOBSET, ns, "jobsets", "gang").get("status", {}).get("conditions", [])
    ), timeout=90)
    assert {p.status.phase for p in core.list_namespaced_pod(ns).items} == {"Succeeded"}


def test_kueue_job_webhook_suspends_queued_job(local_cluster, queue):
    """Kueue's mutating webhook (reached at 127.0.0.1) suspends a queued Job on create."""
    batch = client.BatchV1Api(local_cluster.api_client)
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "queued", "labels": {"kueue.x-k8s.io/queue-name": queue["lq"]}},
        "spec": {"suspend": False, "completionMode": "Indexed", "parallelism": 4, "completions": 4, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "registry.invalid/x:1",
                            "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}],
        }}},
    }
    created = batch.create_namespaced_job(queue["ns"], job)
    assert created.spec.suspend is True  # 32 GPUs asked, 8 in quota: stays suspended
    time.sleep(3)
    assert batch.read_namespaced_job("queued", queue["ns"]).spec.suspend is True


def test_jobset_webhook_rejects_invalid_jobset(local_cluster, queue):
    """JobSet's validating webhook (reached at 127.0.0.1) rejects a bad JobSet."""
    co = client.CustomObjectsApi(local_cluster.api_client)
    bad = jobset("bad", queue["lq"], replicas=1)
    bad["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["no-such-job"]}
    with pytest.raises(client.ApiException) as err:
        co.create_namespaced_custom_object(*JOBSET, queue["ns"], "jobsets", bad)
    assert "does not appear in .spec.ReplicatedJobs" in err.value.body  # the webhook's own check
