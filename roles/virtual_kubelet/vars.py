"""Typed variables of the virtual_kubelet role (documentation: defaults.yaml).

A pool is the virtual kubelet's own :class:`gpufleet.virtual_kubelet.config.Pool`
(its fields, defaults and checks are written there); the endpoint health
check's variables have the kinds of the configuration's fields, and what
spans them (the timeout within the interval) is checked by the configuration
when the inventory is loaded (``roles/virtual_kubelet/config.py``).
"""

from __future__ import annotations

from pydantic import BaseModel

from gpufleet import componentconfig as cc
from gpufleet.virtual_kubelet.config import Pool
from gpufleet_admin.inventory.types import STRICT, DnsLabel, ImageReference
from gpufleet_admin.versions import pin



class PoolVars(Pool):
    """One external capacity pool behind a virtual node: the virtual kubelet's :class:`~gpufleet.virtual_kubelet.config.Pool`
    (its fields, defaults and checks are written there), and the image that pool's virtual kubelet runs (the role's)."""

    #: The image of this pool's virtual kubelet: a provider plugin ships in an image of its own (default: gpufleet_image
    #: for kubernetes pools; the simulated rental lives in gpufleet's workshop image, the gpufleet.workshop_image pin).
    image: ImageReference | None = None

    def image_or(self, fleet_image: str) -> str:
        """The image this pool's virtual kubelet runs: :attr:`image`, else the one its provider ships in."""
        if self.image:
            return str(self.image)
        return pin("gpufleet", "workshop_image") if self.provider == "simulated" else fleet_image

    def pool(self) -> Pool:
        """The pool as its virtual kubelet takes it (without the image, which is the role's)."""
        return Pool.model_validate(self.model_dump(exclude={"image"}))


class Vars(BaseModel):
    """Variables of the virtual_kubelet role."""

    model_config = STRICT

    virtual_kubelet_enabled: bool
    virtual_kubelet_namespace: DnsLabel
    virtual_kubelet_pools: list[PoolVars]
    virtual_kubelet_endpoint_health_interval_seconds: cc.Seconds
    virtual_kubelet_endpoint_health_timeout_seconds: cc.PositiveSeconds
    virtual_kubelet_endpoint_health_unhealthy_threshold: cc.PositiveCount
    virtual_kubelet_kubelet_port: cc.Port0
