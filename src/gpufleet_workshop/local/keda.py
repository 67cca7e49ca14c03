"""KEDA for one local cluster: its operator and metrics adapter, in a network namespace of their own.

What it gives: the external metrics API (``external.metrics.k8s.io``) the
HorizontalPodAutoscaler reads for a KEDA ScaledObject, so the inference
role's Deployments scale on requests in flight (a Prometheus query over the
pods' own metrics, scraped through their Services' EndpointSlices) wherever
their pods run (``roles/inference``).

Why a namespace: KEDA's metrics adapter serves its own ``/metrics`` on every
address of its host (``--port`` takes a number, not an address), and nothing
of the local environment may listen beyond loopback. Both processes run in
network namespace ``gfkd-<8 hex digits>`` (:func:`netns_name`), attached to
the bridge of the cluster's real node at :func:`address` (``10.244.<n>.251``,
above the pods' range, as the Service data plane's namespace is at ``.250``,
:mod:`gpufleet_workshop.local.dataplane`): what binds there is reachable on
that host-internal bridge only. From there they reach what pods of the real
node reach, through its forwards: the API server (``https://<gateway>:6443``,
the admin kubeconfig with that server) and Prometheus
(``http://<gateway>:9090``, :func:`gpufleet_workshop.local.node.in_cluster_prometheus`,
the address the stack gives the inference role). So a cluster without a real
node runs no KEDA.

How it is wired, as KEDA's own manifests wire it but off the pod network:

* the operator: ScaledObjects (CRDs from the pinned module's ``config/crd/bases``),
  the HPA it owns for each, and the scalers' queries; its gRPC metrics
  service on ``127.0.0.1:9666`` inside the namespace, mutual TLS with a
  certificate of the cluster's CA (``--cert-dir``; no rotation: the local PKI
  issues it, :func:`gpufleet_workshop.local.certs.ensure_keda`); no patching
  of webhooks or APIServices (they are ours); health on the namespace's
  address;
* the adapter: ``external.metrics.k8s.io/v1beta1`` on :data:`SECURE_PORT`
  of the namespace's address, its serving certificate for the name the
  aggregator checks (``keda-metrics-apiserver.keda.svc``), delegated
  authentication and authorization through the kubeconfig; it asks the
  operator over gRPC for each metric;
* the APIService ``v1beta1.external.metrics.k8s.io`` points at Service
  ``keda/keda-metrics-apiserver`` of type ExternalName with the namespace's
  address (an IPv4 address is a valid name there, and the aggregator
  dials it as one): no endpoints, no kube-proxy on the host;
* the HPA controller may read external metrics (ClusterRole
  ``gpufleet:keda-external-metrics-reader``, bound to both identities it may
  use: ``kube-system/horizontal-pod-autoscaler`` and
  ``system:kube-controller-manager``), as KEDA's manifests bind it.

Errors: :class:`KedaError` (an ``ip`` command failed); a process that exits
or stays unhealthy is :mod:`gpufleet_workshop.local.processes`' ``ComponentFailed``.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.local import processes
from gpufleet_workshop.local.components import component
from gpufleet_admin.build.gobuild import module_dir

if TYPE_CHECKING:
    from gpufleet_workshop.local.cluster import Cluster

#: KEDA's namespace (its cluster objects; where its own manifests put it).
NAMESPACE = "keda"
#: The adapter's Service (the aggregator's TLS server name is ``<name>.<ns>.svc``) and APIService.
SERVICE = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
#: Names the certificate carries: the adapter's for the aggregator, the operator's for the adapter's gRPC client.
SERVING_NAMES = (f"{SERVICE}.{NAMESPACE}.svc", f"keda-operator.{NAMESPACE}.svc", "localhost")
#: The host octet of the namespace's address on the real node's bridge (the data plane has .250).
HOST_OCTET = 251
#: Ports inside the namespace (its own: no clash with the cluster's loopback block).
SECURE_PORT = 6443
OPERATOR_HEALTH_PORT = 8081
GRPC_PORT = 9666
OPERATOR_METRICS_PORT = 8080
ADAPTER_METRICS_PORT = 8082
#: The process names (log and pid files), started in this order.
COMPONENTS = ("keda-operator", "keda-adapter")


class KedaError(RuntimeError):
    """An ``ip`` command setting up KEDA's namespace failed."""


def netns_name(cluster: str) -> str:
    """KEDA's network namespace of cluster ``cluster``: ``gfkd-<8 hex digits>``."""
    return f"gfkd-{realnode.short_name(cluster)}"


def address(c: "Cluster") -> str:
    """The namespace's address on the real node's bridge (``10.244.<n>.251``)."""
    return realnode.pod_subnet(c.ports).replace(".0/24", f".{HOST_OCTET}")


def crds() -> list[dict]:
    """KEDA's CustomResourceDefinitions, from the pinned module (``config/crd/bases``)."""
    from gpufleet_workshop.local.webhooks import load_crds

    c = component("keda")
    return load_crds(module_dir(c.module, c.version) / "config" / "crd" / "bases")


def _ip(*args: str, ok: tuple[str, ...] = ("File exists",)) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0 and not any(o in proc.stderr for o in ok):
        raise KedaError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def ensure_netns(c: "Cluster") -> str:
    """The namespace, with loopback up and a veth into the real node's bridge at :func:`address`; returns its name.

    Raises:
        KedaError: an ``ip`` command failed (no bridge: the real node is not up).
    """
    ns = netns_name(c.name)
    if not Path(f"/run/netns/{ns}").exists():
        _ip("netns", "add", ns)
    _ip("-n", ns, "link", "set", "lo", "up")
    host_end, inner = f"gk{realnode.short_name(c.name)}", "tobridge"
    if not Path(f"/sys/class/net/{host_end}").exists():
        _ip("link", "add", host_end, "type", "veth", "peer", "name", inner, "netns", ns)
    _ip("link", "set", host_end, "master", realnode.bridge_name(c.name))
    _ip("link", "set", host_end, "up")
    _ip("-n", ns, "addr", "add", f"{address(c)}/24", "dev", inner, ok=("File exists", "already assigned"))
    _ip("-n", ns, "link", "set", inner, "up")
    return ns


def cert_dir(c: "Cluster") -> Path:
    """KEDA's certificate folder (``ca.crt``, ``tls.crt``, ``tls.key``), issued when missing."""
    from gpufleet_workshop.local.certs import ensure_keda

    return ensure_keda(c.pki, c.layout.certs / "keda", SERVING_NAMES, ("127.0.0.1", address(c)))


def kubeconfig(c: "Cluster") -> Path:
    """The admin kubeconfig with the real node's forward as server (what the namespace reaches), written once."""
    path = c.layout.config / "keda.kubeconfig"
    text = c.pod_kubeconfig()
    if not path.exists() or path.read_text() != text:
        # Created 0600: it holds the admin client key, never readable by others, not even for a moment.
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


def specs(c: "Cluster") -> list[processes.ProcessSpec]:
    """The operator's and the adapter's processes (module docstring), in start order."""
    ns, addr, certs, kc = netns_name(c.name), address(c), cert_dir(c), kubeconfig(c)
    keda = component("keda")
    env = {"KUBECONFIG": str(kc), "POD_NAMESPACE": NAMESPACE, "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
           "WATCH_NAMESPACE": ""}
    run = ["/usr/sbin/ip", "netns", "exec", ns]
    operator = [*run, str(keda.binary("operator")),
                f"--health-probe-bind-address={addr}:{OPERATOR_HEALTH_PORT}",
                f"--metrics-bind-address=127.0.0.1:{OPERATOR_METRICS_PORT}",
                f"--metrics-service-bind-address=127.0.0.1:{GRPC_PORT}",
                f"--cert-dir={certs}", "--enable-cert-rotation=false",
                "--enable-webhook-patching=false", "--enable-apiservice-patching=false",
                "--leader-elect=false", "--zap-log-level=info", "--zap-encoder=console"]
    adapter = [*run, str(keda.binary("adapter")),
               f"--bind-address={addr}", f"--secure-port={SECURE_PORT}",
               f"--tls-cert-file={certs / 'tls.crt'}", f"--tls-private-key-file={certs / 'tls.key'}",
               f"--cert-dir={certs}",
               f"--metrics-service-address=127.0.0.1:{GRPC_PORT}",
               f"--port={ADAPTER_METRICS_PORT}",
               f"--lister-kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
               "--zap-log-level=info", "--zap-encoder=console"]
    lay = c.layout
    return [
        processes.ProcessSpec("keda-operator", tuple(operator), lay.log("keda-operator"), lay.pid("keda-operator"),
                              processes.Health(f"http://{addr}:{OPERATOR_HEALTH_PORT}/readyz"), env),
        processes.ProcessSpec("keda-adapter", tuple(adapter), lay.log("keda-adapter"), lay.pid("keda-adapter"),
                              processes.Health(f"https://{addr}:{SECURE_PORT}/livez", ca=c.pki.ca.cert), env),
    ]


def objects(c: "Cluster") -> list[dict]:
    """KEDA's namespace, the adapter's ExternalName Service and APIService, and the HPA controller's RBAC."""
    reader = "gpufleet:keda-external-metrics-reader"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
         "spec": {"type": "ExternalName", "externalName": address(c),
                  "ports": [{"name": "https", "port": SECURE_PORT, "protocol": "TCP"}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
         "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                  "versionPriority": 100, "service": {"namespace": NAMESPACE, "name": SERVICE, "port": SECURE_PORT},
                  "caBundle": base64.b64encode(c.pki.ca.cert.read_bytes()).decode()}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": reader},
         "rules": [{"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": reader},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
         "subjects": [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"},
                      {"kind": "User", "apiGroup": "rbac.authorization.k8s.io",
                       "name": "system:kube-controller-manager"}]},
    ]


def forget(k) -> None:
    """Delete KEDA's APIService from the cluster of client ``k`` (a :class:`gpufleet.kube.Kube`), if there: what a
    cluster without KEDA's processes must not keep registered. Its CRDs and objects stay (a later run with a
    real node serves them again).

    Raises:
        gpufleet.kube.KubeError: the delete was refused (not found is fine).
    """
    from gpufleet.kube import NotFound

    try:
        k.delete("apiregistration.k8s.io/v1", "apiservices", API_SERVICE)
    except NotFound:
        pass


def up(c: "Cluster", *, timeout: float = 120.0) -> list[processes.ProcessSpec]:
    """KEDA running for cluster ``c`` (its namespace, CRDs and objects applied, both processes healthy); idempotent.

    Raises:
        KedaError: the namespace could not be set up.
        gpufleet_workshop.local.processes.ComponentFailed: a process exited or stayed unhealthy.
    """
    from gpufleet_workshop.local.apply import apply_changed

    ensure_netns(c)
    with c.kube() as k:
        apply_changed(k, crds())
        objs = objects(c)
        # The namespace before what goes in it (apply_changed writes in parallel).
        apply_changed(k, [o for o in objs if o["kind"] == "Namespace"])
        apply_changed(k, [o for o in objs if o["kind"] != "Namespace"])
    out = specs(c)
    for sp in out:
        if processes.running(sp.pidfile) is not None and processes.recorded_argv(sp.pidfile) != list(sp.argv):
            processes.stop(sp.pidfile)
        if processes.running(sp.pidfile) is None:
            processes.start(sp)
    for sp in out:
        processes.wait_healthy(sp, timeout)
    return out


def down(name: str, timeout: float = 10.0) -> list[str]:
    """Stop cluster ``name``'s KEDA processes and delete its namespace (the veth goes with it); the processes that
    were running (:data:`COMPONENTS`' names)."""
    from gpufleet_workshop.local.layout import Layout

    lay = Layout(name)
    gone = [n for n in reversed(COMPONENTS) if processes.stop(lay.pid(n), timeout)]
    ns = netns_name(name)
    if Path(f"/run/netns/{ns}").exists():
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    return gone
