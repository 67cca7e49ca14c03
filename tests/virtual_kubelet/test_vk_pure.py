"""Virtual kubelet pure parts: translation rules, provider choice, the simulated provider, the work queue."""

from __future__ import annotations

import threading

import pytest

from gpufleet.kube.workqueue import WorkQueue
from gpufleet.virtual_kubelet.provider import SOURCE_UID, REMOTE_NODE_LABEL, NoProvider, Offer, ProviderError, choose, pod_requests
from gpufleet_workshop.rental.provider import SimulatedProvider
from gpufleet.virtual_kubelet.translate import Refused, mirror_status, translate

H100 = "NVIDIA-H100-80GB-HBM3"


def pod(name="p", uid="u1", gpus=1, **spec) -> dict:
    base = {
        "nodeName": "vk-rental", "serviceAccountName": "default", "priorityClassName": "gpufleet-inference",
        "priority": 1000, "schedulerName": "default-scheduler",
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
        "containers": [{"name": "server", "image": "img:1", "env": [{"name": "A", "value": "1"}],
                        "resources": {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(gpus)},
                                      "limits": {"nvidia.com/gpu": str(gpus)}},
                        "volumeMounts": [{"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
        "volumes": [{"name": "kube-api-access-x", "projected": {"sources": []}}],
    }
    base.update(spec)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "uid": uid, "labels": {"app": "chat"},
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "chat-1"}], "resourceVersion": "9"},
            "spec": base, "status": {"phase": "Pending"}}


# ------------------------------------------------------------------ translate


def test_translate_keeps_containers_drops_cluster_specifics_and_tags_the_source():
    out = translate(pod(), node_name="vk-rental", namespace="remote-inference",
                    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    spec = out["spec"]
    assert out["metadata"]["namespace"] == "remote-inference" and out["metadata"]["name"] == "p"
    assert out["metadata"]["annotations"][SOURCE_UID] == "u1"
    assert out["metadata"]["labels"] == {"app": "chat", REMOTE_NODE_LABEL: "vk-rental"}
    for dropped in ("nodeName", "serviceAccountName", "priorityClassName", "priority", "affinity", "schedulerName"):
        assert dropped not in spec
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert spec["automountServiceAccountToken"] is False
    assert "volumes" not in spec and "volumeMounts" not in spec["containers"][0]
    assert spec["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "ownerReferences" not in out["metadata"] and "uid" not in out["metadata"]


@pytest.mark.parametrize("spec,field", [
    ({"hostNetwork": True}, "hostNetwork"),
    ({"hostPID": True}, "hostPID"),
    ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "hostPath"),
    ({"volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "x"}}]}, "persistentVolumeClaim"),
    ({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]},
     "serviceAccountToken"),
])
def test_translate_refuses_what_cannot_run_remotely(spec, field):
    with pytest.raises(Refused, match=field):
        translate(pod(**spec), node_name="vk")


def test_translate_keeps_empty_dir_and_field_ref_env():
    p = pod(volumes=[{"name": "scratch", "emptyDir": {}}])
    p["spec"]["containers"][0]["env"].append({"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    out = translate(p, node_name="vk")
    assert out["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]


def test_mirror_status_keeps_remote_state_but_not_pod_scheduled():
    remote = {"phase": "Running", "podIP": "10.0.0.5", "startTime": "2026-01-01T00:00:00Z", "hostIP": "10.9.9.9",
              "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
              "containerStatuses": [{"name": "server", "ready": True}]}
    out = mirror_status(remote, host_ip="127.0.0.1")
    assert out["phase"] == "Running" and "podIP" not in out and out["hostIP"] == "127.0.0.1"
    assert [c["type"] for c in out["conditions"]] == ["Ready"]
    failed = mirror_status({**remote, "phase": "Failed"})
    assert failed["conditions"] == [{"type": "Ready", "status": "False", "reason": "PodFailed"}]


# ------------------------------------------------------------------ requests and choice


def test_effective_requests():
    with pytest.raises(ValueError, match="8Gib"):
        pod_requests(pod(gpus="8Gib"))
    p = pod(gpus=2, initContainers=[{"name": "i", "resources": {"requests": {"cpu": "8"}}}])
    req = pod_requests(p)
    assert req["nvidia.com/gpu"] == 2 and req["cpu"] == 8 and req["memory"] == 32 * 2**30


def offers(**free_gpus):
    prices = {"cheap": 1.0, "mid": 2.0, "dear": 3.0, "a100": 0.5}
    return [Offer(n, "NVIDIA-A100-SXM4-80GB" if n == "a100" else H100, prices[n],
                  {"nvidia.com/gpu": g, "cpu": 1e6, "memory": 1e15, "pods": 1000}) for n, g in free_gpus.items()]


def test_choose_prefers_model_then_capacity_then_price():
    p = pod(gpus=4)
    assert choose(p, offers(cheap=8, mid=8, dear=8)) == "cheap"
    assert choose(p, offers(cheap=2, mid=8, dear=8)) == "mid"  # cheapest has no room
    p["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": H100}
    assert choose(p, offers(a100=64, dear=8)) == "dear"  # the cheaper A100 is the wrong model


def test_choose_errors_say_why():
    p = pod(gpus=4, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"})
    with pytest.raises(NoProvider, match="no provider has GPU model NVIDIA-B200") as e:
        choose(p, offers(cheap=8))
    assert not e.value.retryable and e.value.reason == "NoProvider"
    with pytest.raises(NoProvider, match="no provider has room") as e:
        choose(pod(gpus=16), offers(cheap=8))
    assert e.value.retryable


# ------------------------------------------------------------------ simulated provider


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_simulated_lifecycle_latency_capacity_and_faults():
    clock = Clock()
    seen = []
    sim = SimulatedProvider("rental", gpus=2, gpu_product=H100, price_per_gpu_hour=2.85, start_latency_seconds=2,
                            node_name="vk-rental", clock=clock, wall=lambda: 1_700_000_000.0)
    sim.notify_pods(lambda ns, n: seen.append(n))
    sim.create_pod(pod("a", "ua"))
    sim.create_pod(pod("a", "ua"))  # idempotent by UID
    assert sim.creates == 1 and sim.get_pod_status("inference", "a")["phase"] == "Pending"
    clock.t = 2.0
    assert sim.fire_due() == 1 and seen == ["a", "a"]
    st = sim.get_pod_status("inference", "a")
    assert st["phase"] == "Running" and {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "True"
    sim.create_pod(pod("b", "ub"))
    with pytest.raises(ProviderError) as e:
        sim.create_pod(pod("c", "uc"))
    assert e.value.reason == "OutOfCapacity" and e.value.retryable
    sim.fail_pod("inference", "b")
    assert sim.get_pod_status("inference", "b")["phase"] == "Failed"
    sim.lose_pod("inference", "a")
    assert sim.get_pod("inference", "a") is None
    assert [(r.source_uid, r.name) for r in sim.get_pods()] == [("ub", "b")]


def test_simulated_failure_injection_is_seeded_and_refusals_apply():
    sim = SimulatedProvider("rental", gpus=100, gpu_product=H100, price_per_gpu_hour=1, failure_rate=0.5, seed=1)
    results = []
    for i in range(20):
        try:
            sim.create_pod(pod(f"p{i}", f"u{i}"))
            results.append(True)
        except ProviderError as exc:
            assert exc.reason == "ProviderFailed" and not exc.retryable
            results.append(False)
    assert 3 < results.count(False) < 17
    with pytest.raises(Refused):
        sim.create_pod(pod("h", "uh", hostNetwork=True))


def test_simulated_duration_annotation_succeeds():
    clock = Clock()
    sim = SimulatedProvider("rental", gpus=8, gpu_product=H100, price_per_gpu_hour=1, start_latency_seconds=1, clock=clock)
    p = pod()
    p["metadata"]["annotations"] = {"gpufleet.io/simulated-duration-seconds": "5"}
    sim.create_pod(p)
    clock.t = 5.9
    assert sim.get_pod_status("inference", "p")["phase"] == "Running"
    clock.t = 6.0
    assert sim.get_pod_status("inference", "p")["phase"] == "Succeeded"
    assert sim.used()["nvidia.com/gpu"] == 0


def test_simulated_deletes_by_source_uid_only():
    """A rental is deleted by its source pod's UID, never by name: a same-named pod's clean-up leaves it alone."""
    sim = SimulatedProvider("rental", gpus=8, gpu_product=H100, price_per_gpu_hour=1)
    sim.create_pod(pod("a", "new-uid"))
    sim.delete_pod({"metadata": {"namespace": "inference", "name": "a", "uid": "old-uid"}})  # an orphan's clean-up
    sim.delete_pod({"metadata": {"namespace": "inference", "name": "a"}})  # no UID: nothing to match
    assert [(r.source_uid, r.name) for r in sim.get_pods()] == [("new-uid", "a")] and sim.deletes == 0
    sim.delete_pod({"metadata": {"namespace": "inference", "name": "a", "uid": "new-uid"}})
    assert sim.get_pods() == [] and sim.deletes == 1


# ------------------------------------------------------------------ work queue and client helpers


def test_work_queue_dedups_and_never_hands_one_key_to_two_workers():
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a")
    assert len(q) == 1
    assert q.get(0.1) == "a"
    q.add("a")  # added while processing: held back
    assert q.get(0.05) is None
    q.done("a")
    assert q.get(0.1) == "a"
    q.done("a")
    q.add_after("b", 0.05)
    assert q.get(0.5) == "b"
    q.done("b")
    got = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(2)
    assert got == [None]


# ------------------------------------------------------------------ provider configuration errors


def test_provider_configuration_errors_are_clear(tmp_path):
    from types import SimpleNamespace

    from gpufleet.virtual_kubelet.providers import ProviderConfigError, build

    base = dict(name="p", gpu_model="H100-SXM-80GB", capacity_gpus=8, price_per_gpu_hour=1.0, kubeconfig_secret=None,
                start_latency_seconds=0, failure_rate=0, max_pods=10)
    with pytest.raises(ProviderConfigError, match="provider 'rent-a-gpu' is not installed here .kinds: kubernetes, simulated"):
        build(SimpleNamespace(**base, provider="rent-a-gpu"), node_name="vk-p")
    with pytest.raises(ProviderConfigError, match="unknown gpu_model"):
        build(SimpleNamespace(**{**base, "gpu_model": "B300"}, provider="simulated"), node_name="vk-p")
    with pytest.raises(ProviderConfigError, match="needs kubeconfig_secret"):
        build(SimpleNamespace(**base, provider="kubernetes"), node_name="vk-p")
    with pytest.raises(ProviderConfigError, match="does not exist"):
        build(SimpleNamespace(**base, provider="kubernetes"), node_name="vk-p", remote_kubeconfig=str(tmp_path / "nope"))
    bad = tmp_path / "kc"
    bad.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts: []\n")
    with pytest.raises(ProviderConfigError, match=f"pool p: kubeconfig {bad}: .*name x.*contexts"):
        build(SimpleNamespace(**base, provider="kubernetes"), node_name="vk-p", remote_kubeconfig=str(bad))
    sim = build(SimpleNamespace(**base, provider="simulated"), node_name="vk-p", start=False)
    assert sim.capacity().gpus == 8 and sim.capacity().gpu_product == H100


def test_status_write_replaces_host_ips_after_a_restart_on_another_address():
    # The strategic merge key of hostIPs is ip: a plain list would be merged into the old address's.
    from gpufleet.virtual_kubelet.pods import PodController

    from gpufleet_workshop.testing import FakeKube

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "status": {"phase": "Running", "hostIP": "10.244.1.8", "hostIPs": [{"ip": "10.244.1.8"}]}}
    kube = FakeKube(pod)
    ctl = PodController(kube, "vk-x", {}, host_ip="10.244.1.9")
    ctl._write_status(kube.get("v1", "pods", "p", "ns"), {"phase": "Running", "podIP": "10.1.0.5",
                                                          "startTime": "2026-01-01T00:00:00Z"})
    (patch,) = [a for a in kube.actions if a.verb == "patch"]
    status = patch.body["status"]
    assert status["hostIP"] == "10.244.1.9"
    assert status["hostIPs"] == [{"$patch": "replace"}, {"ip": "10.244.1.9"}]
    assert patch.patch_type == "strategic" and patch.subresource == "status"
    assert kube.get("v1", "pods", "p", "ns")["status"]["hostIPs"] == [{"ip": "10.244.1.9"}], "replaced, not merged"


def test_a_condition_turned_true_keeps_nothing_of_when_it_was_false_and_then_is_written_no_more():
    # A strategic merge keeps, per condition type, what the patch leaves out: reason and message of the False state.
    from gpufleet.virtual_kubelet.pods import PodController

    from gpufleet_workshop.testing import FakeKube

    was = {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
           "message": "containers with unready status: [server]", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "status": {"phase": "Pending", "reason": "ProviderStarting", "message": "waiting for the remote pod",
                      "startTime": "2026-01-01T00:00:00Z", "conditions": [was]}}
    kube = FakeKube(pod)
    ctl = PodController(kube, "vk-x", {}, host_ip="10.244.1.9")
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:05Z"}
    remote = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z", "conditions": [ready]}
    ctl._write_status(kube.get("v1", "pods", "p", "ns"), remote)
    status = kube.get("v1", "pods", "p", "ns")["status"]
    assert status["conditions"] == [ready]
    assert "reason" not in status and "message" not in status
    writes = len([a for a in kube.actions if a.verb == "patch"])
    ctl._write_status(kube.get("v1", "pods", "p", "ns"), remote)
    assert len([a for a in kube.actions if a.verb == "patch"]) == writes, "the status matches: nothing to write"


def test_register_with_taints_reads_as_the_kubelets_flag_and_lands_only_on_the_created_node():
    from gpufleet.cliargs import taints
    from gpufleet.names import FREE_GPUS_TAINT
    from gpufleet.virtual_kubelet.node import node_manifest, provider_taint
    from gpufleet.virtual_kubelet.provider import Capacity

    assert taints("") == []
    assert taints(f"{FREE_GPUS_TAINT}:NoSchedule, team=a:NoExecute") == [
        {"key": FREE_GPUS_TAINT, "effect": "NoSchedule"}, {"key": "team", "value": "a", "effect": "NoExecute"}]
    cap = Capacity(gpus=8, cpu=64, memory_bytes=2**40, pods=110, gpu_product="H100", price_per_gpu_hour=2.0)
    closed = node_manifest("rental", "simulated", cap, register_taints=taints(f"{FREE_GPUS_TAINT}:NoSchedule"))
    assert closed["spec"]["taints"] == [provider_taint("simulated"), {"key": FREE_GPUS_TAINT, "effect": "NoSchedule"}]
    assert node_manifest("rental", "simulated", cap)["spec"]["taints"] == [provider_taint("simulated")]
