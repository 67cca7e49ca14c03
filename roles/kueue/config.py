"""What ``gpufleet quota-sync`` is configured with, from the inventory: the variable behind each field.

The model, its defaults and its checks are the component's
(:mod:`gpufleet.quota_sync.config`, a :class:`gpufleet.fleet.quota_policy.QuotaPolicy`);
this declaration is the road from the inventory (and stack config, which
overrides it) to it. The kueue role renders its ClusterQueues with the same
object (the inventory's hosts as the capacity), ``invoke quota.resync`` and
``invoke status`` use it too, and the role renders it into ConfigMap
``quota-sync-config`` for the controller.
"""

from __future__ import annotations

from gpufleet.quota_sync.config import Configuration
from gpufleet_admin import configs
from gpufleet_admin.inventory import Inventory

#: Configuration field -> the inventory variable that feeds it (None: no variable, the model's default).
#: ``gpu_model`` is a host variable: the flavors are the GPU models of the inventory's hosts.
VARIABLES: configs.Variables = {
    "flavors": "gpu_model",
    "cluster_queues": "kueue_cluster_queues",
    "reserve_gpus": "kueue_reserve_gpus",
    "namespace": "kueue_quota_sync_namespace",
    "partial_gpu_nodes_count": "kueue_partial_gpu_nodes_count",
    "subtract_unmanaged": "kueue_quota_subtract_unmanaged_gpus",
    "reclaim_below_priority": "kueue_priority_classes",
    "debounce_seconds": None,
    "resync_seconds": None,
}

#: Fields computed from the inventory: the ResourceFlavors of its hosts; the queues as the policy takes them
#: (their ``borrowing_limit_gpus`` is the role's, for the ClusterQueue objects); the highest PriorityClass's value
#: (GPU holders below it are the flip-out's to take back).
DERIVED: configs.Derived = {
    "flavors": lambda inv: tuple(inv.flavors()),
    "cluster_queues": lambda inv: tuple(q.policy() for q in inv.role("kueue").kueue_cluster_queues),
    "reclaim_below_priority": lambda inv: configs.highest_priority_class(inv).value,
}


def configuration(inv: Inventory) -> Configuration:
    """Quota sync's configuration for ``inv`` (the quota policy with it).

    Raises:
        gpufleet_admin.inventory.InventoryError: a value the configuration refuses, named by variable.
    """
    return configs.build(inv, Configuration, VARIABLES, DERIVED)



def inventory_capacity(inv: Inventory) -> dict[str, dict[str, int]]:
    """Capacity per flavor as the inventory's hosts give it: what ``pulumi up`` sizes the quotas by."""
    return {f: {"gpu": c.gpus, "cpu": c.cpu, "memory": c.memory_bytes} for f, c in inv.flavors().items()}
