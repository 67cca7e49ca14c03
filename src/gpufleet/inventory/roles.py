"""The role registry: which roles exist, their defaults and variable models."""

from __future__ import annotations

import importlib
from functools import cache

from pydantic import BaseModel

from gpufleet.paths import ROLES

#: Every role, in the order the stack composes them (dependencies first).
ROLE_NAMES: tuple[str, ...] = (
    "kueue",
    "gpu_metrics",
    "parallel_fs",
    "training",
    "virtual_kubelet",
    "taint_controller",
    "descheduler",
    "node_health",
    "inference",
    "goodput",
)


@cache
def vars_model(role: str) -> type[BaseModel]:
    """The pydantic model of ``role``'s variables (``roles/<role>/vars.py: Vars``)."""
    return importlib.import_module(f"roles.{role}.vars").Vars


def defaults_file(role: str) -> str:
    """Path of the role's defaults, relative to the checkout, for messages."""
    return f"roles/{role}/defaults.yaml"


def role_of(key: str) -> str | None:
    """The role a variable belongs to by its prefix (longest role name wins), or None."""
    matches = [r for r in ROLE_NAMES if key.startswith(r + "_")]
    return max(matches, key=len) if matches else None


def defaults_path(role: str):
    """Absolute path of ``roles/<role>/defaults.yaml``."""
    return ROLES / role / "defaults.yaml"
