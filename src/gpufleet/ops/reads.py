"""What ops, quota sync and node health read of the cluster, and the errors tasks turn into exits.

The client is :class:`gpufleet.kube.Kube` (plain dicts); this module adds
the node-level reads the operations share and the ops errors. Writes that
replace lists (taints, ClusterQueue resource groups) go through
:func:`gpufleet.kube.retry.update_with_retry` (resourceVersion
precondition, re-read on 409).
"""

from __future__ import annotations

from typing import Any

from gpufleet.fleet import nodes as nodeutil
from gpufleet.kube import Conflict, Forbidden, Kube, NotFound, api_path

Obj = dict[str, Any]


class OpsError(RuntimeError):
    """An operation cannot proceed; the message says why and what to do. Tasks exit 1 with it."""


class InputError(OpsError):
    """The command's input is wrong (unknown node, unreadable kubeconfig); tasks exit 2 with it."""


class NodeNotFound(InputError, LookupError):
    """No Node by that name; the message names it and lists near matches."""

    def __init__(self, node: str, candidates: list[str]):
        self.node = node
        self.candidates = candidates
        near = nodeutil.near_matches(node, candidates)
        hint = f"; near matches: {', '.join(near)}" if near else f"; the cluster has {len(candidates)} nodes"
        super().__init__(f"node {node!r} not found{hint}")


def list_nodes(kube: Kube, label_selector: str | None = None) -> list[Obj]:
    """Every Node (dicts), paged."""
    return kube.list_all(api_path("v1", "nodes"), label_selector=label_selector)[0]


def get_node(kube: Kube, node: str) -> Obj:
    """Node ``node`` as a dict.

    Raises:
        NodeNotFound: no such node; the message lists near matches.
    """
    try:
        return kube.get("v1", "nodes", node)
    except NotFound:
        raise NodeNotFound(node, [nodeutil.name(n) for n in list_nodes(kube)]) from None


def pods_on_node(kube: Kube, node: str) -> list[Obj]:
    """Every pod bound to ``node`` (field selector ``spec.nodeName``), all namespaces."""
    return kube.list_all(api_path("v1", "pods"), field_selector=f"spec.nodeName={node}")[0]


def ensure_namespace(kube: Kube, namespace: str) -> None:
    """Create ``namespace`` if it does not exist (roles declare it; this covers a fresh local cluster).

    Raises:
        OpsError: it does not exist and RBAC does not allow creating it.
    """
    if kube.get_or_none("v1", "namespaces", namespace) is not None:
        return
    try:
        kube.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except Forbidden:
        raise OpsError(f"namespace {namespace} does not exist and may not be created here: "
                       "`pulumi up` declares it (node_health / kueue roles)") from None
    except Conflict:
        pass


def list_gpus(kube: Kube, node: str | None = None) -> dict[str, list[Any]]:
    """The GPUs allocated through DRA, per node, with their taints (:func:`gpufleet.fleet.devices.gpus_by_node`).

    Reads the ResourceSlices of NVIDIA's driver (``gpu.nvidia.com``; of ``node`` only when given)
    and every DeviceTaintRule. A cluster that does not serve ``resource.k8s.io/v1`` (older
    than 1.34) has none: ``{}``.
    """
    from gpufleet.fleet.devices import gpus_by_node
    from gpufleet.names import GPU_DRIVER, RESOURCE_API

    selector = f"spec.driver={GPU_DRIVER}" + (f",spec.nodeName={node}" if node else "")
    try:
        slices = kube.list_all(api_path(RESOURCE_API, "resourceslices"), field_selector=selector)[0]
        rules = kube.list_all(api_path(RESOURCE_API, "devicetaintrules"))[0] if slices else []
    except NotFound:
        return {}
    return gpus_by_node(slices, rules)
