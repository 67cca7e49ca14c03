"""Goodput on the local cluster: the fault replay, the accountant against ground truth, train.goodput, measured MTBF.

The replay (:mod:`gpufleet_workshop.sim.goodput_replay`) runs a JobSet gang on kwok
nodes with a simulated trainer writing checkpoints; faults arrive through
the exporter stand-ins and a real Prometheus; node health takes the node
out, JobSet and Kueue bring the gang back, the trainer resumes from its
last checkpoint. The accountant, fed by watches as ``gpufleet goodput``
is, must agree with the trainer's own ETTR within 2 points.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest
from invoke import Collection, Program

from gpufleet.goodput import api as gkube
from gpufleet.kube.events import record_event
from gpufleet.ops.reads import get_node, list_nodes
from gpufleet.prom.server import PrometheusNotFound

from .helpers import wait

pytestmark = pytest.mark.cluster


def invoke(capsys, *argv: str) -> tuple[int, str, str]:
    from gpufleet_workshop.tasks.sim import sim
    from gpufleet_workshop.tasks.train import train

    ns = Collection()
    ns.add_collection(sim)
    ns.add_collection(train)
    capsys.readouterr()
    try:
        Program(namespace=ns, version="test").run(["invoke", *argv])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_fault_replay_accountant_within_2_points_of_ground_truth(local_cluster, local_queues, tmp_path, capsys):
    from gpufleet_workshop.sim import goodput_replay as r

    opts = r.Options(cluster=local_cluster.name, out=str(tmp_path), total_steps=1800, first_fault_seconds=25,
                     fault_gap_seconds=20, timeout=600, scrape_seconds=1, step_seconds=1, keep=True)
    try:
        result = r.run(opts, say=print)
    except PrometheusNotFound as exc:
        pytest.skip(str(exc))
    job = result["job"]
    try:
        # the one-shot view (train.goodput): the gang's earlier pods are gone, its checkpoints rebuild those runs
        code, _, err = invoke(capsys, "train.goodput", job["name"], "--namespace", job["namespace"],
                              "--out", str(tmp_path / "one-shot"), "--checkpoint-dir", job["checkpoint_dir"],
                              "--kubeconfig", str(local_cluster.kubeconfig))
        assert code == 0, err
        one_shot = json.loads((tmp_path / "one-shot" / "account.json").read_text())
        assert one_shot["reconstructed_runs"] >= 1 and len(one_shot["interruptions"]) == 3
        assert abs(one_shot["ettr"] - result["ettr_ground_truth"]) <= 0.02, (one_shot, result["ettr_ground_truth"])
    finally:
        gkube.delete(local_cluster.kube, "jobset.x-k8s.io/v1alpha2", "jobsets", job["name"], job["namespace"])
    assert result["interruptions_trainer"] == 3
    assert result["account"]["interruptions"] and len(result["account"]["interruptions"]) == 3
    assert result["difference_points"] <= 2.0, result
    for f in result["faults"]:
        assert f["fault_to_tainted_seconds"] is not None and f["fault_to_tainted_seconds"] <= f["fault_to_evicted_seconds"]
        assert f["fault_to_running_seconds"] >= f["fault_to_evicted_seconds"]
    latencies = json.loads((tmp_path / "latencies.json").read_text())
    assert {"fault_to_tainted_seconds", "fault_to_evicted_seconds", "readmitted_to_running_seconds"} <= set(latencies)
    assert latencies["scrape_interval_seconds"] == 1
    # the long-horizon model takes the measured latencies
    from gpufleet_workshop.sim.goodput import Latencies

    assert Latencies.from_file(tmp_path / "latencies.json").fault_to_tainted == latencies["fault_to_tainted_seconds"]
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def jobset(name: str, ns: str, queue: str, pods: int, duration: int, checkpoint_dir: str) -> dict:
    from gpufleet_admin.training.render import build_context, render_context
    import yaml
    from roles.registry import load

    ctx = build_context(load("local"), "jobset", name, pods, queue=f"{ns}/{queue}",
                        sets=[f"simulated_duration_seconds={duration}"])
    (js,) = [d for d in yaml.safe_load_all(render_context(ctx)) if d]
    for c in js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]:
        for env in c["env"]:
            if env["name"] == "CHECKPOINT_DIR":
                env["value"] = checkpoint_dir
    return js


def test_train_goodput_and_the_controller_account_a_finished_job(local_cluster, local_queues, tmp_path, capsys):
    api = local_cluster.kube
    name, ns = f"acct-{uuid.uuid4().hex[:5]}", "team-research"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    gkube.create(api, jobset(name, ns, "research", 2, 12, str(ckpt)))
    try:
        wait("pods running", lambda: len([p for p in gkube.list_pods(api, ns, f"jobset.sigs.k8s.io/jobset-name={name}")
                                          if p["status"].get("phase") == "Running"]) == 2, timeout=120)
        start = time.time()
        for step in (100, 200):  # two checkpoints by the convention while it runs
            time.sleep(3)
            d = ckpt / f"step-{step}"
            d.mkdir()
            (d / "COMPLETE").write_text(json.dumps({"started": time.time() - 1}))
        wait("the Workload finished", lambda: any(
            c["type"] == "Finished" and c["status"] == "True"
            for w in gkube.list_workloads(api, ns) if w["metadata"]["ownerReferences"][0]["name"] == name
            for c in w.get("status", {}).get("conditions", [])), timeout=120)
        code, out, err = invoke(capsys, "train.goodput", name, "--namespace", ns, "--out", str(tmp_path / "out"),
                                "--kubeconfig", str(local_cluster.kubeconfig))
        assert code == 0, err
        account = json.loads((tmp_path / "out" / "account.json").read_text())
        assert account["job"] == name and account["finished"] and account["checkpoints"] == 2
        assert 0.2 < account["ettr"] < 1.0, account
        # the pods ran 12 s; each save took 1 s ("started" one second before its marker)
        assert account["badput_seconds"]["checkpoint_saving"] == pytest.approx(2, abs=0.5)
        assert 9 <= account["productive_seconds"] + account["badput_seconds"]["checkpoint_saving"] <= 14, account
        assert f"JobSet {ns}/{name}" in out
        assert (tmp_path / "out" / "timeline.png").stat().st_size > 10_000
        # the controller's one-shot view agrees
        proc = subprocess.run([sys.executable, "-m", "gpufleet.cli", "goodput", "--once", "--namespace", ns,
                               "--kubeconfig", str(local_cluster.kubeconfig)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        (mine,) = [a for a in json.loads(proc.stdout) if a["job"] == name]
        assert mine["ettr"] == pytest.approx(account["ettr"], abs=0.02) and mine["checkpoints"] == 2
        assert time.time() - start < 120
    finally:
        gkube.delete(api, "jobset.x-k8s.io/v1alpha2", "jobsets", name, ns)


def test_checkpoint_interval_from_the_clusters_own_remediations(local_cluster, capsys):
    api = local_cluster.kube
    node = sorted(n["metadata"]["name"] for n in list_nodes(api, "gpufleet.io/simulated=true"))[0]
    obj = get_node(api, node)
    record_event(api, obj, "NodeSwapRequested", "cordoned and tainted gpufleet.io/swap (node-health): xid: "
                      "GPU 3: fatal XID 79", component="gpufleet-node-health")
    code, out, err = invoke(capsys, "train.checkpoint-interval", "--gpus", "64", "--checkpoint-seconds", "30",
                            "--measured-window-hours", "1", "--kubeconfig", str(local_cluster.kubeconfig))
    assert code == 0, err
    assert "MTTF source: measured:" in out and "node-health remediations in the last 1 h" in out
    assert "job MTTF:" in out and "(measured:" in out
