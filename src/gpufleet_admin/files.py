"""Small file helpers shared by the build, install and process code: log tails, locks, stamps."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path



def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file, read from its last 64 KiB (``""`` when it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            return "\n".join(fh.read().decode(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created with its folder): one holder at a time, across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fingerprint(path: Path) -> list[int] | None:
    """``[size in bytes, mtime in ns]`` of a file, None when it is missing: a cheap "unchanged since" stamp."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` (mode and times kept) so that readers never see a half-written file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    tmp.replace(dst)


def digest(obj: object) -> str:
    """A short (16 hex digits) SHA-256 of ``obj`` as sorted JSON: a stamp that changes when a definition does."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
