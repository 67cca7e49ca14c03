"""The local environment's Service data plane: a real kube-proxy confined to a network namespace.

Services of the local clusters have no data plane of their own (the host's
firewall is never touched; the service range is blackholed on the host).
Where requests must really travel through a Service (``invoke sim.flip``
sends a steady stream through the inference Service), this module makes one:

- a network namespace ``gfdp-<hash>`` (:func:`netns_name`), with a veth
  into the bridge of the cluster's real node and one into the bridge of
  every other local cluster named (the second clusters of ``kubernetes``
  pools). Its address on each bridge is :func:`address` (``10.244.<n>.250``,
  above the range the CNI allocates pods from), so pods of every cluster
  are on-link: no packet is forwarded by the host, none leaves it;
- kube-proxy built from the pinned Kubernetes module, in iptables mode,
  running in that namespace only (its rules, sysctls and conntrack state
  are the namespace's), as ServiceAccount ``kube-system/kube-proxy`` bound
  to the bootstrap ClusterRole ``system:node-proxier``, reaching the
  apiserver through the real node's forward on the bridge. It programs
  every Service's ClusterIP from its EndpointSlices, those
  kube-controller-manager writes for pods in-cluster and those gpufleet's
  virtual kubelets write for pods outside (:mod:`gpufleet.virtual_kubelet.endpoints`);
- clients run in the namespace too (:func:`exec_argv`): what they send to
  a ClusterIP is DNATed by kube-proxy's rules to a pod on either cluster.

:func:`up` is idempotent; :func:`down` (called by ``invoke local.down``)
stops kube-proxy and deletes the namespace, which takes its veths along.

Errors: :class:`DataPlaneError` (an ``ip`` command failed, the token never
came), :class:`gpufleet_workshop.local.processes.ComponentFailed` (kube-proxy did
not become healthy).
"""

from __future__ import annotations

import base64
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from gpufleet_workshop.local.components import binary
from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.local.controlplane import SERVICE_CIDR
from gpufleet_workshop.local import processes
from gpufleet_workshop.local.layout import Layout
from gpufleet_workshop.local.ports import Ports
from gpufleet.wait import PollTimeout, poll_until

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpufleet.kube import Kube
    from gpufleet_workshop.local.cluster import Cluster

#: The host octet of the data plane's address on every pod bridge (the CNI allocates below it: node.POD_RANGE_END).
HOST_OCTET = 250
#: kube-proxy's own ports (its defaults), on the namespace's address on the cluster's bridge.
HEALTHZ_PORT = 10256
METRICS_PORT = 10249
#: The ServiceAccount kube-proxy runs as, and the bootstrap ClusterRole it is bound to.
SERVICE_ACCOUNT = ("kube-system", "kube-proxy")
CLUSTER_ROLE = "system:node-proxier"
COMPONENT = "kube-proxy"


class DataPlaneError(RuntimeError):
    """The data plane could not be set up; the message names the command or object and why."""


def netns_name(cluster: str) -> str:
    """The network namespace of cluster ``cluster``'s data plane: ``gfdp-<8 hex digits>``."""
    return f"gfdp-{realnode.short_name(cluster)}"


def address(ports: Ports) -> str:
    """The data plane's address on the bridge of the cluster with ``ports`` (``10.244.<n>.250``)."""
    return realnode.pod_subnet(ports).replace(".0/24", f".{HOST_OCTET}")


def _ip(*args: str, ok: tuple[str, ...] = ("File exists",)) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0 and not any(o in proc.stderr for o in ok):
        raise DataPlaneError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def exec_argv(cluster: str, argv: list[str]) -> list[str]:
    """``argv`` run inside cluster ``cluster``'s data plane namespace (``ip netns exec``)."""
    return ["ip", "netns", "exec", netns_name(cluster), *argv]


def _attach(ns: str, owner: str, target: str, target_ports: Ports) -> None:
    """A veth from namespace ``ns`` into the bridge of cluster ``target``, addressed on its pod subnet."""
    host_end = f"gd{realnode.short_name(owner)[:6]}{realnode.short_name(target)[:5]}"
    inner = f"to{realnode.short_name(target)}"
    if not Path(f"/sys/class/net/{host_end}").exists():
        _ip("link", "add", host_end, "type", "veth", "peer", "name", inner, "netns", ns)
    _ip("link", "set", host_end, "master", realnode.bridge_name(target))
    _ip("link", "set", host_end, "up")
    _ip("-n", ns, "addr", "add", f"{address(target_ports)}/24", "dev", inner, ok=("File exists", "already assigned"))
    _ip("-n", ns, "link", "set", inner, "up")


@dataclass(frozen=True)
class DataPlane:
    """A running data plane: its namespace, kube-proxy's process spec, and the clusters it reaches."""

    cluster: str
    netns: str
    spec: processes.ProcessSpec
    reaches: tuple[str, ...]

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return exec_argv(self.cluster, argv)


def _token(kube: Kube, timeout: float = 60.0) -> tuple[str, str]:
    """kube-proxy's ServiceAccount, its ClusterRoleBinding and a token Secret; returns ``(token, ca)`` (base64 CA)."""
    from gpufleet.names import FIELD_MANAGER_LOCAL

    ns, name = SERVICE_ACCOUNT
    for obj in (
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"gpufleet:{name}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
        # A long-lived token: kube-proxy runs as long as the local cluster does (a bound token would expire).
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
         "metadata": {"name": f"{name}-token", "namespace": ns, "annotations": {"kubernetes.io/service-account.name": name}}},
    ):
        kube.apply(obj, field_manager=FIELD_MANAGER_LOCAL)
    try:
        data = poll_until(lambda: (d := kube.get("v1", "secrets", f"{name}-token", ns).get("data") or {})
                          .get("token") and d.get("ca.crt") and d, what=f"Secret {ns}/{name}-token's token",
                          timeout=timeout, interval=0.3)
    except PollTimeout:
        raise DataPlaneError(f"Secret {ns}/{name}-token: no token after {timeout:.0f}s (is kube-controller-manager's "
                             "token controller running?)") from None
    return base64.b64decode(data["token"]).decode(), data["ca.crt"]


def _write(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` to ``path`` only when it differs (kube-proxy exits when its configuration file is
    written, even with the same content); whether it was written."""
    if path.is_file() and path.read_text() == text:
        return False
    # Created with its mode (the kubeconfig holds a token: never readable by others, not even for a moment).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def proxy_config(cluster: str, ports: Ports, kubeconfig: Path) -> dict:
    """kube-proxy's KubeProxyConfiguration (``kubeproxy.config.k8s.io/v1alpha1``) for cluster ``cluster``'s data plane."""
    addr = address(ports)
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": realnode.node_name(cluster),
        "mode": "iptables",
        "bindAddress": addr,
        "healthzBindAddress": f"{addr}:{HEALTHZ_PORT}",
        "metricsBindAddress": f"{addr}:{METRICS_PORT}",
        "nodePortAddresses": [f"{addr}/32"],
        "clusterCIDR": realnode.POD_NETWORKS,
        "detectLocalMode": "ClusterCIDR",
        # nf_conntrack_max is the host's (read-only in a namespace): leave every conntrack sysctl alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        # Endpoint changes programmed at once: the flip moves endpoints every few seconds.
        "iptables": {"localhostNodePorts": False, "minSyncPeriod": "0s", "syncPeriod": "30s",
                     # The namespace picks its source address by the ClusterIP route (the main bridge);
                     # endpoints on another bridge must see that bridge's address to answer on-link.
                     "masqueradeAll": True},
    }


def _write_config(c: Cluster, kube: Kube) -> tuple[Path, bool]:
    """kube-proxy's kubeconfig and KubeProxyConfiguration under the cluster's config folder; the latter's path
    and whether it changed."""
    token, ca = _token(kube)
    folder = c.layout.config / "kube-proxy"
    folder.mkdir(parents=True, exist_ok=True)
    kubeconfig = folder / "kubeconfig"
    changed = _write(kubeconfig, yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kube-proxy",
        "clusters": [{"name": "local", "cluster": {"server": c.in_cluster_api, "certificate-authority-data": ca}}],
        "users": [{"name": "kube-proxy", "user": {"token": token}}],
        "contexts": [{"name": "kube-proxy", "context": {"cluster": "local", "user": "kube-proxy"}}]}), mode=0o600)
    config = folder / "config.yaml"
    changed = _write(config, yaml.safe_dump(proxy_config(c.name, c.ports, kubeconfig), sort_keys=False)) | changed
    return config, changed


def spec(c: Cluster, config: Path | None = None) -> processes.ProcessSpec:
    """kube-proxy's process: ``ip netns exec <ns> kube-proxy --config ...``, health on the namespace's address."""
    config = config or c.layout.config / "kube-proxy" / "config.yaml"
    return processes.ProcessSpec(
        name=COMPONENT,
        argv=["/usr/sbin/ip", "netns", "exec", netns_name(c.name), str(binary("kubernetes", "kube-proxy")),
              f"--config={config}", "--v=1"],
        log=c.layout.log(COMPONENT), pidfile=c.layout.pid(COMPONENT),
        health=processes.Health(f"http://{address(c.ports)}:{HEALTHZ_PORT}/healthz"))


def up(c: Cluster, others: Sequence[Cluster] = (), *, timeout: float = 60.0) -> DataPlane:
    """The data plane of cluster ``c`` reaching the pods of ``c`` and of ``others``; started when missing.

    Raises:
        DataPlaneError: an ``ip`` command failed or the token never came.
        gpufleet_workshop.local.processes.ComponentFailed: kube-proxy exited or stayed unhealthy.
    """
    ns = netns_name(c.name)
    if not Path(f"/run/netns/{ns}").exists():
        _ip("netns", "add", ns)
    _ip("-n", ns, "link", "set", "lo", "up")
    for target in (c, *others):
        _attach(ns, c.name, target.name, target.ports)
    # A ClusterIP needs a route before kube-proxy's OUTPUT rule rewrites it (the namespace has no default route).
    _ip("-n", ns, "route", "replace", SERVICE_CIDR, "dev", f"to{realnode.short_name(c.name)}")
    kube = c.kube()
    config, changed = _write_config(c, kube)
    sp = spec(c, config)
    if processes.running(sp.pidfile) is not None and (changed or processes.recorded_argv(sp.pidfile) != list(sp.argv)):
        processes.stop(sp.pidfile)
    if processes.running(sp.pidfile) is None:
        processes.start(sp)
    processes.wait_healthy(sp, timeout)
    return DataPlane(c.name, ns, sp, tuple(o.name for o in (c, *others)))


def down(name: str, timeout: float = 10.0) -> list[str]:
    """Stop cluster ``name``'s kube-proxy and delete its namespace (its veths go with it); what was removed."""
    lay = Layout(name)
    gone = []
    if processes.stop(lay.pid(COMPONENT), timeout):
        gone.append(COMPONENT)
    ns = netns_name(name)
    if Path(f"/run/netns/{ns}").exists():
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        gone.append(f"netns {ns}")
    return gone
