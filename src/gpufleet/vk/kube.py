"""A small Kubernetes REST client over httpx: plain dicts in, plain dicts out, and watches.

Why not ``kubernetes.client``: the virtual kubelet keeps every pod bound to
its node in memory and must stay under 256 MiB with 1,000 pods; the generated
client's model objects (and its import) cost several times what JSON dicts
do. The taint controller shares this client for the same reason.

Shapes:

* objects are the API's JSON as ``dict``;
* :meth:`Kube.watch` yields ``(event_type, object)`` with event types
  ``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK`` (``ERROR`` raises
  :class:`Expired` for 410, :class:`KubeError` otherwise).

Credentials (:func:`load_config`): a kubeconfig file (embedded or file
certificates, bearer token or token file; exec plugins are refused with a
clear error) or the in-cluster service account (token re-read every minute,
as client-go does for bound tokens).

Errors: every non-2xx answer raises :class:`KubeError` (``status``,
``reason``, ``message``), with subclasses :class:`NotFound` (404),
:class:`Conflict` (409), :class:`TooManyRequests` (429: PodDisruptionBudget
refusals of the Eviction API) and :class:`Expired` (410); network failures
raise ``httpx.HTTPError``.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: Content types of the three patch flavours the API server accepts (plus server-side apply).
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}


class KubeError(RuntimeError):
    """The API server answered with an error ``status`` (HTTP code), ``reason`` and ``message``."""

    def __init__(self, status: int, reason: str, message: str, *, path: str = ""):
        super().__init__(f"{status} {reason}: {message}" + (f" ({path})" if path else ""))
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    """404: the object (or its kind) does not exist."""


class Conflict(KubeError):
    """409: already exists, or the resourceVersion/UID precondition failed."""


class TooManyRequests(KubeError):
    """429: throttled, or the Eviction API refused because of a PodDisruptionBudget."""


class Expired(KubeError):
    """410: the watch's resourceVersion is too old; list again."""


class ConfigError(ValueError):
    """The kubeconfig is missing, malformed or uses something this client does not support."""


_BY_STATUS = {404: NotFound, 409: Conflict, 429: TooManyRequests, 410: Expired}


def error_from(status: int, body: bytes | str | dict | None, path: str = "") -> KubeError:
    """The :class:`KubeError` subclass for an HTTP ``status`` and a Status object ``body``."""
    reason, message = "", ""
    data: Any = body
    if isinstance(body, (bytes, str)):
        try:
            data = json.loads(body)
        except ValueError:
            data = {"message": body.decode(errors="replace") if isinstance(body, bytes) else body}
    if isinstance(data, dict):
        reason, message = str(data.get("reason", "")), str(data.get("message", ""))
    return _BY_STATUS.get(status, KubeError)(status, reason, message[:2000], path=path)


@dataclass
class KubeConfig:
    """Where the API server is and how to authenticate.

    Attributes:
        server: base URL, e.g. ``https://127.0.0.1:20003``.
        ca_data: PEM of the CA that signs the server certificate (None: system CAs).
        cert_file / key_file: client certificate and key files (PEM), or None.
        token: bearer token, or None.
        token_file: file re-read for the token (in-cluster), or None.
        insecure: skip server certificate verification.
        source: where this came from (for messages).
    """

    server: str
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False
    source: str = ""
    _token_read: float = field(default=0.0, repr=False)

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The TLS context verifying the server (and presenting the client certificate)."""
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cadata=self.ca_data) if self.ca_data else ssl.create_default_context()
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def bearer(self) -> str | None:
        """The current bearer token (a token file is re-read once a minute)."""
        if self.token_file and time.monotonic() - self._token_read > 60:
            self.token = Path(self.token_file).read_text().strip()
            self._token_read = time.monotonic()
        return self.token


def _materialize(data_b64: str | None, path: str | None, base: Path, suffix: str) -> str | None:
    """A file path for a kubeconfig ``*-data`` (written to a private temp file) or ``path`` field."""
    if data_b64:
        fd, name = tempfile.mkstemp(prefix="gpufleet-kube-", suffix=suffix)
        with os.fdopen(fd, "wb") as fh:
            fh.write(base64.b64decode(data_b64))
        return name
    if path:
        p = Path(path)
        return str(p if p.is_absolute() else base / p)
    return None


def config_from_dict(doc: Mapping[str, Any], *, context: str | None = None, base: Path = Path("."),
                     source: str = "kubeconfig") -> KubeConfig:
    """A :class:`KubeConfig` from a parsed kubeconfig document.

    Args:
        doc: the kubeconfig (``clusters``, ``users``, ``contexts``, ``current-context``).
        context: context to use (default: ``current-context``).
        base: folder relative file paths in the kubeconfig are resolved against.
        source: name used in error messages.

    Raises:
        ConfigError: unknown context/cluster/user, no server, or an exec/auth-provider user.
    """
    def named(kind: str, name: str) -> dict:
        for item in doc.get(kind) or []:
            if item.get("name") == name:
                return item.get(kind[:-1]) or {}
        raise ConfigError(f"{source}: no {kind[:-1]} named {name!r}")

    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise ConfigError(f"{source}: no context given and no current-context")
    ctx = named("contexts", ctx_name)
    cluster = named("clusters", ctx.get("cluster", ""))
    user = named("users", ctx.get("user", "")) if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise ConfigError(f"{source}: user {ctx.get('user')!r} uses an exec/auth-provider plugin, which gpufleet "
                          "does not run; use a client certificate or a token")
    server = cluster.get("server")
    if not server:
        raise ConfigError(f"{source}: cluster {ctx.get('cluster')!r} has no server")
    ca_data = None
    if cluster.get("certificate-authority-data"):
        ca_data = base64.b64decode(cluster["certificate-authority-data"]).decode()
    elif cluster.get("certificate-authority"):
        p = Path(cluster["certificate-authority"])
        ca_data = (p if p.is_absolute() else base / p).read_text()
    token_file = user.get("tokenFile")
    return KubeConfig(
        server=server.rstrip("/"),
        ca_data=ca_data,
        cert_file=_materialize(user.get("client-certificate-data"), user.get("client-certificate"), base, ".crt"),
        key_file=_materialize(user.get("client-key-data"), user.get("client-key"), base, ".key"),
        token=user.get("token"),
        token_file=str(base / token_file) if token_file and not Path(token_file).is_absolute() else token_file,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        source=source,
    )


def load_config(kubeconfig: str | os.PathLike | None = None, context: str | None = None) -> KubeConfig:
    """Credentials from ``kubeconfig`` (or ``$KUBECONFIG``, in-cluster, ``~/.kube/config``, in that order).

    Raises:
        ConfigError: nothing usable found, or the file is malformed.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if not path and os.environ.get("KUBERNETES_SERVICE_HOST") and (IN_CLUSTER_DIR / "token").exists():
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        return KubeConfig(server=f"https://{host}:{port}", ca_data=(IN_CLUSTER_DIR / "ca.crt").read_text(),
                          token_file=str(IN_CLUSTER_DIR / "token"), source="in-cluster service account")
    path = Path(path or Path.home() / ".kube" / "config")
    if not path.exists():
        raise ConfigError(f"kubeconfig {path} does not exist (pass --kubeconfig or set KUBECONFIG)")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"kubeconfig {path}: not YAML: {exc}") from None
    return config_from_dict(doc, context=context, base=path.parent, source=str(path))


def config_from_text(text: str, *, source: str, context: str | None = None) -> KubeConfig:
    """A :class:`KubeConfig` from kubeconfig YAML text (e.g. a Secret's ``kubeconfig`` key).

    Raises:
        ConfigError: malformed, or see :func:`config_from_dict`.
    """
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: not a kubeconfig mapping")
    return config_from_dict(doc, context=context, source=source)


def api_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
    """The REST path of a collection or object: ``/api/v1/namespaces/ns/pods/name/status``."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [root]
    if namespace:
        parts.append(f"namespaces/{quote(namespace)}")
    parts.append(plural)
    if name:
        parts.append(quote(name))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


class Kube:
    """A thread-safe REST client for one API server.

    Args:
        config: credentials (:func:`load_config`).
        timeout: seconds per ordinary request.
        max_connections: connection pool size (watches hold one each).
        user_agent: sent as ``User-Agent`` (shows in audit logs).
    """

    def __init__(self, config: KubeConfig, *, timeout: float = 30.0, max_connections: int = 32,
                 user_agent: str = "gpufleet"):
        self.config = config
        self.timeout = timeout
        self._lock = threading.Lock()
        self._client = httpx.Client(
            base_url=config.server, verify=config.ssl_context(), timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            headers={"User-Agent": user_agent, "Accept": "application/json"},
        )

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | os.PathLike | None = None, context: str | None = None,
                        **kwargs: Any) -> "Kube":
        """A client from :func:`load_config` (raises :class:`ConfigError`)."""
        return cls(load_config(kubeconfig, context), **kwargs)

    def close(self) -> None:
        """Close every connection."""
        self._client.close()

    def __enter__(self) -> "Kube":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {}
        token = self.config.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, body: Any = None,
                patch: str | None = None, timeout: float | None = None) -> dict:
        """One API call; returns the decoded JSON answer (``{}`` when empty).

        Args:
            method: GET, POST, PUT, PATCH or DELETE.
            path: REST path (see :func:`api_path`).
            params: query parameters (None values dropped).
            body: JSON-serialisable request body.
            patch: for PATCH, one of :data:`PATCH_TYPES`' keys (default ``merge``).
            timeout: seconds, overriding the client's default.

        Raises:
            KubeError: (or a subclass) on any non-2xx status.
            httpx.HTTPError: network failure.
        """
        ctype = None
        content = None
        if body is not None:
            ctype = PATCH_TYPES[patch or "merge"] if method == "PATCH" else "application/json"
            content = json.dumps(body, separators=(",", ":")).encode()
        query = {k: v for k, v in (params or {}).items() if v is not None}
        resp = self._client.request(method, path, params=query, content=content, headers=self._headers(ctype),
                                    timeout=timeout or self.timeout)
        if resp.status_code >= 300:
            raise error_from(resp.status_code, resp.content, f"{method} {path}")
        return resp.json() if resp.content else {}

    # Convenience verbs -----------------------------------------------------------------------------

    def get(self, api_version: str, plural: str, name: str, namespace: str | None = None,
            subresource: str | None = None) -> dict:
        """GET one object (raises :class:`NotFound`)."""
        return self.request("GET", api_path(api_version, plural, namespace, name, subresource))

    def get_or_none(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> dict | None:
        """GET one object, or None when it does not exist."""
        try:
            return self.get(api_version, plural, name, namespace)
        except NotFound:
            return None

    def list(self, api_version: str, plural: str, namespace: str | None = None, **params: Any) -> dict:
        """LIST a collection; returns the List object (``items``, ``metadata.resourceVersion``)."""
        return self.request("GET", api_path(api_version, plural, namespace), params=params)

    def create(self, api_version: str, plural: str, body: dict, namespace: str | None = None,
               subresource: str | None = None, name: str | None = None) -> dict:
        """POST an object (raises :class:`Conflict` when it exists)."""
        return self.request("POST", api_path(api_version, plural, namespace, name, subresource), body=body)

    def patch(self, api_version: str, plural: str, name: str, body: Any, namespace: str | None = None, *,
              subresource: str | None = None, patch: str = "merge", **params: Any) -> dict:
        """PATCH an object with a ``merge``, ``strategic``, ``json`` or ``apply`` patch."""
        return self.request("PATCH", api_path(api_version, plural, namespace, name, subresource), body=body,
                            patch=patch, params=params)

    def replace(self, api_version: str, plural: str, name: str, body: dict, namespace: str | None = None,
                subresource: str | None = None) -> dict:
        """PUT an object (optimistic concurrency through its ``metadata.resourceVersion``)."""
        return self.request("PUT", api_path(api_version, plural, namespace, name, subresource), body=body)

    def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None, *,
               grace_seconds: int | None = None, uid: str | None = None, propagation: str | None = None) -> dict:
        """DELETE an object, optionally with a grace period, a UID precondition and a propagation policy."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        if propagation:
            body["propagationPolicy"] = propagation
        return self.request("DELETE", api_path(api_version, plural, namespace, name), body=body)

    def evict(self, namespace: str, name: str, *, grace_seconds: int | None = None) -> dict:
        """Evict a pod through the Eviction API (PodDisruptionBudgets apply).

        Raises:
            TooManyRequests: a PodDisruptionBudget does not allow it now.
            NotFound: the pod is gone.
        """
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
        return self.create("v1", "pods", body, namespace, subresource="eviction", name=name)

    # Watches ---------------------------------------------------------------------------------------

    def watch(self, path: str, *, resource_version: str, params: Mapping[str, Any] | None = None,
              timeout_seconds: int = 300) -> Iterator[tuple[str, dict]]:
        """Stream watch events of the collection at ``path`` from ``resource_version``.

        Ends normally when the server closes the watch (after about
        ``timeout_seconds``). Bookmarks are requested and yielded.

        Raises:
            Expired: the resourceVersion is too old (list again).
            KubeError: any other error status or ERROR event.
            httpx.HTTPError: network failure.
        """
        query = {**{k: v for k, v in (params or {}).items() if v is not None},
                 "watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout_seconds)}
        timeout = httpx.Timeout(self.timeout, read=timeout_seconds + 30)
        with self._client.stream("GET", path, params=query, headers=self._headers(), timeout=timeout) as resp:
            if resp.status_code >= 300:
                raise error_from(resp.status_code, resp.read(), f"WATCH {path}")
            for line in resp.iter_lines():
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise error_from(int(obj.get("code") or 500), obj, f"WATCH {path}")
                yield kind, obj


def now_rfc3339() -> str:
    """The current UTC time as the API's RFC 3339 timestamp (seconds precision)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def now_micro() -> str:
    """The current UTC time as a MicroTime (Lease renewTime, Event eventTime)."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (``...Z``, optional fraction), or None."""
    if not value:
        return None
    import calendar

    main, _, frac = value.rstrip("Z").partition(".")
    secs = calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S"))
    return secs + (float("0." + frac) if frac else 0.0)
