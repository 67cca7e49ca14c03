"""Every role's Pulumi ComponentResource.

A role is data (``roles/<role>/defaults.yaml``), a model (``vars.py``) and
pure builders (``manifests.py``: ``objects(inv)`` and optionally
``releases(inv)``), declared in ``roles.registry``; its component, of the
role's type token, only declares what those return. Helm releases go first;
plain objects are declared in two waves (Namespaces and cluster-scoped
definitions, then the rest) so the engine creates them in an order the API
server accepts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.kube.validation import IMMUTABLE_SELECTOR_KINDS, PRIORITY_CLASS_IMMUTABLE
from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import HelmRelease, labels
from roles.registry import Role

#: Kinds declared in the first wave: others may live in or depend on them. Identities, RBAC and
#: configuration come before the workloads that use them: a DaemonSet created before its
#: ServiceAccount gets FailedCreate events until the controller retries.
FIRST_WAVE = {"Namespace", "CustomResourceDefinition", "PriorityClass", "StorageClass", "Topology", "ResourceFlavor",
              "WorkloadPriorityClass", "ClusterQueue", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
              "Role", "RoleBinding", "ConfigMap", "Secret"}


@dataclass(frozen=True)
class RoleArgs:
    """Arguments of every role component: the role, the validated inventory and the provider to use."""

    role: Role
    inventory: Inventory
    provider: pulumi.ProviderResource | None = None


class RoleComponent(pulumi.ComponentResource):
    """Declares one role's Helm releases and objects as children, as a resource of the role's type token.

    The token (``gpufleet:<area>:<Type>``) and builders come from
    ``args.role`` (``roles.registry``). Outputs: ``object_names``
    (``kind/namespace/name`` of each object) and ``release_names``.
    """

    object_names: pulumi.Output[list[str]]
    release_names: pulumi.Output[list[str]]

    def __init__(self, name: str, args: RoleArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(args.role.token, name, None, opts)
        inv = args.inventory
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)
        releases = [self._release(r, child) for r in args.role.releases(inv)]
        # Namespaces are shared between roles; the stack declares them once (see Namespaces).
        objs = [o for o in args.role.objects(inv) if o["kind"] != "Namespace"]
        first = [o for o in objs if o["kind"] in FIRST_WAVE]
        rest = [o for o in objs if o["kind"] not in FIRST_WAVE]
        deps: list[pulumi.Resource] = list(releases)
        if first:
            deps = deps + [declare(o, pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=list(deps))))
                           for o in first]
        for o in rest:
            declare(o, pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=list(deps))))
        self.object_names = pulumi.Output.from_input([object_id(o) for o in objs])
        self.release_names = pulumi.Output.from_input([r._name for r in releases])
        self.register_outputs({"object_names": self.object_names, "release_names": self.release_names})

    def _release(self, r: HelmRelease, opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
        return k8s.helm.v3.Release(
            r.name,
            k8s.helm.v3.ReleaseArgs(
                name=r.name, chart=r.chart, version=r.version, namespace=r.namespace, create_namespace=True,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=r.repo) if r.repo else None,
                values=r.values, atomic=True, timeout=600,
            ),
            opts=opts,
        )


def type_token(obj: dict[str, Any]) -> str:
    """The pulumi-kubernetes type token of a manifest: ``kubernetes:<group/version>:<Kind>``."""
    api_version = obj["apiVersion"]
    return f"kubernetes:{api_version if '/' in api_version else 'core/' + api_version}:{obj['kind']}"


def declare(obj: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Declare one manifest as a pulumi-kubernetes resource (any kind, built-in or custom).

    This is what pulumi-kubernetes' typed classes and ``apiextensions.CustomResource``
    do underneath: a resource of the kind's type token whose inputs are the
    manifest. Going through it directly keeps fields that ``CustomResource``
    would drop (a WorkloadPriorityClass's top-level ``value``).

    A workload of :data:`gpufleet.kube.validation.IMMUTABLE_SELECTOR_KINDS` keeps the selector it was
    created with: the API server refuses a changed one, so the engine would
    replace the object, deleting every pod at once (a serving Deployment's
    replicas all together). A release that declares another selector
    applies to new objects; an existing one takes it only when replaced on
    purpose (``pulumi up --replace <urn>``).

    A PriorityClass whose ``value`` or ``preemptionPolicy``
    (:data:`gpufleet.kube.validation.PRIORITY_CLASS_IMMUTABLE`) changes is replaced, deleted first
    (its name stays): the API server refuses to change either (422), and the
    provider does not know it, so ``pulumi up`` would fail there. Running
    pods keep the priority their admission gave them; a pod created in the
    moment between the delete and the create is refused and its controller
    tries again.
    """
    props = copy.deepcopy(obj)
    immutable = (obj["apiVersion"], obj["kind"]) in IMMUTABLE_SELECTOR_KINDS
    priority_class = (obj["apiVersion"], obj["kind"]) == ("scheduling.k8s.io/v1", "PriorityClass")
    opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
        version=k8s_version(), ignore_changes=["spec.selector"] if immutable else None,
        replace_on_changes=list(PRIORITY_CLASS_IMMUTABLE) if priority_class else None,
        delete_before_replace=priority_class or None))
    return pulumi.CustomResource(type_token(obj), object_id(obj), props, opts)


def k8s_version() -> str:
    """Version of the pulumi-kubernetes SDK (selects the provider plugin)."""
    from pulumi_kubernetes import _utilities

    return _utilities.get_version()


def object_id(obj: dict[str, Any]) -> str:
    """``Kind/namespace/name`` (``Kind/name`` when cluster-scoped): stable and unique per stack."""
    md = obj["metadata"]
    return "/".join(p for p in (obj["kind"], md.get("namespace"), md["name"]) if p)


@dataclass(frozen=True)
class NamespacesArgs:
    """The namespaces every role needs, declared once for all of them."""

    names: tuple[str, ...]
    provider: pulumi.ProviderResource | None = None


class Namespaces(pulumi.ComponentResource):
    """All Namespaces of the stack (roles share some, e.g. ``gpufleet-system``)."""

    names: pulumi.Output[list[str]]

    def __init__(self, name: str, args: NamespacesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:core:Namespaces", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)
        for ns in args.names:
            k8s.core.v1.Namespace(ns, metadata={"name": ns, "labels": labels(ns)}, opts=child)
        self.names = pulumi.Output.from_input(list(args.names))
        self.register_outputs({"names": self.names})
