"""Go modules as a source of pinned upstream files (CRDs, OpenAPI specs, sources).

The Go module proxy is how this project reaches upstream Kubernetes
components; a module zip carries the whole tree, so the exact CRD and
OpenAPI schemas of a pinned version come from the module cache.
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path


class GoModuleError(RuntimeError):
    """``go mod download`` failed for a module (no network and not cached, or no such version)."""


@cache
def module_dir(module: str, version: str) -> Path:
    """Local directory of ``module@version`` in the Go module cache, downloading it if needed.

    Raises:
        GoModuleError: with go's message when the module cannot be had.
    """
    proc = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"],
                          capture_output=True, text=True, cwd="/", timeout=900)
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        raise GoModuleError(f"go mod download {module}@{version}: {info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"])
