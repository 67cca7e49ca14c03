"""Typed variables of the goodput role (documentation: defaults.yaml; the interval's kind and default are the
accountant's configuration's, :mod:`gpufleet.goodput.config`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpufleet import componentconfig as cc
from gpufleet_admin.inventory.types import STRICT, Quantity


class Vars(BaseModel):
    """Variables of the goodput role."""

    model_config = STRICT

    goodput_enabled: bool
    goodput_interval_seconds: cc.PositiveSeconds
    goodput_port: int = Field(ge=1, le=65535, strict=True)
    goodput_cpu: Quantity
    goodput_memory: Quantity
