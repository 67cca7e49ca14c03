"""Endpoint health: consecutive failures, real TCP connects on loopback, slices, the rental's endpoints, one round."""

from __future__ import annotations

import argparse
import socket

import pytest

from gpufleet.names import SERVICE_NAME_LABEL
from gpufleet.virtual_kubelet.endpoints import build_slices
from gpufleet.virtual_kubelet.endpoint_health import EndpointHealthChecker, HealthSettings, HealthTable, published_targets, tcp_probe
from gpufleet.virtual_kubelet.main import add_arguments, health_settings
from gpufleet.virtual_kubelet.provider import Address
from gpufleet_workshop.rental.provider import PUBLIC_PORT_BASE, SimulatedProvider
from roles.registry import load

from .test_endpoints import H100, NODE, Clock, endpoints_of, pod, service, sim_pod


def test_an_address_is_unreachable_after_the_threshold_of_consecutive_failures_and_back_after_one_success():
    table = HealthTable(2)
    t = ("198.18.0.1", 40000)
    assert table.observe(t, "Connection refused") is None  # one failure is not enough
    assert table.observe(t, None) is None  # and a success resets the count
    assert table.observe(t, "Connection refused") is None
    down = table.observe(t, "Connection refused")
    assert down is not None and not down.reachable and down.error == "Connection refused"
    assert table.unreachable() == {"198.18.0.1"}
    assert table.observe(t, "timed out after 1s") is None  # still down: no second transition
    up = table.observe(t, None)
    assert up is not None and up.reachable and table.unreachable() == frozenset()
    table.observe(t, "x"), table.observe(t, "x")
    table.keep([])  # no longer published: forgotten
    assert table.unreachable() == frozenset() and table.observe(t, "x") is None


def test_tcp_checks_are_real_connects_accepted_or_refused():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    open_port = listener.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # bound once, nothing listens there now
    try:
        got = tcp_probe([("127.0.0.1", open_port), ("127.0.0.1", closed_port)], 1.0, max_parallel=1)
    finally:
        listener.close()
    assert got == {("127.0.0.1", open_port): None, ("127.0.0.1", closed_port): "Connection refused"}


def test_an_unreachable_address_is_published_not_serving_and_not_ready():
    pods = [pod("a"), pod("b")]
    addresses = {"uid-a": Address("10.1.0.5"), "uid-b": Address("10.1.0.6")}
    eps = endpoints_of(build_slices(service(), pods, addresses, node_name=NODE, unreachable={"10.1.0.5"}))
    assert eps["10.1.0.5"]["conditions"] == {"ready": False, "serving": False, "terminating": False}
    assert eps["10.1.0.6"]["conditions"] == {"ready": True, "serving": True, "terminating": False}
    # publishNotReadyAddresses asks for every address whatever its state (the standard controller's rule).
    eps = endpoints_of(build_slices(service(publishNotReadyAddresses=True), pods, addresses, node_name=NODE,
                                    unreachable={"10.1.0.5"}))
    assert eps["10.1.0.5"]["conditions"] == {"ready": True, "serving": False, "terminating": False}


def test_published_targets_are_the_tcp_ports_of_endpoints_not_terminating():
    slices = [{"metadata": {"namespace": "inference", "labels": {SERVICE_NAME_LABEL: "chat"}},
               "ports": [{"port": 40000, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
               "endpoints": [{"addresses": ["198.18.0.1"], "conditions": {"ready": True}},
                             {"addresses": ["198.18.0.2"], "conditions": {"ready": False, "terminating": True}}]}]
    assert published_targets(slices) == {"198.18.0.1": {40000: {"inference/chat"}}}


def test_a_rental_endpoint_can_die_while_its_pod_runs():
    clock = Clock()
    sim = SimulatedProvider("rental", gpus=4, gpu_product=H100, price_per_gpu_hour=2.85, start_latency_seconds=2,
                            node_name=NODE, clock=clock)
    sim.create_pod(sim_pod("a", [{"name": "http", "containerPort": 8000}]))
    with pytest.raises(ConnectionRefusedError):
        sim.dial("198.18.0.1", PUBLIC_PORT_BASE, 1.0)  # still starting
    clock.t = 2.0
    a = sim.pod_address("inference", "a")
    sim.dial(a.ip, PUBLIC_PORT_BASE, 1.0)
    with pytest.raises(ConnectionRefusedError):
        sim.dial(a.ip, PUBLIC_PORT_BASE + 1, 1.0)  # not a port it exposes
    sim.kill_endpoint("inference", "a")
    with pytest.raises(ConnectionRefusedError):
        sim.dial(a.ip, PUBLIC_PORT_BASE, 1.0)
    status = sim.get_pod_status("inference", "a")
    assert status["phase"] == "Running" and {"type": "Ready", "status": "True"}.items() <= next(
        c for c in status["conditions"] if c["type"] == "Ready").items()
    assert sim.pod_address("inference", "a") == a  # still reported
    sim.revive_endpoint("inference", "a")
    sim.dial(a.ip, PUBLIC_PORT_BASE, 1.0)
    with pytest.raises(ConnectionRefusedError):
        sim.dial("198.18.9.9", PUBLIC_PORT_BASE, 1.0)  # nothing there


class Items:
    def __init__(self, items):
        self.list = items

    def items(self):
        return list(self.list)


class EventLog:
    """Stands in for the API client: keeps the Events it is asked to create."""

    def __init__(self):
        self.events = []

    def create(self, api, kind, body, ns):
        self.events.append(body)
        return body


def test_one_round_checks_each_published_address_and_reports_each_transition_once():
    clock = Clock()
    sim = SimulatedProvider("rental", gpus=4, gpu_product=H100, price_per_gpu_hour=2.85, node_name=NODE, clock=clock)
    a, b = sim_pod("a", [{"name": "http", "containerPort": 8000}]), sim_pod("b", [{"name": "http", "containerPort": 8000}])
    sim.create_pod(a)
    sim.create_pod(b)
    for p in (a, b):
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    addresses = {p["metadata"]["uid"]: sim.pod_address("inference", p["metadata"]["name"]) for p in (a, b)}
    svc = service(ports=[{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"}])
    svc["metadata"]["labels"] = {}
    slices = build_slices(svc, [a, b], addresses, node_name=NODE)
    kube, changed = EventLog(), []
    checker = EndpointHealthChecker(kube, NODE, Items(slices), Items([a, b]),
                                    lambda p: addresses[p["metadata"]["uid"]], lambda p: sim.dial,
                                    changed.extend, HealthSettings())
    assert checker.check_once() == [] and checker.unreachable() == frozenset()
    sim.kill_endpoint("inference", "a")
    checker.check_once()
    assert checker.unreachable() == frozenset() and not kube.events  # one failure of two
    (down,) = checker.check_once()
    dead = addresses["uid-a"].ip
    assert down.target == (dead, PUBLIC_PORT_BASE) and checker.unreachable() == {dead}
    assert changed == ["inference/chat"]
    (event,) = kube.events
    assert event["reason"] == "EndpointUnreachable" and event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "a" and f"{dead}:{PUBLIC_PORT_BASE}" in event["message"]
    assert "Connection refused" in event["message"]
    checker.check_once()
    assert len(kube.events) == 1  # once per transition
    sim.revive_endpoint("inference", "a")
    checker.check_once()
    assert checker.unreachable() == frozenset() and [e["reason"] for e in kube.events] == [
        "EndpointUnreachable", "EndpointReachable"]


def test_settings_come_from_the_file_and_flags_override_them(tmp_path):
    from gpufleet.componentconfig import ConfigFileError
    from gpufleet.virtual_kubelet.config import dump
    from gpufleet.virtual_kubelet.main import configuration
    from roles.virtual_kubelet.config import configuration as role_configuration

    inv = load("local")
    for pool in ("rental", "other"):
        (tmp_path / f"{pool}.yaml").write_text(dump(role_configuration(inv, pool)))
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def settings(pool: str, *flags: str) -> HealthSettings | None:
        return health_settings(configuration(parser.parse_args(["--config", str(tmp_path / f"{pool}.yaml"), *flags])))

    assert settings("rental") == HealthSettings(interval_seconds=2.0, timeout_seconds=1.0, unhealthy_threshold=2)
    assert settings("other") is None  # endpoint_health_check: false in the local inventory
    assert settings("other", "--endpoint-health-interval", "0.5", "--endpoint-health-threshold", "3") == \
        HealthSettings(interval_seconds=0.5, timeout_seconds=0.5, unhealthy_threshold=3)
    assert settings("rental", "--endpoint-health-interval", "0") is None
    with pytest.raises(ConfigFileError, match="--endpoint-health-timeout: 5.0: expected --endpoint-health-timeout at "
                                              "most endpoint_health.interval_seconds"):
        settings("rental", "--endpoint-health-timeout", "5")
    with pytest.raises(ConfigFileError, match="--pool 'other': expected the pool of"):
        settings("rental", "--pool", "other")
