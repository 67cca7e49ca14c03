"""The taint controller on the local cluster: hysteresis under a noisy signal, the apiserver signal, metrics."""

from __future__ import annotations

import random
import time

import pytest
from prometheus_client import generate_latest

from gpufleet.taint_controller.controller import TaintController
from gpufleet.taint_controller.decision import Hysteresis
from gpufleet.names import FREE_GPUS_TAINT
from gpufleet.taint_controller.signal import ApiServerSignal
from gpufleet.kube import Kube, NotFound, api_path
from gpufleet.kube.informer import Informer

from .helpers import wait
from .vk_helpers import delete_namespace, namespace

pytestmark = pytest.mark.cluster

POOLS = ("tct-a", "tct-b")


def virtual_node(name: str, pool: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"type": "virtual-kubelet", "gpufleet.io/pool": pool}},
            "spec": {"taints": [{"key": "virtual-kubelet.io/provider", "value": "simulated", "effect": "NoSchedule"}]},
            "status": {"capacity": {"nvidia.com/gpu": "8", "pods": "10"}, "allocatable": {"nvidia.com/gpu": "8", "pods": "10"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Test", "message": "",
                                       "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


@pytest.fixture(scope="module")
def kube(local_cluster):
    k = Kube.from_kubeconfig(local_cluster.kubeconfig)
    yield k
    k.close()


@pytest.fixture
def vnodes(kube):
    """Two virtual nodes of managed pools and one of a pool the controller must not touch."""
    names = {"vk-tct-a": "tct-a", "vk-tct-b": "tct-b", "vk-tct-foreign": "tct-foreign"}
    for n, pool in names.items():
        try:
            kube.delete("v1", "nodes", n)
        except NotFound:
            pass
        kube.create("v1", "nodes", virtual_node(n, pool))
    yield list(names)
    for n in names:
        try:
            kube.delete("v1", "nodes", n)
        except NotFound:
            pass


class Scripted:
    """A signal replaying ``values`` one per tick (then repeating the last)."""

    def __init__(self, values):
        self.values, self.i = list(values), 0

    def value(self):
        v = self.values[min(self.i, len(self.values) - 1)]
        self.i += 1
        return v


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_hysteresis_under_a_noisy_signal_taints_and_untaints_exactly_once(kube, vnodes):
    """300 one-second ticks of noisy free-GPU samples (clock injected, real nodes, real patches).

    Regimes: noise around the high mark (runs above shorter than the hold), then well above (taint),
    then noise around the high mark again (stays tainted), then well below (untaint), then noise
    around the low mark with dips shorter than the hold (stays untainted).
    """
    rng = random.Random(3)
    high, low, hold = 16, 8, 5

    def around(mark, n, max_run):
        out, run = [], 0
        for _ in range(n):
            v = mark + rng.uniform(-5, 5)
            run = run + 1 if v > mark else 0
            if run >= max_run:
                v, run = mark, 0
            out.append(v)
        out[-1] = mark  # no streak carries over into the next regime
        return out

    def around_low(n):
        out, run = [], 0
        for _ in range(n):
            v = low + rng.uniform(-5, 5)
            run = run + 1 if v < low else 0
            if run >= hold:
                v, run = low, 0
            out.append(v)
        return out

    values = around(high, 60, hold) + [40 + rng.uniform(-3, 3) for _ in range(40)] + around(high, 60, 10 ** 6) \
        + [1 + rng.uniform(-1, 1) for _ in range(40)] + around_low(100)
    # Watch the managed node's taints through the API server: every change is one event.
    changes: list[tuple[float, bool]] = []
    clock = FakeClock()

    def on_node(kind, new, old):
        if new["metadata"]["name"] != "vk-tct-a":
            return
        has = any(t.get("key") == FREE_GPUS_TAINT for t in new.get("spec", {}).get("taints") or [])
        if not changes or changes[-1][1] != has:
            changes.append((clock.t, has))

    watch = Informer(kube, api_path("v1", "nodes"), handlers=[on_node], name="test-nodes").start()
    watch.wait_synced()
    caches = ApiServerSignal(kube).start()
    ctl = TaintController(kube, Scripted(values), caches, Hysteresis(high, low, hold, tainted=False), pools=POOLS,
                          clock=clock).start()
    for _ in values:
        ctl.tick()
        clock.t += 1.0
        time.sleep(0.005)  # let watch events arrive in order
    wait("the last taint change observed", lambda: changes and changes[-1][1] is False, timeout=10)
    watch.stop()
    caches.stop()
    assert [c[1] for c in changes] == [False, True, False]  # initial state, one taint, one untaint
    assert [(t.tainted, t.reaction_seconds) for t in ctl.transitions] == [(True, hold), (False, hold)]
    assert 60 + hold <= changes[1][0] <= 60 + hold + 1
    assert 160 + hold <= changes[2][0] <= 160 + hold + 1
    # Only the managed pools' nodes; never NoExecute.
    foreign = kube.get("v1", "nodes", "vk-tct-foreign")
    assert not any(t["key"] == FREE_GPUS_TAINT for t in foreign["spec"].get("taints") or [])
    text = generate_latest().decode()
    assert "gpufleet_taint_controller_transitions_total" in text and "gpufleet_taint_controller_decision_latency_seconds" in text


def test_apiserver_signal_follows_pods_through_the_watch(kube, local_cluster):
    """A pod taking 3 GPUs of a node lowers the signal by 3; deleting it gives them back; a cordon removes the node."""
    caches = ApiServerSignal(kube).start()
    ns = namespace(kube, "tct")
    try:
        base = caches.value()
        nodes = [n for n in caches.nodes.items() if not n["virtual"] and n["gpus"] == 8 and n["ready"]]
        node = next(n for n in nodes if not n["unschedulable"])
        used = sum(p["gpus"] for p in caches.pods.items() if p["node"] == node["name"])
        kube.create("v1", "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu3", "namespace": ns},
                                   "spec": {"nodeName": node["name"], "tolerations": [{"operator": "Exists"}],
                                            "containers": [{"name": "c", "image": "x",
                                                            "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}}, ns)
        wait("signal down by 3", lambda: caches.value() == base - 3, timeout=15)
        kube.patch("v1", "nodes", node["name"], {"spec": {"unschedulable": True}})
        try:
            wait("cordoned node out of the signal", lambda: caches.value() == base - (8 - used), timeout=15)
        finally:
            kube.patch("v1", "nodes", node["name"], {"spec": {"unschedulable": None}})
        kube.delete("v1", "pods", "gpu3", ns, grace_seconds=0)
        wait("signal back", lambda: caches.value() == base, timeout=15)
        assert caches.pods.relists == 1 and caches.nodes.relists == 1  # watch only, no periodic lists
    finally:
        caches.stop()
        delete_namespace(kube, ns)


def test_taint_controller_cli_with_leader_election_taints_virtual_nodes(local_cluster, kube, vnodes):
    """``gpufleet taint-controller`` as a process: takes the Lease and taints the managed virtual nodes."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "taint-controller", "--kubeconfig", str(local_cluster.kubeconfig),
         "--high-water", "4", "--low-water", "2", "--hold-seconds", "1", "--pool", "tct-a", "--pool", "tct-b",
         "--namespace", "default", "--metrics-port", "0", "--flip-back", "off", "--no-flip-out"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait("both managed nodes tainted", lambda: all(
            any(t["key"] == FREE_GPUS_TAINT and t["effect"] == "NoSchedule"
                for t in kube.get("v1", "nodes", n)["spec"].get("taints") or []) for n in ("vk-tct-a", "vk-tct-b")),
             timeout=60)
        lease = kube.get("coordination.k8s.io/v1", "leases", "gpufleet-taint-controller", "default")
        assert lease["spec"]["holderIdentity"]
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        try:
            kube.delete("coordination.k8s.io/v1", "leases", "gpufleet-taint-controller", "default")
        except NotFound:
            pass
    assert "Traceback" not in out, out


def test_a_taint_removed_by_someone_else_is_restored_once_with_an_event_and_a_metric(kube, vnodes, caplog):
    """Restored once (Warning Event, metric, log line); removed again before the next decision, left off."""
    import logging

    from prometheus_client import REGISTRY

    from gpufleet.taint_controller.flipout import set_taint

    def carries(name: str) -> bool:
        return any(t["key"] == FREE_GPUS_TAINT for t in kube.get("v1", "nodes", name)["spec"].get("taints") or [])

    def cached(name: str, want: bool) -> None:
        wait(f"the cache sees {name} {'with' if want else 'without'} the taint",
             lambda: (n := caches.nodes.get(name)) is not None and TaintController.has_taint(n) == want, timeout=15)

    uid = kube.get("v1", "nodes", "vk-tct-a")["metadata"]["uid"]  # this test's node: Events of earlier ones differ

    def events(reason: str) -> list[dict]:
        return [e for e in kube.list("v1", "events", "default")["items"]
                if e["involvedObject"].get("uid") == uid and e["reason"] == reason]

    def metric(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"node": "vk-tct-a"}) or 0.0

    restored0, honoured0 = metric("gpufleet_taint_controller_taint_restored_total"), \
        metric("gpufleet_taint_controller_taint_removals_honoured_total")
    caches = ApiServerSignal(kube).start()
    signal = Scripted([40] * 5 + [1, 40])  # one value per tick below
    ctl = TaintController(kube, signal, caches, Hysteresis(16, 8, 0, tainted=False), pools=POOLS, clock=FakeClock()).start()
    try:
        ctl.tick()  # 40 free: tainted
        assert carries("vk-tct-a") and carries("vk-tct-b")
        cached("vk-tct-a", True)
        ctl.tick()  # seen carrying it
        assert not events("FreeGpusTaintRestored")
        set_taint(kube, "vk-tct-a", {"key": FREE_GPUS_TAINT, "effect": "NoSchedule"}, add=False)  # a person's kubectl
        cached("vk-tct-a", False)
        with caplog.at_level(logging.WARNING, logger="gpufleet.taint_controller.controller"):
            ctl.tick()
        assert carries("vk-tct-a")
        assert "removed from vk-tct-a by another actor" in caplog.text
        (event,) = events("FreeGpusTaintRestored")
        assert event["type"] == "Warning" and "restored once" in event["message"]
        assert metric("gpufleet_taint_controller_taint_restored_total") == restored0 + 1
        # Removed again before the next decision: honoured, said once, not fought over every tick.
        cached("vk-tct-a", True)
        set_taint(kube, "vk-tct-a", {"key": FREE_GPUS_TAINT, "effect": "NoSchedule"}, add=False)
        cached("vk-tct-a", False)
        ctl.tick()
        ctl.tick()
        assert not carries("vk-tct-a") and carries("vk-tct-b")
        assert len(events("FreeGpusTaintRemovalHonoured")) == 1 and len(events("FreeGpusTaintRestored")) == 1
        assert metric("gpufleet_taint_controller_taint_removals_honoured_total") == honoured0 + 1
        # The next decisions (untaint, then taint) take the node back.
        ctl.tick()  # 1 free: untainted
        cached("vk-tct-b", False)  # ticks are a second apart in production: let the cache follow
        ctl.tick()  # 40 free: tainted again
        assert carries("vk-tct-a") and carries("vk-tct-b")
        assert metric("gpufleet_taint_controller_taint_restored_total") == restored0 + 1  # not a restore: a decision
    finally:
        caches.stop()
