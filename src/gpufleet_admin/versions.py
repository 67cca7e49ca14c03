"""Pinned upstream versions, read from ``versions.yaml`` beside this module."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml


@cache
def versions() -> dict[str, dict[str, Any]]:
    """All pins: ``{component: {"version": ..., "module": ..., ...}}``."""
    return yaml.safe_load((Path(__file__).with_name("versions.yaml")).read_text())


def pin(component: str, key: str = "version") -> str:
    """One pinned value, e.g. ``pin("kueue")`` -> ``"v0.17.0"``.

    Raises:
        KeyError: naming the component and key when either is not pinned.
    """
    try:
        return str(versions()[component][key])
    except KeyError:
        raise KeyError(f"versions.yaml: no pin {component}.{key}") from None
