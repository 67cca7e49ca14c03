"""Typed variables of the virtual_kubelet role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gpufleet.inventory.types import STRICT, DnsLabel, KnownGpuModel, NonNegativeInt, PositiveInt


class PoolVars(BaseModel):
    """One external capacity pool behind a virtual node; price in USD per GPU-hour."""

    model_config = STRICT

    name: DnsLabel
    provider: Literal["kubernetes", "simulated"]
    gpu_model: KnownGpuModel
    capacity_gpus: PositiveInt
    price_per_gpu_hour: float = Field(gt=0)
    kubeconfig_secret: DnsLabel | None = None
    start_latency_seconds: float = Field(default=0, ge=0)
    failure_rate: float = Field(default=0, ge=0, le=1)
    max_pods: NonNegativeInt = 1000


class Vars(BaseModel):
    """Variables of the virtual_kubelet role."""

    model_config = STRICT

    virtual_kubelet_enabled: bool
    virtual_kubelet_namespace: DnsLabel
    virtual_kubelet_pools: list[PoolVars]
