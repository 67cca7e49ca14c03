"""The local cluster's one real node: containerd, runc, CNI and a kubelet, beside the kwok GPU nodes.

It runs what production runs on system nodes: gpufleet's own pods, from
gpufleet's image, under their ServiceAccounts. It has no GPUs and carries
``names.SYSTEM_NODE_TAINT`` (and ``SYSTEM_NODE_LABEL``), so only pods that
tolerate it land there.

Nothing leaves the machine:

- images are imported (the pause image built from source under containerd's
  ``sandbox_image`` name, and gpufleet's image); every registry resolves to a
  closed loopback port (``certs.d/_default/hosts.toml``), so a missing image
  fails at once instead of being pulled;
- containerd's gRPC socket is a file in the state folder; its streaming
  server listens on 127.0.0.1; it has no TCP, metrics or debug listeners;
- the kubelet's health endpoint is on 127.0.0.1, its read-only port is off;
  its API (logs, exec; client certificates only) listens on the host's own
  address, the Node's InternalIP, which the apiserver dials and which stays
  on this host;
- pods get a ``resolv.conf`` naming 127.0.0.1; pods that are not
  ``hostNetwork`` join a bridge with no masquerade and no default route;
  the bridge's own address (:func:`gateway_ip`) is the host's end of it,
  where ``socat`` forwards a port to the apiserver on loopback, the API
  endpoint of in-cluster clients (:func:`in_cluster_api`), as there is no
  service network, and one to Prometheus (:func:`in_cluster_prometheus`);
  pods route :data:`POD_NETWORKS` (every local cluster's bridge, all
  host addresses) through it; a blackhole route covers the service range,
  which no kube-proxy serves.

Host state it makes, all named after the cluster and removed by
:func:`teardown`: cgroups ``gpufleet-<cluster>`` in every hierarchy (the
kubelet's ``cgroupRoot``; containerd and its shims live in its ``runtime``
child), the bridge ``gf<hash>``, and mounts under the state folder
(containerd's snapshots and network namespaces, kubelet volumes).

containerd 1.6 on a cgroup v1 host without CAP_SYS_RESOURCE needs
``restrict_oom_score_adj``; the kubelet needs ``failCgroupV1: false`` and the
``cgroupfs`` driver (see the project's component notes).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet import names
from gpufleet_workshop.local.components import binary
from gpufleet_workshop.local.layout import Layout
from gpufleet_workshop.local.ports import Ports
from gpufleet.wait import PollTimeout, poll_until

#: containerd's CRI namespace (where the kubelet's images and containers live).
CRI_NAMESPACE = "k8s.io"
#: The range the apiserver allocates ClusterIPs from (``controlplane.SERVICE_CIDR``): blackholed.
CGROUP_PREFIX = "gpufleet-"


class NodeError(RuntimeError):
    """The real node could not be set up or torn down; the message says which step and why."""


@dataclass(frozen=True)
class NodePaths:
    """Files and folders of one cluster's real node, under ``<state>/<cluster>/node``."""

    root: Path

    @classmethod
    def of(cls, layout: Layout) -> "NodePaths":
        """The node paths of a cluster layout."""
        return cls(layout.root / "node")

    @property
    def fixture(self) -> Path:
        """A fixture GPU node's files (``node.json``, ``sys/``) that the exporter on this node reads: it has no GPUs."""
        return self.root / "fixture"

    @property
    def containerd_root(self) -> Path:
        """containerd's persistent root (content store, snapshots)."""
        return self.root / "containerd"

    @property
    def containerd_state(self) -> Path:
        """containerd's state folder (sockets, network namespaces, task bundles)."""
        return self.root / "run"

    @property
    def socket(self) -> Path:
        """containerd's gRPC socket."""
        return self.containerd_state / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's ``--root-dir`` (pod volumes, plugins, its serving certificate)."""
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        """Container logs (``podLogsDir``): what ``kubectl logs`` reads through the kubelet."""
        return self.root / "pods"

    @property
    def config(self) -> Path:
        """containerd.toml, kubelet.yaml, the kubelet's kubeconfig, resolv.conf, CNI and registry configs."""
        return self.root / "config"

    @property
    def cni_conf(self) -> Path:
        """CNI network configurations (one conflist)."""
        return self.config / "cni"

    @property
    def certs_d(self) -> Path:
        """containerd's registry hosts folder."""
        return self.config / "certs.d"

    @property
    def ipam(self) -> Path:
        """host-local IPAM leases."""
        return self.root / "ipam"

    def create(self) -> "NodePaths":
        """Create every folder (idempotent)."""
        for d in (self.containerd_root, self.containerd_state, self.kubelet_root, self.pod_logs, self.cni_conf,
                  self.certs_d / "_default", self.ipam):
            d.mkdir(parents=True, exist_ok=True)
        return self


def node_name(cluster: str) -> str:
    """The real node's name: ``<cluster>-system``."""
    return f"{cluster}-system"


def host_ip() -> str:
    """The host's own IPv4 address: the one on the default route's interface (``eth0`` here).

    The kubelet's ``--node-ip`` must be a non-loopback address on an
    interface; traffic to it never leaves the host.

    Raises:
        NodeError: no default route with an IPv4 address.
    """
    routes = json.loads(subprocess.run(["ip", "-j", "-4", "route", "show", "default"], capture_output=True,
                                       text=True, check=True).stdout or "[]")
    for route in routes:
        if "dev" in route:
            addrs = json.loads(subprocess.run(["ip", "-j", "-4", "addr", "show", "dev", route["dev"]],
                                              capture_output=True, text=True, check=True).stdout or "[]")
            for link in addrs:
                for a in link.get("addr_info", []):
                    if a.get("scope") == "global":
                        return a["local"]
    raise NodeError("no IPv4 address on the default route's interface: the kubelet needs one for --node-ip")


def short_name(cluster: str) -> str:
    """Eight hex digits naming cluster ``cluster`` on the host (interface, namespace names)."""
    return hashlib.sha256(cluster.encode()).hexdigest()[:8]


def bridge_name(cluster: str) -> str:
    """The CNI bridge of cluster ``cluster``: ``gf`` + 8 hex digits (interface names have 15 characters at most)."""
    return f"gf{short_name(cluster)}"


def pod_subnet(ports: Ports) -> str:
    """A /24 for the node's non-hostNetwork pods, unique per cluster (from its port block): ``10.244.<n>.0/24``."""
    return f"10.244.{(ports.base - 20000) // 20 % 256}.0/24"


def gateway_ip(ports: Ports) -> str:
    """The bridge's own address (``10.244.<n>.1``): the host, as the pods on the node reach it."""
    return pod_subnet(ports).replace(".0/24", ".1")


#: The port of the apiserver forward on :func:`gateway_ip`.
API_FORWARD_PORT = 6443


def in_cluster_api(ports: Ports) -> str:
    """The API endpoint of in-cluster clients on the real node: ``https://<gateway_ip>:6443``."""
    return f"https://{gateway_ip(ports)}:{API_FORWARD_PORT}"


#: The port of the Prometheus forward on :func:`gateway_ip` (Prometheus' own default port).
PROMETHEUS_FORWARD_PORT = 9090


def in_cluster_prometheus(ports: Ports) -> str:
    """The Prometheus URL of pods on the real node: ``http://<gateway_ip>:9090`` (forwarded to the cluster's Prometheus)."""
    return f"http://{gateway_ip(ports)}:{PROMETHEUS_FORWARD_PORT}"


def prometheus_forward_argv(ports: Ports) -> list[str]:
    """socat forwarding :func:`gateway_ip`:9090 to the cluster's Prometheus on 127.0.0.1."""
    return [str(binary("node_runtime", "socat")), "-d",
            f"TCP-LISTEN:{PROMETHEUS_FORWARD_PORT},bind={gateway_ip(ports)},reuseaddr,fork",
            f"TCP:127.0.0.1:{ports.prometheus}"]


def api_forward_argv(ports: Ports) -> list[str]:
    """socat forwarding :func:`gateway_ip`:6443 to the apiserver on 127.0.0.1 (TLS passes through untouched)."""
    return [str(binary("node_runtime", "socat")), "-d",
            f"TCP-LISTEN:{API_FORWARD_PORT},bind={gateway_ip(ports)},reuseaddr,fork",
            f"TCP:127.0.0.1:{ports.apiserver}"]


# --------------------------------------------------------------------------- configuration


def hosts_toml() -> str:
    """``certs.d/_default/hosts.toml``: every registry is a closed loopback port, so nothing is ever pulled."""
    return ('# Every registry resolves here: a closed port on loopback. Images are imported, never pulled.\n'
            'server = "http://127.0.0.1:1"\n\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n')


def containerd_config(paths: NodePaths, sandbox_image: str) -> str:
    """containerd 1.6's ``config.toml`` (version 2) for the real node.

    No TCP, metrics or debug listeners; the CRI's streaming server on
    127.0.0.1; network namespaces under the state folder; runc with cgroupfs;
    ``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE here).
    """
    q = json.dumps  # TOML basic strings are JSON strings
    return f"""version = 2
root = {q(str(paths.containerd_root))}
state = {q(str(paths.containerd_state))}
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {q(str(paths.socket))}

[ttrpc]
  address = {q(str(paths.containerd_state / "containerd-ttrpc.sock"))}

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {q(str(paths.root / "opt"))}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {q(sandbox_image)}
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = {q(str(paths.cni_conf))}
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = {q(str(paths.certs_d))}
"""


#: Every local cluster's pod subnet (:func:`pod_subnet`) lies in it.
POD_NETWORKS = "10.244.0.0/16"
#: The last host octet the CNI gives a pod; addresses above are the host's namespaces' (gpufleet_workshop.local.dataplane).
POD_RANGE_END = 239


def cni_config(cluster: str, ports: Ports, paths: NodePaths) -> dict:
    """The conflist: a bridge with no gateway and no masquerade (pods get no default route), loopback.

    One route, :data:`POD_NETWORKS` through the host's end of the bridge:
    a pod reaches the forwards of the other local clusters' real nodes
    (their bridge addresses are the host's own), as a virtual kubelet of a
    ``kubernetes`` pool reaches the pool's cluster; nothing else is routed.
    """
    return {
        "cniVersion": "1.0.0",
        "name": f"gpufleet-{cluster}",
        "plugins": [
            # The bridge and its address are made by ensure_network; the plugin only plugs pods in.
            {"type": "bridge", "bridge": bridge_name(cluster), "isGateway": False, "isDefaultGateway": False,
             "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(paths.ipam),
                      "routes": [{"dst": POD_NETWORKS, "gw": gateway_ip(ports)}],
                      "ranges": [[{"subnet": pod_subnet(ports), "gateway": gateway_ip(ports),
                                   "rangeEnd": pod_subnet(ports).replace(".0/24", f".{POD_RANGE_END}")}]]}},
            {"type": "loopback"},
        ],
    }


def kubelet_config(cluster: str, ports: Ports, paths: NodePaths, ca: Path, node_ip: str) -> dict:
    """The KubeletConfiguration (``kubelet.config.k8s.io/v1beta1``) of the real node.

    cgroupfs driver under ``/gpufleet-<cluster>``; cgroup v1 allowed; the
    host's kernel settings and firewall left alone; image garbage collection
    off (containerd 1.6 never pins the sandbox image, and nothing can be
    pulled back); eviction thresholds low (the machine is shared); no
    cluster DNS (pods resolve through 127.0.0.1 only).
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_PREFIX}{cluster}",
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "oomScoreAdj": 0,
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "resolvConf": str(paths.config / "resolv.conf"),
        "clusterDomain": "cluster.local",
        "podLogsDir": str(paths.pod_logs),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%",
                         "nodefs.inodesFree": "2%"},
        # The kubelet's default: sim.flip runs up to ~64 inference stand-ins beside the controllers here.
        "maxPods": 110,
        "registerWithTaints": [{"key": names.SYSTEM_NODE_TAINT[0], "value": names.SYSTEM_NODE_TAINT[1],
                                "effect": names.SYSTEM_NODE_TAINT[2]}],
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "nodeStatusReportFrequency": "10s",
        "nodeStatusUpdateFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "volumeStatsAggPeriod": "60s",
        "containerLogMaxSize": "10Mi",
        "containerLogMaxFiles": 2,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def containerd_argv(paths: NodePaths) -> list[str]:
    """containerd with the generated config."""
    return [str(binary("node_runtime", "containerd")), "--config", str(paths.config / "containerd.toml")]


def kubelet_argv(cluster: str, paths: NodePaths, node_ip: str) -> list[str]:
    """The kubelet: config file, kubeconfig, the node's name, address and labels."""
    label = "=".join(names.SYSTEM_NODE_LABEL)
    return [str(binary("kubernetes", "kubelet")), f"--config={paths.config / 'kubelet.yaml'}",
            f"--kubeconfig={paths.config / 'kubelet.kubeconfig'}", f"--root-dir={paths.kubelet_root}",
            f"--cert-dir={paths.kubelet_root / 'pki'}", f"--hostname-override={node_name(cluster)}",
            f"--node-ip={node_ip}", f"--node-labels={label}", "--v=1"]


# --------------------------------------------------------------------------- host state


def cgroup_hierarchies() -> list[Path]:
    """Mount points of the host's cgroup hierarchies (v1 controllers and the v2 one), from mountinfo."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        if fstype in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def cgroup_dirs(cluster: str) -> list[Path]:
    """``<hierarchy>/gpufleet-<cluster>`` in every hierarchy (existing or not)."""
    return [h / f"{CGROUP_PREFIX}{cluster}" for h in cgroup_hierarchies()]


def ensure_cgroups(cluster: str) -> None:
    """Create the kubelet's cgroup root and its ``runtime`` child in every hierarchy (v1 cpuset gets its parent's CPUs and memory nodes)."""
    for d in cgroup_dirs(cluster):
        for sub in (d, d / "runtime"):
            sub.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                f = sub / knob
                if f.exists() and not f.read_text().strip():
                    f.write_text((sub.parent / knob).read_text())


def join_runtime_cgroup(cluster: str, pid: int) -> None:
    """Move process ``pid`` into ``gpufleet-<cluster>/runtime`` of every hierarchy (its later children follow)."""
    for d in cgroup_dirs(cluster):
        procs = d / "runtime" / "cgroup.procs"
        if procs.exists():
            try:
                procs.write_text(str(pid))
            except OSError:  # an exited pid, or a v2 hierarchy refusing a threaded move: the other hierarchies hold it
                continue


def cgroup_pids(cluster: str) -> set[int]:
    """Every process in any cgroup under ``gpufleet-<cluster>``."""
    pids: set[int] = set()
    for d in cgroup_dirs(cluster):
        if d.is_dir():
            for procs in d.rglob("cgroup.procs"):
                try:
                    pids |= {int(p) for p in procs.read_text().split()}
                except OSError:
                    continue
    return pids


def remove_cgroups(cluster: str, timeout: float = 10.0) -> None:
    """Kill every process left under ``gpufleet-<cluster>`` and remove its cgroups, deepest first.

    Raises:
        NodeError: processes or cgroups still there after ``timeout`` seconds.
    """
    def all_killed() -> bool:
        for pid in (pids := cgroup_pids(cluster)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return not pids

    try:
        poll_until(all_killed, what=f"cgroups {CGROUP_PREFIX}{cluster} empty", timeout=timeout, interval=0.2)
    except PollTimeout:
        raise NodeError(f"processes {sorted(cgroup_pids(cluster))} still in cgroups {CGROUP_PREFIX}{cluster} after "
                        f"{timeout:.0f}s") from None
    left = []
    for d in cgroup_dirs(cluster):
        if not d.is_dir():
            continue
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [d]:
            for _ in range(50):
                try:
                    sub.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                left.append(str(sub))
    if left:
        raise NodeError(f"cgroups not removable: {left[:5]}")


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or under ``folder`` in this mount namespace, deepest first."""
    prefix = str(folder.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_under(folder: Path) -> None:
    """Unmount everything mounted under ``folder`` (lazily: nothing of ours uses them any more).

    Raises:
        NodeError: a mount is still there afterwards.
    """
    for point in mounts_under(folder):
        subprocess.run(["umount", "-l", point], capture_output=True)
    if left := mounts_under(folder):
        raise NodeError(f"mounts left under {folder}: {left[:5]}")


#: inotify instances a root process may hold, at least (fs.inotify.max_user_instances): the kubelet's
#: cAdvisor needs several and fails to start without them; every local cluster's control plane holds
#: some (kind documents the same raise: 128, the kernel default, runs out with a few clusters).
INOTIFY_INSTANCES = 1024


def ensure_inotify(log: Callable[[str], None] = lambda m: None) -> None:
    """Raise ``fs.inotify.max_user_instances`` to :data:`INOTIFY_INSTANCES` when it is lower (never lowers it).

    Raises:
        NodeError: the setting is lower and cannot be written (not root).
    """
    knob = Path("/proc/sys/fs/inotify/max_user_instances")
    current = int(knob.read_text())
    if current >= INOTIFY_INSTANCES:
        return
    try:
        knob.write_text(str(INOTIFY_INSTANCES))
    except OSError as exc:
        raise NodeError(f"fs.inotify.max_user_instances is {current}; the kubelet needs more "
                        f"(sysctl -w fs.inotify.max_user_instances={INOTIFY_INSTANCES}): {exc}") from None
    log(f"raised fs.inotify.max_user_instances from {current} to {INOTIFY_INSTANCES} (the kubelet's cAdvisor needs some)")


def ensure_network(cluster: str, ports: Ports, service_cidr: str) -> None:
    """The node's bridge with the gateway address (no uplink: pods reach the host and each other only);
    a blackhole route for the service range (no kube-proxy serves it; a client must not route it out of eth0).

    Raises:
        NodeError: an ``ip`` command failed (its message).
    """
    def ip(*args: str) -> None:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True)
        if proc.returncode != 0 and not any(ok in proc.stderr for ok in ("File exists", "already assigned")):
            raise NodeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")

    bridge = bridge_name(cluster)
    ip("link", "add", "name", bridge, "type", "bridge")
    ip("addr", "add", f"{gateway_ip(ports)}/24", "dev", bridge)
    ip("link", "set", bridge, "up")
    ip("route", "add", "blackhole", service_cidr)


def remove_network(cluster: str, service_cidr: str, *, last: bool) -> None:
    """Delete the node's bridge; delete the blackhole route when no other local node needs it (``last``)."""
    if Path(f"/sys/class/net/{bridge_name(cluster)}").exists():
        subprocess.run(["ip", "link", "delete", bridge_name(cluster)], capture_output=True)
    if last:
        subprocess.run(["ip", "route", "del", "blackhole", service_cidr], capture_output=True)


# --------------------------------------------------------------------------- containerd


def ctr(paths: NodePaths, *args: str, timeout: float = 120) -> str:
    """Run ``ctr`` against the node's containerd in the CRI namespace; its stdout.

    Raises:
        NodeError: ctr failed (its message).
    """
    argv = [str(binary("node_runtime", "ctr")), "--address", str(paths.socket), "--namespace", CRI_NAMESPACE, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise NodeError(f"ctr {' '.join(args[:3])}: {proc.stderr.strip()[-1500:]}")
    return proc.stdout


def wait_containerd(paths: NodePaths, alive: Callable[[], bool], timeout: float) -> None:
    """Wait until containerd answers on its socket.

    Raises:
        NodeError: it exited or did not answer within ``timeout`` seconds.
    """
    def answers() -> bool:
        if paths.socket.exists():
            try:
                ctr(paths, "version", timeout=5)
                return True
            except (NodeError, subprocess.TimeoutExpired):
                pass
        if not alive():
            raise NodeError("containerd exited during startup")
        return False

    try:
        poll_until(answers, what=f"containerd on {paths.socket}", timeout=timeout, interval=0.2)
    except PollTimeout:
        raise NodeError(f"containerd did not answer on {paths.socket} after {timeout:.0f}s") from None


def images(paths: NodePaths) -> dict[str, str]:
    """``{reference: digest}`` of the images in containerd's CRI namespace."""
    out = {}
    for line in ctr(paths, "images", "ls").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and not fields[0].startswith("sha256:"):  # the CRI also lists images by id
            out[fields[0]] = fields[2]
    return out


def import_image(paths: NodePaths, archive: Path, reference: str, digest: str | None = None) -> bool:
    """Import an OCI archive (its index names ``reference``) unless containerd has it at ``digest``; True if imported.

    Raises:
        NodeError: the import failed, or the image is not there afterwards.
    """
    have = images(paths)
    if reference in have and (digest is None or have[reference] == digest):
        return False
    ctr(paths, "images", "import", str(archive), timeout=300)
    if reference not in images(paths):
        raise NodeError(f"{archive} imported, but containerd has no image {reference} "
                        f"(it has {sorted(images(paths))})")
    return True


def remove_containers(paths: NodePaths) -> int:
    """Kill and delete every task and container in the CRI namespace (shims exit, rootfs mounts go); their count."""
    tasks = [line.split()[0] for line in ctr(paths, "tasks", "ls").splitlines()[1:] if line.strip()]
    for task in tasks:
        subprocess.run([str(binary("node_runtime", "ctr")), "--address", str(paths.socket), "--namespace",
                        CRI_NAMESPACE, "tasks", "kill", "--signal", "SIGKILL", task], capture_output=True)
    for task in tasks:
        for _ in range(50):
            proc = subprocess.run([str(binary("node_runtime", "ctr")), "--address", str(paths.socket), "--namespace",
                                   CRI_NAMESPACE, "tasks", "delete", "--force", task], capture_output=True, text=True)
            if proc.returncode == 0 or "not found" in proc.stderr:
                break
            time.sleep(0.1)
    containers = [line.split()[0] for line in ctr(paths, "containers", "ls").splitlines()[1:] if line.strip()]
    for cid in containers:
        subprocess.run([str(binary("node_runtime", "ctr")), "--address", str(paths.socket), "--namespace",
                        CRI_NAMESPACE, "containers", "delete", cid], capture_output=True)
    return len(containers)


def leftovers(cluster: str, paths: NodePaths) -> list[str]:
    """What a stopped real node would have left on the host (empty: nothing).

    Looks for processes in its cgroups or running its binaries against its
    state folder (containerd shims included), its cgroups, mounts under its
    state folder and its bridge.
    """
    found = [f"process {pid} in cgroup {CGROUP_PREFIX}{cluster}" for pid in sorted(cgroup_pids(cluster))]
    found += [f"cgroup {d}" for d in cgroup_dirs(cluster) if d.exists()]
    found += [f"mount {m}" for m in mounts_under(paths.root)]
    if Path(f"/sys/class/net/{bridge_name(cluster)}").exists():
        found.append(f"bridge {bridge_name(cluster)}")
    marker = str(paths.root).encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes():
                    found.append(f"process {proc.name}: {(proc / 'cmdline').read_bytes()[:120]!r}")
            except OSError:
                continue
    return found
