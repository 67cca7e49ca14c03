"""``invoke train.submit`` against the local cluster: Kueue admits a rendered job as a gang and its
pods run on kwok GPU nodes; a job larger than the quota stays pending and the task exits 1 with
Kueue's reason.

The kueue role's objects for the ``local`` inventory (team namespaces, PriorityClasses,
WorkloadPriorityClasses, the ResourceFlavor, ClusterQueues split 3:1 in one cohort, LocalQueues)
are created first when absent, as ``pulumi up`` would, and left in place; the jobs are deleted.
"""

from __future__ import annotations

import uuid

import pytest

from gpufleet.kube import NotFound

from .helpers import wait

pytestmark = pytest.mark.cluster

KUEUE = "kueue.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def queues(local_cluster, local_queues):
    """The local inventory's Kueue objects present (see ``local_queues``)."""
    return local_queues


@pytest.fixture
def cleanup(local_cluster):
    """Delete the jobs a test submitted: ``cleanup.append((plural, namespace, name))``."""
    jobs: list[tuple[str, str, str]] = []
    yield jobs
    api = local_cluster.kube
    for plural, ns, name in jobs:
        try:
            if plural == "jobsets":
                api.delete("jobset.x-k8s.io/v1alpha2", "jobsets", name, ns, propagation="Background")
            else:
                api.delete("batch/v1", "jobs", name, ns, propagation="Background")
                api.delete("v1", "services", name, ns)
        except NotFound:
            pass
        wait(f"pods of {name} gone", lambda: not api.list("v1", "pods", ns, labelSelector=f"gpufleet.io/job={name}")["items"],
             timeout=60)


def _workload(api, ns: str, kind: str, name: str) -> dict:
    items = api.list(KUEUE, "workloads", ns)["items"]
    return next(w for w in items
                if any(r["kind"] == kind and r["name"] == name for r in w["metadata"].get("ownerReferences", [])))


@pytest.mark.parametrize(("template", "kind", "plural"), [("jobset", "JobSet", "jobsets"), ("job", "Job", "jobs")])
def test_rendered_job_is_admitted_as_a_gang_and_runs_on_gpu_nodes(local_cluster, queues, train, cleanup,
                                                                  template, kind, plural):
    name = f"train-{uuid.uuid4().hex[:6]}"
    cleanup.append((plural, "team-pretrain", name))
    code, out, err = train("submit", "--env", "local", "--template", template, "--name", name, "--nodes", "2",
                           "--queue", "team-pretrain/pretrain", "--set", "simulated_duration_seconds=600",
                           "--timeout", "120")
    assert code == 0, err
    assert f"{kind} team-pretrain/{name}: Workload" in out and "admitted; 2 pods running" in out

    api = local_cluster.kube
    wl = _workload(api, "team-pretrain", kind, name)
    conds = {c["type"]: c["status"] for c in wl["status"]["conditions"]}
    assert conds["QuotaReserved"] == conds["Admitted"] == "True"
    # One pod set of 2 pods, admitted together on the inventory's flavor.
    assert [ps["count"] for ps in wl["spec"]["podSets"]] == [2]
    (assignment,) = wl["status"]["admission"]["podSetAssignments"]
    assert assignment["count"] == 2
    assert assignment["flavors"]["nvidia.com/gpu"] == "h100-sxm-80gb"
    # Queue order from the WorkloadPriorityClass label (the inventory's lowest by default).
    assert wl["spec"]["priorityClassRef"]["name"] == "training-research"
    assert wl["spec"]["priority"] == 100

    pods = api.list("v1", "pods", "team-pretrain", labelSelector=f"gpufleet.io/job={name}")["items"]
    assert len(pods) == 2 and {p["status"]["phase"] for p in pods} == {"Running"}
    gpu_nodes = {n["metadata"]["name"]: n for n in api.list("v1", "nodes", labelSelector="type=kwok")["items"]}
    for pod in pods:
        node = gpu_nodes[pod["spec"]["nodeName"]]  # a kwok node
        assert node["metadata"]["labels"]["gpufleet.io/flavor"] == "h100-sxm-80gb"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert pod["spec"]["priorityClassName"] == "gpufleet-training"
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert len({p["spec"]["nodeName"] for p in pods}) == 2  # one pod per node


def test_job_too_big_for_the_quota_stays_pending_with_the_reason(local_cluster, queues, train, cleanup):
    # The local inventory's cohort holds 16 nodes x 8 GPUs = 128 GPUs; 17 nodes (136 GPUs) never fit.
    # --fleet-nodes 32 lets the renderer size a job beyond the 16-node fleet the quota was built from.
    name = f"too-big-{uuid.uuid4().hex[:6]}"
    cleanup.append(("jobsets", "team-pretrain", name))
    code, _, err = train("submit", "--env", "local", "--template", "jobset", "--name", name, "--nodes", "17",
                         "--fleet-nodes", "32", "--queue", "team-pretrain/pretrain", "--timeout", "10")
    assert code == 1
    assert f"JobSet team-pretrain/{name} was not admitted by Kueue within 10 s" in err
    assert "QuotaReserved=False" in err and "nvidia.com/gpu" in err
    assert "still queued" in err

    # Still pending afterwards: suspended, no pod created (all or nothing).
    api = local_cluster.kube
    js = api.get("jobset.x-k8s.io/v1alpha2", "jobsets", name, "team-pretrain")
    assert js["spec"]["suspend"] is True
    assert api.list("v1", "pods", "team-pretrain", labelSelector=f"gpufleet.io/job={name}")["items"] == []
