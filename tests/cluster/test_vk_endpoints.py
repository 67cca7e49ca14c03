"""Inference reachable wherever it runs: a flip onto a virtual node, and the Service follows the pods.

The inference role's Deployment and Service run first in-cluster (kwok GPU
nodes; kube-controller-manager's EndpointSlice controller publishes them),
then flip onto a virtual node (the in-cluster nodes cordoned as if training
held them, the pods evicted): the Service's EndpointSlices then list the
outside pods at the address their provider reports, ready, in slices the
virtual kubelet manages, and none of them in the standard controller's;
each is marked ``endpoints.gpufleet.io/Published`` only while it is a ready
endpoint there (not before a load balancer's address, not while its
address does not answer). A deleted outside pod's endpoint is not ready
(terminating) before its remote pod is stopped, and gone with the pod. Providers: the simulated rental
(instance endpoints with mapped ports) and the kubernetes provider against
a second real cluster (remote pod IPs; a remote load balancer per workload).
"""

from __future__ import annotations

import copy
import time

import pytest

from gpufleet.kube import Kube, NotFound
from gpufleet.kube.events import events_for
from gpufleet.names import (
    ENDPOINTSLICE_MANAGED_BY, ENDPOINTSLICE_MANAGED_BY_LABEL, PUBLISHED_CONDITION, SERVICE_NAME_LABEL,
)
from gpufleet.virtual_kubelet.endpoint_health import HealthSettings
from gpufleet.virtual_kubelet.providers.kubernetes import KubernetesProvider
from gpufleet_workshop.rental.provider import SimulatedProvider
from roles.inference.manifests import objects as inference_objects
from roles.registry import load

from .helpers import wait
from .vk_helpers import (H100, close_virtual_kubelet, delete_namespace, deployment, namespace, pods, ready,
                         simulated_provider, start_virtual_kubelet)

pytestmark = pytest.mark.cluster

SLICES = "discovery.k8s.io/v1"
STANDARD = "endpointslice-controller.k8s.io"


@pytest.fixture(scope="module")
def kube(local_cluster):
    k = Kube.from_kubeconfig(local_cluster.kubeconfig)
    yield k
    k.close()


@pytest.fixture(scope="module")
def other(other_cluster):
    """The second cluster (the session's, :func:`conftest.other_cluster`), the kubernetes provider's remote side."""
    return other_cluster


def slices(kube: Kube, ns: str, service: str, managed_by: str) -> list[dict]:
    return kube.list(SLICES, "endpointslices", ns,
                     labelSelector=f"{SERVICE_NAME_LABEL}={service},{ENDPOINTSLICE_MANAGED_BY_LABEL}={managed_by}")["items"]


def published(kube: Kube, ns: str, service: str, managed_by: str = ENDPOINTSLICE_MANAGED_BY) -> dict[tuple[str, int], dict]:
    """``{(address, port): endpoint}`` of the Service's slices that ``managed_by`` manages (one port per Service here)."""
    out = {}
    for s in slices(kube, ns, service, managed_by):
        for e in s.get("endpoints") or []:
            for port in s.get("ports") or []:
                out[(e["addresses"][0], port["port"])] = e
    return out


def marked_published(pod: dict) -> bool:
    """Whether the virtual kubelet marked ``pod`` published (a ready endpoint of every Service selecting it)."""
    return any(c.get("type") == PUBLISHED_CONDITION and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def inference_in(ns: str, replicas: int) -> tuple[dict, dict]:
    """The inference role's Deployment and Service (local inventory) in namespace ``ns``, ``replicas`` pods."""
    objs = {o["kind"]: copy.deepcopy(o) for o in inference_objects(load("local"))
            if o["kind"] in ("Deployment", "Service")}
    for o in objs.values():
        o["metadata"]["namespace"] = ns
    objs["Deployment"]["spec"]["replicas"] = replicas
    return objs["Deployment"], objs["Service"]


class Cordoned:
    """Every schedulable node but ``keep_node`` cordoned while in the block (as if training held the cluster)."""

    def __init__(self, kube: Kube, keep_node: str):
        self.kube, self.keep_node, self.nodes = kube, keep_node, []

    def __enter__(self):
        for n in self.kube.list("v1", "nodes")["items"]:
            if n["metadata"]["name"] != self.keep_node and not n["spec"].get("unschedulable"):
                self.kube.patch("v1", "nodes", n["metadata"]["name"], {"spec": {"unschedulable": True}})
                self.nodes.append(n["metadata"]["name"])
        return self

    def __exit__(self, *exc):
        for name in self.nodes:
            try:
                self.kube.patch("v1", "nodes", name, {"spec": {"unschedulable": None}})
            except NotFound:
                pass


def simulated(pool: str, node: str, other_cluster) -> SimulatedProvider:
    return simulated_provider(pool, node)


def kubernetes_pod_ip(pool: str, node: str, other_cluster) -> KubernetesProvider:
    return KubernetesProvider(pool, Kube.from_kubeconfig(other_cluster.kubeconfig), node_name=node, gpus=8,
                              gpu_product=H100, price_per_gpu_hour=2.1, address_mode="pod_ip").start()


@pytest.mark.parametrize("make_provider", [simulated, kubernetes_pod_ip], ids=["rental", "other-cluster-pod-ip"])
def test_inference_flipped_outside_is_published_at_its_reachable_address(kube, local_queues, request, make_provider):
    pool = f"ept-{request.node.callspec.id}"[:40]
    node = f"vk-{pool}"
    remote_side = request.getfixturevalue("other") if make_provider is kubernetes_pod_ip else None
    prov = make_provider(pool, node, remote_side)
    vk = start_virtual_kubelet(kube, pool, prov, "simulated" if make_provider is simulated else "kubernetes")
    ns = namespace(kube, "ept")
    dep, svc = inference_in(ns, replicas=2)
    name = svc["metadata"]["name"]
    try:
        kube.create("v1", "services", svc, ns)
        kube.create("apps/v1", "deployments", dep, ns)
        # In-cluster first: the standard controller publishes the pods at their pod IPs; nothing of ours.
        inside = wait("2 pods Ready in-cluster and published by the standard controller",
                      lambda: (p := [x for x in pods(kube, ns) if ready(x) and x["spec"]["nodeName"] != node])
                      and len(p) == 2 and {(x["status"]["podIP"], 8000) for x in p} == set(
                          (a, port) for (a, port), e in published(kube, ns, name, STANDARD).items()
                          if e["conditions"]["ready"]) and p, timeout=90)
        assert published(kube, ns, name) == {}

        with Cordoned(kube, node):
            # The flip: in-cluster pods evicted, their replacements run outside.
            for p in inside:
                kube.delete("v1", "pods", p["metadata"]["name"], ns, grace_seconds=0)
            outside = wait("2 pods Ready on the virtual node",
                           lambda: (p := [x for x in pods(kube, ns) if ready(x) and x["spec"]["nodeName"] == node])
                           and len(p) == 2 and p, timeout=90)
            for p in outside:
                assert "podIP" not in p["status"]  # never the remote side's IP
            addresses = {p["metadata"]["uid"]: prov.pod_address(ns, p["metadata"]["name"]) for p in outside}
            assert all(addresses.values())
            want = {(a.ip, a.port_for("TCP", 8000)): uid for uid, a in addresses.items()}

            def ours_ready():
                got = published(kube, ns, name)
                return got if {k: e["targetRef"]["uid"] for k, e in got.items() if e["conditions"]["ready"]} == want \
                    and len(got) == 2 else None

            got = wait("the outside pods published at their reachable addresses, ready", ours_ready, timeout=30)
            for (ip, port), e in got.items():
                assert e["conditions"] == {"ready": True, "serving": True, "terminating": False}
                assert e["nodeName"] == node and e["targetRef"]["kind"] == "Pod"
            if make_provider is simulated:
                assert all(port == 40000 and ip.startswith("198.1") for ip, port in got)  # the instance's endpoint
            (ours,) = slices(kube, ns, name, ENDPOINTSLICE_MANAGED_BY)
            assert ours["metadata"]["ownerReferences"][0]["kind"] == "Service"
            assert ours["ports"] == [{"name": "http", "protocol": "TCP", "port": next(iter(got))[1]}]
            # Every endpoint has one publisher: the standard controller has none of the outside pods.
            std = published(kube, ns, name, STANDARD)
            assert not any((e.get("targetRef") or {}).get("uid") in want.values() for e in std.values())
            # Settled: resyncs write nothing.
            writes = vk.pods.endpoints.writes
            time.sleep(5)
            assert vk.pods.endpoints.writes == writes

            # Deleting a pod: at the moment its remote pod is stopped, its endpoint is already not ready.
            victim = outside[0]
            uid = victim["metadata"]["uid"]
            seen_at_stop: list = []
            stop_remote = prov.delete_pod

            def spy(pod):
                if pod["metadata"]["uid"] == uid and not seen_at_stop:
                    seen_at_stop.append(next((e["conditions"] for e in published(kube, ns, name).values()
                                              if (e.get("targetRef") or {}).get("uid") == uid), None))
                return stop_remote(pod)

            prov.delete_pod = spy
            kube.delete("v1", "pods", victim["metadata"]["name"], ns)
            wait("the deleted pod gone", lambda: uid not in {p["metadata"]["uid"] for p in pods(kube, ns)}, timeout=30)
            assert seen_at_stop == [{"ready": False, "serving": True, "terminating": True}]
            wait("its endpoint gone, its replacement published", lambda: (got := published(kube, ns, name))
                 and uid not in {e["targetRef"]["uid"] for e in got.values()}
                 and len([e for e in got.values() if e["conditions"]["ready"]]) == 2, timeout=60)

            # A pod IP mirrored by an earlier version is taken away (else the standard controller publishes it too).
            survivor = outside[1]["metadata"]["name"]
            kube.patch("v1", "pods", survivor, {"status": {"podIP": "10.99.0.1", "podIPs": [{"ip": "10.99.0.1"}]}}, ns,
                       subresource="status", patch="strategic")
            wait("the stale pod IP cleared", lambda: "podIP" not in kube.get("v1", "pods", survivor, ns)["status"],
                 timeout=30)
    finally:
        close_virtual_kubelet(kube, vk, ns, node)
        if remote_side is not None:
            with Kube.from_kubeconfig(remote_side.kubeconfig) as r:
                delete_namespace(r, ns)


def test_a_remote_load_balancer_per_workload_is_one_endpoint(kube, other):
    """The kubernetes provider's load_balancer mode: a remote LoadBalancer Service per workload; its ingress IP
    (set here as the remote cloud's load-balancer controller would) is the workload's one endpoint."""
    pool, node = "ept-lb", "vk-ept-lb"
    remote = Kube.from_kubeconfig(other.kubeconfig)
    prov = KubernetesProvider(pool, Kube.from_kubeconfig(other.kubeconfig), node_name=node, gpus=8, gpu_product=H100,
                              price_per_gpu_hour=2.1, address_mode="load_balancer").start()
    vk = start_virtual_kubelet(kube, pool, prov, "kubernetes")
    ns = namespace(kube, "eplb")
    dep = deployment("chat", ns, 2, node_selector={"gpufleet.io/pool": pool})
    dep["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": ns},
           "spec": {"selector": {"app": "chat"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}
    try:
        kube.create("v1", "services", svc, ns)
        kube.create("apps/v1", "deployments", dep, ns)
        wait("2 pods Ready outside", lambda: len([p for p in pods(kube, ns) if ready(p)]) == 2, timeout=60)
        lb = wait("the workload's remote LoadBalancer Service", lambda: remote.get_or_none("v1", "services", "gf-chat", ns))
        assert lb["spec"]["type"] == "LoadBalancer" and lb["spec"]["ports"][0]["port"] == 8000
        time.sleep(3)
        assert published(kube, ns, "chat") == {}  # no ingress yet: nothing reachable to publish
        # Ready, but not reachable yet: not published (a make-before-break replacement would not take a place yet).
        assert not [p for p in pods(kube, ns) if marked_published(p)]
        remote.patch("v1", "services", "gf-chat", {"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}},
                     ns, subresource="status")
        got = wait("the load balancer published as one ready endpoint",
                   lambda: (g := published(kube, ns, "chat")) and g, timeout=30)
        wait("both pods marked published", lambda: len([p for p in pods(kube, ns) if marked_published(p)]) == 2,
             timeout=30)
        assert list(got) == [("203.0.113.10", 8000)]
        (ep,) = got.values()
        assert ep["conditions"] == {"ready": True, "serving": True, "terminating": False} and "targetRef" not in ep
        # The workload leaves: its endpoint and the remote Service go.
        kube.patch("apps/v1", "deployments", "chat", {"spec": {"replicas": 0}}, ns)
        wait("no endpoint left", lambda: published(kube, ns, "chat") == {}, timeout=60)
        wait("the remote Service deleted with the last pod",
             lambda: remote.get_or_none("v1", "services", "gf-chat", ns) is None, timeout=60)
    finally:
        close_virtual_kubelet(kube, vk, ns, node)
        delete_namespace(remote, ns)
        remote.close()


def test_an_endpoint_that_stops_answering_is_published_not_ready_while_its_pod_runs(kube):
    """The rental still reports the pod Running and Ready, but its endpoint refuses connections: the virtual
    kubelet's own TCP check takes it out of the Service within a few seconds, records it on the pod, and puts it
    back once it answers again."""
    pool, node = "ept-health", "vk-ept-health"
    prov = simulated_provider(pool, node)
    settings = HealthSettings(interval_seconds=1.0, timeout_seconds=0.5, unhealthy_threshold=2)
    vk = start_virtual_kubelet(kube, pool, prov, endpoint_health=settings)
    ns = namespace(kube, "eph")
    dep = deployment("chat", ns, 2, node_selector={"gpufleet.io/pool": pool})
    dep["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": ns},
           "spec": {"selector": {"app": "chat"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}
    try:
        kube.create("v1", "services", svc, ns)
        kube.create("apps/v1", "deployments", dep, ns)
        victim, other = wait("2 pods Ready outside", lambda: (p := [x for x in pods(kube, ns) if ready(x)])
                             and len(p) == 2 and sorted(p, key=lambda x: x["metadata"]["name"]), timeout=60)
        name = victim["metadata"]["name"]
        dead = prov.pod_address(ns, name).ip
        wait("both published ready", lambda: len([e for e in published(kube, ns, "chat").values()
                                                  if e["conditions"]["ready"]]) == 2, timeout=30)
        time.sleep(2 * settings.interval_seconds)
        assert all(e["conditions"]["ready"] for e in published(kube, ns, "chat").values())  # answering: left alone
        assert all(marked_published(kube.get("v1", "pods", p["metadata"]["name"], ns)) for p in (victim, other))

        prov.kill_endpoint(ns, name)
        killed = time.monotonic()
        got = wait("the dead endpoint published not ready", lambda: (g := published(kube, ns, "chat"))
                   and (dead, 40000) in g and not g[(dead, 40000)]["conditions"]["ready"] and g, timeout=15, interval=0.2)
        took = time.monotonic() - killed
        print(f"dead endpoint out of the Service after {took:.1f}s")
        assert took < settings.interval_seconds * (settings.unhealthy_threshold + 1) + 3
        assert got[(dead, 40000)]["conditions"] == {"ready": False, "serving": False, "terminating": False}
        assert [e["conditions"]["ready"] for k, e in got.items() if k[0] != dead] == [True]
        live = wait("the pod marked not published", lambda: (p := kube.get("v1", "pods", name, ns))
                    and not marked_published(p) and p, timeout=10, interval=0.2)
        assert live["status"]["phase"] == "Running" and ready(live)  # the provider still says so
        events = [e for e in events_for(kube, "Pod", name, ns) if e["reason"] == "EndpointUnreachable"]
        assert len(events) == 1 and f"{dead}:40000" in events[0]["message"], events

        prov.revive_endpoint(ns, name)
        wait("the endpoint published ready again", lambda: published(kube, ns, "chat").get((dead, 40000), {}).get("conditions")
             == {"ready": True, "serving": True, "terminating": False}, timeout=15, interval=0.2)
        wait("the pod marked published again", lambda: marked_published(kube.get("v1", "pods", name, ns)), timeout=10)
        wait("its recovery recorded", lambda: [e["reason"] for e in events_for(kube, "Pod", name, ns)
                                               if e["reason"].startswith("Endpoint")]
             == ["EndpointUnreachable", "EndpointReachable"], timeout=10)
    finally:
        close_virtual_kubelet(kube, vk, ns, node)
