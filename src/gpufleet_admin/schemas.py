"""Validate manifests against the schemas of the pinned upstream versions.

Built-in kinds: the OpenAPI v3 documents of the pinned Kubernetes release
(``api/openapi-spec/v3`` in the k8s.io/kubernetes module). Custom kinds: the
CRDs of the pinned Kueue, JobSet, Prometheus operator and Kubeflow training
operator, from their Go modules. Validation is strict, like the API
server's field validation: a field no schema declares is an error (objects
with ``properties`` get ``additionalProperties: false`` unless the schema
preserves unknown fields).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Iterator

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from gpufleet_admin.build.gobuild import module_dir
from gpufleet_admin.versions import pin, versions

#: Components whose CRDs validate custom resources (versions.yaml entries with ``crds``).
CRD_SOURCES = ("kueue", "jobset", "prometheus_operator", "training_operator", "keda")
_K8S_URI = "urn:gpufleet:k8s:"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


class UnknownKind(LookupError):
    """No pinned schema knows this apiVersion/kind."""


def _strict(node: Any) -> Any:
    """Copy of a schema where every object with properties forbids unknown fields."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def kubernetes_releases() -> tuple[str, ...]:
    """Kubernetes releases whose schemas :func:`validate` knows: the pinned one, then ``earlier_releases``.

    The earlier releases (``versions.yaml``: ``kubernetes.earlier_releases``) are
    those gpufleet still renders for (native gang shapes of clusters not yet upgraded).
    """
    earlier = versions()["kubernetes"].get("earlier_releases") or []
    return (pin("kubernetes"), *(str(v) for v in earlier))


@cache
def _kubernetes(release: str | None = None) -> tuple[Registry, dict[tuple[str, str], str]]:
    """Registry of a Kubernetes release's OpenAPI v3 documents (default: the pinned) and an index gvk -> schema URI."""
    release = release or pin("kubernetes")
    spec = module_dir(pin("kubernetes", "module"), release) / "api" / "openapi-spec" / "v3"
    registry = Registry()
    index: dict[tuple[str, str], str] = {}
    for path in sorted(spec.glob("*.json")):
        doc = _strict(json.loads(path.read_text()))
        uri = _K8S_URI + path.name
        registry = registry.with_resource(uri, Resource.from_contents(doc, default_specification=DRAFT202012))
        for name, schema in doc.get("components", {}).get("schemas", {}).items():
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                gv = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                index.setdefault((gv, gvk["kind"]), f"{uri}#/components/schemas/{name}")
    return registry, index


class _CrdLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """SafeLoader that reads a bare ``=`` (YAML 1.1's value tag, found in enum lists) as a string."""


_CrdLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def _crd_files() -> Iterator[dict[str, Any]]:
    for component in CRD_SOURCES:
        pins = versions().get(component)
        if not pins or "crds" not in pins:
            continue
        base = module_dir(pins["module"], pins["version"]) / pins["crds"]
        for path in sorted(base.glob("*.yaml")):
            for doc in yaml.load_all(path.read_text(), Loader=_CrdLoader):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    yield doc


def fetch() -> list[str]:
    """Bring the pinned Go modules validation reads into the Go module cache (Kubernetes' OpenAPI documents,
    the CRDs of :data:`CRD_SOURCES`); a warm cache runs no ``go`` at all. Returns ``module@version`` of each.

    ``make test-fast`` runs it first, so the schema tests find what they read instead of downloading it
    mid-test (about 25 MiB of module zips from the Go module proxy on a fresh machine).

    Raises:
        gpufleet_admin.build.gobuild.GoError: a module cannot be downloaded (no ``go``, no proxy).
    """
    wanted = [(pin("kubernetes", "module"), pin("kubernetes"))]
    wanted += [(p["module"], p["version"]) for c in CRD_SOURCES if (p := versions().get(c)) and "crds" in p]
    for module, version in wanted:
        module_dir(module, version)
    return [f"{m}@{v}" for m, v in wanted]


@cache
def _crds() -> dict[tuple[str, str], dict[str, Any]]:
    """Index (apiVersion, kind) -> openAPIV3Schema of every pinned CRD version."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for crd in _crd_files():
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = version.get("schema", {}).get("openAPIV3Schema")
            if version.get("served") and schema:
                out[(f"{group}/{version['name']}", kind)] = _strict(schema)
    return out


def crd(group: str, kind: str) -> dict[str, Any]:
    """The pinned CustomResourceDefinition of ``kind`` in ``group``, as upstream ships it.

    Raises:
        UnknownKind: no pinned CRD defines it.
        OSError: the pinned module is not in the Go module cache.
    """
    for doc in _crd_files():
        if doc["spec"]["group"] == group and doc["spec"]["names"]["kind"] == kind:
            return doc
    raise UnknownKind(f"{group} {kind}: no CRD pinned for this kind")


def validate(obj: dict[str, Any], kubernetes: str | None = None) -> list[str]:
    """Errors of ``obj`` against its pinned schema, as ``path: message`` strings ([] if valid).

    Args:
        obj: one manifest.
        kubernetes: validate built-in kinds against this release (one of
            :func:`kubernetes_releases`) rather than the pinned one.

    Raises:
        UnknownKind: when no pinned schema (Kubernetes or CRD) has this apiVersion/kind.
        ValueError: ``kubernetes`` is not one of :func:`kubernetes_releases`.
    """
    if kubernetes is not None and kubernetes not in kubernetes_releases():
        raise ValueError(f"kubernetes={kubernetes!r}: expected one of {', '.join(kubernetes_releases())} "
                         "(versions.yaml: kubernetes.version and kubernetes.earlier_releases)")
    registry, index = _kubernetes(kubernetes)
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    if key in index:
        schema: dict[str, Any] = {"$ref": index[key]}
    elif key in _crds():
        schema = dict(_crds()[key])
        props = dict(schema.get("properties", {}))
        # CRD schemas leave metadata open; the API server checks it as ObjectMeta.
        props["metadata"] = {"$ref": _meta_uri(index)}
        schema["properties"] = props
    else:
        where = f"Kubernetes {kubernetes}" if kubernetes else "pinned"
        raise UnknownKind(f"{key[0]} {key[1]}: no {where} schema for this kind")
    validator = Draft202012Validator(schema, registry=registry)
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]


def _meta_uri(index: dict[tuple[str, str], str]) -> str:
    some = next(iter(v for (gv, _), v in index.items() if gv == "v1"))
    return some.split("#")[0] + f"#/components/schemas/{_OBJECT_META}"
