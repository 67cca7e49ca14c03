"""Topology-aware placement on the local cluster: Kueue keeps a gang in one rack, or says why it cannot.

The local inventory's 16 kwok nodes are 2 blocks x 2 racks x 4 nodes, labelled
``gpufleet.io/block`` and ``gpufleet.io/rack``; the kueue role's Topology
(block, rack, hostname) and its ResourceFlavor pointing at it are created as
``pulumi up`` would. Jobs go through ``invoke train.submit`` (in-process);
pods bound outside Kueue ("fillers") take whole nodes to leave racks short.
"""

from __future__ import annotations

import uuid

import pytest

from gpufleet_workshop.tasks import fleet_status as st
from roles.registry import load

from .helpers import TEAM_NAMESPACE, busy_nodes, delete_job, fill, gpu_nodes_by, wait

pytestmark = pytest.mark.cluster

NS = TEAM_NAMESPACE
RACK, BLOCK = "gpufleet.io/rack", "gpufleet.io/block"


def pods_of(api, name: str) -> list[dict]:
    return api.list("v1", "pods", NS, labelSelector=f"gpufleet.io/job={name}")["items"]


def domains(api, pods, label: str) -> dict[str, int]:
    labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in api.list("v1", "nodes")["items"]}
    out: dict[str, int] = {}
    for p in pods:
        d = labels[p["spec"]["nodeName"]][label]
        out[d] = out.get(d, 0) + 1
    return out


def submit(train, name: str, nodes: int, *extra: str, timeout: int = 90):
    return train("submit", "--env", "local", "--template", "job", "--name", name, "--nodes", str(nodes),
                 "--queue", f"{NS}/pretrain", "--timeout", str(timeout), *extra)


def test_a_gang_stays_in_one_rack_or_waits_or_spreads_as_asked(local_cluster, train, scratch):
    api = local_cluster.kube
    fillers_ns, jobs = scratch
    racks = gpu_nodes_by(api, RACK)
    assert [len(v) for v in racks.values()] == [4, 4, 4, 4] and not busy_nodes(api), \
        f"the local cluster should have 4 idle nodes in each of 4 racks: {racks}, busy: {busy_nodes(api)}"

    # 1. Room everywhere: a 4-node gang that requires a rack gets one rack to itself.
    first = f"rack-{uuid.uuid4().hex[:5]}"
    jobs.append(first)
    code, out, err = submit(train, first, 4, "--topology", "rack", "--topology-mode", "required")
    assert code == 0, err
    (home,) = domains(api, pods_of(api, first), RACK)
    assert f"rack {home} (4)" in out
    wl = next(w for w in api.list("kueue.x-k8s.io/v1beta2", "workloads", NS)["items"]
              if w["metadata"]["ownerReferences"][0]["name"] == first)
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    assert psa["topologyAssignment"]["levels"][-1] == "kubernetes.io/hostname"

    # 2. Every other rack loses one node to pods outside Kueue: no rack has 4 free nodes.
    fill(api, fillers_ns, [nodes[0] for rack, nodes in racks.items() if rack != home])
    held = f"held-{uuid.uuid4().hex[:5]}"
    jobs.append(held)
    code, _, err = submit(train, held, 4, "--topology", "rack", "--topology-mode", "required", timeout=15)
    assert code == 1
    assert f"Job {NS}/{held} was not admitted by Kueue within 15 s" in err
    assert "QuotaReserved=False" in err and 'topology "gpu-fabric"' in err and "out of 4 pod(s)" in err, err
    assert pods_of(api, held) == []  # held whole: no pod exists

    # 3. The same gang, preferring a rack: Kueue spreads it over two racks of one block (the next level up).
    spread = f"spread-{uuid.uuid4().hex[:5]}"
    jobs.append(spread)
    code, out, err = submit(train, spread, 4, "--topology", "rack", "--topology-mode", "preferred")
    assert code == 0, err
    pods = pods_of(api, spread)
    assert len(domains(api, pods, RACK)) == 2 and len(domains(api, pods, BLOCK)) == 1, domains(api, pods, RACK)

    # invoke status: GPUs per domain, and the spread gang is the one across racks.
    status = st.gather(api, load("local"))
    assert [g.gang for g in status.spanning] == [f"{NS}/{spread}"]
    home_row = next(r for r in status.domains if (r.level, r.domain) == ("rack", home))
    assert (home_row.training, home_row.free) == (32, 0)

    # 4. Room appears (the first gang ends): the held gang is admitted, whole, into that rack.
    delete_job(api, NS, first)
    jobs.remove(first)
    pods = wait("the held gang running", lambda: (ps := pods_of(api, held)) and len(ps) == 4 and all(
        p["status"].get("phase") == "Running" for p in ps) and ps, timeout=90)
    assert domains(api, pods, RACK) == {home: 4}

