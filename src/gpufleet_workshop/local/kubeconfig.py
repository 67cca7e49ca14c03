"""Kubeconfig files for the local cluster (admin and per component).

Certificates are embedded (``*-data`` fields) so a kubeconfig can be copied
elsewhere and still work while the cluster runs.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml

from gpufleet_workshop.local.certs import KeyPair


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def render(server: str, ca: Path, client: KeyPair, *, cluster: str, user: str) -> dict:
    """A kubeconfig as a dict: one cluster, one user, one current context named ``cluster``.

    Args:
        server: apiserver URL (``https://127.0.0.1:<port>``).
        ca: CA certificate file verifying the apiserver.
        client: client certificate/key used to authenticate.
        cluster: cluster and context name (``gpufleet-<name>``).
        user: user entry name.
    """
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [
            {"name": user, "user": {"client-certificate-data": _b64(client.cert), "client-key-data": _b64(client.key)}}
        ],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }


def write(path: Path, server: str, ca: Path, client: KeyPair, *, cluster: str, user: str) -> Path:
    """Write :func:`render`'s kubeconfig to ``path`` (mode 0600) and return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(render(server, ca, client, cluster=cluster, user=user), sort_keys=False)
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    path.with_suffix(".tmp").replace(path)
    return path


def local_cluster_of(path: Path) -> str | None:
    """The local cluster a kubeconfig's current context points at (``gpufleet-<name>`` on 127.0.0.1), else None.

    Unreadable or foreign kubeconfigs give None: this only recognises the
    files :func:`write` makes.
    """
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        ctx = next(c["context"] for c in doc.get("contexts") or [] if c.get("name") == doc.get("current-context"))
        cluster = next(c for c in doc.get("clusters") or [] if c.get("name") == ctx.get("cluster"))
    except (OSError, yaml.YAMLError, StopIteration, KeyError, TypeError, AttributeError):
        return None
    server = str((cluster.get("cluster") or {}).get("server", ""))
    name = str(cluster.get("name", ""))
    if name.startswith("gpufleet-") and server.startswith("https://127.0.0.1:"):
        return name.removeprefix("gpufleet-")
    return None
