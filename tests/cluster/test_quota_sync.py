"""Quota sync on the local cluster: quota follows nodes leaving and returning, gangs, drift, conflicts, bad input.

Uses the local inventory's Kueue objects (ResourceFlavor h100-sxm-80gb,
ClusterQueues training (share 3) and research (share 1) in cohort gpufleet,
LocalQueues team-pretrain/pretrain and team-research/research), created
here when absent and removed after. Every node change is undone at the end
of each test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from gpufleet.kube import KubeError
from gpufleet.kube.events import events_for
from gpufleet.kube.retry import update_with_retry
from gpufleet.names import SWAP_TAINT
from gpufleet.ops.reads import OpsError, ensure_namespace, list_nodes
from gpufleet.paths import REPO_ROOT
from gpufleet.quota_sync import resync as rs
from gpufleet.quota_sync.controller import QuotaSync

from .helpers import wait

pytestmark = pytest.mark.cluster

KUEUE = "kueue.x-k8s.io/v1beta2"
JOBSET = "jobset.x-k8s.io/v1alpha2"
FLAVOR = "h100-sxm-80gb"
GPU = "nvidia.com/gpu"


def quota(inv, **changes):
    """Quota sync's configuration for ``inv`` as the kueue role builds it, with ``changes`` (the loop's timings)."""
    from roles.kueue.config import configuration

    return configuration(inv).model_copy(update=changes)


@pytest.fixture(scope="module")
def kueue_stack(local_cluster, local_queues):
    """The local inventory, its Kueue objects present (see ``local_queues``).

    At module end the quotas are resynced to the nodes as the tests left them.
    """
    yield local_queues
    api = local_cluster.kube
    rs.apply(api, rs.compute(api, quota(local_queues)), allow_zero=True, events=False)


@pytest.fixture
def nodes(local_cluster):
    """Names of the 16 simulated nodes, all schedulable; restores every node's taints and cordon after the test."""
    from gpufleet.fleet import nodes as nodeutil

    api = local_cluster.kube
    before = {n["metadata"]["name"]: n for n in list_nodes(api, "gpufleet.io/simulated=true")}
    left_out = {k: nodeutil.out_reasons(n) for k, n in before.items() if nodeutil.out_reasons(n)}
    assert len(before) == 16 and not left_out, f"the local cluster should have 16 schedulable nodes; out: {left_out}"
    yield sorted(before)
    for name, n in before.items():
        def change(obj, n=n):
            want = {"spec": {"taints": n["spec"].get("taints"), "unschedulable": n["spec"].get("unschedulable")}}
            have = {"spec": {"taints": obj["spec"].get("taints"), "unschedulable": obj["spec"].get("unschedulable")}}
            return want if want != have else None
        update_with_retry(api, f"/api/v1/nodes/{name}", change)


def take_out(api, names, value="test"):
    """Taint ``names`` gpufleet.io/swap (what a swap does to capacity, without draining)."""
    for name in names:
        update_with_retry(api, f"/api/v1/nodes/{name}", lambda obj: {"spec": {"taints": (obj["spec"].get("taints") or [])
                                                                                   + [{"key": SWAP_TAINT, "value": value, "effect": "NoSchedule"}]}})


def put_back(api, names):
    """Remove the taint :func:`take_out` added."""
    for name in names:
        update_with_retry(api, f"/api/v1/nodes/{name}", lambda obj: {"spec": {"taints": [
            t for t in obj["spec"].get("taints") or [] if t["key"] != SWAP_TAINT] or None}})


def gpu_quota(api) -> dict[str, int]:
    out = {}
    for q in ("training", "research"):
        cq = api.request("GET", f"{rs.CQ_PATH}/{q}")
        out[q] = int(rs.quota_of(cq, FLAVOR)["nominal"])
    return out


def schedulable_gpus(api) -> int:
    from gpufleet.fleet.capacity import flavor_capacity

    return flavor_capacity(list_nodes(api))[FLAVOR].schedulable_gpus


def jobset(name: str, queue: str, pods: int, duration_s: int = 600) -> dict:
    """A JobSet gang of ``pods`` one-pod Jobs, each asking for a whole 8-GPU node."""
    pod = {"metadata": {"annotations": {"gpufleet.io/simulated-duration-seconds": str(duration_s)}},
           "spec": {"restartPolicy": "Never",
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "trainer", "image": "registry.invalid/trainer:1",
                                    "resources": {"requests": {GPU: "8", "cpu": "8", "memory": "64Gi"}, "limits": {GPU: "8"}}}]}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": pods, "template": {"spec": {
                "parallelism": 1, "completions": 1, "backoffLimit": 0, "template": pod}}}]}}


def workload_of(api, ns: str, jobset_name: str):
    items = api.list(KUEUE, "workloads", ns)["items"]
    return next((w for w in items if any(o.get("name") == jobset_name for o in w["metadata"].get("ownerReferences", []))), None)


def conds(wl) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (wl or {}).get("status", {}).get("conditions", [])}


@pytest.fixture
def jobsets(local_cluster):
    """Delete the JobSets a test created in team-pretrain (list of names to fill)."""
    names: list[str] = []
    yield names
    api = local_cluster.kube
    for n in names:
        try:
            api.delete(JOBSET, "jobsets", n, "team-pretrain", propagation="Foreground")
        except KubeError:
            pass
    wait("test pods gone", lambda: not [p for p in api.list("v1", "pods", "team-pretrain")["items"]
                                       if (p["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name")
                                       in names], timeout=90)


def test_quota_follows_nodes_leaving_and_returning(local_cluster, kueue_stack, nodes):
    api = local_cluster.kube
    rs.apply(api, rs.compute(api, quota(kueue_stack)))
    assert gpu_quota(api) == {"training": 96, "research": 32}

    sync = QuotaSync(api, quota(kueue_stack, debounce_seconds=0.5, resync_seconds=3600))
    stop = threading.Event()
    runner = threading.Thread(target=sync.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait("node cache synced", sync.cache.synced.is_set)
        out = nodes[:7]
        t0 = time.monotonic()
        take_out(api, out[:5])
        update_with_retry(api, f"/api/v1/nodes/{out[5]}", lambda o: {"spec": {"unschedulable": True}})
        update_with_retry(api, f"/api/v1/nodes/{out[6]}", lambda o: {"spec": {"taints": (o["spec"].get("taints") or [])
                               + [{"key": "gpufleet.io/degraded", "value": "ib_errors", "effect": "NoSchedule"}]}})
        # 9 nodes left: 72 GPUs, training 54 and research 18 (shares 3:1)
        wait("quota to follow 7 nodes out", lambda: gpu_quota(api) == {"training": 54, "research": 18}, timeout=30)
        converged = time.monotonic() - t0
        real = schedulable_gpus(api)
        assert real == 72
        assert all(v <= real for v in gpu_quota(api).values()) and sum(gpu_quota(api).values()) <= real
        assert converged < 10, f"converged in {converged:.1f}s"
        assert sync.registry.get_sample_value("gpufleet_quota_nominal_gpus", {"cluster_queue": "training", "flavor": FLAVOR}) == 54
        assert sync.registry.get_sample_value("gpufleet_quota_schedulable_gpus", {"flavor": FLAVOR}) == 72

        # `pulumi up` force-applies the queue as the kueue role declares it (full-fleet quotas) ...
        from roles.kueue.manifests import objects

        declared = next(o for o in objects(kueue_stack) if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "training")
        assert declared["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
        applied = api.apply(declared, field_manager="pulumi-kubernetes-test")
        gpu = [r for f in applied["spec"]["resourceGroups"][0]["flavors"] for r in f["resources"] if r["name"] == GPU]
        assert [int(r["nominalQuota"]) for r in gpu] == [96]
        # ... and quota-sync, watching the queues, puts the schedulable capacity back within seconds.
        wait("quota-sync to undo the overwrite", lambda: gpu_quota(api) == {"training": 54, "research": 18}, timeout=30)

        put_back(api, out[:5])
        wait("quota to follow 5 nodes back", lambda: gpu_quota(api) == {"training": 84, "research": 28}, timeout=30)
        assert sync.registry.get_sample_value("gpufleet_quota_sync_convergence_seconds_count") >= 2
    finally:
        stop.set()
        runner.join(10)


def test_gang_that_fits_stale_quota_but_not_real_capacity_stays_pending(local_cluster, kueue_stack, nodes, jobsets):
    api = local_cluster.kube
    rs.apply(api, rs.compute(api, quota(kueue_stack)))  # in sync with 16 nodes: 96 + 32 GPUs
    out = nodes[:8]
    take_out(api, out)

    # Stale quota (128 in the cohort) would admit a 10-node gang that only 8 nodes could run; the flavor's
    # Topology (kueue role) makes Kueue count the tainted nodes out itself, so it holds the gang even so.
    stale = f"stale-{uuid.uuid4().hex[:5]}"
    jobsets.append(stale)
    api.create(JOBSET, "jobsets", jobset(stale, "pretrain", 10), "team-pretrain")
    held = wait("Kueue's verdict on the stale-quota gang", lambda: (
        c := (workload_of(api, "team-pretrain", stale) or {}).get("status", {}).get("conditions"))
        and any(x["type"] == "QuotaReserved" for x in c) and c)  # PodsReady may come first
    assert {x["type"]: x["status"] for x in held}.get("QuotaReserved") == "False"
    assert 'topology "gpu-fabric"' in next(x["message"] for x in held if x["type"] == "QuotaReserved")
    api.delete(JOBSET, "jobsets", stale, "team-pretrain", propagation="Foreground")
    wait("the stale gang's workload gone", lambda: workload_of(api, "team-pretrain", stale) is None, timeout=60)

    # After the resync (64 GPUs: 48 + 16) the same gang stays pending and is reported.
    plan = rs.compute(api, quota(kueue_stack))
    rs.apply(api, plan)
    assert gpu_quota(api) == {"training": 48, "research": 16}
    gang = f"gang-{uuid.uuid4().hex[:5]}"
    jobsets.append(gang)
    api.create(JOBSET, "jobsets", jobset(gang, "pretrain", 10), "team-pretrain")
    wl = wait("the gang's Workload", lambda: workload_of(api, "team-pretrain", gang))
    time.sleep(8)
    wl = workload_of(api, "team-pretrain", gang)
    assert conds(wl).get("QuotaReserved") != "True", conds(wl)
    plan = rs.compute(api, quota(kueue_stack))
    report = {g.workload: g for g in plan.cannot_fit}
    name = f"team-pretrain/{wl['metadata']['name']}"
    assert report[name].gpus == 80 and report[name].max_gpus == 64
    rs.record_findings(api, plan, [], [report[name]])
    events = events_for(api, "Workload", wl["metadata"]["name"], "team-pretrain")
    assert any(e["reason"] == "GangCannotFit" and "needs 80 GPUs" in e["message"] for e in events)

    # Capacity returns: the resync raises quota and Kueue admits the gang.
    put_back(api, out)
    rs.apply(api, rs.compute(api, quota(kueue_stack)))
    wait("the gang admitted once nodes returned", lambda: conds(workload_of(api, "team-pretrain", gang)).get("QuotaReserved") == "True",
         timeout=60)


def test_quota_below_admitted_never_evicts(local_cluster, kueue_stack, nodes, jobsets):
    api = local_cluster.kube
    rs.apply(api, rs.compute(api, quota(kueue_stack)))
    name = f"run-{uuid.uuid4().hex[:5]}"
    jobsets.append(name)
    api.create(JOBSET, "jobsets", jobset(name, "pretrain", 6), "team-pretrain")
    running = lambda: [p for p in api.list("v1", "pods", "team-pretrain",
                                           labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}")["items"]
                       if p["status"].get("phase") == "Running"]
    wait("6 gang pods running", lambda: len(running()) == 6, timeout=90)
    pods_before = {p["metadata"]["name"] for p in running()}
    # Kueue reports the reservation in the queue's status a moment after admitting.
    wait("training's reservation in its status", lambda: rs.reserved_gpus(
        api.request("GET", f"{rs.CQ_PATH}/training")).get(FLAVOR) == 48)

    take_out(api, nodes[:12])  # 4 nodes left: 32 GPUs -> training 24, research 8
    sync = QuotaSync(api, quota(kueue_stack))

    def cache_sees_the_taints():
        # An informer's first list is served from the API server's watch cache
        # (resourceVersion=0), which may trail the last taint written by a moment.
        sync.cache.informer.relist()
        return sum(any(t.get("key") == SWAP_TAINT for t in n["spec"]["taints"])
                   for n in sync.cache.informer.items()) == 12
    wait("the node cache sees the 12 nodes taken out", cache_sees_the_taints)
    outcome = sync.resync_once()
    assert outcome.error is None
    assert gpu_quota(api) == {"training": 24, "research": 8}
    drift = {(d.cluster_queue, d.flavor): d for d in outcome.plan.drift}
    assert drift[("training", FLAVOR)].reserved == 48 and drift[("training", FLAVOR)].gpus == 24
    assert sync.registry.get_sample_value("gpufleet_quota_drift_gpus", {"cluster_queue": "training", "flavor": FLAVOR}) == 24
    events = events_for(api, "ClusterQueue", "training")
    assert any(e["reason"] == "QuotaBelowUsage" and "48 GPUs admitted, nominal quota now 24" in e["message"] for e in events)
    time.sleep(5)
    wl = workload_of(api, "team-pretrain", name)
    assert conds(wl).get("Admitted") == "True" and conds(wl).get("Evicted") != "True", conds(wl)
    assert {p["metadata"]["name"] for p in running()} == pods_before


def test_resourceversion_conflict_is_retried(local_cluster, kueue_stack):
    api = local_cluster.kube
    path = f"{rs.CQ_PATH}/research"
    calls = {"n": 0}

    def change(obj):
        calls["n"] += 1
        if calls["n"] == 1:  # another writer gets in between our read and our write
            api.request("PATCH", path, body={"metadata": {"annotations": {"test/other-writer": str(time.time())}}})
        return {"metadata": {"annotations": {"test/ours": "1"}}}

    conflicts = []
    after, patch = update_with_retry(api, path, change, on_conflict=conflicts.append)
    assert conflicts == [1] and calls["n"] == 2
    assert after["metadata"]["annotations"]["test/ours"] == "1" and "test/other-writer" in after["metadata"]["annotations"]
    api.request("PATCH", path, body={"metadata": {"annotations": {"test/ours": None, "test/other-writer": None}}})


def test_zero_capacity_flavor_is_refused_with_a_clear_message(local_cluster, kueue_stack, nodes):
    api = local_cluster.kube
    take_out(api, nodes)
    plan = rs.compute(api, quota(kueue_stack))
    assert plan.zero_flavors == [FLAVOR]
    with pytest.raises(OpsError) as err:
        rs.apply(api, plan)
    msg = str(err.value)
    assert f"flavor {FLAVOR}: 0 schedulable GPUs of 128 on 16 nodes" in msg and "--allow-zero" in msg
    assert "swap: test" in msg
    assert gpu_quota(api)["training"] > 0  # nothing written


def test_task_bad_input_exits_2_with_the_problem(local_cluster):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=120)

    r = run("quota.resync", "--env", "nope", "--kubeconfig", str(local_cluster.kubeconfig))
    assert r.returncode == 2 and "'nope'" in r.stderr and "known: local" in r.stderr
    r = run("quota.resync", "--env", "local", "--kubeconfig", "/nonexistent/kubeconfig")
    assert r.returncode == 2 and "--kubeconfig /nonexistent/kubeconfig" in r.stderr
    r = run("quota.resync", "--env", "local", "--kubeconfig", str(local_cluster.kubeconfig))
    assert r.returncode in (0, 1), r.stderr  # 1 only if the inventory's queues are absent in this session
    assert "schedulable capacity" in r.stdout or "ClusterQueues" in r.stderr


def test_quota_sync_command_leads_serves_metrics_and_follows_nodes(local_cluster, kueue_stack, nodes, tmp_path):
    import httpx

    from gpufleet.prom.server import free_port

    from .helpers import config_file

    api = local_cluster.kube
    ensure_namespace(api, "gpufleet-system")
    rs.apply(api, rs.compute(api, quota(kueue_stack)))
    port = free_port()
    config = config_file(tmp_path / "quota-sync.yaml", "quota-sync")  # as the kueue role renders it
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "quota-sync", "--config", str(config), "--kubeconfig",
                             str(local_cluster.kubeconfig), "--metrics-port", str(port), "--debounce", "0.5"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lease = wait("the Lease held", lambda: _lease(api, "gpufleet-quota-sync"), timeout=60)
        assert lease["spec"]["holderIdentity"]
        wait("/healthz", lambda: _get(httpx, f"http://127.0.0.1:{port}/healthz") == 200, timeout=30)
        # The counter's family is listed before any resync: wait for a successful one instead.
        wait("a first resync", lambda: "gpufleet_quota_sync_last_success_timestamp_seconds 0.0"
             not in httpx.get(f"http://127.0.0.1:{port}/metrics").text, timeout=60)
        take_out(api, nodes[:2])
        wait("quota to follow 2 nodes out", lambda: gpu_quota(api) == {"training": 84, "research": 28}, timeout=30)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'gpufleet_quota_nominal_gpus{cluster_queue="training",flavor="h100-sxm-80gb"} 84.0' in metrics
        assert 'gpufleet_quota_schedulable_gpus{flavor="h100-sxm-80gb"} 112.0' in metrics
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out


def _lease(api, name: str):
    lease = api.get_or_none("coordination.k8s.io/v1", "leases", name, "gpufleet-system")
    return lease if lease and lease.get("spec", {}).get("holderIdentity") else None


def _get(httpx, url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_quota_follows_any_taint_partial_nodes_and_gpus_held_outside_kueue(local_cluster, kueue_stack, nodes):
    """The classifier's view through the real API: a node tainted for another purpose, a node whose GPU
    allocatable fell below capacity, and a pod Kueue does not manage holding GPUs all leave training quota;
    the controller follows each within its debounce (the unmanaged pod through its pod watch)."""
    api = local_cluster.kube
    rs.apply(api, rs.compute(api, quota(kueue_stack)))
    assert gpu_quota(api) == {"training": 96, "research": 32}
    sync = QuotaSync(api, quota(kueue_stack, debounce_seconds=0.5, resync_seconds=3600))
    stop = threading.Event()
    runner = threading.Thread(target=sync.run, args=(stop,), daemon=True)
    runner.start()
    ns = f"quota-{uuid.uuid4().hex[:6]}"
    ensure_namespace(api, ns)
    partial = nodes[1]
    try:
        wait("caches synced", lambda: sync.cache.synced.is_set() and sync.pods.synced.is_set())
        update_with_retry(api, f"/api/v1/nodes/{nodes[0]}", lambda o: {"spec": {"taints": (o["spec"].get("taints") or [])
                          + [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}]}})
        wait("quota to drop the dedicated node", lambda: gpu_quota(api) == {"training": 90, "research": 30}, timeout=30)
        api.patch("v1", "nodes", partial, {"status": {"allocatable": {GPU: "7"}}},
                  subresource="status")  # the device plugin withdrew a GPU
        wait("quota to drop the partial node", lambda: gpu_quota(api) == {"training": 84, "research": 28}, timeout=30)
        # A debugging pod with the training priority and no Kueue label holds 4 GPUs on a counted node.
        api.create("v1", "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "debug"}, "spec": {
            "nodeName": nodes[5], "priorityClassName": "gpufleet-training",
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "registry.invalid/x:1", "resources": {"limits": {GPU: "4"}}}]}}, ns)
        wait("quota to drop the GPUs held outside Kueue", lambda: gpu_quota(api) == {"training": 81, "research": 27},
             timeout=30)
        assert sync.registry.get_sample_value("gpufleet_quota_schedulable_gpus", {"flavor": FLAVOR}) == 108
        api.delete("v1", "pods", "debug", ns, grace_seconds=0)
        wait("quota to get them back", lambda: gpu_quota(api) == {"training": 84, "research": 28}, timeout=30)
    finally:
        stop.set()
        runner.join(10)
        api.patch("v1", "nodes", partial, {"status": {"allocatable": {GPU: "8"}}}, subresource="status")
        api.delete("v1", "namespaces", ns, grace_seconds=0)


def quota_sum(api, resource: str) -> int:
    """nominalQuota of ``resource`` for the flavor over both queues (cores, bytes or GPUs)."""
    total = 0
    for q in ("training", "research"):
        cq = api.request("GET", f"{rs.CQ_PATH}/{q}")
        total += int(rs.quota_of(cq, FLAVOR, resource)["nominal"])
    return total


def test_cpu_and_memory_quota_follow_daemonsets_and_a_gpu_pod_moves_only_gpus(local_cluster, kueue_stack, nodes):
    """A DaemonSet on every GPU node takes its requests out of CPU and memory quota (the one-shot task shows it
    in the diff before applying, the controller follows it); an unmanaged GPU pod that requests no CPU moves
    GPU quota only, not a GPU's share of the fleet's CPU."""
    api = local_cluster.kube
    rs.apply(api, rs.compute(api, quota(kueue_stack)), allow_zero=True, events=False)
    cpu0, mem0, gpu0 = quota_sum(api, "cpu"), quota_sum(api, "memory"), quota_sum(api, GPU)
    assert gpu0 == 128 and cpu0 > 0 and mem0 > 0
    unmanaged0 = rs.compute(api, quota(kueue_stack)).capacity[FLAVOR].unmanaged_cpu
    ns = f"quota-ds-{uuid.uuid4().hex[:6]}"
    ensure_namespace(api, ns)
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "node-agent"}, "spec": {
        "selector": {"matchLabels": {"app": "node-agent"}},
        "template": {"metadata": {"labels": {"app": "node-agent"}}, "spec": {
            "nodeSelector": {"gpufleet.io/simulated": "true"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "agent", "image": "registry.invalid/agent:1",
                            "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}}]}}}}
    sync = QuotaSync(api, quota(kueue_stack, debounce_seconds=0.5, resync_seconds=3600))
    stop = threading.Event()
    runner = None
    try:
        api.create("apps/v1", "daemonsets", ds, ns)
        wait("16 DaemonSet pods bound", lambda: len([p for p in api.list("v1", "pods", ns)["items"]
                                                     if p["spec"].get("nodeName")]) == 16, timeout=90)
        # the one-shot task: the diff names the CPU and memory change, and nothing is written without --apply
        r = subprocess.run([sys.executable, "-m", "invoke", "quota.resync", "--env", "local", "--kubeconfig",
                            str(local_cluster.kubeconfig)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "300"})
        assert r.returncode == 0, r.stdout + r.stderr
        assert "not applied: pass --apply" in r.stdout and " cpu " in r.stdout and " memory " in r.stdout, r.stdout
        assert "unmanaged)" in r.stdout, r.stdout
        assert rs.compute(api, quota(kueue_stack)).capacity[FLAVOR].unmanaged_cpu == unmanaged0 + 8
        assert quota_sum(api, "cpu") == cpu0

        runner = threading.Thread(target=sync.run, args=(stop,), daemon=True)
        runner.start()
        wait("caches synced", lambda: sync.cache.synced.is_set() and sync.pods.synced.is_set())
        # 16 x 500m = 8 cores and 16 x 256 MiB, exactly: the floor of (X - 8) is floor(X) - 8
        wait("CPU quota to drop by the DaemonSet's requests", lambda: quota_sum(api, "cpu") == cpu0 - 8, timeout=30)
        assert quota_sum(api, "memory") == mem0 - 16 * 256 * 2**20
        assert quota_sum(api, GPU) == gpu0

        # An unmanaged pod holding 4 GPUs, requesting no CPU or memory: GPU quota moves, CPU and memory do not.
        api.create("v1", "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "debug"}, "spec": {
            "nodeName": nodes[5], "priorityClassName": "gpufleet-training",
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "registry.invalid/x:1", "resources": {"limits": {GPU: "4"}}}]}}, ns)
        wait("GPU quota to drop the GPUs held outside Kueue", lambda: quota_sum(api, GPU) == gpu0 - 4, timeout=30)
        assert gpu_quota(api) == {"training": 93, "research": 31}
        assert quota_sum(api, "cpu") == cpu0 - 8 and quota_sum(api, "memory") == mem0 - 16 * 256 * 2**20
        api.delete("v1", "pods", "debug", ns, grace_seconds=0)
        wait("GPU quota back", lambda: quota_sum(api, GPU) == gpu0, timeout=30)
        assert quota_sum(api, "cpu") == cpu0 - 8

        api.delete("apps/v1", "daemonsets", "node-agent", ns, propagation="Foreground")
        wait("CPU and memory quota back once the DaemonSet is gone",
             lambda: quota_sum(api, "cpu") == cpu0 and quota_sum(api, "memory") == mem0, timeout=90)
    finally:
        stop.set()
        if runner is not None:
            runner.join(10)
        api.delete("v1", "namespaces", ns, grace_seconds=0)
