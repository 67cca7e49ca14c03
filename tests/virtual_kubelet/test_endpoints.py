"""Publishing pods that run outside: slice building (pods -> EndpointSlices), the plan, providers' addresses."""

from __future__ import annotations

import pytest

from gpufleet.kube.informer import Informer
from gpufleet.names import (
    ENDPOINTSLICE_MANAGED_BY, ENDPOINTSLICE_MANAGED_BY_LABEL, PUBLISHED_CONDITION, SERVICE_NAME_LABEL,
)
from gpufleet.virtual_kubelet.endpoints import (
    MAX_ENDPOINTS_PER_SLICE, EndpointPublisher, build_slices, endpoint_ports, plan, published_in, selects,
)
from gpufleet.virtual_kubelet.provider import REMOTE_NODE_LABEL, Address
from gpufleet.virtual_kubelet.providers.kubernetes import ADDRESS_MODES, remote_service_name, workload_name
from gpufleet_workshop.rental.provider import PUBLIC_PORT_BASE, SimulatedProvider

NODE = "vk-rental"
H100 = "NVIDIA-H100-80GB-HBM3"


def service(name="chat", ns="inference", ports=None, **spec) -> dict:
    ports = ports if ports is not None else [{"name": "http", "protocol": "TCP", "port": 8000, "targetPort": "http"}]
    return {"metadata": {"name": name, "namespace": ns, "uid": f"svc-{name}"},
            "spec": {"selector": {"app": "chat"}, "ports": ports, "type": "ClusterIP", **spec}}


def pod(name: str, *, ready=True, deleting=False, phase="Running", labels=None, ns="inference", ports=None) -> dict:
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {"app": "chat"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"nodeName": NODE, "containers": [{"name": "server", "ports": ports if ports is not None else
                                                       [{"name": "http", "containerPort": 8000}]}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def endpoints_of(slices: list[dict]) -> dict[str, dict]:
    return {e["addresses"][0]: e for s in slices for e in s["endpoints"]}


def test_ready_outside_pods_become_endpoints_of_a_slice_gpufleet_manages():
    pods = [pod("a"), pod("b")]
    addresses = {"uid-a": Address("10.1.0.5"), "uid-b": Address("10.1.0.6")}
    (s,) = build_slices(service(), pods, addresses, node_name=NODE)
    assert s["apiVersion"] == "discovery.k8s.io/v1" and s["kind"] == "EndpointSlice"
    assert s["metadata"]["namespace"] == "inference"
    assert s["metadata"]["labels"] == {SERVICE_NAME_LABEL: "chat", ENDPOINTSLICE_MANAGED_BY_LABEL: ENDPOINTSLICE_MANAGED_BY,
                                       REMOTE_NODE_LABEL: NODE}
    assert ENDPOINTSLICE_MANAGED_BY != "endpointslice-controller.k8s.io"  # never the standard controller's slices
    assert s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Service", "name": "chat", "uid": "svc-chat"}]
    assert s["addressType"] == "IPv4" and s["ports"] == [{"name": "http", "protocol": "TCP", "port": 8000}]
    eps = endpoints_of([s])
    assert set(eps) == {"10.1.0.5", "10.1.0.6"}
    assert eps["10.1.0.5"] == {"addresses": ["10.1.0.5"], "nodeName": NODE,
                               "conditions": {"ready": True, "serving": True, "terminating": False},
                               "targetRef": {"kind": "Pod", "namespace": "inference", "name": "a", "uid": "uid-a"}}
    # Stable names: the same input gives the same slice (apply is idempotent).
    assert build_slices(service(), pods, addresses, node_name=NODE) == [s]
    assert len(s["metadata"]["name"]) <= 63 and s["metadata"]["name"].startswith("chat-gf-")


def test_conditions_mirror_the_pod_as_the_standard_controller_does():
    pods = [pod("up"), pod("warming", ready=False), pod("leaving", deleting=True),
            pod("leaving-unready", ready=False, deleting=True)]
    addresses = {p["metadata"]["uid"]: Address(f"10.1.0.{i}") for i, p in enumerate(pods, 1)}
    eps = endpoints_of(build_slices(service(), pods, addresses, node_name=NODE))
    cond = {e["targetRef"]["name"]: e["conditions"] for e in eps.values()}
    assert cond == {"up": {"ready": True, "serving": True, "terminating": False},
                    "warming": {"ready": False, "serving": False, "terminating": False},
                    "leaving": {"ready": False, "serving": True, "terminating": True},
                    "leaving-unready": {"ready": False, "serving": False, "terminating": True}}
    # publishNotReadyAddresses: always ready (as the standard controller).
    eps = endpoints_of(build_slices(service(publishNotReadyAddresses=True), pods, addresses, node_name=NODE))
    assert all(e["conditions"]["ready"] for e in eps.values())


def test_terminal_unselected_unaddressed_and_other_namespace_pods_are_left_out():
    pods = [pod("done", phase="Succeeded"), pod("failed", phase="Failed"), pod("other", labels={"app": "embed"}),
            pod("pending"), pod("elsewhere", ns="team-a"), pod("in")]
    addresses = {p["metadata"]["uid"]: Address("10.2.0.1" if p["metadata"]["name"] == "in" else f"10.2.1.{i}")
                 for i, p in enumerate(pods)}
    addresses["uid-pending"] = None
    eps = endpoints_of(build_slices(service(), pods, addresses, node_name=NODE))
    assert [e["targetRef"]["name"] for e in eps.values()] == ["in"]
    # No pod to publish: no slice (an existing one is then deleted by the plan).
    assert build_slices(service(), [pod("done", phase="Failed")], {"uid-done": Address("10.2.0.9")}, node_name=NODE) == []
    # A Service without selector, or ExternalName, is never ours to fill.
    assert build_slices(service(selector={}), [pod("in")], addresses, node_name=NODE) == []
    assert not selects(service(type="ExternalName"), pod("in"))


def test_ports_resolve_target_port_by_name_or_number_then_through_the_providers_port_map():
    svc = service(ports=[{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"},
                         {"name": "metrics", "protocol": "TCP", "port": 9090, "targetPort": 9400},
                         {"name": "grpc", "protocol": "TCP", "port": 50051, "targetPort": "grpc"}])
    p = pod("a", ports=[{"name": "http", "containerPort": 8000}, {"name": "metrics", "containerPort": 9400}])
    # Same numbers (a pod IP): the named port resolves to 8000; grpc is not declared by the pod: left out.
    assert endpoint_ports(svc, p, Address("10.0.0.1")) == (("http", "TCP", 8000, ""), ("metrics", "TCP", 9400, ""))
    # A rental maps ports: only what it exposes, at its public port.
    rented = Address("198.18.0.1", {("TCP", 8000): 40000})
    assert endpoint_ports(svc, p, rented) == (("http", "TCP", 40000, ""),)


def test_pods_with_different_port_sets_or_families_get_slices_of_their_own():
    pods = [pod("a"), pod("b"), pod("c")]
    addresses = {"uid-a": Address("10.0.0.1"), "uid-b": Address("198.18.0.2", {("TCP", 8000): 40000}),
                 "uid-c": Address("fd00::3")}
    slices = build_slices(service(ipFamilies=["IPv4", "IPv6"]), pods, addresses, node_name=NODE)
    shapes = sorted((s["addressType"], s["ports"][0]["port"], [e["addresses"][0] for e in s["endpoints"]]) for s in slices)
    assert shapes == [("IPv4", 8000, ["10.0.0.1"]), ("IPv4", 40000, ["198.18.0.2"]), ("IPv6", 8000, ["fd00::3"])]
    assert len({s["metadata"]["name"] for s in slices}) == 3
    # A single-stack IPv4 Service takes no IPv6 endpoint.
    assert [s["addressType"] for s in build_slices(service(ipFamilies=["IPv4"]), pods, addresses, node_name=NODE)] == [
        "IPv4", "IPv4"]


def test_pods_sharing_a_load_balancer_address_are_one_endpoint_ready_while_any_is():
    lb = Address("203.0.113.7", shared=True)
    pods = [pod("a", deleting=True), pod("b"), pod("c", ready=False)]
    (s,) = build_slices(service(), pods, {p["metadata"]["uid"]: lb for p in pods}, node_name=NODE)
    (ep,) = s["endpoints"]
    assert ep["addresses"] == ["203.0.113.7"] and "targetRef" not in ep
    assert ep["conditions"] == {"ready": True, "serving": True, "terminating": False}
    (s,) = build_slices(service(), [pods[0]], {"uid-a": lb}, node_name=NODE)
    assert s["endpoints"][0]["conditions"] == {"ready": False, "serving": True, "terminating": True}


def test_slices_hold_at_most_the_standard_number_of_endpoints():
    pods = [pod(f"p{i}") for i in range(MAX_ENDPOINTS_PER_SLICE + 5)]
    addresses = {p["metadata"]["uid"]: Address(f"10.3.{i // 250}.{i % 250 + 1}") for i, p in enumerate(pods)}
    slices = build_slices(service(), pods, addresses, node_name=NODE)
    assert sorted(len(s["endpoints"]) for s in slices) == [5, MAX_ENDPOINTS_PER_SLICE]
    assert len({e["addresses"][0] for s in slices for e in s["endpoints"]}) == len(pods)


def test_hostname_is_set_for_the_services_subdomain_as_the_standard_controller_does():
    p = pod("a")
    p["spec"].update(hostname="replica-0", subdomain="chat")
    (s,) = build_slices(service(), [p], {"uid-a": Address("10.0.0.1")}, node_name=NODE)
    assert s["endpoints"][0]["hostname"] == "replica-0"


def test_plan_writes_only_what_changed_and_deletes_what_is_no_longer_wanted():
    addresses = {"uid-a": Address("10.0.0.1")}
    desired = build_slices(service(), [pod("a")], addresses, node_name=NODE)
    live = [{**desired[0], "metadata": {**desired[0]["metadata"], "uid": "x", "resourceVersion": "7",
                                        "managedFields": [{}], "generation": 1}}]
    assert plan(desired, live) == ([], [])
    not_ready = build_slices(service(), [pod("a", ready=False)], addresses, node_name=NODE)
    assert plan(not_ready, live) == (not_ready, [])
    assert plan([], live) == ([], live)


# ------------------------------------------------------------------ providers' addresses


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def sim_pod(name: str, ports: list[dict]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "uid": f"uid-{name}", "labels": {"app": "chat"}},
            "spec": {"containers": [{"name": "server", "image": "img:1", "ports": ports,
                                     "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def test_a_rental_instance_reports_its_endpoint_while_it_runs():
    clock = Clock()
    sim = SimulatedProvider("rental", gpus=4, gpu_product=H100, price_per_gpu_hour=2.85, start_latency_seconds=2,
                            node_name=NODE, clock=clock)
    sim.create_pod(sim_pod("a", [{"name": "http", "containerPort": 8000}, {"name": "m", "containerPort": 9400}]))
    sim.create_pod(sim_pod("b", [{"name": "http", "containerPort": 8000}]))
    assert sim.pod_address("inference", "a") is None  # still starting
    clock.t = 2.0
    a, b = sim.pod_address("inference", "a"), sim.pod_address("inference", "b")
    assert a.ip != b.ip and a.ip.startswith("198.1") and not a.shared
    assert a.port_for("TCP", 8000) == PUBLIC_PORT_BASE and a.port_for("TCP", 9400) == PUBLIC_PORT_BASE + 1
    assert a.port_for("TCP", 1234) is None  # not exposed
    # Its own IP is not the endpoint: the instance's private address is not reachable from here.
    assert sim.get_pod_status("inference", "a")["podIP"] != a.ip
    sim.fail_pod("inference", "a")
    sim.delete_pod(sim_pod("b", []))
    assert sim.pod_address("inference", "a") is None and sim.pod_address("inference", "b") is None
    assert sim.pod_address("inference", "nope") is None


def test_remote_services_are_named_per_workload():
    rs_pod = {"metadata": {"name": "chat-7d9f-abcde", "labels": {"pod-template-hash": "7d9f"},
                           "ownerReferences": [{"kind": "ReplicaSet", "name": "chat-7d9f", "controller": True}]}}
    assert workload_name(rs_pod) == "chat"
    assert workload_name({"metadata": {"name": "p", "ownerReferences": [{"kind": "StatefulSet", "name": "db"}]}}) == "db"
    assert workload_name({"metadata": {"name": "bare"}}) == "bare"
    assert remote_service_name("chat") == "gf-chat"
    long = remote_service_name("a.b" + "x" * 100)
    assert len(long) <= 63 and "." not in long and long == remote_service_name("a.b" + "x" * 100)
    assert ADDRESS_MODES == ("pod_ip", "load_balancer")


# ------------------------------------------------------------------ the pool setting


def pool(**extra) -> dict:
    return {"name": "burst", "provider": "kubernetes", "gpu_model": "H100-SXM-80GB", "capacity_gpus": 8,
            "price_per_gpu_hour": 2.0, **extra}


def test_address_mode_is_validated_per_pool():
    from pydantic import ValidationError
    from roles.virtual_kubelet.vars import PoolVars

    assert PoolVars(**pool()).address_mode is None
    assert PoolVars(**pool(address_mode="load_balancer")).address_mode == "load_balancer"
    with pytest.raises(ValidationError, match=r"(?s)address_mode.*'pod_ip' or 'load_balancer'"):
        PoolVars(**pool(address_mode="nodeport"))
    with pytest.raises(ValidationError, match=r"address_mode 'pod_ip' applies to provider kubernetes only.*'rental'"):
        PoolVars(**pool(name="rental", provider="simulated", address_mode="pod_ip"))


def test_a_bad_address_mode_in_an_inventory_names_the_file_key_and_value(tmp_path):
    import shutil

    import yaml

    from gpufleet_admin.inventory import InventoryError
    from gpufleet.paths import INVENTORIES
    from roles.registry import load

    root = tmp_path / "inventories" / "staging"
    shutil.copytree(INVENTORIES / "staging", root)
    path = root / "group_vars/all/virtual_kubelet.yml"
    data = yaml.safe_load(path.read_text())
    data["virtual_kubelet_pools"][0]["address_mode"] = "nodeport"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InventoryError) as info:
        load("staging", root=root)
    text = str(info.value)
    assert ("inventories/staging/group_vars/all/virtual_kubelet.yml: virtual_kubelet_pools[0].address_mode: "
            "'nodeport': expected 'pod_ip' or 'load_balancer'") in text


def test_a_pod_is_published_once_every_service_selecting_it_holds_it_ready():
    chat, other, elsewhere = service(), service("chat-admin"), service("chat", ns="other")
    p = pod("a")
    ready_slice = {"endpoints": [{"addresses": ["198.18.0.1"], "conditions": {"ready": True, "serving": True},
                                  "targetRef": {"uid": "uid-a"}}]}
    not_ready = {"endpoints": [{"addresses": ["198.18.0.1"], "conditions": {"ready": False, "serving": False},
                                "targetRef": {"uid": "uid-a"}}]}
    shared = {"endpoints": [{"addresses": ["203.0.113.10"], "conditions": {"ready": True}}]}  # a load balancer's
    slices = {"chat": [ready_slice], "chat-admin": []}
    assert not published_in(p, [chat, other, elsewhere], lambda ns, name: slices[name], "198.18.0.1")
    slices["chat-admin"] = [not_ready]
    assert not published_in(p, [chat, other], lambda ns, name: slices[name], "198.18.0.1")
    slices["chat-admin"] = [ready_slice]
    assert published_in(p, [chat, other, elsewhere], lambda ns, name: slices.get(name, []), "198.18.0.1")
    # An endpoint naming no pod is the pod's when it is at the pod's (shared) address; not before the address is known.
    assert published_in(p, [chat], lambda ns, name: [shared], "203.0.113.10")
    assert not published_in(p, [chat], lambda ns, name: [shared], None)
    # No Service selects it: nothing to wait for.
    assert published_in(pod("b", labels={"app": "batch"}), [chat], lambda ns, name: [], None)


class StatusWrites:
    """A client for the publisher: slice applies answered as written, pod status patches recorded."""

    def __init__(self):
        self.status: list[tuple[str, dict]] = []

    def patch(self, api_version, plural, name, body, namespace=None, subresource=None, **kw):
        if plural == "pods":
            assert subresource == "status" and kw.get("patch") == "strategic"
            self.status.append((name, body["status"]["conditions"][0]))
            return {}
        return {**body, "metadata": {**body["metadata"], "uid": f"uid-{name}"}}

    def delete(self, *args, **kw):
        return {}


def test_the_publisher_marks_a_pod_published_once_its_services_slices_hold_it_and_not_before():
    kube = StatusWrites()
    node_pods = Informer(kube, "/api/v1/pods")
    where: dict[str, Address | None] = {"uid-a": None}
    pub = EndpointPublisher(kube, NODE, node_pods, lambda p: where[p["metadata"]["uid"]])
    pub._on_service("ADDED", service(), None)
    pub.services.apply("ADDED", service())
    a = pod("a")
    node_pods.apply("ADDED", a)
    pub.sync_service("inference/chat")
    assert kube.status == [], "no address yet (a load balancer's ingress not there): nothing to say"
    where["uid-a"] = Address("203.0.113.10", shared=True)
    pub.sync_service("inference/chat")
    assert [(n, c["type"], c["status"]) for n, c in kube.status] == [("a", PUBLISHED_CONDITION, "True")]
    a["status"]["conditions"].append(kube.status[-1][1])
    node_pods.apply("MODIFIED", a)
    pub.sync_service("inference/chat")
    assert len(kube.status) == 1, "written again though unchanged"
    pub.services.apply("ADDED", service("chat-admin"))
    pub._on_service("ADDED", service("chat-admin"), None)
    pub.mark(a)  # a second Service selects it, its slices not written yet
    assert [c["status"] for _, c in kube.status] == ["True", "False"]


def test_many_pods_published_together_are_all_marked_and_a_failed_write_is_raised_after_the_others():
    from gpufleet.kube import ServerError

    class Flaky(StatusWrites):
        def patch(self, api_version, plural, name, body, namespace=None, subresource=None, **kw):
            if plural == "pods" and name == "p-7":
                raise ServerError(500, "InternalError", "etcd leader changed")
            return super().patch(api_version, plural, name, body, namespace, subresource, **kw)

    kube = Flaky()
    node_pods = Informer(kube, "/api/v1/pods")
    pub = EndpointPublisher(kube, NODE, node_pods, lambda p: Address("198.18.0.1"))
    pub.services.apply("ADDED", service())
    names = [f"p-{i}" for i in range(40)]
    for n in names:
        node_pods.apply("ADDED", pod(n))
    with pytest.raises(ServerError, match="etcd leader changed"):
        pub.sync_service("inference/chat")
    assert sorted(n for n, _ in kube.status) == sorted(n for n in names if n != "p-7"), "every other write was made"
    assert {c["status"] for _, c in kube.status} == {"True"}
    pub.stop()
