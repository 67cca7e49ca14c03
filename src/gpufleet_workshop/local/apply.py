"""Bootstrapping the local cluster fast: apply only what changed, and wait for what the API server must serve.

CRDs, webhooks, kwok Stages and thousands of Nodes are applied at every
``local.up``; most are unchanged. :func:`apply_changed` stamps each object
with the hash of its manifest and skips those whose live stamp matches,
found through one metadata-only list per kind (megabyte CRDs are not
downloaded). The client is :class:`gpufleet.kube.Kube` with the local
field manager (:data:`gpufleet.names.FIELD_MANAGER_LOCAL`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpufleet.kube import Kube, KubeError
from gpufleet.names import APPLIED_ANNOTATION
from gpufleet.wait import poll_until

#: Annotation holding the hash of the manifest last applied by :func:`apply_changed`.
#: Ask for metadata only (PartialObjectMetadataList), falling back to the full list.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"


def _stamps(kube: Kube, api_version: str, kind: str) -> dict[tuple[str, str], str]:
    """``{(namespace, name): applied hash}`` of every object of a kind, all namespaces (metadata only)."""
    plural, _ = kube.resource(api_version, kind)
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    body = kube.request("GET", f"{base}/{plural}", accept=METADATA_ONLY)
    return {
        (i["metadata"].get("namespace", ""), i["metadata"]["name"]):
            (i["metadata"].get("annotations") or {}).get(APPLIED_ANNOTATION, "")
        for i in body.get("items") or []
    }


def apply_changed(kube: Kube, objs: list[dict], *, workers: int = 4) -> list[dict]:
    """Server-side apply the objects whose content changed since they were last applied here.

    Each object is stamped with annotation :data:`APPLIED_ANNOTATION` (the
    hash of the manifest); objects whose live stamp matches are skipped.
    Cluster-scoped or namespaced kinds alike.

    Returns:
        The live objects the API server returned for those applied (the skipped ones are not included).

    Raises:
        KubeError: the API server rejected an object.
    """
    todo = []
    live: dict[tuple[str, str], dict[tuple[str, str], str]] = {}
    for obj in objs:
        obj = json.loads(json.dumps(obj))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("annotations", {}).pop(APPLIED_ANNOTATION, None)
        digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()
        meta["annotations"][APPLIED_ANNOTATION] = digest
        key = (obj["apiVersion"], obj["kind"])
        if key not in live:
            live[key] = _stamps(kube, *key)
        if live[key].get((meta.get("namespace", ""), meta["name"])) != digest:
            todo.append(obj)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(kube.apply, todo))


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5) -> Any:
    """Call ``check()`` until it returns something truthy (API errors count as not yet); return that.

    Raises:
        TimeoutError: naming ``what`` after ``timeout`` seconds.
    """
    return poll_until(check, what=what, timeout=timeout, interval=interval, ignore=(KubeError,))
