"""The real node's configuration keeps every listener on loopback (or the host's own address) and pulls nothing."""

from __future__ import annotations

import ipaddress

import tomllib
from pathlib import Path

from gpufleet import names
from gpufleet_workshop.local.components import component
from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.local.ports import Ports

PORTS = Ports(20000)
PATHS = realnode.NodePaths(Path("/state/c/node"))


def test_kubelet_and_kube_proxy_are_built_in_the_same_go_build_as_the_control_plane():
    k8s = component("kubernetes")
    assert k8s.binaries == ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
    assert k8s.packages[-2:] == ("k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kube-proxy")
    assert k8s.method == "go-module"


def test_containerd_has_no_network_listeners_and_cannot_pull():
    cfg = tomllib.loads(realnode.containerd_config(PATHS, "registry.k8s.io/pause:3.10.1"))
    assert cfg["grpc"]["address"].startswith("/state/c/node/") and "tcp_address" not in cfg["grpc"]
    assert cfg["debug"]["address"] == "" and cfg["metrics"]["address"] == ""
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["stream_server_address"] == "127.0.0.1"
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.10.1"
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE on these hosts
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["registry"]["config_path"] == str(PATHS.certs_d)
    hosts = tomllib.loads(realnode.hosts_toml())
    assert hosts["server"] == "http://127.0.0.1:1"


def test_kubelet_listens_on_loopback_and_the_node_ip_only():
    cfg = realnode.kubelet_config("c", PORTS, PATHS, Path("/ca.crt"), "192.0.2.2")
    assert cfg["address"] == "192.0.2.2" and cfg["healthzBindAddress"] == "127.0.0.1" and cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False and cfg["authorization"]["mode"] == "Webhook"
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["failCgroupV1"] is False and cfg["cgroupRoot"] == "/gpufleet-c"
    assert cfg["makeIPTablesUtilChains"] is False and cfg["protectKernelDefaults"] is False
    assert cfg["imageGCHighThresholdPercent"] == 100  # the sandbox image is never garbage-collected
    assert cfg["registerWithTaints"] == [dict(zip(("key", "value", "effect"), names.SYSTEM_NODE_TAINT))]
    assert cfg["resolvConf"].startswith("/state/c/node/")
    argv = realnode.kubelet_argv("c", PATHS, "192.0.2.2")
    assert "--node-ip=192.0.2.2" in argv and f"--node-labels={'='.join(names.SYSTEM_NODE_LABEL)}" in argv


def test_pod_network_has_no_gateway_and_no_masquerade():
    conf = realnode.cni_config("c", PORTS, PATHS)
    bridge = conf["plugins"][0]
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False and bridge["isDefaultGateway"] is False
    assert len(bridge["bridge"]) <= 15 and bridge["ipam"]["dataDir"].startswith("/state/c/node/")
    assert realnode.pod_subnet(PORTS) != realnode.pod_subnet(Ports(20020))
    # One route: to the other local clusters' pod networks (their forwards), through the host's end of the bridge.
    assert bridge["ipam"]["routes"] == [{"dst": realnode.POD_NETWORKS, "gw": realnode.gateway_ip(PORTS)}]
    assert all(ipaddress.ip_network(realnode.pod_subnet(Ports(b))).subnet_of(ipaddress.ip_network(realnode.POD_NETWORKS))
               for b in (20000, 20020, 25100))
