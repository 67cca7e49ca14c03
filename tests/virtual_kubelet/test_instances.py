"""Rental instances as local processes: the simulated provider's endpoints really serve (loopback)."""

from __future__ import annotations


import pytest

from gpufleet_workshop.sim import traffic
from gpufleet_workshop.rental.instances import LocalInstances, standin_flags
from gpufleet_workshop.rental.provider import SimulatedProvider
from gpufleet.prom.server import free_port
from gpufleet.wait import poll_until


def _pod(name: str, uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "uid": uid, "labels": {"app": "chat"}},
            "spec": {"containers": [{"name": "server", "image": "img:1",
                                     "command": ["gpufleet-standin"], "args": ["--port", "8000", "--latency-ms", "3"],
                                     "ports": [{"name": "http", "containerPort": 8000}],
                                     "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}


def _until(check, timeout: float = 15.0):
    return poll_until(check, what=getattr(check, "__name__", "the condition"), timeout=timeout, interval=0.1)


@pytest.fixture
def provider():
    prov = SimulatedProvider("rental", gpus=8, gpu_product="H100", price_per_gpu_hour=1.0, node_name="vk-rental",
                             # A port the kernel has free now: a fixed one lies in the ephemeral range, where a
                             # busy machine's outgoing connections may hold it, and the stand-in could not listen.
                             instances=LocalInstances("127.0.0.1", "vk-rental", port_base=free_port()))
    yield prov
    prov.close()


def test_the_pods_own_stand_in_flags_are_kept():
    assert standin_flags(["--port", "8000", "--latency-ms", "7"]) == ["--latency-ms", "7"]
    assert standin_flags(["serve", "--latency-ms"]) == []


def test_a_rental_with_local_instances_serves_at_its_reported_endpoint_until_it_goes(provider):
    provider.create_pod(_pod("chat-a", "u1"))
    addr = _until(lambda: provider.pod_address("inference", "chat-a"))
    assert addr.ip == "127.0.0.1"
    port = addr.port_for("TCP", 8000)
    r = _until(lambda: (x := traffic.send("127.0.0.1", port, "/", 2)).ok and x)
    assert r.node == "vk-rental"
    provider.dial("127.0.0.1", port, 1)  # the health check's connect is real

    # The endpoint dies while the rental API still reports the pod Running, then comes back.
    provider.kill_endpoint("inference", "chat-a")
    _until(lambda: not traffic.send("127.0.0.1", port, "/", 1).ok)
    assert provider.get_pod_status("inference", "chat-a")["phase"] == "Running"
    with pytest.raises(OSError):
        provider.dial("127.0.0.1", port, 1)
    provider.revive_endpoint("inference", "chat-a")
    _until(lambda: traffic.send("127.0.0.1", port, "/", 2).ok)

    provider.delete_pod(_pod("chat-a", "u1"))
    _until(lambda: not traffic.send("127.0.0.1", port, "/", 1).ok)


def test_each_rental_gets_its_own_port(provider):
    provider.create_pod(_pod("chat-a", "u1"))
    provider.create_pod(_pod("chat-b", "u2"))
    a = _until(lambda: provider.pod_address("inference", "chat-a")).port_for("TCP", 8000)
    b = _until(lambda: provider.pod_address("inference", "chat-b")).port_for("TCP", 8000)
    assert a != b


def test_a_pod_that_does_not_run_the_stand_in_gets_no_process(provider):
    pod = _pod("bench-a", "u9")
    pod["spec"]["containers"][0]["command"] = ["serve"]
    provider.create_pod(pod)
    addr = _until(lambda: provider.pod_address("inference", "bench-a"))
    assert addr.ip.startswith("198.1") and provider.instances.ports("u9") is None
    with pytest.raises(ConnectionRefusedError):  # answered by the simulated network, never a real connect
        provider.dial(addr.ip, addr.port_for("TCP", 8000) + 1, 1)


def test_a_rental_whose_second_process_cannot_start_leaves_no_process_behind(monkeypatch):
    import subprocess

    started, real = [], subprocess.Popen

    def popen(*args, **kwargs):
        if started:
            raise OSError(24, "Too many open files")
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    inst = LocalInstances("127.0.0.1", "vk-rental", port_base=47200)
    with pytest.raises(OSError):
        inst.start("u1", "chat-1", 2, [])
    # Killed and reaped (a zombie has no returncode yet); its ports are free again.
    assert started[0].returncode is not None and inst.ports("u1") is None and sorted(inst._free) == [47200, 47201]


def test_a_running_rental_reports_what_its_instance_process_uses(provider):
    provider.create_pod(_pod("chat-b", "u2"))
    addr = _until(lambda: provider.pod_address("inference", "chat-b"))
    port = addr.port_for("TCP", 8000)
    for _ in range(20):  # some work for the process to account
        _until(lambda: traffic.send("127.0.0.1", port, "/", 2).ok)
    (stats,) = provider.pod_stats()
    assert (stats.namespace, stats.name, stats.uid) == ("inference", "chat-b", "u2")
    (c,) = stats.containers
    # A Python process: some CPU spent, tens of MiB resident.
    assert c.name == "server" and c.cpu_seconds > 0 and 5 << 20 < c.memory_working_set_bytes < 200 << 20
    assert c.start_time <= c.timestamp
    provider.delete_pod(_pod("chat-b", "u2"))
    assert provider.pod_stats() == []
