"""The local Service data plane's names, addresses and kube-proxy configuration (pure)."""

from __future__ import annotations

from pathlib import Path

from gpufleet_workshop.local import dataplane
from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.local.ports import Ports

PORTS = Ports(20000)


def test_the_namespace_address_is_on_the_bridge_above_every_pod_address():
    assert dataplane.address(PORTS) == "10.244.0.250"
    assert realnode.POD_RANGE_END < dataplane.HOST_OCTET
    conf = realnode.cni_config("c", PORTS, realnode.NodePaths(Path("/state/c/node")))
    ranges = conf["plugins"][0]["ipam"]["ranges"][0][0]
    assert ranges["rangeEnd"] == "10.244.0.239"
    assert len(dataplane.netns_name("a-long-cluster-name")) <= 15


def test_kube_proxy_stays_in_its_namespace_and_touches_no_host_sysctl():
    conf = dataplane.proxy_config("c", PORTS, Path("/k"))
    assert conf["mode"] == "iptables" and conf["hostnameOverride"] == "c-system"
    # Every listener on the namespace's own address; node ports only there, never on localhost.
    assert {conf["bindAddress"], conf["healthzBindAddress"].split(":")[0], conf["metricsBindAddress"].split(":")[0]} \
        == {"10.244.0.250"}
    assert conf["nodePortAddresses"] == ["10.244.0.250/32"] and conf["iptables"]["localhostNodePorts"] is False
    assert conf["conntrack"]["maxPerCore"] == 0 and conf["conntrack"]["min"] == 0
    assert conf["iptables"]["masqueradeAll"] is True


def test_kube_proxy_runs_inside_the_namespace():
    class C:
        name = "c"
        ports = PORTS

        class layout:  # noqa: N801 - stands in for a Layout
            config = Path("/state/c/config")

            @staticmethod
            def log(n):
                return Path(f"/state/c/logs/{n}.log")

            @staticmethod
            def pid(n):
                return Path(f"/state/c/pids/{n}.pid")

    sp = dataplane.spec(C)
    assert sp.argv[:4] == ["/usr/sbin/ip", "netns", "exec", dataplane.netns_name("c")]
    assert sp.argv[4].endswith("/kube-proxy") and sp.health.url == "http://10.244.0.250:10256/healthz"


def test_files_are_written_only_when_they_change(tmp_path):
    f = tmp_path / "config.yaml"
    assert dataplane._write(f, "a: 1\n") is True
    mtime = f.stat().st_mtime_ns
    assert dataplane._write(f, "a: 1\n") is False and f.stat().st_mtime_ns == mtime
    assert dataplane._write(f, "a: 2\n") is True
