"""Typed variables of the descheduler role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from pydantic import BaseModel

from gpufleet import componentconfig as cc
from gpufleet_admin.inventory.types import STRICT, DnsLabel, PositiveInt


class Vars(BaseModel):
    """Variables of the descheduler role."""

    model_config = STRICT

    descheduler_enabled: bool
    descheduler_install: bool
    descheduler_namespace: DnsLabel
    descheduler_interval_seconds: PositiveInt
    descheduler_max_evictions_per_cycle: PositiveInt
    descheduler_max_evictions_per_node: PositiveInt
    #: The taint controller's flip-back budget (its configuration's kind and default: gpufleet.taint_controller.config).
    descheduler_migration_pods_per_minute: cc.PositiveNumber
