"""Typed variables of the goodput role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpufleet_admin.inventory.types import STRICT, PositiveInt, Quantity


class Vars(BaseModel):
    """Variables of the goodput role."""

    model_config = STRICT

    goodput_enabled: bool
    goodput_interval_seconds: PositiveInt
    goodput_port: int = Field(ge=1, le=65535, strict=True)
    goodput_cpu: Quantity
    goodput_memory: Quantity
