"""Typed building blocks shared by the inventory and role variable models."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field

from gpufleet_admin import imageref
from gpufleet.kube.intstr import parse_int_or_percent
from gpufleet.kube.quantity import parse_quantity
from gpufleet.kube.validation import dns_label

from .catalog import GPU_MODELS

#: Every variable model forbids unknown keys so a typo is an error, not a no-op.
STRICT = ConfigDict(extra="forbid", frozen=True)



def _quantity(value: str) -> str:
    """Accept a Kubernetes quantity ("2Ti", "500m", "1.5Gi"); reject "8Gib" and the like."""
    try:
        amount = parse_quantity(value)
    except ValueError:
        raise ValueError("a Kubernetes quantity such as 512Gi, 2Ti or 1500m") from None
    if amount < 0:
        raise ValueError("a quantity >= 0 such as 512Gi, 2Ti or 1500m")
    return value


def _known_gpu_model(value: str) -> str:
    """A name of :data:`gpufleet_admin.inventory.catalog.GPU_MODELS`."""
    if value not in GPU_MODELS:
        raise ValueError(f"one of {', '.join(sorted(GPU_MODELS))}")
    return value


def _image_reference(value: str) -> str:
    """A container image reference with a tag or a digest (:func:`gpufleet_admin.imageref.parse`)."""
    try:
        imageref.parse(value)
    except ValueError as exc:
        raise ValueError(str(exc).split("expected ", 1)[1]) from None
    return value


def _https_endpoint(value: str) -> str:
    """``https://HOST:PORT`` (an IP or a DNS name; no path): where in-cluster clients reach the API server."""
    import urllib.parse

    u = urllib.parse.urlsplit(value)
    try:
        port = u.port
    except ValueError:
        port = None
    if u.scheme != "https" or not u.hostname or port is None or u.path not in ("", "/") or u.query or u.username:
        raise ValueError("an API server endpoint https://HOST:PORT (e.g. https://10.0.0.10:6443)")
    return value


Quantity = Annotated[str, AfterValidator(_quantity)]
#: ``https://HOST:PORT`` of the API server.
HttpsEndpoint = Annotated[str, AfterValidator(_https_endpoint)]
#: ``REGISTRY/REPO:TAG``, ``REGISTRY/REPO@sha256:...`` or both.
ImageReference = Annotated[str, AfterValidator(_image_reference)]
#: A GPU model gpufleet knows (``H100-SXM-80GB``, ...): the key into the catalog.
KnownGpuModel = Annotated[str, AfterValidator(_known_gpu_model)]
DnsLabel = Annotated[str, AfterValidator(dns_label)]
#: A Kubernetes IntOrString count of pods: an int >= 0 or a percentage ``"10%"`` (PDBs, rollouts).
IntOrPercent = Annotated[int | str, AfterValidator(parse_int_or_percent)]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
#: A temperature threshold in degrees Celsius; beyond 30..110 it is a typo, not a policy.
Celsius = Annotated[float, Field(ge=30, le=110)]
