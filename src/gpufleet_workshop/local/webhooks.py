"""Render upstream webhook and CRD manifests for webhook servers on loopback.

Upstream manifests point the apiserver at a Service (``clientConfig.service``)
and leave ``caBundle`` to cert-manager or the controller's own cert rotation.
Locally the servers listen on ``127.0.0.1:<port>``, so each ``clientConfig``
becomes ``url: https://127.0.0.1:<port><path>`` with our CA as ``caBundle``.
Only the small part of kustomize the upstream ``config/`` folders use is
implemented: JSON 6902 ``add``/``replace``/``remove`` patches and
strategic-merge patches of the ``webhooks`` list by name.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable, Iterable
from pathlib import Path

from gpufleet_workshop.local import manifests


def client_config(port: int, path: str, ca_pem: bytes) -> dict:
    """``{"url": "https://127.0.0.1:<port><path>", "caBundle": <base64 CA>}``."""
    return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": base64.b64encode(ca_pem).decode()}


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def json6902(doc: dict, ops: Iterable[dict]) -> dict:
    """Apply JSON-patch operations (``add``, ``replace``, ``remove``) to a copy of ``doc``.

    Raises:
        ValueError: an unsupported operation or a path that does not resolve.
    """
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(idx, op["value"])
            elif kind == "replace":
                parent[idx] = op["value"]
            elif kind == "remove":
                del parent[idx]
            else:
                raise ValueError(f"unsupported JSON patch op {kind!r}")
        else:
            if kind in ("add", "replace"):
                parent[last] = op["value"]
            elif kind == "remove":
                del parent[last]
            else:
                raise ValueError(f"unsupported JSON patch op {kind!r}")
    return doc


def merge_webhooks(doc: dict, patch: dict) -> dict:
    """Strategic-merge a webhook configuration patch: list entries merge by ``name``."""
    doc = copy.deepcopy(doc)
    by_name = {w["name"]: w for w in doc.get("webhooks", [])}
    for w in patch.get("webhooks", []):
        if w["name"] in by_name:
            by_name[w["name"]].update(copy.deepcopy(w))
    return doc


def kustomize_webhooks(folder: Path) -> list[dict]:
    """The Mutating/ValidatingWebhookConfigurations of an upstream ``config/components/webhook``.

    Reads ``kustomization.yaml``'s resources and applies its patches
    (inline or by path; JSON 6902 lists or strategic-merge documents).
    Services are dropped.
    """
    kust = manifests.load_one(folder / "kustomization.yaml")
    docs = []
    for res in kust.get("resources", []):
        docs += manifests.load_all(folder / res)
    docs = [d for d in docs if d.get("kind", "").endswith("WebhookConfiguration")]
    for p in kust.get("patches", []):
        body = manifests.parse(p["patch"])[0] if "patch" in p else manifests.load_one(folder / p["path"])
        target = p.get("target", {})
        for i, d in enumerate(docs):
            if isinstance(body, list):
                if target.get("kind") == d["kind"] and target.get("name", d["metadata"]["name"]) == d["metadata"]["name"]:
                    docs[i] = json6902(d, body)
            elif body.get("kind") == d["kind"] and body["metadata"]["name"] == d["metadata"]["name"]:
                docs[i] = merge_webhooks(d, body)
    return docs


def localize_webhooks(
    docs: Iterable[dict],
    *,
    port: int,
    ca_pem: bytes,
    name_prefix: str,
    keep: Callable[[dict], bool] = lambda w: True,
) -> list[dict]:
    """Point every kept webhook of ``docs`` at ``https://127.0.0.1:<port>`` with our CA.

    Args:
        docs: webhook configuration manifests (not modified).
        port: the webhook server's loopback port.
        ca_pem: PEM of the CA that signed the server's certificate.
        name_prefix: prefix for the configuration names (``"kueue-"``), as the
            upstream kustomize ``namePrefix`` does.
        keep: which webhook entries to keep (e.g. only enabled integrations);
            a configuration left with none is dropped.

    Returns:
        New manifests, ready to apply.
    """
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": name_prefix + doc["metadata"]["name"], "labels": {"app.kubernetes.io/managed-by": "gpufleet-local"}}
        hooks = []
        for w in doc.get("webhooks", []):
            if not keep(w):
                continue
            path = w["clientConfig"].get("service", {}).get("path", "/")
            w["clientConfig"] = client_config(port, path, ca_pem)
            w.setdefault("timeoutSeconds", 10)
            hooks.append(w)
        if hooks:
            doc["webhooks"] = hooks
            out.append(doc)
    return out


def webhook_targets(webhook: dict) -> set[tuple[str, str]]:
    """``{(apiGroup, resource)}`` a webhook entry's rules match (``""`` is the core group)."""
    return {
        (g, r)
        for rule in webhook.get("rules", [])
        for g in rule.get("apiGroups", [])
        for r in rule.get("resources", [])
    }


def localize_crd_conversion(crd: dict, *, port: int, ca_pem: bytes) -> dict:
    """A copy of ``crd`` whose ``spec.conversion`` is a webhook at ``https://127.0.0.1:<port>/convert``."""
    crd = copy.deepcopy(crd)
    crd["spec"]["conversion"] = {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": client_config(port, "/convert", ca_pem),
            "conversionReviewVersions": ["v1"],
        },
    }
    return crd


def load_crds(folder: Path) -> list[dict]:
    """Every CustomResourceDefinition in the YAML files of ``folder`` (sorted by file name)."""
    out = []
    for f in sorted(folder.glob("*.yaml")):
        out += [d for d in manifests.load_all(f) if d.get("kind") == "CustomResourceDefinition"]
    return out
