"""Container image references (``REGISTRY/REPO:TAG``, ``REGISTRY/REPO@sha256:...``), parsed and checked.

The grammar is the one registries and container runtimes share
(distribution/reference ``reference.go``): a name of slash-separated
lower-case components, optionally behind a registry host (``ghcr.io``,
``registry.example:5000``), then a tag, a digest, or both. gpufleet asks
for an explicit tag or digest: an implied ``latest`` is how a cluster ends
up running something nobody built on purpose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_REFERENCE = re.compile(
    rf"^(?:(?P<registry>{_HOST})/)?(?P<repository>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
EXPECTED = ("an image reference REGISTRY/REPO:TAG, REGISTRY/REPO@sha256:<64 hex digits> or both "
            "(e.g. ghcr.io/gpufleet/gpufleet:0.1.0)")


@dataclass(frozen=True)
class ImageRef:
    """One parsed reference.

    Attributes:
        registry: host[:port] (``ghcr.io``); ``""`` when the reference names none.
        repository: ``gpufleet/gpufleet``.
        tag: ``0.1.0`` or ``""``.
        digest: ``sha256:<64 hex>`` or ``""``.
    """

    registry: str
    repository: str
    tag: str
    digest: str

    @property
    def name(self) -> str:
        """``registry/repository`` (no tag, no digest)."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def with_digest(self, digest: str) -> "ImageRef":
        """This reference pinned to ``digest`` (tag kept, for people to read)."""
        return ImageRef(self.registry, self.repository, self.tag, parse(f"x@{digest}").digest)


def parse(text: str, *, what: str = "image reference") -> ImageRef:
    """Parse ``text`` into an :class:`ImageRef`.

    A first component is a registry when it has a dot or a port or is
    ``localhost`` (the runtimes' rule); otherwise it is part of the name
    (``gpufleet/gpufleet:1`` has no registry).

    Raises:
        ValueError: ``<what> '<text>': expected ...`` when it is no reference,
            or has neither tag nor digest.
    """
    m = _REFERENCE.match(text or "")
    if not m:
        raise ValueError(f"{what} {text!r}: expected {EXPECTED}")
    registry, repository = m["registry"] or "", m["repository"]
    if registry and not ("." in registry or ":" in registry or registry == "localhost"):
        if not re.fullmatch(_COMPONENT, registry):
            raise ValueError(f"{what} {text!r}: expected {EXPECTED}")
        registry, repository = "", f"{registry}/{repository}"
    ref = ImageRef(registry, repository, m["tag"] or "", m["digest"] or "")
    if not ref.tag and not ref.digest:
        raise ValueError(f"{what} {text!r}: expected {EXPECTED}; it has neither tag nor digest")
    if len(ref.name) > 255:
        raise ValueError(f"{what} {text!r}: expected a name of at most 255 characters")
    return ref
