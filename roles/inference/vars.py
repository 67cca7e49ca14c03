"""Typed variables of the inference role (defaults and documentation: defaults.yaml).

A deployment scales on one signal (``scale_on``); the target of the other
is refused rather than ignored, so an inventory never carries a setting
that does nothing.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, model_validator

from gpufleet import componentconfig as cc
from gpufleet_admin.inventory.types import STRICT, DnsLabel, IntOrPercent, NonNegativeInt, PositiveInt
from gpufleet.kube.intstr import scaled

#: Prometheus' metric name syntax (https://prometheus.io/docs/concepts/data_model/).
METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _metric_name(value: str) -> str:
    """A Prometheus metric name; anything else would make the PromQL query wrong or a different metric."""
    if not METRIC_NAME_RE.fullmatch(value):
        raise ValueError(f"a Prometheus metric name matching {METRIC_NAME_RE.pattern} "
                         "(e.g. vllm:num_requests_running), without labels or spaces")
    return value


#: A Prometheus metric name, e.g. ``vllm:num_requests_running``.
MetricName = Annotated[str, AfterValidator(_metric_name)]

#: What the autoscaler of a deployment follows: requests in flight per pod (KEDA) or CPU (plain HPA).
ScaleOn = Literal["requests_in_flight", "cpu"]


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
    #: Signal the autoscaler follows (module doc of manifests.py): requests in flight per pod, or CPU.
    scale_on: ScaleOn = "requests_in_flight"
    #: Requests in flight per pod the autoscaler aims at (scale_on: requests_in_flight).
    target_requests_in_flight: cc.PositiveNumber = 8.0
    #: The HPA's CPU target, percent of the CPU request (scale_on: cpu).
    target_cpu_utilization: int = Field(default=70, gt=0, le=100)
    #: The HPA's ``behavior.scaleDown.stabilizationWindowSeconds`` (seconds, 0-3600 as the API validates
    #: it); None leaves the field out: Kubernetes' default, 300.
    scale_down_stabilization_seconds: int | None = Field(default=None, ge=0, le=3600)
    #: The PodDisruptionBudget: exactly one of minAvailable (pods) and maxUnavailable (pods or "10%").
    pdb_min_available: NonNegativeInt | None = None
    pdb_max_unavailable: IntOrPercent | None = None

    @model_validator(mode="after")
    def _bounds(self) -> "DeploymentVars":
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError("min_replicas <= replicas <= max_replicas")
        unused, other = (("target_cpu_utilization", "cpu") if self.scale_on == "requests_in_flight"
                         else ("target_requests_in_flight", "requests_in_flight"))
        if unused in self.model_fields_set:
            raise ValueError(f"deployment {self.name}: {unused} does nothing with scale_on: {self.scale_on} "
                             f"(remove it, or set scale_on: {other})")
        if (self.pdb_min_available is None) == (self.pdb_max_unavailable is None):
            raise ValueError(f"deployment {self.name}: set exactly one of pdb_min_available and pdb_max_unavailable "
                             f"(got {self.pdb_min_available!r} and {self.pdb_max_unavailable!r})")
        if self.pdb_min_available is not None and self.pdb_min_available > self.min_replicas:
            raise ValueError("pdb_min_available <= min_replicas (else no pod can ever be evicted)")
        if self.pdb_max_unavailable is not None and scaled(self.pdb_max_unavailable, self.min_replicas) < 1:
            raise ValueError(f"deployment {self.name}: pdb_max_unavailable {self.pdb_max_unavailable!r} allows no "
                             f"eviction at min_replicas {self.min_replicas} (else no pod can ever be evicted)")
        return self

    def pdb_floor(self, replicas: int) -> int:
        """Fewest Ready pods the PDB keeps with ``replicas`` desired: minAvailable, or replicas less maxUnavailable
        rounded up (as the disruption controller scales a percentage)."""
        if self.pdb_min_available is not None:
            return self.pdb_min_available
        return max(replicas - scaled(self.pdb_max_unavailable, replicas), 0)

    def pdb_spec(self) -> dict:
        """The PodDisruptionBudget's ``minAvailable`` or ``maxUnavailable`` (the other left out)."""
        if self.pdb_min_available is not None:
            return {"minAvailable": self.pdb_min_available}
        return {"maxUnavailable": self.pdb_max_unavailable}


class Vars(BaseModel):
    """Variables of the inference role."""

    model_config = STRICT

    inference_enabled: bool
    inference_namespace: DnsLabel
    #: Prometheus KEDA's scalers query (base URL).
    inference_prometheus_url: cc.HttpUrl
    #: Gauge of the requests a model server is working on, one series (or more) per pod.
    inference_requests_in_flight_metric: MetricName
    inference_deployments: list[DeploymentVars]
