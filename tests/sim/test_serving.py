"""How ``sim.flip`` makes inference serve for real: stand-in pods and simulated trainers (pure)."""

from __future__ import annotations

from gpufleet.names import GPU_RESOURCE
from gpufleet_workshop.sim import serving
from roles.registry import load


def _template():
    from roles.inference.manifests import objects

    dep = next(o for o in objects(load("local")) if o["kind"] == "Deployment")
    return dep["spec"]["template"]


def test_a_stand_in_keeps_the_workload_but_runs_only_where_pods_really_run():
    before = _template()
    pod = serving.standin_pod(before, image="reg.example/gpufleet:1", real_node="c-system", latency_ms=7, cluster="c")
    c = pod["spec"]["containers"][0]
    assert c["image"] == "reg.example/gpufleet:1" and c["command"] == ["gpufleet-standin"]
    assert "--latency-ms" in c["args"] and c["args"][c["args"].index("--latency-ms") + 1] == "7"
    assert c["resources"]["requests"][GPU_RESOURCE] == before["spec"]["containers"][0]["resources"]["requests"][GPU_RESOURCE]
    assert c["ports"] == before["spec"]["containers"][0]["ports"]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["c-system"], ["virtual-kubelet"]]
    # The soft preference for in-cluster nodes, labels and tolerations stay; the input is not changed.
    assert pod["spec"]["tolerations"] == before["spec"]["tolerations"]
    assert pod["metadata"] == before["metadata"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in before["spec"]["affinity"]["nodeAffinity"]


def test_a_simulated_trainer_waits_for_its_clusters_end_file():
    container = {"name": "trainer", "image": "x", "resources": {"requests": {GPU_RESOURCE: "8", "cpu": "8"},
                                                                "limits": {GPU_RESOURCE: "8"}}}
    c, volume = serving.trainer_container(container, "img:1", "c1")
    assert volume["hostPath"]["path"] == str(serving.end_dir("c1"))
    assert c["resources"]["requests"][GPU_RESOURCE] == "8" and c["resources"]["requests"]["cpu"] == serving.TRAINER_REQUESTS["cpu"]
    assert str(serving.end_dir("c1") / serving.END_FILE) in c["command"][-1]


def test_a_stopped_stream_is_reaped_and_says_why_it_failed(tmp_path, caplog):
    import subprocess
    import sys

    out = tmp_path / "r.jsonl"
    out.write_text("")
    failed = serving.Stream(subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('--rate x: bad')"],
                                             stderr=subprocess.PIPE), out)
    failed.proc.wait()
    assert failed.stop() == [] and failed.stderr == "--rate x: bad" and "--rate x: bad" in caplog.text
    stubborn = serving.Stream(subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE), out)
    stubborn.proc.stdout.readline()
    stubborn.stop(timeout=0.3)
    assert stubborn.proc.returncode == -9 and stubborn.proc.stderr.closed
