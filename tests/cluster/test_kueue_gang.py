"""Kueue on the local cluster: quota holds a JobSet gang suspended; more quota admits it whole.

Also checks the webhooks are really reached (Kueue's Job webhook suspends
a queued Job on create) and that simulated training pods finish after
their ``gpufleet.io/simulated-duration-seconds``.
"""

from __future__ import annotations

import time
import uuid

import pytest

from gpufleet.kube import KubeError

from .helpers import wait

pytestmark = pytest.mark.cluster

KUEUE = "kueue.x-k8s.io/v1beta2"
JOBSET = "jobset.x-k8s.io/v1alpha2"
FLAVOR_LABEL = ("gpufleet.io/flavor", "h100-sxm-80gb")


@pytest.fixture
def queue(local_cluster):
    """A namespace with a LocalQueue on a fresh ClusterQueue of 8 GPUs (one node's worth)."""
    api = local_cluster.kube
    suffix = uuid.uuid4().hex[:6]
    ns, flavor, cq, lq = f"gang-{suffix}", f"h100-{suffix}", f"cq-{suffix}", "research"
    api.create("v1", "namespaces", {"metadata": {"name": ns}})
    api.create(KUEUE, "resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor},
        "spec": {
            "nodeLabels": {FLAVOR_LABEL[0]: FLAVOR_LABEL[1]},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    })
    api.create(KUEUE, "clusterqueues", {
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
    api.create(KUEUE, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": lq, "namespace": ns},
        "spec": {"clusterQueue": cq},
    }, ns)
    wait("ClusterQueue active", lambda: any(
        c["type"] == "Active" and c["status"] == "True"
        for c in api.get(KUEUE, "clusterqueues", cq).get("status", {}).get("conditions", [])
    ))
    yield {"ns": ns, "cq": cq, "lq": lq, "flavor": flavor}
    api.delete("v1", "namespaces", ns)
    wait("namespace gone", lambda: api.get_or_none("v1", "namespaces", ns) is None, timeout=60)
    api.delete(KUEUE, "clusterqueues", cq)
    api.delete(KUEUE, "resourceflavors", flavor)


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
    api = local_cluster.kube
    ns = queue["ns"]
    pods = lambda: api.list("v1", "pods", ns)["items"]  # noqa: E731
    api.create(JOBSET, "jobsets", jobset("gang", queue["lq"], replicas=2, duration_s=20), ns)

    # Short quota (8 GPUs for a 16-GPU gang): Kueue keeps the whole JobSet suspended, no pod exists.
    wl = wait("a Workload for the JobSet", lambda: api.list(KUEUE, "workloads", ns)["items"])[0]
    time.sleep(3)
    js = api.get(JOBSET, "jobsets", "gang", ns)
    assert js["spec"].get("suspend") is True
    wl = api.get(KUEUE, "workloads", wl["metadata"]["name"], ns)
    assert not any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in wl.get("status", {}).get("conditions", []))
    assert pods() == []

    # Raise the quota: the gang is admitted as a whole and both pods run on simulated GPU nodes.
    api.patch(KUEUE, "clusterqueues", queue["cq"], {"spec": {"resourceGroups": [{
        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
        "flavors": [{"name": queue["flavor"], "resources": [
            {"name": "cpu", "nominalQuota": "1000"},
            {"name": "memory", "nominalQuota": "10Ti"},
            {"name": "nvidia.com/gpu", "nominalQuota": "16"},
        ]}],
    }]}})
    running = wait("2 pods Running", lambda: (up := [p for p in pods() if p["status"].get("phase") == "Running"])
                   and len(up) == 2 and up, timeout=90)
    nodes = {n["metadata"]["name"]: n for n in api.list("v1", "nodes", labelSelector="type=kwok")["items"]}
    for pod in running:
        node = nodes[pod["spec"]["nodeName"]]
        assert node["metadata"]["labels"][FLAVOR_LABEL[0]] == FLAVOR_LABEL[1]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert pod["status"].get("podIP")
    assert len({p["spec"]["nodeName"] for p in running}) == 2
    js = api.get(JOBSET, "jobsets", "gang", ns)
    assert js["spec"].get("suspend") is False
    wl = api.list(KUEUE, "workloads", ns)["items"][0]
    conds = {c["type"]: c["status"] for c in wl["status"]["conditions"]}
    assert conds.get("Admitted") == "True"

    # The simulated run ends after its duration: pods Succeed and the JobSet completes.
    wait("JobSet Completed", lambda: any(
        c["type"] == "Completed" and c["status"] == "True"
        for c in api.get(JOBSET, "jobsets", "gang", ns).get("status", {}).get("conditions", [])
    ), timeout=90)
    assert {p["status"]["phase"] for p in pods()} == {"Succeeded"}


def test_kueue_job_webhook_suspends_queued_job(local_cluster, queue):
    """Kueue's mutating webhook (reached at 127.0.0.1) suspends a queued Job on create."""
    api = local_cluster.kube
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "queued", "labels": {"kueue.x-k8s.io/queue-name": queue["lq"]}},
        "spec": {"suspend": False, "completionMode": "Indexed", "parallelism": 4, "completions": 4, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "registry.invalid/x:1",
                            "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}],
        }}},
    }
    created = api.create("batch/v1", "jobs", job, queue["ns"])
    assert created["spec"]["suspend"] is True  # 32 GPUs asked, 8 in quota: stays suspended
    time.sleep(3)
    assert api.get("batch/v1", "jobs", "queued", queue["ns"])["spec"]["suspend"] is True


def test_jobset_webhook_rejects_invalid_jobset(local_cluster, queue):
    """JobSet's validating webhook (reached at 127.0.0.1) rejects a bad JobSet."""
    bad = jobset("bad", queue["lq"], replicas=1)
    bad["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["no-such-job"]}
    with pytest.raises(KubeError) as err:
        local_cluster.kube.create(JOBSET, "jobsets", bad, queue["ns"])
    assert "does not appear in .spec.ReplicatedJobs" in err.value.message  # the webhook's own check
