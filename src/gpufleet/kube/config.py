"""Where the API server is and how to authenticate: decided here, once, for every gpufleet part.

Order (:func:`load_config`):

1. an explicit kubeconfig (``--kubeconfig``);
2. ``$KUBECONFIG`` (one file, or several joined with ``:`` as kubectl merges them);
3. the in-cluster service account (a pod: token and CA under
   :data:`IN_CLUSTER_DIR`, API server from ``$KUBERNETES_SERVICE_HOST``/
   ``_PORT``), unless a kubeconfig context was asked for;
4. ``~/.kube/config``.

Kubeconfigs are read by the official ``kubernetes`` client's loader: client
certificates and keys (files or ``*-data``), bearer tokens and token files,
and exec credential plugins (``users[].user.exec``, what EKS, GKE and AKS
kubeconfigs use), whose tokens are fetched again before they expire. The
in-cluster token is re-read every minute (bound service-account tokens
rotate, as client-go does).

:data:`API_SERVER_ENV` (``GPUFLEET_API_SERVER``) overrides the in-cluster
API server address, for clusters whose pods cannot reach the
``kubernetes`` Service (no kube-proxy yet, the Cilium ``k8sServiceHost``
case): ``https://10.0.0.1:6443``, ``10.0.0.1:6443`` or ``api.example``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kubernetes.client import Configuration
from kubernetes.config import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader
from kubernetes.config.kube_config import load_kube_config, load_kube_config_from_dict

from .errors import ConfigError

#: Where a pod's service-account token, CA and namespace are mounted.
IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Environment variable overriding the in-cluster API server (``https://host:port``, ``host:port`` or ``host``).
API_SERVER_ENV = "GPUFLEET_API_SERVER"
#: What to tell a user with no configuration at all.
NO_CONFIG_HINT = "give --kubeconfig FILE (for the local cluster: export KUBECONFIG=$(invoke local.kubeconfig))"


@dataclass(frozen=True)
class ClusterConfig:
    """One cluster's configuration, ready for :class:`gpufleet.kube.client.Kube`.

    Attributes:
        configuration: the ``kubernetes.client.Configuration`` (server, TLS, credentials, refresh hook).
        source: where it came from, for messages (``kubeconfig /path``, ``in-cluster service account``).
    """

    configuration: Configuration
    source: str

    @property
    def server(self) -> str:
        """The API server's base URL, e.g. ``https://127.0.0.1:6443``."""
        return str(self.configuration.host)


def _new() -> Configuration:
    # A fresh object, never the library's process-wide default.
    return type.__call__(Configuration)


def from_kubeconfig(path: str | os.PathLike, context: str | None = None, *, label: str = "kubeconfig") -> ClusterConfig:
    """The configuration of ``context`` (default: current-context) in kubeconfig file(s) ``path``.

    Raises:
        ConfigError: the file does not exist, is not a kubeconfig, or names an unknown context/cluster/user.
    """
    text = str(path)
    files = [Path(p).expanduser() for p in text.split(":") if p]
    missing = [str(p) for p in files if not p.is_file()]
    if not files or missing:
        raise ConfigError(f"{label} {', '.join(missing) or text} does not exist")
    cfg = _new()
    try:
        load_kube_config(config_file=":".join(str(p) for p in files), context=context, client_configuration=cfg,
                         persist_config=False)
    except (ConfigException, OSError, TypeError, ValueError, KeyError, AttributeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{label} {text}: {exc}") from None
    return ClusterConfig(cfg, f"{label} {text}")


def from_text(text: str, *, source: str, context: str | None = None) -> ClusterConfig:
    """The configuration in kubeconfig YAML ``text`` (e.g. a Secret's ``kubeconfig`` key) named ``source``.

    Raises:
        ConfigError: not YAML, not a kubeconfig mapping, or an unknown context/cluster/user.
    """
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not YAML: {exc}") from None
    return from_dict(doc, source=source, context=context)


def from_dict(doc: Mapping[str, Any], *, source: str, context: str | None = None) -> ClusterConfig:
    """The configuration in a parsed kubeconfig ``doc``.

    Raises:
        ConfigError: not a kubeconfig mapping, or an unknown context/cluster/user.
    """
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: not a kubeconfig mapping")
    cfg = _new()
    try:
        load_kube_config_from_dict(dict(doc), context=context, client_configuration=cfg, persist_config=False)
    except (ConfigException, OSError, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return ClusterConfig(cfg, source)


def api_server_override(value: str) -> tuple[str, str]:
    """``(host, port)`` from a :data:`API_SERVER_ENV` value.

    Raises:
        ConfigError: not ``https://host[:port]``, ``host:port`` or ``host``.
    """
    raw = value.strip()
    parts = urlsplit(raw if "://" in raw else f"https://{raw}")
    try:
        port = parts.port or 443
    except ValueError:
        port = None
    if parts.scheme != "https" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ConfigError(f"${API_SERVER_ENV} {value!r}: expected https://host[:port], host:port or host "
                          "(the API server's address as pods reach it)")
    return parts.hostname, str(port)


def in_cluster(environ: Mapping[str, str] | None = None, directory: Path | None = None) -> ClusterConfig:
    """The pod's service-account configuration (token re-read every minute).

    Raises:
        ConfigError: no token/CA mounted, or no API server address (neither
            ``$KUBERNETES_SERVICE_HOST`` nor :data:`API_SERVER_ENV`).
    """
    environ = os.environ if environ is None else environ
    directory = directory or IN_CLUSTER_DIR
    env = dict(environ)
    source = "in-cluster service account"
    if environ.get(API_SERVER_ENV):
        env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = api_server_override(environ[API_SERVER_ENV])
        source += f" (API server from ${API_SERVER_ENV})"
    env.setdefault("KUBERNETES_SERVICE_PORT", "443")
    cfg = _new()
    try:
        InClusterConfigLoader(token_filename=str(directory / "token"), cert_filename=str(directory / "ca.crt"),
                              environ=env).load_and_set(cfg)
    except (ConfigException, OSError) as exc:
        raise ConfigError(f"{source} ({directory}): {exc}") from None
    return ClusterConfig(cfg, source)


def load_config(kubeconfig: str | os.PathLike | None = None, context: str | None = None, *,
                environ: Mapping[str, str] | None = None, in_cluster_dir: Path | None = None) -> ClusterConfig:
    """The configuration gpufleet uses (order in the module docstring).

    Args:
        kubeconfig: explicit kubeconfig file (``--kubeconfig``), or None.
        context: kubeconfig context (None: the file's current-context); a
            context means a kubeconfig, so the in-cluster account is skipped.
        environ: environment to read (default ``os.environ``; tests pass their own).
        in_cluster_dir: service-account folder (default :data:`IN_CLUSTER_DIR`).

    Raises:
        ConfigError: the chosen source is unusable (names it), or there is none.
    """
    environ = os.environ if environ is None else environ
    directory = in_cluster_dir or IN_CLUSTER_DIR
    if kubeconfig:
        return from_kubeconfig(kubeconfig, context, label="--kubeconfig")
    if environ.get("KUBECONFIG"):
        return from_kubeconfig(environ["KUBECONFIG"], context, label="$KUBECONFIG")
    pod = environ.get("KUBERNETES_SERVICE_HOST") or environ.get(API_SERVER_ENV)
    if context is None and pod and (directory / "token").is_file():
        return in_cluster(environ, directory)
    home = Path(environ.get("HOME") or Path.home()) / ".kube" / "config"
    if home.is_file():
        return from_kubeconfig(home, context)
    raise ConfigError("no kubeconfig: --kubeconfig not given, $KUBECONFIG unset and ~/.kube/config missing "
                      f"(and no in-cluster service account); {NO_CONFIG_HINT}")
