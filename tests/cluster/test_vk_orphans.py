"""No endpoint without a living publisher: a virtual kubelet stops, and what is still alive takes over its endpoints.

A virtual kubelet (short node Lease) publishes a pod it runs at the
simulated rental into a Service's EndpointSlices. Its loops then stop, as
a killed process's do: nothing renews its Lease or touches its slices. The
taint controller's pass over orphaned endpoints (:mod:`gpufleet.virtual_kubelet.orphans`,
run here in-process against the real cluster, as the taint controller runs
it) marks the endpoints not ready within the Lease's duration and a few
seconds; a virtual kubelet started again for the pool publishes them ready
again; once it stops and its Node is deleted, its slices are removed.
"""

from __future__ import annotations

import threading
import time

import pytest

from gpufleet.taint_controller.signal import node_view
from gpufleet.kube import Kube, api_path
from gpufleet.kube.informer import Informer
from gpufleet.names import ENDPOINTSLICE_MANAGED_BY, ENDPOINTSLICE_MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from gpufleet.virtual_kubelet.main import VirtualKubelet
from gpufleet.virtual_kubelet.orphans import EVENT_REASON, OrphanedEndpoints

from .helpers import wait
from .vk_helpers import close_virtual_kubelet, namespace, ready, simulated_provider, start_virtual_kubelet

pytestmark = pytest.mark.cluster

POOL = "vko-rental"
NODE = f"vk-{POOL}"
LEASE_SECONDS = 6
#: Seconds past the Lease's duration within which the endpoints must be not ready: ticks of 1 s, a write, the
#: test's own polling.
SLACK_SECONDS = 6


def endpoints(kube: Kube, ns: str) -> list[dict]:
    """Endpoints of the Service ``chat`` in gpufleet's slices of ``NODE``."""
    items = kube.list("discovery.k8s.io/v1", "endpointslices", ns, labelSelector=(
        f"{SERVICE_NAME_LABEL}=chat,{ENDPOINTSLICE_MANAGED_BY_LABEL}={ENDPOINTSLICE_MANAGED_BY},"
        f"gpufleet.io/virtual-node={NODE}"))["items"]
    return [e for s in items for e in s.get("endpoints") or []]


def pod() -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "server", "labels": {"app": "chat"}},
            "spec": {"nodeSelector": {"gpufleet.io/pool": POOL}, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                                     {"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "server", "image": "registry.invalid/inference:1",
                                     "ports": [{"name": "http", "containerPort": 8000}],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_a_stopped_virtual_kubelets_endpoints_go_not_ready_within_its_lease_and_leave_with_its_node(local_cluster):
    kube = Kube.from_kubeconfig(local_cluster.kubeconfig)
    prov = simulated_provider(POOL, NODE)

    def virtual_kubelet() -> VirtualKubelet:
        return start_virtual_kubelet(kube, POOL, prov, lease_seconds=LEASE_SECONDS)

    vk = virtual_kubelet()
    nodes = Informer(kube, api_path("v1", "nodes"), transform=node_view, name="nodes").start()
    orphans = OrphanedEndpoints(kube, nodes)
    stop = threading.Event()

    def ticks():
        while not stop.wait(1.0):
            orphans.tick()

    ns = namespace(kube, "vko")
    try:
        assert nodes.wait_synced(30)
        orphans.start()
        threading.Thread(target=ticks, daemon=True, name="orphans-test").start()
        kube.create("v1", "services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"},
                                       "spec": {"selector": {"app": "chat"},
                                                "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}, ns)
        kube.create("v1", "pods", pod(), ns)
        wait("the pod Ready outside", lambda: ready(kube.get("v1", "pods", "server", ns)), timeout=60)
        wait("its endpoint published ready", lambda: (e := endpoints(kube, ns)) and all(
            x["conditions"]["ready"] for x in e), timeout=30)
        time.sleep(2 * LEASE_SECONDS)  # a living publisher is left alone however long it lives
        assert all(x["conditions"]["ready"] for x in endpoints(kube, ns))

        vk.stop()  # as a killed process: nothing renews the Lease or touches the slices from now on
        stopped = time.monotonic()
        wait("its endpoints not ready", lambda: (e := endpoints(kube, ns)) and all(
            not x["conditions"]["ready"] and not x["conditions"]["serving"] for x in e),
             timeout=LEASE_SECONDS + SLACK_SECONDS)
        took = time.monotonic() - stopped
        print(f"endpoints not ready {took:.1f}s after the virtual kubelet stopped (Lease {LEASE_SECONDS}s)")
        assert took >= LEASE_SECONDS - 2  # not before the Lease could have expired (its last renewal <= 1.5 s earlier)
        events = [e for e in kube.list("v1", "events", "default")["items"]
                  if e["involvedObject"].get("name") == NODE and e["reason"] == EVENT_REASON]
        assert events and events[-1]["type"] == "Warning"

        # The publisher comes back: its endpoints are its own again, ready.
        vk = virtual_kubelet()
        wait("the endpoints ready again under a restarted virtual kubelet", lambda: (e := endpoints(kube, ns)) and all(
            x["conditions"]["ready"] for x in e), timeout=30)

        # Gone for good: stopped, then its Node deleted; its slices leave with it.
        vk.stop()
        kube.delete("v1", "nodes", NODE)
        wait("its slices removed with its Node", lambda: not endpoints(kube, ns), timeout=15)
        assert kube.get_or_none("v1", "services", "chat", ns) is not None  # the Service itself is the user's
    finally:
        stop.set()
        orphans.stop()
        nodes.stop()
        close_virtual_kubelet(kube, vk, ns, NODE)
        kube.close()
