"""Kubernetes' own gang scheduling on the local cluster (1.35: ``scheduling.k8s.io/v1alpha1`` Workload).

The local control plane enables GenericWorkload and GangScheduling on the API
server and the scheduler, and serves ``scheduling.k8s.io/v1alpha1``
(:mod:`gpufleet_workshop.local.controlplane`). ``invoke train.submit --gang native``
finds that version by API discovery, creates the Job, then the Workload
(owned by the Job); the scheduler holds every pod until all of them fit,
then binds them together. ``--gang both`` queues the same job through Kueue
first: Kueue's quota (and topology) admits the gang, the scheduler binds it whole.
"""

from __future__ import annotations

import uuid

import pytest

from gpufleet.kube.times import parse_time
from gpufleet_admin.training import gang as native

from .helpers import TEAM_NAMESPACE, busy_nodes, fill, gpu_nodes_by, wait

pytestmark = pytest.mark.cluster

NS = TEAM_NAMESPACE


def pods_of(api, name: str) -> list[dict]:
    """The job's pods (JSON, as the API server answers)."""
    return api.list("v1", "pods", NS, labelSelector=f"gpufleet.io/job={name}")["items"]


def bound_at(pod: dict) -> float:
    """When the pod was bound (its PodScheduled condition's lastTransitionTime), seconds since the epoch."""
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    return parse_time(cond["lastTransitionTime"])


def test_the_cluster_serves_the_1_35_shape(local_cluster):
    served = native.discover(local_cluster.kube)
    assert "workloads" in served["v1alpha1"]
    assert native.choose(served).version == "v1alpha1"


def test_a_gang_that_does_not_fit_stays_unbound_then_binds_at_once(local_cluster, train, scratch):
    api = local_cluster.kube
    fillers_ns, jobs = scratch
    nodes = [n for ns in gpu_nodes_by(api, "gpufleet.io/rack").values() for n in ns]
    assert len(nodes) == 16 and not busy_nodes(api), f"GPU pods left on {busy_nodes(api)}"
    fillers = fill(api, fillers_ns, nodes[:13])  # 3 nodes free for a gang of 4

    name = f"gang-{uuid.uuid4().hex[:5]}"
    jobs.append(name)
    code, _, err = train("submit", "--env", "local", "--template", "job", "--name", name, "--nodes", "4",
                         "--gang", "native", "--topology", "none", "--timeout", "15")
    assert code == 1
    assert f"Job {NS}/{name} has 0/4 pods running (native gang: the scheduler binds all or none)" in err
    pods = pods_of(api, name)
    assert len(pods) == 4 and not [p for p in pods if p["spec"].get("nodeName")], "a pod of the gang was bound alone"
    assert all(p["spec"]["workloadRef"] == {"name": name, "podGroup": "workers"} for p in pods)
    wl = api.get("scheduling.k8s.io/v1alpha1", "workloads", name, NS)
    assert wl["spec"]["podGroups"] == [{"name": "workers", "policy": {"gang": {"minCount": 4}}}]
    assert wl["metadata"]["ownerReferences"][0]["kind"] == "Job"  # goes with the Job

    # Room for the whole gang: one filler goes, and all four pods bind together.
    api.delete("v1", "pods", fillers[0], fillers_ns, grace_seconds=0)
    pods = wait("the gang bound", lambda: (ps := pods_of(api, name)) and all(
        p["spec"].get("nodeName") for p in ps) and ps, timeout=120)
    bound = sorted(bound_at(p) for p in pods)
    assert bound[-1] - bound[0] <= 2, bound  # one decision, not four
    assert len({p["spec"]["nodeName"] for p in pods}) == 4


def test_both_kueue_quota_and_the_schedulers_gang_agree(local_cluster, train, scratch):
    api = local_cluster.kube
    _, jobs = scratch
    assert not busy_nodes(api), f"GPU pods left on {busy_nodes(api)}"
    name = f"both-{uuid.uuid4().hex[:5]}"
    jobs.append(name)
    code, out, err = train("submit", "--env", "local", "--template", "job", "--name", name, "--nodes", "4",
                           "--queue", f"{NS}/pretrain", "--gang", "both", "--timeout", "90")
    assert code == 0, err
    assert "Workload" in out and "admitted; 4 pods running" in out
    pods = pods_of(api, name)
    assert len(pods) == 4 and all(p["spec"]["workloadRef"]["name"] == name for p in pods)

    # Beyond the queue's quota (96 GPUs of the training queue plus the research queue's 32 lent through
    # the cohort, 32 in use): Kueue holds the whole gang and the scheduler never sees a pod of it.
    big = f"big-{uuid.uuid4().hex[:5]}"
    jobs.append(big)
    code, _, err = train("submit", "--env", "local", "--template", "job", "--name", big, "--nodes", "13",
                         "--queue", f"{NS}/pretrain", "--gang", "both", "--timeout", "10")
    assert code == 1 and "was not admitted by Kueue" in err and "QuotaReserved=False" in err
    assert pods_of(api, big) == []
    wl = api.get("scheduling.k8s.io/v1alpha1", "workloads", big, NS)
    assert wl["spec"]["podGroups"][0]["policy"]["gang"]["minCount"] == 13
