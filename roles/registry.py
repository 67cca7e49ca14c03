"""The role registry: every role gpufleet provisions, declared once, in composition order.

Each :class:`Role` names what the rest of gpufleet needs of a role: its
variables model (``vars.py``), its builders (``manifests.py``: plain objects
and Helm releases, pure functions of the inventory), the type token of the
Pulumi component the stack declares it as, and the roles it waits for. The
layers: ``gpufleet_admin.stack`` and the entry points read this registry; the
roles build on ``gpufleet_admin.manifests``, ``gpufleet_admin.inventory`` and
``gpufleet.fleet``; none of those imports a role.

:func:`load` and :func:`node_specs` are how entry points read an environment:
:func:`gpufleet_admin.inventory.load` validated against every role's variables.
:data:`COMPONENTS` lists the gpufleet commands whose configuration file a
role builds from the inventory. Nothing here imports Pulumi.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel

from gpufleet_admin.inventory import Inventory, NodeSpec, Problem
from gpufleet_admin.inventory import load as load_inventory
from gpufleet_admin import configs
from gpufleet_admin.manifests import HelmRelease, Obj

from gpufleet.goodput import config as goodput_component
from gpufleet.node_health import config as node_health_component
from gpufleet.quota_sync import config as quota_sync_component
from gpufleet.taint_controller import config as taint_controller_component
from gpufleet.virtual_kubelet import config as virtual_kubelet_component
from roles.descheduler import manifests as descheduler, vars as descheduler_vars
from roles.goodput import config as goodput_config, manifests as goodput, vars as goodput_vars
from roles.gpu_metrics import manifests as gpu_metrics, vars as gpu_metrics_vars
from roles.inference import manifests as inference, vars as inference_vars
from roles.kueue import config as kueue_config, manifests as kueue, vars as kueue_vars
from roles.node_health import config as node_health_config, manifests as node_health, vars as node_health_vars
from roles.parallel_fs import manifests as parallel_fs, vars as parallel_fs_vars
from roles.taint_controller import config as taint_controller_config, manifests as taint_controller
from roles.taint_controller import vars as taint_controller_vars
from roles.training import manifests as training, vars as training_vars
from roles.virtual_kubelet import config as virtual_kubelet_config, manifests as virtual_kubelet
from roles.virtual_kubelet import vars as virtual_kubelet_vars


def _no_releases(inv: Inventory) -> list[HelmRelease]:
    """The releases of a role that installs no Helm chart."""
    return []


@dataclass(frozen=True)
class Role:
    """One role: its name, what it validates and builds, its component's type token, what it waits for.

    Attributes:
        name: the role's folder under ``roles/`` and the prefix of its variables (``<name>_*``).
        vars: pydantic model of its variables (defaults: ``roles/<name>/defaults.yaml``).
        objects: ``objects(inv)``: the Kubernetes manifests it declares (Namespaces included).
        releases: ``releases(inv)``: the pinned Helm releases it installs, declared before its objects.
        token: type token of its Pulumi component (``gpufleet:<area>:<Type>``).
        after: roles whose components it is declared after (when they are enabled).
    """

    name: str
    vars: type[BaseModel]
    objects: Callable[[Inventory], list[Obj]]
    token: str
    releases: Callable[[Inventory], list[HelmRelease]] = _no_releases
    after: tuple[str, ...] = ()

    @property
    def component_name(self) -> str:
        """Name of its component in the stack (``gpu_metrics`` -> ``gpu-metrics``)."""
        return self.name.replace("_", "-")


#: What every other role waits for: the kueue release installs Kueue's CRDs and admission webhooks, and the
#: kueue role declares the PriorityClasses the other roles' pods name (inference takes the lowest).
AFTER_KUEUE = ("kueue",)

#: Every role, in the order the stack composes them (what a role waits for comes first).
ROLES: tuple[Role, ...] = (
    # Kueue install and configuration: flavors, queues in one cohort, priorities.
    Role("kueue", kueue_vars.Vars, kueue.objects, releases=kueue.releases, token="gpufleet:scheduling:Kueue"),
    # dcgm-exporter, the fabric exporter, scrape config, alert rules and dashboards.
    Role("gpu_metrics", gpu_metrics_vars.Vars, gpu_metrics.objects, releases=gpu_metrics.releases,
         token="gpufleet:monitoring:GpuMetrics", after=AFTER_KUEUE),
    # The checkpoint filesystem: StorageClass and shared volumes.
    Role("parallel_fs", parallel_fs_vars.Vars, parallel_fs.objects, token="gpufleet:storage:ParallelFs",
         after=AFTER_KUEUE),
    # Defaults that training job templates use.
    Role("training", training_vars.Vars, training.objects, token="gpufleet:workloads:Training", after=AFTER_KUEUE),
    # One virtual kubelet per external capacity pool.
    Role("virtual_kubelet", virtual_kubelet_vars.Vars, virtual_kubelet.objects, token="gpufleet:flip:VirtualKubelet",
         after=AFTER_KUEUE),
    # The taint controller on virtual nodes.
    Role("taint_controller", taint_controller_vars.Vars, taint_controller.objects,
         token="gpufleet:flip:TaintController", after=AFTER_KUEUE),
    # The descheduler and its flip-back policy.
    Role("descheduler", descheduler_vars.Vars, descheduler.objects, releases=descheduler.releases,
         token="gpufleet:scheduling:Descheduler", after=AFTER_KUEUE),
    # The remediation controller.
    Role("node_health", node_health_vars.Vars, node_health.objects, token="gpufleet:health:NodeHealth",
         after=AFTER_KUEUE),
    # Inference Deployments with Service, autoscaling (KEDA ScaledObject, or a CPU HPA) and PodDisruptionBudget.
    Role("inference", inference_vars.Vars, inference.objects, token="gpufleet:workloads:Inference",
         after=AFTER_KUEUE),
    # The goodput accountant, one per team namespace.
    Role("goodput", goodput_vars.Vars, goodput.objects, token="gpufleet:training:Goodput", after=AFTER_KUEUE),
)


def _check(roles: tuple[Role, ...]) -> None:
    """Each role is declared once, and waits only for roles declared before it.

    Raises:
        ValueError: a duplicate name, or an ``after`` naming an unknown or a later role.
    """
    seen: list[str] = []
    for r in roles:
        if r.name in seen:
            raise ValueError(f"roles/registry.py: role {r.name!r} is declared twice")
        later = [d for d in r.after if d not in seen]
        if later:
            raise ValueError(f"roles/registry.py: role {r.name!r} waits for {later[0]!r}: expected a role "
                             f"declared before it (one of {', '.join(seen) or 'none'})")
        seen.append(r.name)


_check(ROLES)

#: Role name -> the model of its variables, in composition order (what the inventory validates).
ROLE_MODELS: Mapping[str, type[BaseModel]] = {r.name: r.vars for r in ROLES}


def _single(inv: Inventory) -> list[str]:
    """The instances of a component that runs one configuration: one, unnamed."""
    return [""]


@dataclass(frozen=True)
class Component:
    """A gpufleet command a role deploys with a configuration file it builds from the inventory.

    Attributes:
        command: the ``gpufleet`` command (``taint-controller``).
        role: the role that deploys it and renders its file.
        model: the component's configuration model (``gpufleet.<component>.config.Configuration``).
        variables: the role's declaration: configuration field -> inventory variable
            (``roles/<role>/config.py`` ``VARIABLES``).
        build: ``build(inv, instance)``: the configuration of one instance.
        dump: the configuration as its file's text; load: the component's own reader of that file.
        instances: ``instances(inv)``: the instances the role runs, each with its own file
            (a virtual kubelet per pool; ``[""]`` for one).
        check: ``check(inv)``: what the configuration refuses of an inventory, where the role says more
            than building each instance's configuration does (None: :meth:`problems` builds them).
    """

    command: str
    role: str
    model: type[BaseModel]
    variables: Mapping[str, str | None]
    build: Callable[[Inventory, str], BaseModel]
    dump: Callable[[Any], str]
    load: Callable[[str], BaseModel]
    check: Callable[[Inventory], list[Problem]] | None = None
    instances: Callable[[Inventory], list[str]] = _single

    def problems(self, inv: Inventory) -> list[Problem]:
        """What the configuration refuses of ``inv`` (an inventory check, run when it is loaded: nothing is
        declared then): ``check``'s, else every instance's refusals, each once."""
        if self.check is not None:
            return self.check(inv)
        out: list[Problem] = []
        for instance in self.instances(inv):
            out += [p for p in configs.check(lambda: self.build(inv, instance)) if p not in out]
        return out


#: Every component that takes a configuration file, with the role that renders it.
COMPONENTS: tuple[Component, ...] = (
    Component("taint-controller", "taint_controller", taint_controller_component.Configuration,
              taint_controller_config.VARIABLES, lambda inv, _: taint_controller_config.configuration(inv),
              taint_controller_component.dump, taint_controller_component.load),
    Component("quota-sync", "kueue", quota_sync_component.Configuration, kueue_config.VARIABLES,
              lambda inv, _: kueue_config.configuration(inv), quota_sync_component.dump, quota_sync_component.load),
    Component("node-health", "node_health", node_health_component.Configuration, node_health_config.VARIABLES,
              lambda inv, _: node_health_config.configuration(inv), node_health_component.dump,
              node_health_component.load),
    Component("virtual-kubelet", "virtual_kubelet", virtual_kubelet_component.Configuration,
              virtual_kubelet_config.VARIABLES, virtual_kubelet_config.configuration, virtual_kubelet_component.dump,
              virtual_kubelet_component.load, check=virtual_kubelet_config.problems, instances=virtual_kubelet_config.pools),
    Component("goodput", "goodput", goodput_component.Configuration, goodput_config.VARIABLES,
              lambda inv, _: goodput_config.configuration(inv), goodput_component.dump, goodput_component.load),
)


def component(command: str) -> Component:
    """The :class:`Component` of ``gpufleet <command>``.

    Raises:
        KeyError: no component of that name takes a configuration file (the message lists those that do).
    """
    for c in COMPONENTS:
        if c.command == command:
            return c
    raise KeyError(f"component {command!r}: expected one of {', '.join(c.command for c in COMPONENTS)}")


def load(
    env: str,
    *,
    overrides: Mapping[str, Any] | None = None,
    overrides_file: str | None = None,
    nodes: int | None = None,
    root: Path | None = None,
) -> Inventory:
    """Load and validate ``inventories/<env>`` (or ``root``) with every role's variables.

    :func:`gpufleet_admin.inventory.load` with :data:`ROLE_MODELS`, and every
    component's configuration built from it as a check (:data:`COMPONENTS`:
    what spans variables is the configuration's to refuse); the arguments are
    passed on as they are (``overrides``: stack-config values, highest
    precedence; ``overrides_file``: their name in messages; ``nodes``: hosts
    of a simulated fleet).

    Raises:
        gpufleet_admin.inventory.InventoryError: listing every problem (file, key, value, expected).
    """
    return load_inventory(env, ROLE_MODELS, overrides=overrides, overrides_file=overrides_file, nodes=nodes,
                          root=root, checks=[c.problems for c in COMPONENTS])


def node_specs(env: str, nodes: int | None = None) -> list[NodeSpec]:
    """The Nodes of ``env`` (``nodes`` sizes a simulated fleet). Raises gpufleet_admin.inventory.InventoryError."""
    return load(env, nodes=nodes).node_specs()
