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
Nothing here imports Pulumi, so gpufleet's image (which has no Pulumi)
loads inventories through it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel

from gpufleet_admin.inventory import Inventory, NodeSpec
from gpufleet_admin.inventory import load as load_inventory
from gpufleet_admin.manifests import HelmRelease, Obj

from roles.descheduler import manifests as descheduler, vars as descheduler_vars
from roles.goodput import manifests as goodput, vars as goodput_vars
from roles.gpu_metrics import manifests as gpu_metrics, vars as gpu_metrics_vars
from roles.inference import manifests as inference, vars as inference_vars
from roles.kueue import manifests as kueue, vars as kueue_vars
from roles.node_health import manifests as node_health, vars as node_health_vars
from roles.parallel_fs import manifests as parallel_fs, vars as parallel_fs_vars
from roles.taint_controller import manifests as taint_controller, vars as taint_controller_vars
from roles.training import manifests as training, vars as training_vars
from roles.virtual_kubelet import manifests as virtual_kubelet, vars as virtual_kubelet_vars


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
    # Inference Deployments with Service, HPA and PodDisruptionBudget.
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


def load(
    env: str,
    *,
    overrides: Mapping[str, Any] | None = None,
    overrides_file: str | None = None,
    nodes: int | None = None,
    root: Path | None = None,
) -> Inventory:
    """Load and validate ``inventories/<env>`` (or ``root``) with every role's variables.

    :func:`gpufleet_admin.inventory.load` with :data:`ROLE_MODELS`; the arguments are
    passed on as they are (``overrides``: stack-config values, highest
    precedence; ``overrides_file``: their name in messages; ``nodes``: hosts
    of a simulated fleet).

    Raises:
        gpufleet_admin.inventory.InventoryError: listing every problem (file, key, value, expected).
    """
    return load_inventory(env, ROLE_MODELS, overrides=overrides, overrides_file=overrides_file, nodes=nodes,
                          root=root)


def node_specs(env: str, nodes: int | None = None) -> list[NodeSpec]:
    """The Nodes of ``env`` (``nodes`` sizes a simulated fleet). Raises gpufleet_admin.inventory.InventoryError."""
    return load(env, nodes=nodes).node_specs()
