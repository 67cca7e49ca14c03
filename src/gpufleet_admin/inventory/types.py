"""Typed building blocks shared by the inventory and role variable models.

The kinds a component's configuration also takes (counts, seconds, DNS
labels, temperatures, GPU models...) are the product's own
(:mod:`gpufleet.componentconfig`, :mod:`gpufleet.fleet.catalog`), imported
here so that a variable and the configuration field it feeds are checked by
one rule; the kinds only provisioning needs (quantities, image references,
API endpoints) are defined here.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from gpufleet.componentconfig import STRICT, Celsius, DnsLabel, NonNegativeInt, PositiveInt  # noqa: F401
from gpufleet.fleet.catalog import KnownGpuModel  # noqa: F401
from gpufleet.kube.intstr import parse_int_or_percent
from gpufleet.kube.quantity import parse_quantity
from gpufleet_admin import imageref


def _quantity(value: str) -> str:
    """Accept a Kubernetes quantity ("2Ti", "500m", "1.5Gi"); reject "8Gib" and the like."""
    try:
        amount = parse_quantity(value)
    except ValueError:
        raise ValueError("a Kubernetes quantity such as 512Gi, 2Ti or 1500m") from None
    if amount < 0:
        raise ValueError("a quantity >= 0 such as 512Gi, 2Ti or 1500m")
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
#: A Kubernetes IntOrString count of pods: an int >= 0 or a percentage ``"10%"`` (PDBs, rollouts).
IntOrPercent = Annotated[int | str, AfterValidator(parse_int_or_percent)]
