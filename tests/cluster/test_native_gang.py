"""Kubernetes' own gang scheduling on the local cluster (1.37: ``scheduling.k8s.io/v1beta1`` Workload and PodGroup).

The local control plane serves the pinned release's most stable shape
(:func:`gpufleet_workshop.local.controlplane.gang_shape`: on 1.37 GenericWorkload
on the API server, controller manager and scheduler, and
``scheduling.k8s.io/v1beta1``). ``invoke train.submit --gang native`` finds that
version by API discovery, creates the Job, then the Workload and the PodGroup
(owned by the Job); the scheduler holds every pod until all of them fit,
then binds them together. ``--gang both`` queues the same job through Kueue
first: Kueue's quota (and topology) admits the gang, the scheduler binds it whole.
"""

from __future__ import annotations

import uuid

import pytest

from gpufleet.kube.times import parse_time
from gpufleet_admin.training import gang as native
from gpufleet_workshop.local.controlplane import gang_shape

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


SHAPE = gang_shape()


def gang_of(api, name: str) -> tuple[dict, dict | None]:
    """The job's Workload and its PodGroup (None where the shape has none)."""
    wl = api.get(SHAPE.api_version, "workloads", name, NS)
    pg = api.get(SHAPE.api_version, "podgroups", native.pod_group_name(name), NS) if SHAPE.pod_group_object else None
    return wl, pg


def min_count(wl: dict, pg: dict | None) -> int:
    """The gang's minCount as the cluster stored it (the PodGroup's where there is one)."""
    if pg is not None:
        return pg["spec"]["schedulingPolicy"]["gang"]["minCount"]
    return wl["spec"]["podGroups"][0]["policy"]["gang"]["minCount"]


def in_gang(pod: dict, name: str) -> bool:
    """Whether ``pod`` names the job's gang in the shape's pod field."""
    return pod["spec"].get(SHAPE.pod_field) == native.pod_reference(SHAPE, name)[1]


def test_the_cluster_serves_the_pinned_releases_shape(local_cluster):
    served = native.discover(local_cluster.kube)
    assert {"workloads", "podgroups"} <= served["v1beta1"]
    assert "v1alpha2" not in served  # 1.37 dropped it (alpha objects are never converted)
    assert native.choose(served) == SHAPE and SHAPE.version == "v1beta1"


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
    assert all(in_gang(p, name) for p in pods)
    wl, pg = gang_of(api, name)
    assert min_count(wl, pg) == 4
    assert pg["spec"]["workloadRef"] == {"workloadName": name, "templateName": "workers"}
    # The group's priority, resolved by admission, is its pods' (else the 1.37 scheduler never binds them).
    assert pg["spec"]["priority"] == pods[0]["spec"]["priority"] == 100000
    for obj in (wl, pg):
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "Job"  # goes with the Job

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
    assert len(pods) == 4 and all(in_gang(p, name) for p in pods)

    # Beyond the queue's quota (96 GPUs of the training queue plus the research queue's 32 lent through
    # the cohort, 32 in use): Kueue holds the whole gang and the scheduler never sees a pod of it.
    big = f"big-{uuid.uuid4().hex[:5]}"
    jobs.append(big)
    code, _, err = train("submit", "--env", "local", "--template", "job", "--name", big, "--nodes", "13",
                         "--queue", f"{NS}/pretrain", "--gang", "both", "--timeout", "10")
    assert code == 1 and "was not admitted by Kueue" in err and "QuotaReserved=False" in err
    assert pods_of(api, big) == []
    assert min_count(*gang_of(api, big)) == 13
