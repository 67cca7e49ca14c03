"""Every training template renders for local, staging and prod with sensible sizes.

Expected values come from the inventories, not from the renderer: GPUs per
node, HCAs, LocalQueues and the checkpoint backend of each environment.
"""

from __future__ import annotations

import math

import jinja2
import pytest
import yaml

from gpufleet_admin.training import render as r

# (env, flavor, nodes): one small job and the whole flavor per environment.
SIZES = [
    ("local", "h100-sxm-80gb", 1),
    ("local", "h100-sxm-80gb", 16),
    ("staging", "h100-sxm-80gb", 2),
    ("staging", "a100-sxm-80gb", 2),
    ("prod", "h100-sxm-80gb", 4),
    ("prod", "h100-sxm-80gb", 128),
]
HCAS = {
    ("local", "h100-sxm-80gb"): "=mlx5_0:1",
    ("staging", "h100-sxm-80gb"): "=mlx5_0:1,mlx5_1:1",
    ("staging", "a100-sxm-80gb"): "=mlx5_0:1",
    ("prod", "h100-sxm-80gb"): "=" + ",".join(f"mlx5_{i}:1" for i in range(8)),
}
QUEUES = {"local": ("team-pretrain", "pretrain"), "staging": ("team-staging", "staging"),
          "prod": ("team-pretrain", "pretrain")}


@pytest.fixture
def objects(inventory):
    """``objects(env, template, nodes, ...)``: the rendered objects as dicts."""
    def make(env: str, template: str, nodes: int, flavor: str | None = None, sets=(), name: str = "run1"):
        text = r.render(env, template, name, nodes, flavor=flavor, sets=sets, inventory=inventory(env))
        return [d for d in yaml.safe_load_all(text) if d]
    return make


def main_object(objs):
    return next(o for o in objs if "kueue.x-k8s.io/queue-name" in o["metadata"].get("labels", {}))


def pod_templates(obj) -> list[tuple[dict, int]]:
    """(pod template, pods) pairs of a JobSet, PyTorchJob or Job."""
    if obj["kind"] == "JobSet":
        rj = obj["spec"]["replicatedJobs"]
        return [(j["template"]["spec"]["template"], j["replicas"] * j["template"]["spec"]["parallelism"]) for j in rj]
    if obj["kind"] == "PyTorchJob":
        return [(s["template"], s["replicas"]) for s in obj["spec"]["pytorchReplicaSpecs"].values()]
    return [(obj["spec"]["template"], obj["spec"]["parallelism"])]


def env_of(container) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize("template", list(r.TEMPLATES))
@pytest.mark.parametrize(("env", "flavor", "nodes"), SIZES)
def test_renders(env, flavor, nodes, template, inventory, objects):
    inv = inventory(env)
    gpn = inv.flavors()[flavor].gpus // inv.flavors()[flavor].nodes
    objs = objects(env, template, nodes, flavor=flavor, sets=["simulated_duration_seconds=30"])
    job = main_object(objs)
    ns, queue = QUEUES[env]
    assert (job["apiVersion"], job["kind"]) == (r.TEMPLATES[template].api_version, r.TEMPLATES[template].kind)
    assert job["metadata"]["namespace"] == ns
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == queue
    assert labels["kueue.x-k8s.io/priority-class"] == "training-research"  # lowest WorkloadPriorityClass

    pods = pod_templates(job)
    assert sum(n for _, n in pods) == nodes
    for pod, _ in pods:
        spec = pod["spec"]
        assert spec["priorityClassName"] == "gpufleet-training"
        assert spec["nodeSelector"] == {"gpufleet.io/flavor": flavor}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        # Placement: the inventory's training_topology (rack, preferred) through Kueue; no scheduler affinity.
        assert inv.role("training").training_topology == "rack"
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"] == "gpufleet.io/rack"
        assert "affinity" not in spec
        assert pod["metadata"]["labels"]["gpufleet.io/job"] == "run1"
        assert pod["metadata"]["annotations"]["gpufleet.io/simulated-duration-seconds"] == "30"
        (c,) = spec["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == gpn == 8
        assert c["resources"]["requests"]["nvidia.com/gpu"] == gpn

        env_vars = env_of(c)
        job_dir = f"/mnt/checkpoints/{ns}/run1"
        assert env_vars["JOB_DIR"] == job_dir
        assert env_vars["CHECKPOINT_DIR"] == f"{job_dir}/checkpoints"
        assert env_vars["RESUME_FROM"] == "latest"
        assert env_vars["CHECKPOINT_MARKER"] == "COMPLETE"
        # Daly's interval for nodes * 8 GPUs and training_checkpoint_seconds = 60, by hand:
        m = 54 * 24 * 3600 * 16384 / 419 / (nodes * gpn)
        daly = math.sqrt(2 * 60 * m) * (1 + math.sqrt(60 / (2 * m)) / 3 + 60 / (2 * m) / 9) - 60
        # ... capped by training_checkpoint_interval_minutes (25 minutes).
        assert int(env_vars["CHECKPOINT_INTERVAL_SECONDS"]) == min(round(daly), 25 * 60)
        assert env_vars["NCCL_IB_HCA"] == HCAS[(env, flavor)]
        assert env_vars["NCCL_IB_DISABLE"] == "0"
        assert env_vars["NCCL_SOCKET_IFNAME"] == "eth0"
        assert {k: env_vars[k] for k in ("NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT", "NCCL_DEBUG")} == \
            inv.role("training").training_nccl_env

        mounts = {m["name"]: m for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert mounts["checkpoints"]["mountPath"] == job_dir
        if inv.role("parallel_fs").parallel_fs_backend == "weka":
            assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "gpufleet-checkpoints"}
            assert mounts["checkpoints"]["subPath"] == f"{ns}/run1"
        else:
            assert volumes["checkpoints"]["hostPath"] == {"path": job_dir, "type": "DirectoryOrCreate"}


def test_jobset_restarts_the_gang_from_the_latest_checkpoint(objects):
    (js,) = objects("prod", "jobset", 4)
    assert js["spec"]["suspend"] is True
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 50, "restartStrategy": "BlockingRecreate"}
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (job["completionMode"], job["parallelism"], job["completions"], job["backoffLimit"]) == ("Indexed", 4, 4, 0)
    c = job["template"]["spec"]["containers"][0]
    env_vars = env_of(c)
    assert env_vars["MASTER_ADDR"] == "run1-workers-0-0.run1"
    assert (env_vars["NNODES"], env_vars["NPROC_PER_NODE"]) == ("4", "8")
    rank = next(e for e in c["env"] if e["name"] == "NODE_RANK")
    assert rank["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert job["template"]["spec"]["restartPolicy"] == "Never"


def test_pytorchjob_master_and_workers(objects):
    (pj,) = objects("prod", "pytorchjob", 3)
    specs = pj["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 2)
    assert pj["spec"]["nprocPerNode"] == "8"
    assert pj["spec"]["runPolicy"]["suspend"] is True
    assert pj["spec"]["runPolicy"]["backoffLimit"] == 50
    c = specs["Master"]["template"]["spec"]["containers"][0]
    assert c["name"] == "pytorch"
    assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]
    (single,) = objects("prod", "pytorchjob", 1)
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_batch_job_has_its_headless_service(objects):
    svc, job = objects("staging", "job", 2, flavor="h100-sxm-80gb")
    assert (svc["kind"], svc["spec"]["clusterIP"], svc["spec"]["selector"]) == ("Service", "None", {"gpufleet.io/job": "run1"})
    assert job["spec"]["template"]["spec"]["subdomain"] == "run1"
    assert env_of(job["spec"]["template"]["spec"]["containers"][0])["MASTER_ADDR"] == "run1-0.run1"
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"] == [{"type": "DisruptionTarget"}]


def test_sets_override_defaults(objects):
    sets = ["checkpoint_interval_seconds=900", "priority_class=training-production", "image=example.com/t:1",
            "max_restarts=3", "cpu=100", "memory=1Ti", "socket_ifname=^lo,docker", "args=--lr 3e-4 --name 'x y'"]
    (js,) = objects("local", "jobset", 2, sets=sets)
    assert js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "training-production"
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 3
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["image"] == "example.com/t:1"
    assert c["args"][0].endswith("/workspace/train.py --lr 3e-4 --name 'x y'")
    assert c["resources"]["requests"]["cpu"] == "100" and c["resources"]["requests"]["memory"] == "1Ti"
    env_vars = env_of(c)
    assert (env_vars["CHECKPOINT_INTERVAL_SECONDS"], env_vars["NCCL_SOCKET_IFNAME"]) == ("900", "^lo,docker")
    assert "gpufleet.io/simulated-duration-seconds" not in pod["metadata"]["annotations"]  # unless set


def test_default_requests_leave_room_on_the_node(objects):
    (js,) = objects("local", "jobset", 1)
    req = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert req["cpu"] == str(int(224 * 0.9))  # 201 of 224 cores
    assert req["memory"] == f"{int(2 * 1024 * 0.9)}Gi"  # 1843Gi of 2Ti


def test_no_hcas_disables_infiniband():
    env = r.nccl_env([], "eth0", {"NCCL_DEBUG": "INFO"})
    assert env == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}


def test_roce_sets_the_gid_index():
    from gpufleet_admin.inventory.models import Hca

    env = r.nccl_env([Hca(name="mlx5_0", rate_gbps=400, link_layer="Ethernet")], "eth0", {})
    assert env["NCCL_IB_GID_INDEX"] == "3" and env["NCCL_IB_HCA"] == "=mlx5_0:1"


@pytest.mark.parametrize("template", list(r.TEMPLATES))
def test_templates_fail_on_undefined_variables(template, inventory):
    ctx = r.build_context(inventory("local"), template, "run1", 2)
    del ctx["checkpoint_dir"]
    with pytest.raises(jinja2.UndefinedError, match="checkpoint_dir"):
        r.render_context(ctx)


def test_local_fleet_size_follows_fleet_nodes():
    (js,) = [d for d in yaml.safe_load_all(r.render("local", "jobset", "big", 24, fleet_nodes=32)) if d]
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 24


def test_checkpoint_claim_is_the_one_parallel_fs_declares():
    from roles.parallel_fs.manifests import PVC_NAME

    assert r.CHECKPOINT_CLAIM == PVC_NAME
