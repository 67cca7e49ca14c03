"""Typed variables of the taint_controller role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, model_validator

from gpufleet_admin.inventory.types import STRICT, NonNegativeInt


class Vars(BaseModel):
    """Variables of the taint_controller role; low-water must be below high-water."""

    model_config = STRICT

    taint_controller_enabled: bool
    taint_controller_high_water_gpus: NonNegativeInt
    taint_controller_low_water_gpus: NonNegativeInt
    taint_controller_hold_seconds: NonNegativeInt
    taint_controller_add_hold_seconds: NonNegativeInt | None
    taint_controller_remove_hold_seconds: NonNegativeInt | None
    taint_controller_signal: Literal["prometheus", "apiserver"]
    taint_controller_promql: str
    taint_controller_prometheus_url: str
    taint_controller_flip_mode: Literal["make_before_break", "evict_first"]
    taint_controller_surge_max_wait_seconds: NonNegativeInt

    @model_validator(mode="after")
    def _hysteresis(self) -> "Vars":
        if self.taint_controller_low_water_gpus >= self.taint_controller_high_water_gpus:
            raise ValueError(
                "taint_controller_low_water_gpus below taint_controller_high_water_gpus (hysteresis)"
            )
        return self
