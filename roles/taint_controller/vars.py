"""Typed variables of the taint_controller role (documentation: defaults.yaml).

The variables the controller's configuration takes have the kinds of its
fields (:mod:`gpufleet.taint_controller.config`: one rule per value, and the
defaults written there; ``defaults.yaml`` documents them and
``tests/roles/test_component_config.py`` keeps the two equal). What spans
variables (the low-water mark below the high-water mark) is checked by the
configuration too, when the inventory is loaded (``roles/taint_controller/config.py``).
"""

from __future__ import annotations

from pydantic import BaseModel

from gpufleet import componentconfig as cc
from gpufleet.taint_controller.config import FlipMode, PromQL, Signal
from gpufleet_admin.inventory.types import STRICT


class Vars(BaseModel):
    """Variables of the taint_controller role."""

    model_config = STRICT

    taint_controller_enabled: bool
    taint_controller_high_water_gpus: cc.Count
    taint_controller_low_water_gpus: cc.Count
    taint_controller_hold_seconds: cc.Seconds
    taint_controller_add_hold_seconds: cc.Seconds | None
    taint_controller_remove_hold_seconds: cc.Seconds | None
    taint_controller_signal: Signal
    taint_controller_promql: PromQL
    taint_controller_prometheus_url: cc.HttpUrl
    taint_controller_flip_mode: FlipMode
    taint_controller_surge_max_wait_seconds: cc.Seconds
    taint_controller_flip_back_max_in_flight: cc.PositiveCount
