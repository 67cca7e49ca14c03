"""Where a role's variables come from: its defaults file, and which role a variable belongs to.

The roles themselves (their variable models) are declared in ``roles.registry``
and handed to :func:`gpufleet_admin.inventory.load`; nothing here imports a role.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpufleet.paths import ROLES


def defaults_file(role: str) -> str:
    """Path of the role's defaults, relative to the checkout, for messages."""
    return f"roles/{role}/defaults.yaml"


def role_of(key: str, roles: Iterable[str]) -> str | None:
    """The role of ``roles`` a variable belongs to by its prefix (longest role name wins), or None."""
    matches = [r for r in roles if key.startswith(r + "_")]
    return max(matches, key=len) if matches else None


def defaults_path(role: str) -> Path:
    """Absolute path of ``roles/<role>/defaults.yaml``."""
    return ROLES / role / "defaults.yaml"
