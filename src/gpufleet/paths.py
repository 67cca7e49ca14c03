"""Where gpufleet keeps things: the checkout, the component cache, cluster state.

The cache lives outside the checkout so a fresh clone (CI) finds components
built by an earlier run; ``GPUFLEET_CACHE`` / ``GPUFLEET_STATE`` override it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: Root of the checkout: holds ``roles/``, ``inventories/``, ``templates/``.
REPO_ROOT: Path = Path(__file__).resolve().parents[2]
#: The inventories of the checkout (gpufleet's pods read none: each gets its configuration file).
INVENTORIES: Path = REPO_ROOT / "inventories"
#: The roles (``defaults.yaml`` of each): the ``roles`` package, wherever it is installed; found without importing it.
ROLES: Path = Path(importlib.util.find_spec("roles").origin).parent if importlib.util.find_spec("roles") else REPO_ROOT / "roles"
TEMPLATES: Path = REPO_ROOT / "templates"


def cache_dir() -> Path:
    """Component cache (built binaries, downloaded packages), keyed by name and version."""
    return Path(os.environ.get("GPUFLEET_CACHE", Path.home() / ".cache" / "gpufleet"))


def state_dir() -> Path:
    """Runtime state of local clusters (certs, etcd data, logs), one folder per cluster name."""
    return Path(os.environ.get("GPUFLEET_STATE", Path.home() / ".local" / "state" / "gpufleet"))
