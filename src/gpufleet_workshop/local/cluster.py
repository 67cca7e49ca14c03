"""Bring a local cluster up, report on it, take it down.

``up`` is idempotent: components already running with the same command line
and healthy are left alone, others are (re)started; certificates, ports and
etcd data persist in the state folder between ``down`` and ``up``. Order:

1. etcd, then kube-apiserver (each waited for on its health endpoint);
2. bootstrap objects: namespaces, CRDs (kwok Stage, Kueue, JobSet) until
   Established, webhook configurations, Prometheus' service account;
3. kube-controller-manager, kube-scheduler, kwok, Kueue, JobSet,
   descheduler, Prometheus (and its discovery of annotated Services'
   endpoints, :mod:`gpufleet_workshop.local.endpointslice_sd`) and
   metrics-server, started together and waited for together;
4. kwok Stages, then one Node per inventory host, until all are Ready;
5. the real node (:mod:`gpufleet_workshop.local.node`): containerd, the pause image
   gpufleet's image and its workshop variant imported, the kubelet, until its Node is Ready;
6. KEDA on the node's bridge (:mod:`gpufleet_workshop.local.keda`): the external metrics API.

A component that exits or stays unhealthy stops ``up`` with
:class:`~gpufleet_workshop.local.processes.ComponentFailed`, whose message carries
the tail of that component's log.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet import paths
from gpufleet_workshop.local import install
from gpufleet_admin.files import locked
from gpufleet.kube import Conflict, Kube, KubeError, NotFound
from gpufleet.kube.config import from_kubeconfig
from gpufleet_workshop.local import controlplane, descheduler, keda, kueue, kwok, metrics_server, prometheus
from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.local import kubeconfig as kubeconfigs
from gpufleet_workshop.local import ports as portblocks
from gpufleet_workshop.local.apply import apply_changed, wait_for
from gpufleet_workshop.local.certs import Pki, ensure_pki
from gpufleet_workshop.local.layout import DEFAULT_NAME, Layout, check_name
from gpufleet_workshop.local.ports import Ports
from gpufleet_workshop.local.processes import ComponentFailed, Health, ProcessSpec, probe, rss_bytes, running
from gpufleet.names import FIELD_MANAGER_LOCAL, SIMULATED_LABEL
from gpufleet.wait import PollTimeout, poll_until

#: Start order; ``down`` stops in reverse.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kueue",
    "jobset",
    "descheduler",
    "prometheus",
    "endpointslice-sd",
    "metrics-server",
    "containerd",
    "api-forward",
    "prometheus-forward",
    "kubelet",
)
_ADDONS = COMPONENTS[2:-4]
#: The real node's processes (:mod:`gpufleet_workshop.local.node`), started last and stopped first.
NODE_COMPONENTS = COMPONENTS[-4:]
_NOT_NODE = COMPONENTS[:-4]


@dataclass
class Cluster:
    """A local cluster by name: its state folder, ports and credentials.

    Attributes:
        name: cluster name (DNS label).
        layout: paths of its state folder.
        ports: its loopback port block.
    """

    name: str
    layout: Layout
    ports: Ports
    _pki: Pki | None = field(default=None, repr=False)
    _node_ip: str | None = field(default=None, repr=False)

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig path."""
        return self.layout.kubeconfig

    @property
    def server(self) -> str:
        """apiserver URL."""
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def pki(self) -> Pki:
        """The cluster's PKI (created on first access)."""
        if self._pki is None:
            self._pki = ensure_pki(self.layout.certs, apiserver_ips=(realnode.gateway_ip(self.ports),))
        return self._pki

    def kube(self, timeout: float = 30.0, *, field_manager: str = FIELD_MANAGER_LOCAL,
             user_agent: str = "gpufleet-local") -> Kube:
        """A client authenticated as admin through the admin kubeconfig (close it after use).

        Its writes are the local bootstrap's (field manager ``gpufleet-local``)
        unless ``field_manager`` says otherwise.

        Raises:
            gpufleet.kube.ConfigError: the admin kubeconfig is not written yet.
        """
        return Kube(from_kubeconfig(self.kubeconfig), timeout=timeout, field_manager=field_manager,
                    user_agent=user_agent)

    def specs(self, policy_file: Path | None = None) -> dict[str, ProcessSpec]:
        """Process specs of every component, keyed by :data:`COMPONENTS` names.

        Args:
            policy_file: descheduler policy; default: the generated
                ``config/descheduler-policy.yaml``.
        """
        lay, p, pki = self.layout, self.ports, self.pki
        cfg = lay.config
        admin = lay.kubeconfig
        ca = pki.ca.cert

        def spec(name: str, argv: Sequence[str], health: Health | None, **env: str) -> ProcessSpec:
            return ProcessSpec(name, tuple(argv), lay.log(name), lay.pid(name), health, env)

        https = lambda port, path: Health(f"https://127.0.0.1:{port}{path}", ca=ca)  # noqa: E731
        npaths = realnode.NodePaths.of(lay)
        http = lambda port, path: Health(f"http://127.0.0.1:{port}{path}")  # noqa: E731
        return {
            "etcd": spec("etcd", controlplane.etcd_argv(self.name, lay.data / "etcd", p), http(p.etcd_client, "/health")),
            "kube-apiserver": spec("kube-apiserver", controlplane.apiserver_argv(pki, p), https(p.apiserver, "/readyz")),
            "kube-controller-manager": spec(
                "kube-controller-manager",
                controlplane.controller_manager_argv(pki, p, cfg / "kube-controller-manager.kubeconfig"),
                https(p.controller_manager, "/healthz"),
            ),
            "kube-scheduler": spec(
                "kube-scheduler",
                controlplane.scheduler_argv(pki, p, cfg / "kube-scheduler.kubeconfig"),
                https(p.scheduler, "/readyz"),
            ),
            "kwok": spec("kwok", kwok.kwok_argv(admin, p.kwok, cfg / "kwok.yaml"), http(p.kwok, "/healthz")),
            "kueue": spec(
                "kueue", kueue.kueue_argv(cfg / "kueue.yaml", pki.webhook_dir), http(p.kueue_health, "/readyz"),
                KUBECONFIG=str(admin),
            ),
            "jobset": spec("jobset", kueue.jobset_argv(cfg / "jobset.yaml"), http(p.jobset_health, "/readyz"), KUBECONFIG=str(admin)),
            "descheduler": spec(
                "descheduler",
                descheduler.descheduler_argv(policy_file or cfg / "descheduler-policy.yaml", admin, pki, p.descheduler),
                https(p.descheduler, "/healthz"),
            ),
            "prometheus": spec(
                "prometheus",
                prometheus.argv(cfg / "prometheus.yaml", lay.data / "prometheus", p.prometheus),
                http(p.prometheus, "/-/ready"),
            ),
            # Prometheus' discovery of annotated Services' endpoints (Debian's build has no Kubernetes discovery).
            # kwok's pods have addresses no host answers: never scraped (a scrape would leave the machine).
            "endpointslice-sd": spec("endpointslice-sd", [sys.executable, "-m", "gpufleet_workshop.local.endpointslice_sd",
                                                          "--kubeconfig", str(admin), "--out",
                                                          str(lay.endpointslice_targets), "--exclude", kwok.POD_CIDR],
                                     None),
            # /livez, not /readyz: it is ready only once it holds two scrapes of a node, and the real node (the
            # one node it scrapes before virtual nodes come) joins after the add-ons, or never in a cluster without.
            "metrics-server": spec("metrics-server", metrics_server.argv(pki, admin, p.metrics_server),
                                   https(p.metrics_server, "/livez")),
            # containerd has no HTTP endpoint: up waits for its socket (node.wait_containerd).
            "containerd": spec("containerd", realnode.containerd_argv(npaths), None),
            "api-forward": spec("api-forward", realnode.api_forward_argv(p), None),
            "prometheus-forward": spec("prometheus-forward", realnode.prometheus_forward_argv(p), None),
            "kubelet": spec("kubelet", realnode.kubelet_argv(self.name, npaths, self.node_ip),
                            http(p.kubelet_healthz, "/healthz")),
        }

    @property
    def in_cluster_api(self) -> str:
        """The API endpoint of pods on the real node (``https://<bridge address>:6443``, forwarded to the apiserver)."""
        return realnode.in_cluster_api(self.ports)

    def pod_kubeconfig(self) -> str:
        """The admin kubeconfig (YAML) with :attr:`in_cluster_api` as its server: what pods on any local cluster's
        real node can use (a ``kubernetes`` pool's Secret for its virtual kubelet; the pod networks route to
        each other's forwards, :data:`gpufleet_workshop.local.node.POD_NETWORKS`)."""
        doc = yaml.safe_load(self.kubeconfig.read_text())
        for entry in doc["clusters"]:
            entry["cluster"]["server"] = self.in_cluster_api
        return yaml.safe_dump(doc, sort_keys=False)

    @property
    def in_cluster_prometheus(self) -> str:
        """The Prometheus URL of pods on the real node (``http://<bridge address>:9090``, forwarded to Prometheus)."""
        return realnode.in_cluster_prometheus(self.ports)

    @property
    def node_ip(self) -> str:
        """The real node's InternalIP: the host's own address (see :func:`gpufleet_workshop.local.node.host_ip`)."""
        if self._node_ip is None:
            self._node_ip = realnode.host_ip()
        return self._node_ip


def get(name: str = DEFAULT_NAME, *, allocate: bool = False) -> Cluster:
    """The :class:`Cluster` called ``name``.

    Args:
        allocate: give it a port block if it has none yet.

    Raises:
        ValueError: invalid name.
        LookupError: no such cluster (no port block) and ``allocate`` is false.
    """
    check_name(name)
    ports = portblocks.allocate(name) if allocate else portblocks.lookup(name)
    if ports is None:
        raise LookupError(f"no local cluster named {name!r} (run `invoke local.up --name {name}`)")
    return Cluster(name, Layout(name), ports)


# --------------------------------------------------------------------------- up


def _locked(name: str):
    """Serialise up/down of one cluster name across processes (a flock beside its state folder)."""
    return locked(paths.state_dir() / f".{check_name(name)}.lock")


def _write_configs(c: Cluster, policy: dict | None) -> None:
    lay, pki, p = c.layout, c.pki, c.ports
    kubeconfigs.write(lay.kubeconfig, c.server, pki.ca.cert, pki.admin, cluster=f"gpufleet-{c.name}", user="gpufleet-admin")
    kubeconfigs.write(
        lay.config / "kube-controller-manager.kubeconfig", c.server, pki.ca.cert, pki.controller_manager,
        cluster=f"gpufleet-{c.name}", user="system:kube-controller-manager",
    )
    kubeconfigs.write(
        lay.config / "kube-scheduler.kubeconfig", c.server, pki.ca.cert, pki.scheduler,
        cluster=f"gpufleet-{c.name}", user="system:kube-scheduler",
    )

    def dump(obj: dict, name: str) -> None:
        (lay.config / name).write_text(yaml.safe_dump(obj, sort_keys=False))

    dump(kwok.kwok_configuration(), "kwok.yaml")
    dump(kueue.kueue_configuration(p, pki.webhook_dir), "kueue.yaml")
    dump(kueue.jobset_configuration(p, pki.webhook_dir), "jobset.yaml")
    dump(policy or descheduler.default_policy(), "descheduler-policy.yaml")
    prometheus.dump(prometheus.config(lay, p, pki.ca.cert, lay.config / "prometheus.token"), lay.config / "prometheus.yaml")
    token = lay.config / "prometheus.token"
    if not token.exists():
        token.write_text("")
        token.chmod(0o600)


def _ensure(specs: list[ProcessSpec], timeout: float, log: Callable[[str], None]) -> None:
    """Start what is not running with the same argv, then wait for all to be healthy."""
    from gpufleet_workshop.local import processes

    to_wait = []
    for s in specs:
        pid = running(s.pidfile)
        if pid is not None and processes.recorded_argv(s.pidfile) == list(s.argv):
            if s.health is None or probe(s.health):
                continue
        elif pid is not None:
            log(f"restarting {s.name} (command line changed)")
            processes.stop(s.pidfile)
        if running(s.pidfile) is None:
            processes.start(s)
        to_wait.append(s)
    if not to_wait:
        return
    with ThreadPoolExecutor(max_workers=len(to_wait)) as pool:
        futures = [pool.submit(processes.wait_healthy, s, timeout) for s in to_wait]
        errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]


def _bootstrap(c: Cluster, k: Kube, phase: Callable[[str], None]) -> None:
    ca_pem = c.pki.ca.cert.read_bytes()
    for ns in (kueue.KUEUE_NAMESPACE, kueue.JOBSET_NAMESPACE):
        k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    crds = kwok.stage_crds() + kueue.kueue_crds(c.ports, ca_pem) + kueue.jobset_crds()
    phase("read CRDs")
    applied = apply_changed(k, crds)  # unchanged CRDs were served when first applied
    phase("CRDs applied")
    # Served = listed in discovery (small answers, unlike GETs of megabyte CRDs).
    wanted: dict[str, set[str]] = {}
    for crd in applied:
        for v in crd["spec"]["versions"]:
            if v.get("served"):
                wanted.setdefault(f"{crd['spec']['group']}/{v['name']}", set()).add(crd["spec"]["names"]["plural"])
    for gv, plurals in wanted.items():
        wait_for(
            f"{gv} serving {sorted(plurals)}",
            lambda gv=gv, plurals=plurals: plurals <= {
                r["name"] for r in k.request("GET", f"/apis/{gv}").get("resources", [])
            },
            timeout=60,
            interval=0.2,
        )
    phase("CRDs served")
    apply_changed(k, kueue.kueue_webhook_configurations(c.ports, ca_pem) + kueue.jobset_webhook_configurations(c.ports, ca_pem))
    apply_changed(k, prometheus.rbac_objects())
    apply_changed(k, metrics_server.objects(c.pki, c.ports.metrics_server))


def _prometheus_token(c: Cluster, k: Kube) -> None:
    import base64

    ns = prometheus.SERVICE_ACCOUNT[0]
    secret = wait_for(
        "the Prometheus service-account token",
        lambda: (s := k.get_or_none("v1", "secrets", prometheus.TOKEN_SECRET, ns)) and s.get("data", {}).get("token") and s,
        timeout=60,
    )
    token = base64.b64decode(secret["data"]["token"]).decode()
    path = c.layout.config / "prometheus.token"
    if path.read_text() != token:
        path.write_text(token)


def _condition(obj: dict | None, kind: str) -> bool:
    """True when ``obj`` has status condition ``kind`` with status "True"."""
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conds)


def _node_ready(node: dict) -> bool:
    return _condition(node, "Ready")


def _taints(node: dict) -> set[tuple[str, str, str]]:
    # Taints the node lifecycle controller manages come and go; compare ours only.
    return {
        (t["key"], t.get("value", ""), t["effect"])
        for t in (node.get("spec") or {}).get("taints") or []
        if not t["key"].startswith("node.kubernetes.io/")
    }


def _release_node_leases(k: Kube) -> None:
    """Delete the node Leases of simulated nodes that a kwok of an earlier start left behind.

    kwok holds a Lease per node under a holder identity of its own process
    and does not take over one held by another identity until it expires
    (``kwok.LEASE_SECONDS``, 400 s); until then it runs no pods on those
    nodes, so pods bound after a restart would stay Pending for minutes.
    Only called while no kwok runs; virtual-kubelet Leases are kept.
    """
    simulated = {n["metadata"]["name"] for n in k.list("v1", "nodes", labelSelector=SIMULATED_LABEL)["items"]}
    for lease in k.list("coordination.k8s.io/v1", "leases", "kube-node-lease")["items"]:
        if lease["metadata"]["name"] in simulated:
            try:
                k.delete("coordination.k8s.io/v1", "leases", lease["metadata"]["name"], "kube-node-lease")
            except NotFound:
                pass


def apply_nodes(c: Cluster, k: Kube, specs: Sequence[Any], *, workers: int = 8) -> tuple[int, int]:
    """Make the cluster's simulated Nodes exactly ``specs``; returns ``(created, deleted)``.

    Missing nodes are created (with status capacity), existing ones
    server-side applied (labels, taints; capacity patched through the status
    subresource when it differs), simulated nodes not in ``specs`` deleted.
    """
    selector = f"{SIMULATED_LABEL}=true"
    existing = {n["metadata"]["name"]: n for n in k.list("v1", "nodes", labelSelector=selector)["items"]}
    wanted = {s.name: kwok.node_manifest(s, c.name) for s in specs}

    def put(name: str) -> int:
        node = wanted[name]
        if name not in existing:
            try:
                k.create("v1", "nodes", node)
                return 1
            except Conflict:
                return 0
        live = existing[name]
        meta, live_meta = node["metadata"], live["metadata"]
        same = (
            all((live_meta.get("labels") or {}).get(k_) == v for k_, v in meta["labels"].items())
            and all((live_meta.get("annotations") or {}).get(k_) == v for k_, v in meta["annotations"].items())
            and _taints(live) == _taints(node)
        )
        if not same:
            k.apply({k_: v for k_, v in node.items() if k_ != "status"})
        if live.get("status", {}).get("capacity") != node["status"]["capacity"]:
            k.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": node["status"]}, subresource="status")
        return 0

    stale = [n for n in existing if n not in wanted]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        created = sum(pool.map(put, wanted))
        list(pool.map(lambda n: _delete_node(k, n), stale))
    return created, len(stale)


def _delete_node(k: Kube, name: str) -> None:
    try:
        k.delete("v1", "nodes", name)
    except NotFound:
        pass


def wait_nodes_ready(k: Kube, names: set[str], timeout: float) -> float:
    """Wait until every named Node is Ready; returns the seconds waited.

    Raises:
        TimeoutError: naming how many are not Ready after ``timeout`` s.
    """
    started = time.monotonic()
    interval = 0.5 if len(names) <= 256 else 2.0
    missing = set(names)

    def all_ready() -> bool:
        nodes = k.list("v1", "nodes", labelSelector=f"{SIMULATED_LABEL}=true", resourceVersion="0")["items"]
        missing.intersection_update(names - {n["metadata"]["name"] for n in nodes if _node_ready(n)})
        return not missing

    poll_until(all_ready, what=f"{len(names)} nodes Ready", timeout=timeout, interval=interval,
               detail=lambda: f"{len(missing)} of {len(names)} not Ready (e.g. {sorted(missing)[:3]})")
    return time.monotonic() - started



def _write_node_configs(c: Cluster) -> tuple[realnode.NodePaths, set[str]]:
    """The real node's config files: containerd, registries, CNI, resolv.conf, kubelet and its kubeconfig;
    returns the paths and the names of the files this call changed."""
    from gpufleet_workshop.local import pause
    from gpufleet_workshop.local.certs import ensure_node_client

    npaths = realnode.NodePaths.of(c.layout).create()
    cfg = npaths.config

    def put(path: Path, text: str) -> None:
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.add(path.name)

    changed: set[str] = set()

    put(cfg / "containerd.toml", realnode.containerd_config(npaths, pause.reference()))
    put(npaths.certs_d / "_default" / "hosts.toml", realnode.hosts_toml())
    put(npaths.cni_conf / "10-gpufleet.conflist", json.dumps(realnode.cni_config(c.name, c.ports, npaths), indent=1))
    put(cfg / "resolv.conf", "# Pods resolve through loopback only: no query leaves the machine.\nnameserver 127.0.0.1\n")
    put(cfg / "kubelet.yaml", yaml.safe_dump(realnode.kubelet_config(c.name, c.ports, npaths, c.pki.ca.cert, c.node_ip),
                                             sort_keys=False))
    client = ensure_node_client(c.pki, realnode.node_name(c.name))
    kubeconfigs.write(cfg / "kubelet.kubeconfig", c.server, c.pki.ca.cert, client, cluster=f"gpufleet-{c.name}",
                      user=f"system:node:{realnode.node_name(c.name)}")
    return npaths, changed


#: The real node's DRA driver (``gpufleet-dra-driver``): a process of its own, run when the fleet allocates GPUs
#: through DRA (:mod:`gpufleet_workshop.local.dra`), started after the kubelet and stopped before it.
DRA_DRIVER = "dra-driver"


def dra_driver_spec(c: Cluster) -> ProcessSpec:
    """The DRA driver's process: the kubelet's kubeconfig and root folder, the fixture GPUs' devices file."""
    from gpufleet_workshop.local import dra
    from gpufleet_workshop.local.components import binary

    npaths = realnode.NodePaths.of(c.layout)
    argv = dra.driver_argv(binary("dra_driver"), realnode.node_name(c.name), npaths.config / "kubelet.kubeconfig",
                           npaths.config / "gpu-devices.json", npaths.kubelet_root)
    return ProcessSpec(DRA_DRIVER, tuple(argv), c.layout.log(DRA_DRIVER), c.layout.pid(DRA_DRIVER), None, {})


def _dra_driver(c: Cluster, k: Kube, timeout: float, log: Callable[[str], None]) -> None:
    """Start (or keep) the real node's DRA driver; wait until its ResourceSlice is published.

    Raises:
        ComponentFailed: the driver exited.
        TimeoutError: no slice in time.
    """
    from gpufleet_workshop.fixtures.node import healthy_node
    from gpufleet_workshop.local import dra
    from gpufleet_workshop.local import processes

    node = realnode.node_name(c.name)
    spec = dra_driver_spec(c)
    changed = dra.devices_file(realnode.NodePaths.of(c.layout).config / "gpu-devices.json", healthy_node(node))
    pid = running(spec.pidfile)
    if pid is not None and (changed or processes.recorded_argv(spec.pidfile) != list(spec.argv)):
        log("restarting the DRA driver (its devices or command line changed)")
        processes.stop(spec.pidfile)
    if running(spec.pidfile) is None:
        pid = processes.start(spec)
        realnode.join_runtime_cgroup(c.name, pid)

    def published() -> bool:
        if running(spec.pidfile) is None:
            raise ComponentFailed(DRA_DRIVER, "exited", spec.log)
        return bool(k.list("resource.k8s.io/v1", "resourceslices", fieldSelector=f"spec.nodeName={node}")["items"])

    wait_for(f"the DRA driver's ResourceSlice of {node}", published, timeout=timeout)


def _real_node(c: Cluster, k: Kube, specs: dict[str, ProcessSpec], timeout: float, phase: Callable[[str], None],
               log: Callable[[str], None], *, dra_driver: bool = False) -> None:
    """Start the real node: containerd, images imported, the kubelet (and the DRA driver when ``dra_driver``);
    wait until its Node is Ready.

    Raises:
        gpufleet_workshop.local.node.NodeError: containerd, an import or the host setup failed.
        ComponentFailed: the kubelet exited or stayed unhealthy.
        TimeoutError: the Node not Ready in time.
    """
    from gpufleet_admin.build import image as images
    from gpufleet_workshop.local import pause, processes, workshop_image

    npaths, changed = _write_node_configs(c)
    realnode.ensure_cgroups(c.name)
    realnode.ensure_network(c.name, c.ports, controlplane.SERVICE_CIDR)
    realnode.ensure_inotify(log)
    cd = specs["containerd"]
    pid = running(cd.pidfile)
    if pid is not None and processes.recorded_argv(cd.pidfile) != list(cd.argv):
        log("restarting containerd (command line changed)")
        processes.stop(cd.pidfile)
        pid = None
    if pid is None:
        pid = processes.start(cd)
        realnode.join_runtime_cgroup(c.name, pid)
    realnode.wait_containerd(npaths, lambda: running(cd.pidfile) is not None, timeout)
    phase("containerd")
    realnode.import_image(npaths, pause.build(), pause.reference())
    built = images.build(say=log)
    imported = realnode.import_image(npaths, built.archive, built.reference, built.digest)
    # What the local environment runs besides the product: the inference stand-in and the simulated rental.
    workshop = workshop_image.build(built, say=log)
    imported_workshop = realnode.import_image(npaths, workshop.archive, workshop.reference, workshop.digest)
    phase(f"images ({'imported' if imported or imported_workshop else 'present'}: gpufleet {built.digest[:19]}, "
          f"workshop {workshop.digest[:19]})")
    _ensure([specs["api-forward"], specs["prometheus-forward"]], timeout, log)
    kl = specs["kubelet"]
    if "kubelet.yaml" in changed and running(kl.pidfile) is not None:
        log("restarting the kubelet (its configuration changed)")  # it reads the file only at start
        processes.stop(kl.pidfile)
    started_before = running(kl.pidfile)
    _ensure([kl], timeout, log)
    if (kpid := running(kl.pidfile)) is not None and kpid != started_before:
        realnode.join_runtime_cgroup(c.name, kpid)
    name = realnode.node_name(c.name)
    wait_for(f"node {name} Ready", lambda: _node_ready(k.get_or_none("v1", "nodes", name) or {}), timeout=timeout)
    phase(f"real node {name} Ready")
    if dra_driver:
        _dra_driver(c, k, timeout, log)
        phase("DRA driver")
    else:
        from gpufleet_workshop.local import processes

        processes.stop(c.layout.pid(DRA_DRIVER))
    # On the node's bridge: KEDA reaches the API server and Prometheus through the node's forwards.
    keda.up(c, timeout=max(timeout, 120.0))
    phase("KEDA (external metrics API)")


def up(
    name: str = DEFAULT_NAME,
    *,
    env: str = "local",
    nodes: int | None = None,
    specs: Sequence[Any] | None = None,
    descheduler_policy: dict | None = None,
    descheduler_policy_file: Path | None = None,
    timeout: float = 120.0,
    fresh: bool = False,
    real_node: bool = True,
    log: Callable[[str], None] = lambda msg: None,
) -> Cluster:
    """Start (or complete) local cluster ``name``; returns it once every node is Ready.

    Args:
        name: cluster name; distinct names run side by side on distinct ports.
        env: inventory environment for :func:`gpufleet_admin.inventory.node_specs`.
        nodes: number of nodes to ask the inventory for (None: its default).
        specs: explicit node list (``NodeSpec``-like objects) instead of the inventory.
        descheduler_policy: DeschedulerPolicy dict written to the state folder
            (default :func:`gpufleet_workshop.local.descheduler.default_policy`).
        descheduler_policy_file: use this policy file as is instead.
        timeout: seconds each phase may take (health waits, nodes Ready).
        fresh: start from empty etcd and Prometheus data (certs and ports are
            kept), so no object of an earlier run survives; refused while any
            component of the cluster is running.
        real_node: also start the real node (containerd, kubelet) with
            gpufleet's image imported (built first when missing).
        log: progress callback, one line per phase with its duration.

    Concurrent ``up``/``down`` calls for the same name (other processes
    included) run one after the other.

    Raises:
        gpufleet_admin.build.gobuild.GoError: components missing and not buildable (InstallError included).
        ComponentFailed: a component exited or stayed unhealthy (log tail inside).
        TimeoutError: CRDs or nodes not ready in time.
        gpufleet_workshop.local.node.NodeError: the real node's host setup, containerd or an image import failed.
        gpufleet_admin.build.image.ImageError: gpufleet's image could not be built.
        KubeError: the apiserver rejected a bootstrap object.
        ValueError: ``fresh`` while the cluster is running; a descheduler
            policy file that is not a DeschedulerPolicy (nothing is restarted).
    """
    if descheduler_policy_file is not None:
        descheduler.check_policy(descheduler_policy_file)
    with _locked(name):
        if fresh:
            _wipe_data(name)
        return _up(name, env, nodes, specs, descheduler_policy, descheduler_policy_file, timeout, real_node, log)


def control_plane(name: str, *, fresh: bool = True, timeout: float = 60.0,
                  log: Callable[[str], None] = lambda msg: None) -> Cluster:
    """Start only etcd and kube-apiserver of local cluster ``name``; returns it once the API server is ready.

    The integration tier's cluster (``tests/integration``): the API
    server's own behaviour (storage, admission, validation, selectors,
    patches, watches, the Eviction API) with no controller, scheduler or
    node, in seconds rather than the full cluster's minute. Only the
    ``etcd`` and ``kubernetes`` components are installed. :func:`down`
    stops it as it stops a full cluster.

    Args:
        name: cluster name (its own ports and state folder).
        fresh: start from empty etcd data (refused while any component of it runs).
        timeout: seconds each component may take to become healthy.
        log: progress callback.

    Raises:
        ValueError: ``fresh`` while the cluster runs.
        ComponentFailed: a component did not become healthy (its log tail in the message).
    """
    from gpufleet.wait import poll_until

    install.install(["etcd", "kubernetes"])
    with _locked(name):
        if fresh:
            _wipe_data(name)
        c = get(name, allocate=True)
        c.layout.create()
        _write_configs(c, None)
        specs = c.specs()
        _ensure([specs["etcd"]], timeout, log)
        _ensure([specs["kube-apiserver"]], timeout, log)
        with c.kube() as k:  # the system namespaces controller creates default and kube-system right after start
            poll_until(lambda: k.get_or_none("v1", "namespaces", "default"), what=f"cluster {name}: namespace default",
                       timeout=timeout, interval=0.2, ignore=(KubeError,))
    return c


def _wipe_data(name: str) -> None:
    lay = Layout(check_name(name))
    alive = [comp for comp in COMPONENTS if running(lay.pid(comp)) is not None]
    if alive:
        raise ValueError(f"cluster {name!r}: cannot start fresh while {', '.join(alive)} run; run local.down first")
    for sub in ("etcd", "prometheus"):
        shutil.rmtree(lay.data / sub, ignore_errors=True)


def _up(name, env, nodes, specs, descheduler_policy, descheduler_policy_file, timeout, real_node, log) -> Cluster:
    t0 = time.monotonic()
    timings: dict[str, float] = {}

    def phase(label: str, since: float) -> float:
        now = time.monotonic()
        timings[label] = round(now - since, 2)
        log(f"{label:28} {now - since:6.1f}s")
        return now

    install.install()
    c = get(name, allocate=True)
    c.layout.create()
    if specs is None:
        from roles.registry import node_specs

        specs = node_specs(env, nodes) if nodes is not None else node_specs(env)
    _write_configs(c, descheduler_policy)
    t = phase("certs, ports, configs", t0)
    all_specs = c.specs(descheduler_policy_file)
    _ensure([all_specs["etcd"]], timeout, log)
    t = phase("etcd", t)
    _ensure([all_specs["kube-apiserver"]], timeout, log)
    t = phase("kube-apiserver", t)
    with c.kube() as k:
        marks = [t]

        def sub(label: str) -> None:
            marks.append(phase(label, marks[-1]))

        _bootstrap(c, k, sub)
        t = phase("webhooks, RBAC", marks[-1])
        if running(all_specs["kwok"].pidfile) is None:
            _release_node_leases(k)
        _ensure([all_specs[n] for n in _ADDONS], timeout, log)
        t = phase("controllers, kwok, Prometheus", t)
        apply_changed(k, kwok.stages())
        created, deleted = apply_nodes(c, k, specs)
        t = phase(f"nodes (+{created} -{deleted})", t)
        wait_nodes_ready(k, {s.name for s in specs}, timeout)
        t = phase(f"{len(specs)} nodes Ready", t)
        dra_nodes = [s for s in specs if getattr(s, "gpu_allocation", "device_plugin") == "dra"]
        if dra_nodes or k.list("resource.k8s.io/v1", "resourceslices", limit=1)["items"]:
            from gpufleet_workshop.local import dra

            applied, removed = dra.apply_slices(k, specs)
            t = phase(f"ResourceSlices (+{applied} -{removed})", t)
        _prometheus_token(c, k)
        if real_node:
            marks = [t]
            _real_node(c, k, all_specs, timeout, sub, log, dra_driver=bool(dra_nodes))
            t = marks[-1]
        else:
            # KEDA runs beside the real node only: an APIService an earlier run left would answer for nothing,
            # and an unavailable aggregated API stalls discovery (namespace deletion waits on it).
            keda.forget(k)
    # A component can answer its health check and exit a moment later (bad config).
    for spec in all_specs.values():
        if not real_node and spec.name in NODE_COMPONENTS:
            continue
        if running(spec.pidfile) is None:
            raise ComponentFailed(spec.name, "exited after becoming healthy", spec.log)
    record = {
        "name": name,
        "env": env,
        "nodes": len(specs),
        "real_node": realnode.node_name(name) if real_node else None,
        "dra_driver": bool(real_node and dra_nodes),
        "kubeconfig": str(c.kubeconfig),
        "server": c.server,
        "ports": c.ports.all(),
        "up_seconds": round(time.monotonic() - t0, 2),
        "phases": timings,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    c.layout.record.write_text(json.dumps(record, indent=1))
    log(f"{'up':28} {time.monotonic() - t0:6.1f}s")
    return c


# --------------------------------------------------------------------------- down / status


def down(name: str = DEFAULT_NAME, *, purge: bool = False, timeout: float = 10.0) -> list[str]:
    """Stop every process of cluster ``name`` and check its ports are free.

    Args:
        purge: also delete its state folder (certs, etcd data) and release its ports.
        timeout: seconds each process gets after SIGTERM before SIGKILL.

    Returns:
        Names of the components that were running.

    Raises:
        RuntimeError: ports of the block still in use after stopping (names them).
    """
    check_name(name)
    with _locked(name):
        return _down(name, purge, timeout)


def _down_node(name: str, lay: Layout, timeout: float) -> list[str]:
    """Stop the real node and remove what it made on the host: containers, cgroups, mounts, its bridge.

    The kubelet goes first (it would restart what is removed); containerd
    then kills and deletes every container (shims exit, rootfs mounts go)
    before it stops; whatever is left in the node's cgroups is killed.
    """
    from gpufleet_workshop.local import processes

    stopped = keda.down(name, timeout)
    npaths = realnode.NodePaths.of(lay)
    if processes.stop(lay.pid(DRA_DRIVER), timeout):
        stopped.append(DRA_DRIVER)
    if processes.stop(lay.pid("kubelet"), timeout):
        stopped.append("kubelet")
    for forward in ("api-forward", "prometheus-forward"):
        if processes.stop(lay.pid(forward), timeout):
            stopped.append(forward)
    if running(lay.pid("containerd")) is not None:
        try:
            realnode.remove_containers(npaths)
        except (realnode.NodeError, OSError, subprocess.TimeoutExpired):
            pass  # the cgroup sweep below still ends every process
    if processes.stop(lay.pid("containerd"), timeout):
        stopped.append("containerd")
    realnode.remove_cgroups(name)
    realnode.unmount_under(npaths.root)
    others = [n for n in _cluster_names() if n != name and running(Layout(n).pid("containerd")) is not None]
    realnode.remove_network(name, controlplane.SERVICE_CIDR, last=not others)
    return stopped


def _cluster_names() -> list[str]:
    """Names of the clusters that have a state folder."""
    root = paths.state_dir()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _down(name: str, purge: bool, timeout: float) -> list[str]:
    from gpufleet_workshop.local import processes

    from gpufleet_workshop.local import dataplane

    lay = Layout(name)
    stopped = dataplane.down(name, timeout)
    stopped += _down_node(name, lay, timeout)
    for comp in reversed(_NOT_NODE):
        if processes.stop(lay.pid(comp), timeout):
            stopped.append(comp)
    ports = portblocks.lookup(name)
    if ports is not None:
        try:
            poll_until(lambda: not portblocks.busy_ports(ports), what=f"cluster {name!r}'s ports free", timeout=10,
                       interval=0.2)
        except PollTimeout:
            raise RuntimeError(f"cluster {name!r} is down but ports {portblocks.busy_ports(ports)} are still in use") from None
    if purge:
        shutil.rmtree(lay.root, ignore_errors=True)
        portblocks.release(name)
    return stopped


@dataclass(frozen=True)
class ComponentStatus:
    """One component's state: ``pid`` (None if not running), ``healthy``, ``rss`` in bytes."""

    name: str
    pid: int | None
    healthy: bool
    rss: int


@dataclass(frozen=True)
class Status:
    """What :func:`status` found.

    Attributes:
        name: cluster name.
        kubeconfig: admin kubeconfig path.
        components: one entry per component, in start order.
        nodes: simulated nodes registered, and how many are Ready (None if
            the apiserver is not reachable).
        ports: the cluster's named ports.
        real_node: the real node, when the last ``up`` started one (None otherwise).
    """

    name: str
    kubeconfig: Path
    components: list[ComponentStatus]
    nodes: tuple[int, int] | None
    ports: dict[str, int]
    real_node: "RealNodeStatus | None" = None

    @property
    def up(self) -> bool:
        """Every component running and healthy (the real node's only when it was started), its Node Ready."""
        wanted = [c for c in self.components if self.real_node is not None or c.name not in NODE_COMPONENTS]
        return all(c.pid is not None and c.healthy for c in wanted) and (
            self.real_node is None or bool(self.real_node.ready))


@dataclass(frozen=True)
class RealNodeStatus:
    """The real node: ``name``, ``ready`` (its Node's Ready condition; None when the apiserver is down),
    ``pods`` running on it (None when unknown), ``images`` in its containerd (reference -> digest)."""

    name: str
    ready: bool | None
    pods: int | None
    images: dict[str, str]


def status(name: str = DEFAULT_NAME) -> Status:
    """Processes, health, memory and node counts of cluster ``name``.

    Raises:
        LookupError: no such cluster.
    """
    c = get(name)
    comps = []
    for comp, spec in c.specs().items():
        pid = running(spec.pidfile)
        healthy = pid is not None and (spec.health is None or probe(spec.health))
        comps.append(ComponentStatus(comp, pid, healthy, rss_bytes(pid) if pid else 0))
    nodes = None
    try:
        record = json.loads(c.layout.record.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        record = {}
    node_name = record.get("real_node")
    ready = pods = None
    if any(s.name == "kube-apiserver" and s.healthy for s in comps):
        try:
            with c.kube(timeout=10) as k:
                items = k.list("v1", "nodes", labelSelector=f"{SIMULATED_LABEL}=true", resourceVersion="0")["items"]
                nodes = (len(items), sum(_node_ready(n) for n in items))
                if node_name:
                    ready = _node_ready(k.get_or_none("v1", "nodes", node_name) or {})
                    pods = sum(p.get("status", {}).get("phase") == "Running" for p in k.list(
                        "v1", "pods", fieldSelector=f"spec.nodeName={node_name}", resourceVersion="0")["items"])
        except (KubeError, OSError):
            nodes = None
    real = None
    if node_name:
        imgs: dict[str, str] = {}
        if any(s.name == "containerd" and s.pid for s in comps):
            try:
                imgs = realnode.images(realnode.NodePaths.of(c.layout))
            except (realnode.NodeError, OSError, subprocess.TimeoutExpired):
                imgs = {}
        real = RealNodeStatus(node_name, ready, pods, imgs)
    return Status(name, c.kubeconfig, comps, nodes, c.ports.all(), real)


def main_pids(name: str = DEFAULT_NAME) -> dict[str, int]:
    """``{component: pid}`` of the running components of cluster ``name``."""
    lay = Layout(check_name(name))
    return {comp: pid for comp in COMPONENTS if (pid := running(lay.pid(comp))) is not None}
