"""Command lines of etcd and the Kubernetes control plane on loopback.

Kept minimal but real: TLS everywhere the apiserver is involved, client
certificates for authentication, ``--authorization-mode=Node,RBAC``,
service-account tokens signed by the cluster's key. etcd listens on
loopback without TLS (only the apiserver talks to it). The apiserver
advertises 127.0.0.1, which Kubernetes will not publish as the
``kubernetes`` Service endpoint, so the endpoint reconciler is off. The
request-header (front proxy) flags are set so the controllers' delegated
authentication is complete; no aggregated API is registered.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet_admin.training import gang
from gpufleet_admin.training.gang import GangApi
from gpufleet_workshop.local.certs import Pki
from gpufleet_workshop.local.components import component
from gpufleet_workshop.local.kwok import NODE_MONITOR_GRACE
from gpufleet_workshop.local.ports import Ports

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def gang_shape() -> GangApi:
    """The native gang API (KEP-4671) the local control plane serves: the pinned release's most stable shape.

    1.35: ``v1alpha1`` (GenericWorkload, GangScheduling, alpha runtime config);
    1.37: ``v1beta1`` (GenericWorkload on the API server, controller manager
    and scheduler; beta runtime config). Its flags are data of
    :mod:`gpufleet_admin.training.gang`, which also renders the objects.
    """
    return gang.for_release(component("kubernetes").version)


def feature_gates(binary: str) -> list[str]:
    """``--feature-gates=...`` of ``binary`` (``kube-apiserver``, ...) for the gang API; empty when none."""
    gates = gang_shape().feature_gates.get(binary)
    return [f"--feature-gates={gates}"] if gates else []


def etcd_argv(name: str, data_dir: Path, ports: Ports, *, unsafe_no_fsync: bool = True) -> list[str]:
    """etcd, single member, on 127.0.0.1 (client, peer and metrics ports of ``ports``).

    Args:
        name: member name (the cluster name).
        data_dir: etcd data folder.
        unsafe_no_fsync: skip fsync (a throwaway local cluster on a slow disk
            starts and scales much faster; never for real data).
    """
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    argv = [
        str(component("etcd").binary()),
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={name}={peer}",
        "--initial-cluster-state=new",
        f"--listen-metrics-urls=http://127.0.0.1:{ports.etcd_metrics}",
        "--quota-backend-bytes=8589934592",
        "--snapshot-count=10000",
        "--log-level=warn",
    ]
    if unsafe_no_fsync:
        argv.append("--unsafe-no-fsync")
    return argv


def apiserver_argv(pki: Pki, ports: Ports, *, max_inflight: int = 800) -> list[str]:
    """kube-apiserver on ``https://127.0.0.1:<ports.apiserver>``, storing in the local etcd.

    Args:
        max_inflight: ``--max-requests-inflight`` (mutating gets half); raised
            from the default so thousands of simulated nodes are not throttled.
    """
    return [
        str(component("kubernetes").binary("kube-apiserver")),
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
        # The real node's kubelet (logs, exec): reached at its InternalIP, the host's own address.
        f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
        f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        "--enable-priority-and-fairness=true",
        f"--max-requests-inflight={max_inflight}",
        f"--max-mutating-requests-inflight={max_inflight // 2}",
        *feature_gates("kube-apiserver"),
        f"--runtime-config={gang_shape().runtime_config}",
        "--profiling=false",
        "--v=1",
    ]


def _secure_serving(pki: Pki, port: int, kubeconfig: Path) -> list[str]:
    """Flags shared by the controller-manager and the scheduler: HTTPS on loopback, delegated authn/authz."""
    return [
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--client-ca-file={pki.ca.cert}",
    ]


def controller_manager_argv(pki: Pki, ports: Ports, kubeconfig: Path) -> list[str]:
    """kube-controller-manager (all default controllers), serving on ``127.0.0.1:<ports.controller_manager>``.

    Args:
        kubeconfig: its own kubeconfig (``CN=system:kube-controller-manager``).
    """
    return [
        str(component("kubernetes").binary("kube-controller-manager")),
        *_secure_serving(pki, ports.controller_manager, kubeconfig),
        f"--root-ca-file={pki.ca.cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        "--use-service-account-credentials=true",
        # The TTL controller tunes kubelets' secret caching by patching every
        # Node as the fleet grows (thousands of writes); kwok has no kubelet.
        "--controllers=*,-ttl-controller",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--leader-elect=false",
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
        "--kube-api-qps=100",
        "--kube-api-burst=200",
        # A training run of a thousand one-pod Jobs (a JobSet per node) is synced five at a time by default,
        # about ten pods a second here: training would wait on its own pods' creation, not on the flip.
        "--concurrent-job-syncs=25",
        *feature_gates("kube-controller-manager"),
        "--profiling=false",
        "--v=1",
    ]


def scheduler_argv(pki: Pki, ports: Ports, kubeconfig: Path) -> list[str]:
    """kube-scheduler (default profile, with the gang scheduling plugin), serving on ``127.0.0.1:<ports.scheduler>``.

    Args:
        kubeconfig: its own kubeconfig (``CN=system:kube-scheduler``).
    """
    return [
        str(component("kubernetes").binary("kube-scheduler")),
        *_secure_serving(pki, ports.scheduler, kubeconfig),
        "--leader-elect=false",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        *feature_gates("kube-scheduler"),
        "--profiling=false",
        "--v=1",
    ]
