"""Typed variables of the virtual_kubelet role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from gpufleet_admin.inventory.types import STRICT, DnsLabel, ImageReference, KnownGpuModel, NonNegativeInt, PositiveInt
from gpufleet_admin.versions import pin


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
    #: kubernetes pools: how the main cluster reaches their pods (pod_ip: the clusters share a pod
    #: network; load_balancer: a remote LoadBalancer Service per workload); default pod_ip.
    address_mode: Literal["pod_ip", "load_balancer"] | None = None
    #: simulated pools: how a rental's instance serves (none: an endpoint in 198.18.0.0/15 that nothing
    #: routes; local_process: a local process beside the virtual kubelet answering HTTP, the local environment's).
    instances: Literal["none", "local_process"] = "none"
    #: Check the pool's published addresses (gpufleet.virtual_kubelet.endpoint_health); off where they cannot be reached from here.
    endpoint_health_check: bool = True
    #: The image of this pool's virtual kubelet: a provider plugin ships in an image of its own (default: gpufleet_image
    #: for kubernetes pools; the simulated rental lives in gpufleet's workshop image, the gpufleet.workshop_image pin).
    image: ImageReference | None = None

    def image_or(self, fleet_image: str) -> str:
        """The image this pool's virtual kubelet runs: :attr:`image`, else the one its provider ships in."""
        if self.image:
            return str(self.image)
        return pin("gpufleet", "workshop_image") if self.provider == "simulated" else fleet_image

    @model_validator(mode="after")
    def _address_mode_for_kubernetes(self) -> "PoolVars":
        if self.address_mode is not None and self.provider != "kubernetes":
            raise ValueError(f"address_mode {self.address_mode!r} applies to provider kubernetes only "
                             f"(pool {self.name!r} has provider {self.provider!r}, whose pods are reached at "
                             "the endpoints the provider reports)")
        if self.instances != "none" and self.provider != "simulated":
            raise ValueError(f"instances {self.instances!r} applies to provider simulated only (pool {self.name!r} "
                             f"has provider {self.provider!r})")
        return self


class Vars(BaseModel):
    """Variables of the virtual_kubelet role."""

    model_config = STRICT

    virtual_kubelet_enabled: bool
    virtual_kubelet_namespace: DnsLabel
    virtual_kubelet_pools: list[PoolVars]
    #: Endpoint health check (gpufleet.virtual_kubelet.endpoint_health): seconds between checks (0: off), connect timeout
    #: (seconds, at most the interval), consecutive failures that publish an address not ready.
    virtual_kubelet_endpoint_health_interval_seconds: float = Field(ge=0)
    virtual_kubelet_endpoint_health_timeout_seconds: float = Field(gt=0)
    virtual_kubelet_endpoint_health_unhealthy_threshold: PositiveInt

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> "Vars":
        interval = self.virtual_kubelet_endpoint_health_interval_seconds
        if interval and self.virtual_kubelet_endpoint_health_timeout_seconds > interval:
            raise ValueError(f"virtual_kubelet_endpoint_health_timeout_seconds "
                             f"{self.virtual_kubelet_endpoint_health_timeout_seconds:g} must be at most "
                             f"virtual_kubelet_endpoint_health_interval_seconds {interval:g}")
        return self
