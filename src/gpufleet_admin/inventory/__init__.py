"""Inventories: Ansible-format environments, validated into typed variables.

``load(env, role_models)`` reads ``inventories/<env>/`` with Ansible's
precedence and validates every variable against the roles' models it is
handed; ``Inventory.node_specs()`` gives the Nodes it describes. This package
imports no role: entry points load an environment with every role through
``roles.registry.load``.
"""

from __future__ import annotations

from gpufleet.fleet.catalog import GPU_MODELS, GpuModel
from .errors import InventoryError, Problem
from .inventory import FlavorCapacity, Host, Inventory, NodeSpec
from .load import RoleModels, environments, load

__all__ = [
    "GPU_MODELS", "FlavorCapacity", "GpuModel", "Host", "Inventory", "InventoryError", "NodeSpec", "Problem",
    "RoleModels", "environments", "load",
]
