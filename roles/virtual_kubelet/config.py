"""What each ``gpufleet virtual-kubelet`` is configured with, from the inventory: the variable behind each field.

One configuration per pool of ``virtual_kubelet_pools``. The model, its
defaults and its checks are the component's
(:mod:`gpufleet.virtual_kubelet.config`); this declaration is the road from
the inventory (and stack config, which overrides it) to it.
:func:`gpufleet_admin.configs.build` makes each configuration from it; the
role renders it into ConfigMap ``vk-<pool>-config``.
"""

from __future__ import annotations

from gpufleet.virtual_kubelet.config import FREE_GPUS, Configuration, HealthSettings
from gpufleet_admin import configs
from gpufleet_admin.inventory import Inventory, Problem

#: Configuration field -> the inventory variable that feeds it (None: no variable, the model's default).
VARIABLES: configs.Variables = {
    "pool": "virtual_kubelet_pools",
    "namespace": "virtual_kubelet_namespace",
    "endpoint_health.interval_seconds": "virtual_kubelet_endpoint_health_interval_seconds",
    "endpoint_health.timeout_seconds": "virtual_kubelet_endpoint_health_timeout_seconds",
    "endpoint_health.unhealthy_threshold": "virtual_kubelet_endpoint_health_unhealthy_threshold",
    "register_with_taints": "taint_controller_enabled",
    "kubelet_port": "virtual_kubelet_kubelet_port",
}


def derived(pool: str) -> configs.Derived:
    """Fields computed from the inventory for pool ``pool``: that pool of the list; the node registers closed
    (with the free-GPU taint) where a taint controller runs to open it, open where none does."""
    return {
        "pool": lambda inv: next(p.pool() for p in inv.role("virtual_kubelet").virtual_kubelet_pools if p.name == pool),
        "register_with_taints": lambda inv: (FREE_GPUS,) if inv.enabled("taint_controller") else (),
    }


def pools(inv: Inventory) -> list[str]:
    """The pools of ``inv``: one virtual kubelet, and one configuration, each."""
    return [p.name for p in inv.role("virtual_kubelet").virtual_kubelet_pools]


def configuration(inv: Inventory, pool: str) -> Configuration:
    """The configuration of pool ``pool``'s virtual kubelet.

    Raises:
        KeyError: ``pool`` is not a pool of ``inv`` (the message lists them).
        gpufleet_admin.inventory.InventoryError: a value the configuration refuses, named by variable.
    """
    if pool not in pools(inv):
        raise KeyError(f"pool {pool!r}: not a pool of inventories/{inv.env} virtual_kubelet_pools "
                       f"({', '.join(pools(inv)) or 'none'})")
    return configs.build(inv, Configuration, VARIABLES, derived(pool))


def problems(inv: Inventory) -> list[Problem]:
    """What the configuration refuses of ``inv``, every pool's (an inventory check: nothing is declared then)."""
    # The endpoint health check's variables are checked with or without pools.
    health = {k.split(".", 1)[1]: v for k, v in VARIABLES.items() if k.startswith("endpoint_health.")}
    out: list[Problem] = configs.check(lambda: configs.build(inv, HealthSettings, health))
    for pool in pools(inv):
        out += [p for p in configs.check(lambda: configuration(inv, pool)) if p not in out]
    return out
