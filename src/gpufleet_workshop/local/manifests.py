"""Read upstream YAML manifests (CRDs, webhooks, Stages) from the Go module cache, fast.

Kueue's CRDs alone are megabytes of YAML; parsing them on every ``up``
cost seconds. Files under the module cache never change (the path carries
the module version), so each file is parsed once, with libyaml when
PyYAML has it, and its documents kept as JSON under
``cache_dir()/manifests/``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from functools import cache
from pathlib import Path

import yaml

from gpufleet import paths

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse(text: str) -> list[dict]:
    """Non-empty YAML documents of ``text``."""
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


@cache
def _cached(path: Path, stamp: tuple[int, int]) -> tuple[dict, ...]:
    key = hashlib.sha256(f"{path}:{stamp}".encode()).hexdigest()[:24]
    store = paths.cache_dir() / "manifests" / f"{key}.json"
    try:
        return tuple(json.loads(store.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    docs = parse(path.read_text())
    store.parent.mkdir(parents=True, exist_ok=True)
    tmp = store.with_suffix(".tmp")
    tmp.write_text(json.dumps(docs))
    tmp.replace(store)
    return tuple(docs)


def load_all(path: Path) -> list[dict]:
    """The non-empty YAML documents of a file, as fresh copies (callers may modify them).

    Raises:
        FileNotFoundError: no such file.
        yaml.YAMLError: the file is not YAML.
    """
    st = path.stat()
    return copy.deepcopy(list(_cached(path.resolve(), (st.st_size, st.st_mtime_ns))))


def load_one(path: Path) -> dict:
    """The single YAML document of a file (the first one if there are several)."""
    return load_all(path)[0]
