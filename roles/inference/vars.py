"""Typed variables of the inference role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from gpufleet.inventory.types import STRICT, DnsLabel, NonNegativeInt, PositiveInt


class DeploymentVars(BaseModel):
    """One inference Deployment and its autoscaling/disruption bounds (pods, GPUs, percent)."""

    model_config = STRICT

    name: DnsLabel
    image: str
    replicas: PositiveInt
    min_replicas: PositiveInt
    max_replicas: PositiveInt
    gpus_per_pod: NonNegativeInt = 1
    cpu: str = "4"
    memory: str = "32Gi"
    target_cpu_utilization: int = Field(default=70, gt=0, le=100)
    pdb_min_available: NonNegativeInt

    @model_validator(mode="after")
    def _bounds(self) -> "DeploymentVars":
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError("min_replicas <= replicas <= max_replicas")
        if self.pdb_min_available > self.min_replicas:
            raise ValueError("pdb_min_available <= min_replicas (else no pod can ever be evicted)")
        return self


class Vars(BaseModel):
    """Variables of the inference role."""

    model_config = STRICT

    inference_enabled: bool
    inference_namespace: DnsLabel
    inference_deployments: list[DeploymentVars]
