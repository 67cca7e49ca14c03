"""The virtual kubelet against a second real cluster: node, lease, pod lifecycle, failures, restart, bad input.

The second cluster (``<session cluster>-other``, the session's ``other_cluster``: the ``other`` pool's nodes) is the
kubernetes provider's remote side, exactly what ``invoke local.up --name
other`` gives the ``other`` pool.
"""

from __future__ import annotations

import time

import pytest

from gpufleet.kube import Kube, NotFound
from gpufleet.kube.times import parse_time
from gpufleet.virtual_kubelet.main import VirtualKubelet
from gpufleet.virtual_kubelet.provider import SOURCE_UID
from gpufleet.virtual_kubelet.providers.kubernetes import KubernetesProvider
from gpufleet_workshop.rental.provider import SimulatedProvider

from .helpers import wait
from .vk_helpers import H100, delete_namespace, deployment, namespace, pods, ready

pytestmark = pytest.mark.cluster

POOL = "vkt-other"
NODE = f"vk-{POOL}"


@pytest.fixture(scope="module")
def other(other_cluster):
    """The second cluster (the session's, :func:`conftest.other_cluster`); this module's pods there live in its
    own namespaces, removed by ``ns``."""
    return other_cluster


@pytest.fixture(scope="module")
def kube(local_cluster):
    k = Kube.from_kubeconfig(local_cluster.kubeconfig)
    yield k
    k.close()


def start_vk(kube: Kube, other_cluster) -> VirtualKubelet:
    remote = Kube.from_kubeconfig(other_cluster.kubeconfig)
    prov = KubernetesProvider(POOL, remote, node_name=NODE, gpus=16, gpu_product=H100, price_per_gpu_hour=2.1).start()
    return VirtualKubelet(Kube(kube.config), POOL, "kubernetes", {POOL: prov}, resync_seconds=2.0,
                          status_interval=5.0, lease_seconds=40).start()


@pytest.fixture(scope="module")
def vk(kube, other):
    v = start_vk(kube, other)
    yield v
    v.close()
    try:
        kube.delete("v1", "nodes", NODE)
    except NotFound:
        pass


@pytest.fixture
def ns(kube, other):
    name = namespace(kube, "vkt")
    yield name
    delete_namespace(kube, name)
    remote = Kube.from_kubeconfig(other.kubeconfig)
    delete_namespace(remote, name)
    remote.close()


def remote_pods(other, ns: str) -> list[dict]:
    with Kube.from_kubeconfig(other.kubeconfig) as r:
        return r.list("v1", "pods", ns)["items"]


def test_node_registers_with_labels_taint_capacity_and_renews_its_lease(kube, vk):
    node = kube.get("v1", "nodes", NODE)
    labels = node["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet" and labels["gpufleet.io/pool"] == POOL
    assert labels["nvidia.com/gpu.product"] == H100
    assert {"key": "virtual-kubelet.io/provider", "value": "kubernetes", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "16"
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    lease = kube.get("coordination.k8s.io/v1", "leases", NODE, "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == NODE
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first = lease["spec"]["renewTime"]
    vk.lease.renew()
    assert kube.get("coordination.k8s.io/v1", "leases", NODE, "kube-node-lease")["spec"]["renewTime"] > first


def test_pod_lifecycle_create_status_delete(kube, vk, other, ns):
    kube.create("apps/v1", "deployments", deployment("web", ns, 2, node_selector={"gpufleet.io/pool": POOL}), ns)
    running = wait("2 pods Ready on the virtual node", lambda: (p := pods(kube, ns)) and
                   len([x for x in p if ready(x)]) == 2 and p, timeout=60)
    remote = {p["metadata"]["annotations"][SOURCE_UID]: p for p in remote_pods(other, ns)}
    assert len(remote) == 2
    for pod in running:
        assert pod["spec"]["nodeName"] == NODE
        r = remote[pod["metadata"]["uid"]]
        assert r["metadata"]["name"] == pod["metadata"]["name"]
        assert r["spec"]["nodeName"] not in (None, NODE)  # really scheduled in the other cluster
        assert "serviceAccountName" not in r["spec"] or r["spec"]["serviceAccountName"] == "default"
        # The remote pod's IP is not mirrored (gpufleet.virtual_kubelet.endpoints publishes the pod at its reachable address).
        assert pod["status"]["phase"] == "Running" and r["status"].get("podIP") and "podIP" not in pod["status"]
        assert parse_time(pod["status"]["startTime"]) is not None
        assert pod["status"]["containerStatuses"][0]["state"].get("running")
    # Scale down: the deleted pod goes here and there; the VK finishes the graceful deletion itself.
    kube.patch("apps/v1", "deployments", "web", {"spec": {"replicas": 1}}, ns)
    wait("1 pod left here and remotely", lambda: len(pods(kube, ns)) == 1 and len(remote_pods(other, ns)) == 1,
         timeout=60)
    # Delete the last pod directly (graceful, 5 s grace): gone in both clusters well before the grace ends.
    last = pods(kube, ns)[0]
    t0 = time.monotonic()
    kube.delete("v1", "pods", last["metadata"]["name"], ns)
    wait("the deleted pod gone here", lambda: last["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods(kube, ns)},
         timeout=30)
    assert time.monotonic() - t0 < 5
    assert last["metadata"]["uid"] not in {p["metadata"]["annotations"][SOURCE_UID] for p in remote_pods(other, ns)}


def test_the_offload_ledger_counts_gpu_seconds_and_cost_while_pods_run_outside(kube, vk, other, ns):
    """gpufleet_flip_external_gpu_{seconds,cost}_total{pool} grow by GPUs x seconds (x price / 3600) while the pods
    run at the provider, and stop growing once they are gone (the vk in-process: its registry is this one)."""
    from prometheus_client.core import REGISTRY

    def counters() -> tuple[float, float]:
        seconds = REGISTRY.get_sample_value("gpufleet_flip_external_gpu_seconds_total", {"pool": POOL})
        cost = REGISTRY.get_sample_value("gpufleet_flip_external_gpu_cost_total", {"pool": POOL, "currency": "USD"})
        assert seconds is not None and cost is not None, "the pool's counters are not served"
        return seconds, cost

    # Earlier tests' namespaces are deleted without waiting: let their pods leave the node first.
    wait("no pod on the virtual node", lambda: not kube.list("v1", "pods", fieldSelector=f"spec.nodeName={NODE}")["items"]
         and not vk.pods.ledger.gpus_running(), timeout=90)
    seconds0, cost0 = counters()  # earlier tests' pods have counted too: deltas only
    t0 = time.monotonic()
    kube.create("apps/v1", "deployments", deployment("paid", ns, 2, gpus=2, node_selector={"gpufleet.io/pool": POOL}), ns)
    wait("2 pods Ready on the virtual node", lambda: len([p for p in pods(kube, ns) if ready(p)]) == 2, timeout=60)
    assert vk.pods.ledger.gpus_running() == {POOL: 4}
    time.sleep(3)
    seconds1, cost1 = counters()
    assert seconds1 - seconds0 >= 4 * 3
    kube.patch("apps/v1", "deployments", "paid", {"spec": {"replicas": 0}}, ns)
    wait("the pods gone here and remotely", lambda: not pods(kube, ns) and not remote_pods(other, ns), timeout=60)
    elapsed = time.monotonic() - t0
    assert vk.pods.ledger.gpus_running() == {}
    seconds2, cost2 = counters()
    assert 4 * 3 <= seconds2 - seconds0 <= 4 * elapsed
    assert cost2 - cost0 == pytest.approx((seconds2 - seconds0) / 3600 * 2.1)
    time.sleep(1)
    assert counters() == (seconds2, cost2)  # nothing runs outside: the counters stand still


def test_remote_failure_and_loss_mark_failed_and_the_replicaset_replaces(kube, vk, other, ns):
    kube.create("apps/v1", "deployments", deployment("svc", ns, 2, node_selector={"gpufleet.io/pool": POOL}), ns)
    wait("2 Ready", lambda: len([p for p in pods(kube, ns) if ready(p)]) == 2, timeout=60)
    first, second = sorted(pods(kube, ns), key=lambda p: p["metadata"]["name"])
    with Kube.from_kubeconfig(other.kubeconfig) as r:
        # The remote pod fails (its container exits): mirrored as Failed.
        r.patch("v1", "pods", first["metadata"]["name"], {"status": {"phase": "Failed", "reason": "Evicted",
                                                                    "message": "remote node ran out of GPUs"}},
                ns, subresource="status")
        # The provider loses the other one: Failed, reason ProviderLost.
        r.delete("v1", "pods", second["metadata"]["name"], ns, grace_seconds=0)
    failed = wait("both pods Failed", lambda: (f := {p["metadata"]["uid"]: p for p in pods(kube, ns)
                                                     if p["status"].get("phase") == "Failed"}) and len(f) == 2 and f,
                  timeout=30)
    assert failed[first["metadata"]["uid"]]["status"]["reason"] == "Evicted"
    assert failed[second["metadata"]["uid"]]["status"]["reason"] == "ProviderLost"
    assert any(e["reason"] == "ProviderLost" and e["involvedObject"]["uid"] == second["metadata"]["uid"]
               for e in kube.list("v1", "events", ns)["items"])
    wait("2 replacements Ready", lambda: len([p for p in pods(kube, ns) if ready(p)]) == 2, timeout=60)


def test_a_stale_cached_pod_never_overwrites_a_mirrored_terminal_status(kube, vk, other, ns):
    # The watch can deliver our own terminal status write after the remote pod's deletion: a reconcile
    # then sees the pod Running with no remote pod. It must not turn Failed/Evicted into ProviderLost.
    kube.create("apps/v1", "deployments", deployment("svc", ns, 1, node_selector={"gpufleet.io/pool": POOL}), ns)
    running = wait("1 Ready", lambda: [p for p in pods(kube, ns) if ready(p)], timeout=60)[0]
    name = running["metadata"]["name"]
    with Kube.from_kubeconfig(other.kubeconfig) as r:
        r.patch("v1", "pods", name, {"status": {"phase": "Failed", "reason": "Evicted", "message": "remote node ran out"}},
                ns, subresource="status")
        wait("Failed mirrored", lambda: kube.get("v1", "pods", name, ns)["status"].get("phase") == "Failed", timeout=30)
        try:
            r.delete("v1", "pods", name, ns, grace_seconds=0)  # what the remote kubelet does after our delete
        except NotFound:
            pass
    wait("the remote pod gone", lambda: vk.providers[POOL].get_pod(ns, name) is None, timeout=30)
    key = f"{ns}/{name}"
    with vk.pods.pods.lock:
        vk.pods.pods._items[key] = running  # the view from before the status write
    vk.pods.reconcile(key)
    live = kube.get("v1", "pods", name, ns)
    assert (live["status"]["phase"], live["status"]["reason"]) == ("Failed", "Evicted")


def test_restart_mid_flight_loses_duplicates_and_orphans_nothing(kube, vk, other, ns):
    kube.create("apps/v1", "deployments", deployment("job", ns, 3, node_selector={"gpufleet.io/pool": POOL}), ns)
    wait("3 Ready", lambda: len([p for p in pods(kube, ns) if ready(p)]) == 3, timeout=60)
    before = {p["metadata"]["uid"]: p["metadata"]["uid"] for p in remote_pods(other, ns)}
    vk.pods.stop()  # the pod side stops (a crash); the node stays Ready meanwhile
    time.sleep(0.5)
    survivors = sorted(pods(kube, ns), key=lambda p: p["metadata"]["name"])
    # While it is down: one pod is deleted gracefully (stays Terminating: no kubelet finishes it),
    # one is force-deleted (its remote pod becomes an orphan), and two new pods are bound to the node.
    kube.delete("v1", "pods", survivors[0]["metadata"]["name"], ns)
    kube.delete("v1", "pods", survivors[1]["metadata"]["name"], ns, grace_seconds=0)
    kube.patch("apps/v1", "deployments", "job", {"spec": {"replicas": 4}}, ns)
    wait("new pods bound while the VK is down", lambda: len([p for p in pods(kube, ns)
                                                            if not p["metadata"].get("deletionTimestamp")]) >= 4, timeout=30)
    remote_before_restart = {p["metadata"]["annotations"][SOURCE_UID]: p["metadata"]["uid"] for p in remote_pods(other, ns)}
    assert len(remote_before_restart) == 3  # nothing changed remotely while down

    vk.pods = type(vk.pods)(vk.kube, NODE, vk.providers, resync_seconds=2.0)  # a fresh pod side, nothing remembered
    vk.pods.start()

    def settled():
        here = [p for p in pods(kube, ns)]
        there = remote_pods(other, ns)
        live = {p["metadata"]["uid"] for p in here if ready(p)}
        remote_src = [p["metadata"]["annotations"][SOURCE_UID] for p in there]
        return (len(here) == 4 and len(live) == 4 and sorted(remote_src) == sorted(live)) and (here, there)

    here, there = wait("4 Ready pods, each with exactly one remote pod, nothing else remotely", settled, timeout=60)
    remote_after = {p["metadata"]["annotations"][SOURCE_UID]: p["metadata"]["uid"] for p in there}
    kept = survivors[2]["metadata"]["uid"]
    assert remote_after[kept] == remote_before_restart[kept] == before[remote_before_restart[kept]]  # adopted, not re-created
    assert survivors[0]["metadata"]["uid"] not in remote_after and survivors[1]["metadata"]["uid"] not in remote_after


def test_bad_input_fails_the_pod_with_an_event_and_never_crashes(kube, vk, ns):
    def bound(name: str, **spec) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "x",
                                                           "resources": {"limits": {"nvidia.com/gpu": "1"}}}], **spec}}

    kube.create("v1", "pods", bound("b200", nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"}), ns)
    kube.create("v1", "pods", bound("hostpath", volumes=[{"name": "h", "hostPath": {"path": "/etc"}}]), ns)
    kube.create("v1", "pods", bound("hostnet", hostNetwork=True), ns)
    got = wait("3 pods Failed", lambda: (f := {p["metadata"]["name"]: p["status"] for p in pods(kube, ns)
                                              if p["status"].get("phase") == "Failed"}) and len(f) == 3 and f, timeout=30)
    assert got["b200"]["reason"] == "NoProvider" and "NVIDIA-B200" in got["b200"]["message"]
    assert got["hostpath"]["reason"] == "Refused" and "hostPath" in got["hostpath"]["message"]
    assert got["hostnet"]["reason"] == "Refused" and "hostNetwork" in got["hostnet"]["message"]
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in kube.list("v1", "events", ns)["items"]}
    assert {("b200", "NoProvider"), ("hostpath", "Refused"), ("hostnet", "Refused")} <= reasons
    # The loop is alive: a good pod still runs.
    kube.create("v1", "pods", bound("good"), ns)
    wait("the good pod Ready", lambda: ready(kube.get("v1", "pods", "good", ns)), timeout=30)


def test_simulated_provider_failure_injection_fails_pods_and_replacements_run(kube, ns):
    """The rental stand-in: an injected create failure fails the pod (Event), a later remote failure too."""
    sim = SimulatedProvider("vkt-rental", gpus=8, gpu_product=H100, price_per_gpu_hour=2.85, start_latency_seconds=0.5,
                            failure_rate=0.0, node_name="vk-vkt-rental").start()
    v = VirtualKubelet(Kube(kube.config), "vkt-rental", "simulated", {"vkt-rental": sim}, resync_seconds=2.0).start()
    try:
        sim.failure_rate = 1.0  # every create fails
        kube.create("apps/v1", "deployments", deployment("r", ns, 1, node_selector={"gpufleet.io/pool": "vkt-rental"}), ns)
        failed = wait("a pod Failed by the rental", lambda: [p for p in pods(kube, ns) if p["status"].get("phase") == "Failed"],
                      timeout=30)
        assert failed[0]["status"]["reason"] == "ProviderFailed"
        sim.failure_rate = 0.0
        wait("a replacement Ready", lambda: [p for p in pods(kube, ns) if ready(p)], timeout=30)
        (live,) = [p for p in pods(kube, ns) if ready(p)]
        sim.fail_pod(ns, live["metadata"]["name"], reason="XidError", message="GPU fell off the bus")
        wait("the failed rental mirrored", lambda: kube.get("v1", "pods", live["metadata"]["name"], ns)["status"].get("reason")
             == "XidError", timeout=30)
        wait("another replacement Ready", lambda: [p for p in pods(kube, ns) if ready(p)
                                                   and p["metadata"]["uid"] != live["metadata"]["uid"]], timeout=30)
    finally:
        v.close()
        try:
            kube.delete("v1", "nodes", "vk-vkt-rental")
        except NotFound:
            pass


def test_a_remote_delete_never_hits_a_same_named_replacement(kube, other, ns):
    """Every remote delete carries the remote pod's UID: with a stale watch cache, the clean-up of an
    orphan whose name a replacement now carries gets 409 from the remote API server; the replacement serves on."""
    from gpufleet.virtual_kubelet.provider import SOURCE_NAME, SOURCE_NAMESPACE, REMOTE_NODE_LABEL

    remote = Kube.from_kubeconfig(other.kubeconfig)
    node = "vk-vkt-uid"
    prov = KubernetesProvider("vkt-uid", remote, node_name=node, gpus=8, gpu_product=H100, price_per_gpu_hour=1.0).start()
    try:
        prov._ensure_namespace(ns)

        def remote_pod(source_uid: str) -> dict:
            return {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "dup", "namespace": ns, "labels": {REMOTE_NODE_LABEL: node},
                                 "annotations": {SOURCE_UID: source_uid, SOURCE_NAMESPACE: ns, SOURCE_NAME: "dup"}},
                    "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "x"}]}}

        remote.create("v1", "pods", remote_pod("source-1"), ns)
        wait("the first remote pod cached", lambda: prov.get_pod(ns, "dup") is not None, timeout=20)
        # Freeze the watch cache on the first pod: stop the watch, let one more event end its thread.
        prov.pods.stop()
        remote.patch("v1", "pods", "dup", {"metadata": {"labels": {"freeze": "1"}}}, ns)
        prov.pods._thread.join(timeout=20)
        assert not prov.pods._thread.is_alive()
        remote.delete("v1", "pods", "dup", ns, grace_seconds=0)
        wait("the first remote pod gone", lambda: remote.get_or_none("v1", "pods", "dup", ns) is None, timeout=20)
        replacement = remote.create("v1", "pods", remote_pod("source-2"), ns)
        assert (prov.get_pod(ns, "dup")["metadata"]["annotations"] or {})[SOURCE_UID] == "source-1"  # stale
        prov.delete_pod({"metadata": {"namespace": ns, "name": "dup", "uid": "source-1"}})  # the orphan's clean-up
        live = remote.get("v1", "pods", "dup", ns)
        assert live["metadata"]["uid"] == replacement["metadata"]["uid"] and live["metadata"].get("deletionTimestamp") is None
        prov.delete_pod({"metadata": {"namespace": ns, "name": "dup", "uid": "other-source"}})  # no such remote pod
        assert remote.get("v1", "pods", "dup", ns)["metadata"].get("deletionTimestamp") is None
        prov.delete_pod({"metadata": {"namespace": ns, "name": "dup", "uid": "source-2"}})  # its own source: deleted
        wait("the replacement deleted by its own source", lambda: remote.get_or_none("v1", "pods", "dup", ns) is None,
             timeout=20)
    finally:
        prov.close()


def test_retried_creates_leave_one_event_per_attempt_class_and_the_final_failure_its_own(kube, ns):
    """A create refused as out of capacity is retried: one OutOfCapacity Event counts the attempts, and
    the failure after the retry window records its own Event."""
    sim = SimulatedProvider("vkt-full", gpus=1, gpu_product=H100, price_per_gpu_hour=1.0, node_name="vk-vkt-full").start()
    v = VirtualKubelet(Kube(kube.config), "vkt-full", "simulated", {"vkt-full": sim}, resync_seconds=2.0,
                       create_retry_seconds=6.0).start()
    try:
        kube.create("v1", "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": ns},
                                   "spec": {"nodeName": "vk-vkt-full", "containers": [
                                       {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}, ns)
        wait("the pod Failed after its retries", lambda: kube.get("v1", "pods", "big", ns)["status"].get("phase") == "Failed",
             timeout=60)
        events = [e for e in kube.list("v1", "events", ns)["items"] if e["involvedObject"]["name"] == "big"]
        retries = [e for e in events if "retrying" in e["message"]]
        final = [e for e in events if "gave up after" in e["message"]]
        assert len(retries) == 1, events
        (retry,) = retries
        assert retry["reason"] == "OutOfCapacity" and retry["count"] >= 3
        assert f"attempt {retry['count']}, retrying" in retry["message"]
        assert len(final) == 1 and final[0]["reason"] == "OutOfCapacity" and final[0]["type"] == "Warning"
        assert kube.get("v1", "pods", "big", ns)["status"]["reason"] == "OutOfCapacity"
    finally:
        v.close()
        try:
            kube.delete("v1", "nodes", "vk-vkt-full")
        except NotFound:
            pass
