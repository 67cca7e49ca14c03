"""Inventories: Ansible-format environments, validated into typed variables.

``load(env)`` reads ``inventories/<env>/`` with Ansible's precedence and
validates every variable; ``node_specs(env)`` gives the Nodes it describes.
"""

from __future__ import annotations

from .catalog import GPU_MODELS, GpuModel
from .errors import InventoryError, Problem
from .inventory import FlavorCapacity, Host, Inventory, NodeSpec
from .load import environments, load


def node_specs(env: str, nodes: int | None = None) -> list[NodeSpec]:
    """The Nodes of ``env`` (``nodes`` sizes a simulated fleet). Raises InventoryError."""
    return load(env, nodes=nodes).node_specs()


__all__ = [
    "GPU_MODELS", "FlavorCapacity", "GpuModel", "Host", "Inventory", "InventoryError", "NodeSpec", "Problem",
    "environments", "load", "node_specs",
]
