"""Typed variables of the training role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from gpufleet_admin.inventory.types import STRICT, PositiveInt


class Vars(BaseModel):
    """Variables of the training role."""

    model_config = STRICT

    training_enabled: bool
    training_checkpoint_interval_minutes: PositiveInt
    training_checkpoint_seconds: PositiveInt
    training_max_restarts: PositiveInt
    training_checkpoint_subdir: str
    training_nccl_env: dict[str, str]
    training_topology: Literal["block", "rack", "none"]
    training_topology_mode: Literal["required", "preferred"]
    training_gang: Literal["kueue", "native", "both"]
