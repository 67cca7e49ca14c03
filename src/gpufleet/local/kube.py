"""A small Kubernetes REST client for bootstrapping the local cluster.

Bootstrapping (CRDs, webhooks, kwok Stages and Nodes, thousands of them)
needs server-side apply, create, list and delete, fast and from several
threads; ``httpx`` does that with one connection pool and no discovery
round trips for the kinds we know. Unknown kinds are found through API
discovery once and cached.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import httpx

from gpufleet.local.certs import KeyPair

FIELD_MANAGER = "gpufleet-local"
#: Annotation holding the hash of the manifest last applied by :meth:`Kube.apply_changed`.
APPLIED_ANNOTATION = "gpufleet.io/applied-sha256"

# kind -> (api prefix template, plural, namespaced) for what bootstrap touches.
_KNOWN: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "Node"): ("nodes", False),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): ("mutatingwebhookconfigurations", False),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): ("validatingwebhookconfigurations", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("kwok.x-k8s.io/v1alpha1", "Stage"): ("stages", False),
}


class KubeError(RuntimeError):
    """The apiserver answered an error; ``status`` is the HTTP code, the message its reason."""

    def __init__(self, method: str, path: str, status: int, message: str):
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


class Kube:
    """Thread-safe client of one apiserver, authenticating with a client certificate.

    Args:
        server: ``https://127.0.0.1:<port>``.
        ca: CA file verifying the apiserver.
        client: client certificate (the admin one for bootstrap).
        timeout: per-request timeout in seconds.
    """

    def __init__(self, server: str, ca: Path, client: KeyPair, timeout: float = 30.0):
        import ssl

        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.load_cert_chain(str(client.cert), str(client.key))
        self.server = server
        self._http = httpx.Client(
            base_url=server, verify=ctx, timeout=timeout,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
        )
        self._resources: dict[tuple[str, str], tuple[str, bool]] = dict(_KNOWN)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Kube:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ raw

    def request(self, method: str, path: str, *, ok404: bool = False, **kw: Any) -> dict | None:
        """One request; returns the decoded JSON body (None on 404 when ``ok404``).

        Raises:
            KubeError: any other HTTP status >= 400.
        """
        resp = self._http.request(method, path, **kw)
        if resp.status_code == 404 and ok404:
            return None
        if resp.status_code >= 400:
            try:
                msg = resp.json().get("message", resp.text)
            except json.JSONDecodeError:
                msg = resp.text
            raise KubeError(method, path, resp.status_code, msg[:2000])
        return resp.json() if resp.content else {}

    # ------------------------------------------------------------------ paths

    def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """``(plural, namespaced)`` of a kind, from the table or API discovery.

        Raises:
            KubeError: the group/version is not served.
            KeyError: the version is served but has no such kind.
        """
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            found = self.request("GET", base) or {}
            for res in found.get("resources", []):
                if "/" not in res["name"]:
                    self._resources[(api_version, res["kind"])] = (res["name"], bool(res["namespaced"]))
            if key not in self._resources:
                raise KeyError(f"{api_version} serves no kind {kind}")
        return self._resources[key]

    def path(self, api_version: str, kind: str, name: str = "", namespace: str = "") -> str:
        """REST path of a collection (``name=""``) or of one object."""
        plural, namespaced = self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            base += f"/namespaces/{namespace or 'default'}"
        return f"{base}/{plural}" + (f"/{name}" if name else "")

    def path_of(self, obj: dict) -> str:
        """REST path of an object given as a manifest dict."""
        meta = obj.get("metadata", {})
        return self.path(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace", ""))

    # ------------------------------------------------------------------ verbs

    def apply(self, obj: dict, *, subresource: str = "", force: bool = True) -> dict:
        """Server-side apply ``obj`` (field manager ``gpufleet-local``); returns the live object.

        Raises:
            KubeError: the apiserver rejected it (validation, webhook, conflict).
        """
        path = self.path_of(obj) + (f"/{subresource}" if subresource else "")
        params = {"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"}
        return self.request(
            "PATCH", path, params=params, content=json.dumps(obj),
            headers={"Content-Type": "application/apply-patch+yaml"},
        ) or {}

    def apply_changed(self, objs: list[dict], *, workers: int = 4) -> list[dict]:
        """Server-side apply the objects whose content changed since we last applied them.

        Each object is stamped with annotation ``gpufleet.io/applied-sha256``
        (hash of the manifest); objects whose live stamp matches are skipped,
        found through one metadata-only list per kind (big CRDs are not
        downloaded). Cluster-scoped or namespaced kinds alike.

        Returns:
            The live objects the apiserver returned for those applied (the
            skipped ones are not included).

        Raises:
            KubeError: the apiserver rejected an object.
        """
        from concurrent.futures import ThreadPoolExecutor

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
                live[key] = self._stamps(*key)
            if live[key].get((meta.get("namespace", ""), meta["name"])) != digest:
                todo.append(obj)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(self.apply, todo))

    def _stamps(self, api_version: str, kind: str) -> dict[tuple[str, str], str]:
        """``{(namespace, name): applied hash}`` of every object of a kind (metadata only)."""
        body = self.request(
            "GET", self.path(api_version, kind).replace("/namespaces/default/", "/"),
            headers={"Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"},
        ) or {}
        return {
            (i["metadata"].get("namespace", ""), i["metadata"]["name"]): (i["metadata"].get("annotations") or {}).get(APPLIED_ANNOTATION, "")
            for i in body.get("items") or []
        }

    def create(self, obj: dict) -> dict | None:
        """POST ``obj``; returns the created object, or None if it already existed.

        Raises:
            KubeError: any error other than AlreadyExists (409).
        """
        meta = obj.get("metadata", {})
        path = self.path(obj["apiVersion"], obj["kind"], namespace=meta.get("namespace", ""))
        try:
            return self.request("POST", path, params={"fieldManager": FIELD_MANAGER}, json=obj)
        except KubeError as err:
            if err.status == 409:
                return None
            raise

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict | None:
        """One object, or None if it does not exist."""
        return self.request("GET", self.path(api_version, kind, name, namespace), ok404=True)

    def list(self, api_version: str, kind: str, namespace: str = "", **params: str) -> list[dict]:
        """All objects of a kind (``params``: labelSelector, fieldSelector, resourceVersion...)."""
        body = self.request("GET", self.path(api_version, kind, namespace=namespace), params=params) or {}
        return body.get("items") or []

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "") -> bool:
        """Delete one object; False if it did not exist."""
        return self.request("DELETE", self.path(api_version, kind, name, namespace), ok404=True) is not None

    def wait_for(self, what: str, check, timeout: float = 60.0, interval: float = 0.5) -> Any:
        """Call ``check()`` until it returns something truthy; return that.

        Raises:
            TimeoutError: naming ``what`` after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = check()
            except (KubeError, httpx.HTTPError):
                got = None
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)
