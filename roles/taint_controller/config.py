"""What ``gpufleet taint-controller`` is configured with, from the inventory: the variable behind each field.

The model, its defaults and its checks are the component's
(:mod:`gpufleet.taint_controller.config`); this declaration is the road from
the inventory (and stack config, which overrides it) to it.
:func:`gpufleet_admin.configs.build` makes the configuration from it; the
role renders that into the controller's ConfigMap ``taint-controller-config``.
"""

from __future__ import annotations

from gpufleet.kube.validation import HIGHEST_USER_PRIORITY
from gpufleet.names import SURGE_PRIORITY_CLASS
from gpufleet.taint_controller.config import Configuration
from gpufleet_admin import configs
from gpufleet_admin.inventory import Inventory
from gpufleet_admin.inventory.errors import InventoryError, Problem

#: Configuration field -> the inventory variable that feeds it (None: no variable, the model's default).
VARIABLES: configs.Variables = {
    "high_water_gpus": "taint_controller_high_water_gpus",
    "low_water_gpus": "taint_controller_low_water_gpus",
    "hold_seconds": "taint_controller_hold_seconds",
    "add_hold_seconds": "taint_controller_add_hold_seconds",
    "remove_hold_seconds": "taint_controller_remove_hold_seconds",
    "signal": "taint_controller_signal",
    "promql": "taint_controller_promql",
    "prometheus_url": "taint_controller_prometheus_url",
    "flip_mode": "taint_controller_flip_mode",
    "surge_max_wait_seconds": "taint_controller_surge_max_wait_seconds",
    "surge_priority_class": "taint_controller_flip_mode",
    "pools": "virtual_kubelet_pools",
    "flip_out_priority_classes": "kueue_priority_classes",
    "flip_back_pods_per_minute": "descheduler_migration_pods_per_minute",
    "flip_out": None,
    "flip_out_max_wait_seconds": None,
    "flip_out_concurrent_syncs": None,
    "flip_back": None,
    "flip_back_max_in_flight": "taint_controller_flip_back_max_in_flight",
    "tick_seconds": None,
}

#: Fields computed from their variable: the pools' names; the highest PriorityClass (training's) is the
#: flip-out's preemptor; the surges' PriorityClass where the role declares it (:func:`surges_run`).
DERIVED: configs.Derived = {
    "pools": lambda inv: tuple(p.name for p in inv.role("virtual_kubelet").virtual_kubelet_pools),
    "flip_out_priority_classes": lambda inv: (configs.highest_priority_class(inv).name,),
    "surge_priority_class": lambda inv: surge_priority_class(inv),
}


def surges_run(inv: Inventory) -> bool:
    """Whether the flip-out starts replacements outside (make before break, where inference runs): the role then
    declares their PriorityClass and their ReplicaSets' RBAC."""
    return (inv.role("taint_controller").taint_controller_flip_mode == "make_before_break"
            and inv.role("inference").inference_enabled)


def surge_priority_class(inv: Inventory) -> str | None:
    """The surges' PriorityClass where they run (:func:`surges_run`), else None (the workload's own).

    Raises:
        gpufleet_admin.inventory.InventoryError: the highest kueue class (training's) is at the API's ceiling
            (:data:`gpufleet.kube.validation.HIGHEST_USER_PRIORITY`): the surge class must be above it, so that
            kube-scheduler places the replacements before the gang they make room for.
    """
    if not surges_run(inv):
        return None
    classes = inv.role("kueue").kueue_priority_classes
    top = max(range(len(classes)), key=lambda i: classes[i].value)
    if classes[top].value >= HIGHEST_USER_PRIORITY:
        raise InventoryError([Problem(
            configs.source_file(inv, "kueue_priority_classes"), f"kueue_priority_classes[{top}].value",
            classes[top].value, f"at most {HIGHEST_USER_PRIORITY - 1} with taint_controller_flip_mode "
            f"make_before_break: {SURGE_PRIORITY_CLASS} is declared one above it, and a PriorityClass may be at "
            f"most {HIGHEST_USER_PRIORITY}")])
    return SURGE_PRIORITY_CLASS


def configuration(inv: Inventory) -> Configuration:
    """The taint controller's configuration for ``inv``.

    Raises:
        gpufleet_admin.inventory.InventoryError: a value the configuration refuses, named by variable.
    """
    return configs.build(inv, Configuration, VARIABLES, DERIVED)
