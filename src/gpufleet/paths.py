"""Where gpufleet keeps things: the checkout, the component cache, cluster state.

The cache lives outside the checkout so a fresh clone (CI) finds components
built by an earlier run; ``GPUFLEET_CACHE`` / ``GPUFLEET_STATE`` override it.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Root of the checkout: holds ``roles/``, ``inventories/``, ``templates/``.
REPO_ROOT: Path = Path(__file__).resolve().parents[2]
INVENTORIES: Path = REPO_ROOT / "inventories"
ROLES: Path = REPO_ROOT / "roles"
TEMPLATES: Path = REPO_ROOT / "templates"


def cache_dir() -> Path:
    """Component cache (built binaries, downloaded packages), keyed by name and version."""
    return Path(os.environ.get("GPUFLEET_CACHE", Path.home() / ".cache" / "gpufleet"))


def state_dir() -> Path:
    """Runtime state of local clusters (certs, etcd data, logs), one folder per cluster name."""
    return Path(os.environ.get("GPUFLEET_STATE", Path.home() / ".local" / "state" / "gpufleet"))
