"""metrics-server as a local process: the resource metrics API (``metrics.k8s.io``) of the local cluster.

What it gives: ``kubectl top``, and the CPU and memory figures the
HorizontalPodAutoscaler controller reads, for every pod whose node serves
the kubelet's ``/metrics/resource``: the real node's kubelet, and the
virtual nodes (:mod:`gpufleet.virtual_kubelet.kubelet_api`), so a CPU HPA
keeps its figures while inference runs outside.

How it is wired, as in a cluster but off the pod network:

* metrics-server (``sigs.k8s.io/metrics-server``, pinned in
  ``versions.yaml``) listens on ``127.0.0.1`` with a serving certificate of
  the cluster's CA for ``metrics-server.kube-system.svc`` (the name the
  aggregator checks), delegated authentication and authorization through
  the admin kubeconfig (the local control plane's components all use it);
* the APIService ``v1beta1.metrics.k8s.io`` points at Service
  ``kube-system/metrics-server`` of type ExternalName ``localhost``: the
  aggregator resolves an ExternalName Service to that host and the
  APIService's port, so no endpoint (which may not be a loopback address)
  and no kube-proxy on the host are needed;
* it scrapes the nodes at their InternalIP and registered kubelet port
  (``--kubelet-use-node-status-port``; the real node's kubelet is not on
  10250), skips kwok's simulated nodes (``--node-selector``: they serve no
  kubelet), and accepts the kubelets' self-signed serving certificates
  (``--kubelet-insecure-tls``: the local kubelet and the virtual kubelets
  make their own, as kubelets without ``serverTLSBootstrap`` do);
* every 15 s (``--metric-resolution``), the HPA controller's default sync
  period.

Errors: none here; the process and its health check are
:mod:`gpufleet_workshop.local.processes`'.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.names import SIMULATED_LABEL
from gpufleet_workshop.local.components import component

if TYPE_CHECKING:  # certs names this module's serving names: a type only here
    from gpufleet_workshop.local.certs import Pki

#: Where the APIService's Service lives, and its name (the aggregator's TLS server name is ``<name>.<ns>.svc``).
SERVICE = ("kube-system", "metrics-server")
API_SERVICE = "v1beta1.metrics.k8s.io"
#: Seconds between scrapes (metrics-server's ``--metric-resolution``).
RESOLUTION = "15s"
#: Names the serving certificate carries.
SERVING_NAMES = (f"{SERVICE[1]}.{SERVICE[0]}.svc", "localhost")


def argv(pki: "Pki", kubeconfig: Path, port: int) -> list[str]:
    """metrics-server's command line (module docstring): HTTPS on ``127.0.0.1:port``."""
    return [
        str(component("metrics_server").binary("metrics-server")),
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.metrics_server.cert}",
        f"--tls-private-key-file={pki.metrics_server.key}",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--kubelet-preferred-address-types=InternalIP",
        "--kubelet-use-node-status-port",
        "--kubelet-insecure-tls",
        f"--node-selector={SIMULATED_LABEL}!=true",
        f"--metric-resolution={RESOLUTION}",
        "--v=1",
    ]


def objects(pki: "Pki", port: int) -> list[dict]:
    """The Service and the APIService that route ``metrics.k8s.io`` to the local metrics-server."""
    ns, name = SERVICE
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
         "spec": {"type": "ExternalName", "externalName": "localhost",
                  "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
         "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                  "versionPriority": 100, "service": {"namespace": ns, "name": name, "port": port},
                  "caBundle": base64.b64encode(pki.ca.cert.read_bytes()).decode()}},
    ]
