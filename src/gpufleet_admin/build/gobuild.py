"""Go modules and Go builds: how this project gets upstream programs and files.

The Go module proxy is how this machine reaches upstream Kubernetes
components, Kueue, kwok, the Pulumi CLI and its Kubernetes provider. A
module zip carries the whole tree, so the exact CRDs and OpenAPI schemas of
a pinned version come from the module cache too (:mod:`gpufleet_admin.schemas`).
The callers are :mod:`gpufleet_workshop.local.install` (the local cluster's
components) and :mod:`gpufleet_admin.build.pulumi` (the Pulumi CLI and provider).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet import paths
from gpufleet_admin.files import tail


class Cached:
    """Where a pinned program lives in the cache; mixed into dataclasses that have ``name`` and ``version``."""

    name: str
    version: str

    @property
    def key(self) -> str:
        """``<name>-<version>`` (e.g. ``"kueue-v0.17.0"``): the cache folder name."""
        return f"{self.name}-{self.version}"

    @property
    def dir(self) -> Path:
        """``cache_dir()/components/<name>-<version>``: ``bin/``, ``stamp.json``, ``install.json``."""
        return paths.cache_dir() / "components" / self.key

    @property
    def build_dir(self) -> Path:
        """Scratch folder of a generated build module: ``cache_dir()/build/<name>-<version>``."""
        return paths.cache_dir() / "build" / self.key


class GoError(RuntimeError):
    """The Go toolchain is missing, a module cannot be had, or a build step failed (with go's message or log tail)."""


def go_binary() -> str:
    """Path of the ``go`` tool.

    Raises:
        GoError: no ``go`` on PATH nor in /usr/local/go/bin.
    """
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if not found:
        raise GoError("the Go toolchain is needed to build upstream components (go not found on PATH "
                      "nor in /usr/local/go/bin); install Go 1.25 or later")
    return found


def go_env(**extra: str) -> dict[str, str]:
    """The environment of go commands: no VCS stamping (module builds have no checkout), plus ``extra``."""
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env.update(extra)
    return env


def module_info(module: str, version: str) -> dict[str, str]:
    """``go mod download -json module@version``: ``{"Dir": ..., "GoMod": ..., "Version": ...}``.

    Downloads into the module cache through the Go module proxy if needed.

    Raises:
        GoError: the download failed (go's message: not served, no network and not cached).
    """
    proc = subprocess.run([go_binary(), "mod", "download", "-json", f"{module}@{version}"],
                          capture_output=True, text=True, env=go_env(), cwd="/", timeout=900)
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        raise GoError(f"go mod download {module}@{version} failed: {info.get('Error') or proc.stderr.strip()}")
    return info


def module_dir(module: str, version: str) -> Path:
    """Folder of ``module@version`` in the Go module cache (downloaded if missing).

    Remembered in ``cache_dir()/components/modules.json`` so that later
    calls run no ``go`` at all.

    Raises:
        GoError: the module cannot be downloaded.
    """
    index = paths.cache_dir() / "components" / "modules.json"
    key = f"{module}@{version}"
    try:
        known = json.loads(index.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        known = {}
    if key in known and (Path(known[key]) / "go.mod").exists():
        return Path(known[key])
    found = module_info(module, version)["Dir"]
    known[key] = found
    index.parent.mkdir(parents=True, exist_ok=True)
    tmp = index.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    tmp.replace(index)
    return Path(found)


_REPLACE = re.compile(r"^(\S+)(?:\s+v\S+)?\s+=>\s+(\S+)(?:\s+(v\S+))?$")


def parse_replaces(gomod: str) -> list[tuple[str, str, str]]:
    """``(old_module, new_path_or_module, new_version)`` for each replace directive of a go.mod text.

    ``new_version`` is ``""`` for a local-path replace. Handles the one-line
    form and ``replace ( ... )`` blocks; comments are ignored (go.mod syntax:
    https://go.dev/ref/mod#go-mod-file-replace).
    """
    out: list[tuple[str, str, str]] = []
    block = False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith("replace ("):
            block = True
            continue
        if block and line == ")":
            block = False
            continue
        if not block and not line.startswith("replace "):
            continue
        m = _REPLACE.match(line.removeprefix("replace ").strip())
        if m:
            out.append((m.group(1), m.group(2), m.group(3) or ""))
    return out


def go_directive(gomod: str, default: str) -> str:
    """The ``go`` version line of a go.mod text (``default`` when it has none)."""
    m = re.search(r"^go\s+(\S+)", gomod, re.M)
    return m.group(1) if m else default


def build_module(name: str, requires: list[tuple[str, str]], replaces: dict[str, str], go: str) -> str:
    """The text of a generated build module's ``go.mod`` (``gpufleet_workshop.local/build/<name>``).

    Upstream modules with ``replace`` directives cannot be built with
    ``go install mod@version``; a module of our own that requires them
    (and restates the replaces it needs) can.
    """
    lines = [f"module gpufleet_workshop.local/build/{name}", "", f"go {go}", "", "require ("]
    lines += [f"\t{mod} {ver}" for mod, ver in requires]
    lines += [")"]
    if replaces:
        lines += ["", "replace (", *(f"\t{k} => {v}" for k, v in sorted(replaces.items())), ")"]
    return "\n".join(lines) + "\n"


def ldflags(settings: tuple[str, ...] | list[str]) -> str:
    """``-ldflags`` value: stripped binaries (``-s -w``) with each ``-X importpath.name=value`` of ``settings``."""
    return " ".join(["-s", "-w", *(f"-X {x}" for x in settings)])


def built_from(path: Path, module: str, version: str) -> bool:
    """True when ``go version -m path`` lists ``module`` at ``version`` (as the main module or a dependency)."""
    info = subprocess.run([go_binary(), "version", "-m", str(path)], capture_output=True, text=True).stdout
    return any(len(f) >= 3 and f[0] in ("mod", "dep") and (f[1], f[2]) == (module, version)
               for f in (line.split() for line in info.splitlines()))


def version_problem(path: Path, probe: tuple[str, ...] | list[str], expected: str) -> str | None:
    """Run ``path *probe``; a problem line unless its output contains ``expected``, else None."""
    out = subprocess.run([str(path), *probe], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    if expected in text:
        return None
    return f"{path} {' '.join(probe)}: expected {expected!r}, got {text.strip()[:200]!r}"


#: ``(packages compiled so far, seconds since start, last output line)``.
Progress = Callable[[int, float, str], None]


def run_logged(argv: list[str], cwd: Path, log: Path, *, env: dict[str, str] | None = None,
               progress: Progress | None = None) -> None:
    """Run one build step, appending its command line and output to ``log``.

    ``go build -v`` prints one package per line on stderr; ``progress`` is
    called with the count after every line.

    Raises:
        GoError: the step exited non-zero (message: the command, folder, log path and its tail).
    """
    started = time.monotonic()
    with open(log, "a") as out:
        out.write(f"\n$ (cd {cwd} && {' '.join(argv)})\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=cwd, env=env or go_env(), stdout=out, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        count = 0
        for line in proc.stderr:
            out.write(line)
            count += not line.startswith(("go: ", "#"))
            if progress is not None:
                progress(count, time.monotonic() - started, line.strip())
        rc = proc.wait()
    if rc != 0:
        raise GoError(f"{' '.join(argv[:3])} failed (exit {rc}) in {cwd}; log {log}:\n{tail(log)}")
