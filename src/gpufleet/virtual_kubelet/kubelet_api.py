"""The virtual node's kubelet API: ``/metrics/resource`` and ``/stats/summary``, authenticated and authorized as a kubelet's.

Why: the API server's node proxy, metrics-server and ``kubectl top`` reach
a node at its ``status.daemonEndpoints.kubeletEndpoint.Port`` on its
InternalIP. A virtual node that registers port 0 serves nothing, so CPU and
memory of pods outside vanish from the resource metrics API and a CPU HPA
stops with most of its pods outside. This server answers the kubelet's
read-only statistics endpoints from what the provider reports
(:mod:`gpufleet.virtual_kubelet.stats`).

Security, as the kubelet's with webhook authentication and authorization
(``--authentication-token-webhook``, ``--authorization-mode=Webhook``,
anonymous requests refused):

* HTTPS only, with a serving certificate the virtual kubelet makes itself
  at start (self-signed for the node's name and InternalIP, as the kubelet
  does without ``--tls-cert-file``), written under a private folder;
* **authentication**: a client certificate signed by the cluster's client
  CA (``kube-system/extension-apiserver-authentication``, key
  ``client-ca-file``: the API server's own kubelet client, metrics-server
  with a client certificate) gives user = CN, groups = O; otherwise a
  bearer token is checked with a ``TokenReview``; neither: 401;
* **authorization**: a ``SubjectAccessReview`` for the user (its uid and
  extra too) on the node as the kubelet maps paths with fine-grained
  authorization (``/stats/*`` -> ``nodes/stats``, ``/metrics/*`` ->
  ``nodes/metrics``, ``/healthz`` -> ``nodes/healthz`` then ``nodes/proxy``,
  anything else ``nodes/proxy``; GET is ``get``); denied: 403 naming user,
  verb, resource and subresources, the kubelet's message; a review that
  fails: 401 (TokenReview) or 500 (SubjectAccessReview), as the kubelet;
* results are cached as the kubelet caches them (authentication 2 min,
  authorization allowed 5 min, denied 30 s), so a scrape every 15 s costs
  the API server nothing after the first.

The ServiceAccount needs what ``system:auth-delegator`` grants (create
TokenReviews and SubjectAccessReviews) and ``get`` on that one ConfigMap in
``kube-system``: the virtual_kubelet role grants both, nothing more.

Errors: :class:`KubeletApiError` when the serving certificate cannot be
made or the port cannot be bound (at :meth:`KubeletApi.start`).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.kube import Kube, KubeError

from .stats import NodeCpu, PodStats, Rates, resource_metrics, summary

log = logging.getLogger(__name__)

#: The kubelet's port (``--port``): what the node registers as its kubelet endpoint.
DEFAULT_PORT = 10250
#: Where the API server publishes the client CA for delegated authentication.
CLIENT_CA_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
CLIENT_CA_KEY = "client-ca-file"
#: The kubelet's webhook cache lifetimes (KubeletConfiguration defaults), seconds.
AUTHN_TTL, AUTHZ_ALLOWED_TTL, AUTHZ_DENIED_TTL = 120.0, 300.0, 30.0
#: Entries each review cache keeps at most.
CACHE_ENTRIES = 4096
#: The largest request body read (and discarded: GET has none to read); a larger one closes the connection.
MAX_BODY_BYTES = 1 << 20
#: Seconds a connection may take to finish its TLS handshake or send a request (then it is closed).
REQUEST_TIMEOUT_SECONDS = 30.0
#: ``(pods, error)``: the provider's report for the node's pods, and whether it failed (in part).
StatsSource = Callable[[], tuple[list[PodStats], bool]]


class KubeletApiError(RuntimeError):
    """The kubelet API cannot serve (certificate, port)."""


@dataclass(frozen=True)
class User:
    """An authenticated caller: name and groups."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


#: Path prefix -> the ``nodes`` subresources it is authorized as, in the order tried (the kubelet's
#: ``server/auth.go`` with fine-grained authorization, GA in 1.36: the specific one, then ``proxy``).
_SUBRESOURCES = (("/stats", ("stats",)), ("/metrics", ("metrics",)), ("/logs", ("log",)),
                 ("/healthz", ("healthz", "proxy")), ("/pods", ("pods", "proxy")), ("/configz", ("configz", "proxy")))


def subresources_for(path: str) -> tuple[str, ...]:
    """The ``nodes`` subresources a kubelet path is authorized as, in the order tried (any one allows it).

    A prefix matches the path itself or the path below it (``/stats`` and ``/stats/summary``, not
    ``/statsfoo``), as the kubelet's ``isSubpath``; anything else is ``proxy``.
    """
    for prefix, subs in _SUBRESOURCES:
        if path == prefix or path.startswith(prefix + "/"):
            return subs
    return ("proxy",)


def serving_certificate(folder: Path, node_name: str, ip: str) -> tuple[Path, Path]:
    """Write a self-signed serving certificate (ECDSA P-256, one year) for ``node_name`` and ``ip`` into ``folder``.

    Returns ``(cert, key)`` paths (the key readable by the owner only).

    Raises:
        KubeletApiError: the folder cannot be written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{node_name}@{int(time.time())}")])
    sans: list[x509.GeneralName] = [x509.DNSName(node_name)]
    try:
        sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
    except ValueError:
        pass
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        cert_path, key_path = folder / "kubelet.crt", folder / "kubelet.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    except OSError as exc:
        raise KubeletApiError(f"kubelet API: cannot write its serving certificate in {folder}: {exc}") from None
    return cert_path, key_path


class _Cache:
    """A small TTL cache (key -> (value, expiry)); thread-safe; at most :data:`CACHE_ENTRIES` entries, the least
    recently written dropped first (a flood of distinct bad tokens costs a constant, not a growing, price)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self._items: OrderedDict[str, tuple[object, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> object | None:
        with self._lock:
            hit = self._items.get(key)
            return hit[0] if hit is not None and hit[1] > self.clock() else None

    def put(self, key: str, value: object, ttl: float) -> None:
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = (value, self.clock() + ttl)
            while len(self._items) > CACHE_ENTRIES:
                self._items.popitem(last=False)


def _strings(value: object) -> tuple[str, ...] | None:
    """``value`` as a tuple of strings (None or missing: empty), None when it is not a list of strings."""
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _authenticated(review: object) -> User | None:
    """The user a TokenReview answer authenticates, None unless it says ``authenticated: true`` with a user
    whose name is a string and whose groups and extra are lists of strings (anything else is not believed)."""
    status = review.get("status") if isinstance(review, dict) else None
    if not isinstance(status, dict) or status.get("authenticated") is not True:
        return None
    info = status.get("user")
    if not isinstance(info, dict) or not isinstance(info.get("username"), str) or not info["username"]:
        return None
    groups, raw_extra = _strings(info.get("groups")), info.get("extra") or {}
    if groups is None or not isinstance(raw_extra, dict):
        return None
    extra = []
    for k, v in sorted(raw_extra.items()):
        values = _strings(v)
        if values is None:
            return None
        extra.append((k, values))
    uid = info.get("uid") if isinstance(info.get("uid"), str) else ""
    return User(info["username"], groups, uid, tuple(extra))


class Authorizer:
    """Authentication (client certificate or TokenReview) and authorization (SubjectAccessReview) of a request.

    Args:
        kube: the virtual kubelet's client (its ServiceAccount creates the reviews).
        node_name: the node the requests are about.
    """

    def __init__(self, kube: Kube, node_name: str, clock: Callable[[], float] = time.monotonic):
        self.kube, self.node_name = kube, node_name
        self._authn, self._authz = _Cache(clock), _Cache(clock)

    @staticmethod
    def from_certificate(peer: dict | None) -> User | None:
        """The user a verified client certificate names (``ssl.SSLSocket.getpeercert()``): CN, groups = O."""
        if not peer:
            return None
        cn, groups = None, []
        for rdn in peer.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
                elif key == "organizationName":
                    groups.append(value)
        return User(cn, tuple(groups)) if cn else None

    def from_token(self, token: str) -> User | None:
        """The user a bearer token belongs to (TokenReview; cached), None when it is not valid.

        Raises:
            KubeError: the review could not be made (the caller answers 500, nothing cached).
        """
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._authn.get(key)
        if hit is not None:
            return hit or None  # type: ignore[return-value]
        review = self.kube.create("authentication.k8s.io/v1", "tokenreviews", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        user = _authenticated(review)
        self._authn.put(key, user or False, AUTHN_TTL)
        return user

    def allowed(self, user: User, verb: str, subresource: str) -> bool:
        """Whether ``user`` may ``verb`` ``nodes/<subresource>`` of this node (SubjectAccessReview; cached).

        Raises:
            KubeError: the review could not be made (nothing cached).
        """
        key = json.dumps([user.name, sorted(user.groups), user.uid, user.extra, verb, subresource])
        hit = self._authz.get(key)
        if hit is not None:
            return bool(hit)
        spec: dict = {"user": user.name, "groups": list(user.groups),
                      "resourceAttributes": {"verb": verb, "version": "v1", "resource": "nodes",
                                             "subresource": subresource, "name": self.node_name}}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = self.kube.create("authorization.k8s.io/v1", "subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
        status = review.get("status") if isinstance(review, dict) else None
        # Allowed only when the answer says so in its own types, and does not also deny (apiserver's webhook).
        ok = isinstance(status, dict) and status.get("allowed") is True and status.get("denied") is not True
        self._authz.put(key, ok, AUTHZ_ALLOWED_TTL if ok else AUTHZ_DENIED_TTL)
        return ok


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header as the kubelet's parser reads it (split on single
    spaces: ``Bearer  x`` has an empty token, ``Bearer a b`` the token ``a``), None when there is none."""
    parts = header.split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def _handler(api: "KubeletApi") -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A caller that connects and says nothing (or stops mid-handshake) frees its thread after this many seconds.
        timeout = REQUEST_TIMEOUT_SECONDS
        server_version, sys_version = "gpufleet-virtual-kubelet", ""

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _discard_body(self) -> bool:
            """Read and drop a request body (none is used), so that it is never read as the next request on the
            connection; False, with the connection closed, for a chunked, unreadable or oversized one."""
            length = self.headers.get("Content-Length")
            if self.headers.get("Transfer-Encoding") or (length is not None and not length.strip().isdigit()):
                self.close_connection = True
                self._reply(400, b"Bad Request")
                return False
            if length is not None and int(length) > MAX_BODY_BYTES:
                self.close_connection = True
                self._reply(413, b"Request Entity Too Large")
                return False
            if length:
                self.rfile.read(int(length))
            return True

        def _user(self, path: str) -> User | None:
            user = Authorizer.from_certificate(self.connection.getpeercert())
            token = None if user is not None else bearer_token(self.headers.get("Authorization") or "")
            if token is not None:
                try:
                    user = api.authorizer.from_token(token)
                except KubeError as exc:  # the kubelet answers an authentication that failed with 401
                    log.warning("kubelet API: %s %s: TokenReview failed: %s", self.command, path, exc)
            return user

        def _serve(self) -> None:
            if api.stopped:
                self.close_connection = True
                self._reply(503, b"Service Unavailable")
                return
            if not self._discard_body():
                return
            path = urlsplit(self.path).path
            user = self._user(path)
            if user is None:
                self._reply(401, b"Unauthorized")
                return
            if self.command != "GET":
                self._reply(405, b"Method Not Allowed")
                return
            subs = subresources_for(path)
            # The kubelet's messages (server/auth.go): subresources as Go prints a []string.
            what = f"user={user.name}, verb=get, resource=nodes, subresource(s)=[{' '.join(subs)}]"
            try:
                allowed = any(api.authorizer.allowed(user, "get", sub) for sub in subs)
            except KubeError as exc:
                log.warning("kubelet API: GET %s: SubjectAccessReview failed: %s", path, exc)
                self._reply(500, f"Authorization error ({what})".encode())
                return
            if not allowed:
                self._reply(403, f"Forbidden ({what})\n".encode())
                return
            if path == "/metrics/resource":
                pods, error = api.stats()
                self._reply(200, resource_metrics(pods, api.node_cpu.observe(pods, time.time()), error=error),
                            "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/stats/summary":
                pods, _ = api.stats()
                node = api.node_cpu.observe(pods, time.time())
                self._reply(200, json.dumps(summary(api.node_name, api.started, pods, node, api.rates)).encode(),
                            "application/json")
            elif path == "/healthz":
                self._reply(200, b"ok")
            else:
                self._reply(404, b"404 page not found")

        def _guarded(self) -> None:
            try:
                self._serve()
            except Exception:  # a provider or a review that answers what it should not: 500, said in the log
                log.exception("kubelet API: %s %s failed", self.command, self.path)
                self.close_connection = True
                try:
                    self._reply(500, b"Internal Server Error")
                except OSError:
                    pass

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _guarded  # noqa: N815 - the library's names

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - one line per scrape is noise
            return

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    address_family = socket.AF_INET

    def handle_error(self, request, client_address) -> None:
        # A failed TLS handshake (no or a foreign client certificate, a port scan) is the caller's problem:
        # one debug line, not the standard library's traceback on stderr.
        log.debug("kubelet API: connection from %s failed", client_address[0], exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class KubeletApi:
    """The HTTPS server (module docstring) for virtual node ``node_name`` on ``host_ip:port``.

    Args:
        stats: the provider's report for the node's pods (:data:`StatsSource`).
        port: the port (0: any free one; :attr:`port` says which once started).
        host_ip: where to listen and what the certificate names: the node's InternalIP (the pod's IP).
        cert_dir: where the serving certificate is written (default: a new private temporary folder).
    """

    def __init__(self, kube: Kube, node_name: str, stats: StatsSource, *,
                 port: int = DEFAULT_PORT, host_ip: str = "127.0.0.1", cert_dir: Path | None = None):
        self.kube, self.node_name, self.stats = kube, node_name, stats
        self.port, self.host_ip = port, host_ip
        self.cert_dir = cert_dir
        self.authorizer = Authorizer(kube, node_name)
        self.rates = Rates()
        self.node_cpu = NodeCpu()
        self.started = time.time()
        self._server: _Server | None = None
        self.stopped = False
        self._thread: threading.Thread | None = None

    def client_ca(self) -> str | None:
        """The cluster's client CA bundle (PEM), None when it cannot be read (certificates are then refused)."""
        ns, name = CLIENT_CA_CONFIGMAP
        try:
            cm = self.kube.get("v1", "configmaps", name, ns)
        except KubeError as exc:
            log.warning("kubelet API: %s/%s: %s; client certificates are not accepted, bearer tokens are", ns, name,
                        exc)
            return None
        ca = (cm.get("data") or {}).get(CLIENT_CA_KEY)
        if not ca or not isinstance(ca, str):
            log.warning("kubelet API: %s/%s has no %s; client certificates are not accepted, bearer tokens are",
                        ns, name, CLIENT_CA_KEY)
            return None
        return ca

    def start(self) -> "KubeletApi":
        """Make the certificate, bind, serve in a thread.

        Raises:
            KubeletApiError: the certificate could not be made or the port bound.
        """
        folder = self.cert_dir or Path(tempfile.mkdtemp(prefix="gpufleet-kubelet-"))
        cert, key = serving_certificate(folder, self.node_name, self.host_ip)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert, key)
        ca = self.client_ca()
        if ca:
            try:
                ctx.load_verify_locations(cadata=ca)
                ctx.verify_mode = ssl.CERT_OPTIONAL
            except (ssl.SSLError, ValueError) as exc:
                ns, name = CLIENT_CA_CONFIGMAP
                log.warning("kubelet API: %s/%s key %s is not a PEM CA bundle (%s); client certificates are not "
                            "accepted, bearer tokens are", ns, name, CLIENT_CA_KEY, exc)
        server_class = _Server6 if ":" in self.host_ip else _Server
        try:
            server = server_class((self.host_ip, self.port), _handler(self), bind_and_activate=True)
        except OSError as exc:
            raise KubeletApiError(f"kubelet API: cannot listen on {self.host_ip}:{self.port}: {exc}") from None
        server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="kubelet-api", daemon=True)
        self._thread.start()
        log.info("kubelet API of %s on https://%s:%d", self.node_name, self.host_ip, self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket; a connection still open gets 503 and is closed at its next request."""
        self.stopped = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
