"""The local cluster's PKI, generated with ``cryptography``.

One CA signs everything: the kube-apiserver serving certificate, one
loopback serving certificate shared by the add-on servers (webhooks,
metrics, health endpoints of Kueue, JobSet, kube-controller-manager,
kube-scheduler, descheduler), and client certificates (admin in
``system:masters``; kube-controller-manager and kube-scheduler under their
own names, which Kubernetes' default RBAC binds). A separate RSA key pair
signs service-account tokens; a second CA backs request-header (front
proxy) authentication, so delegated authentication in the controllers
finds a complete ``extension-apiserver-authentication`` ConfigMap.

Files are PEM, written with mode 0600 for keys, and generated only when
missing, so a restarted cluster keeps its identity (and clients their
trust). Validity: 10 years for the CA, 1 year for leaf certificates.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet_workshop.local import metrics_server

#: Names the apiserver is reached by, in and out of the cluster.
APISERVER_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
#: First address of the service range (the ``kubernetes`` Service).
APISERVER_SERVICE_IP = "10.96.0.1"


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key on disk (PEM)."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every credential file of one local cluster.

    Attributes:
        ca: the cluster CA (signs all certificates below; ``ca.cert`` is the
            trust anchor and the webhooks' ``caBundle``).
        apiserver: kube-apiserver serving certificate.
        serving: loopback serving certificate for add-on servers.
        webhook_dir: folder holding ``tls.crt``/``tls.key`` (copy of ``serving``),
            the layout controller-runtime webhook servers expect.
        admin: client certificate, ``O=system:masters``.
        controller_manager: client certificate ``CN=system:kube-controller-manager``.
        scheduler: client certificate ``CN=system:kube-scheduler``.
        sa_key: service-account signing key (RSA, PEM PKCS#8).
        sa_pub: its public key (PEM).
        front_proxy_ca: CA of the apiserver's request-header (front proxy)
            authentication, which controllers' delegated authn reads.
        front_proxy_client: client certificate ``CN=front-proxy-client``.
        apiserver_kubelet_client: the apiserver's client certificate towards
            kubelets (logs, exec), ``O=system:masters``.
        metrics_server: metrics-server's serving certificate, for the name the aggregator checks
            (:data:`gpufleet_workshop.local.metrics_server.SERVING_NAMES`) and ``127.0.0.1``.
        kubelet: the real node's client certificate, ``CN=system:node:<node>``,
            ``O=system:nodes`` (what the Node authorizer expects), made by
            :func:`ensure_node_client`.
    """

    ca: KeyPair
    apiserver: KeyPair
    serving: KeyPair
    webhook_dir: Path
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    sa_key: Path
    sa_pub: Path
    front_proxy_ca: KeyPair
    front_proxy_client: KeyPair
    apiserver_kubelet_client: KeyPair
    metrics_server: KeyPair
    kubelet: KeyPair


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _write_key(path: Path, key) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _load_key(path: Path):
    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def _new_ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _ensure_ca(pair: KeyPair, common_name: str) -> None:
    if pair.cert.exists() and pair.key.exists():
        return
    key = _new_ec_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(pair.key, key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ensure_leaf(
    pair: KeyPair,
    ca: KeyPair,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> None:
    if pair.cert.exists() and pair.key.exists():
        return
    ca_key = _load_key(ca.key)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = _new_ec_key()
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=False, key_cert_sign=False, crl_sign=False,
                content_commitment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
    )
    if dns or ips:
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(pair.key, key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ensure_sa_keys(key_path: Path, pub_path: Path) -> None:
    if key_path.exists() and pub_path.exists():
        return
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(key_path, key)
    pub_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def ensure_node_client(pki: Pki, node: str) -> KeyPair:
    """The kubelet's client certificate for Node ``node`` (made when missing or named for another node)."""
    if pki.kubelet.cert.exists():
        cert = x509.load_pem_x509_certificate(pki.kubelet.cert.read_bytes())
        if cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value != f"system:node:{node}":
            pki.kubelet.cert.unlink()
    _ensure_leaf(pki.kubelet, pki.ca, f"system:node:{node}", organizations=("system:nodes",), client=True)
    return pki.kubelet


def ensure_keda(pki: Pki, folder: Path, dns: tuple[str, ...], ips: tuple[str, ...]) -> Path:
    """KEDA's certificate folder ``folder``: ``ca.crt``, ``tls.crt``, ``tls.key``, the layout its operator and
    metrics adapter read from ``--cert-dir`` (one pair for both ends of their gRPC link, mutual TLS, and the
    adapter's API serving), for names ``dns`` and addresses ``ips``; issued anew when an address is missing.
    Returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(folder / "tls.crt", folder / "tls.key")
    if pair.cert.exists() and not _has_ips(pair.cert, ips):
        pair.cert.unlink()
    _ensure_leaf(pair, pki.ca, "keda", dns=dns, ips=ips, server=True, client=True)
    ca = folder / "ca.crt"
    if not ca.exists() or ca.read_bytes() != pki.ca.cert.read_bytes():
        ca.write_bytes(pki.ca.cert.read_bytes())
    return folder


def _has_ips(cert_file: Path, ips: tuple[str, ...]) -> bool:
    """True when the certificate's SubjectAlternativeName lists every address of ``ips``."""
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return not ips
    have = {str(a) for a in sans.get_values_for_type(x509.IPAddress)}
    return set(ips) <= have


def ensure_pki(folder: Path, apiserver_ips: tuple[str, ...] = ()) -> Pki:
    """Create (only what is missing of) the cluster's PKI under ``folder``.

    Args:
        folder: the cluster's ``certs`` folder; created if missing.
        apiserver_ips: further addresses the apiserver is reached at (the
            real node's pod-network gateway); its certificate is issued anew
            (same CA, so every client keeps trusting it) when one is missing.

    Returns:
        The :class:`Pki` with every path filled in.

    Raises:
        ValueError: an existing key file cannot be parsed (delete the folder
            to regenerate).
    """
    folder.mkdir(parents=True, exist_ok=True)

    def pair(stem: str) -> KeyPair:
        return KeyPair(folder / f"{stem}.crt", folder / f"{stem}.key")

    pki = Pki(
        ca=pair("ca"),
        apiserver=pair("apiserver"),
        serving=pair("serving"),
        webhook_dir=folder / "webhook",
        admin=pair("admin"),
        controller_manager=pair("kube-controller-manager"),
        scheduler=pair("kube-scheduler"),
        sa_key=folder / "sa.key",
        sa_pub=folder / "sa.pub",
        front_proxy_ca=pair("front-proxy-ca"),
        front_proxy_client=pair("front-proxy-client"),
        apiserver_kubelet_client=pair("apiserver-kubelet-client"),
        metrics_server=pair("metrics-server"),
        kubelet=pair("kubelet"),
    )
    _ensure_ca(pki.ca, "gpufleet-local-ca")
    ips = ("127.0.0.1", APISERVER_SERVICE_IP, *apiserver_ips)
    if pki.apiserver.cert.exists() and not _has_ips(pki.apiserver.cert, ips):
        pki.apiserver.cert.unlink()  # kube-apiserver reloads its serving certificate when the file changes
    _ensure_leaf(pki.apiserver, pki.ca, "kube-apiserver", dns=APISERVER_NAMES, ips=ips, server=True)
    _ensure_leaf(pki.serving, pki.ca, "gpufleet-local-loopback", dns=("localhost",), ips=("127.0.0.1",), server=True)
    _ensure_leaf(pki.admin, pki.ca, "gpufleet-admin", organizations=("system:masters",), client=True)
    _ensure_leaf(pki.controller_manager, pki.ca, "system:kube-controller-manager", client=True)
    _ensure_leaf(pki.scheduler, pki.ca, "system:kube-scheduler", client=True)
    _ensure_sa_keys(pki.sa_key, pki.sa_pub)
    _ensure_ca(pki.front_proxy_ca, "gpufleet-local-front-proxy-ca")
    _ensure_leaf(pki.front_proxy_client, pki.front_proxy_ca, "front-proxy-client", client=True)
    _ensure_leaf(pki.apiserver_kubelet_client, pki.ca, "kube-apiserver-kubelet-client",
                 organizations=("system:masters",), client=True)
    _ensure_leaf(pki.metrics_server, pki.ca, "metrics-server", dns=metrics_server.SERVING_NAMES, ips=("127.0.0.1",), server=True)
    pki.webhook_dir.mkdir(exist_ok=True)
    for src, name in ((pki.serving.cert, "tls.crt"), (pki.serving.key, "tls.key")):
        dst = pki.webhook_dir / name
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            dst.write_bytes(src.read_bytes())
            dst.chmod(0o600 if name.endswith(".key") else 0o644)
    return pki
