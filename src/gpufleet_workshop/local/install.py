"""Fetch, build, verify and cache the local cluster's components.

Each component ends up under ``cache_dir()/components/<name>-<version>/bin/``
(apt packages stay in ``/usr/bin``). A component is *installed* when its
binaries exist and are verified: ``go version -m`` names the pinned module
and version, and ``--version`` output (where the binary has one) matches. A
stamp (sizes and mtimes of verified binaries) makes a second
:func:`install` a no-op that runs nothing.

Builds run one at a time (two cores); a build someone else started in the
same build folder is waited for, never duplicated. Each step's wall time is
recorded in ``<component dir>/install.json`` for the benchmark.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from gpufleet import paths
from gpufleet_admin.build import gobuild
from gpufleet_admin.files import copy_atomic, digest, fingerprint, locked, tail
from gpufleet_admin.build.gobuild import GoError, go_binary, go_env
from gpufleet_workshop.local.components import Component, components


class InstallError(GoError):
    """A component could not be fetched, built or verified; the message ends with the log tail.

    Go download and build steps raise :class:`gpufleet_admin.build.gobuild.GoError`, its
    base class; catch that to handle both.
    """


@dataclass(frozen=True)
class StepResult:
    """What :func:`install` did for one component.

    Attributes:
        component: component key (``"kueue-v0.17.0"``).
        action: ``"cached"`` (stamp matched), ``"verified"`` (binaries there,
            verified now), ``"reused"`` (taken from an existing build folder),
            ``"built"``, ``"installed"`` (apt).
        seconds: wall time of this step, in seconds.
    """

    component: str
    action: str
    seconds: float


# --------------------------------------------------------------------------- build module


def build_module_files(comp: Component, upstream_gomod: str) -> tuple[str, str]:
    """The generated ``go.mod`` (before ``go mod tidy``) and ``tools.go`` of a go-module build.

    Local-path replaces of the upstream module become version replaces:
    ``k8s.io/*`` to ``comp.staging_version`` when set, any other module to
    ``comp.version`` (sibling modules of one repository); replaces to
    guard paths (``FORBIDDEN_DEPENDENCY``) are dropped; version replaces
    are kept as they are.

    Returns:
        ``(go_mod_text, tools_go_text)``.
    """
    replaces: dict[str, str] = {}
    for old, new, new_version in gobuild.parse_replaces(upstream_gomod):
        if new_version:
            replaces[old] = f"{new} {new_version}"
        elif "FORBIDDEN" in new:
            continue
        elif comp.staging_version and old.startswith("k8s.io/"):
            replaces[old] = f"{old} {comp.staging_version}"
        else:
            replaces[old] = f"{old} {comp.version}"
    for extra in comp.extra_requires:
        replaces.setdefault(extra, f"{extra} {comp.version}")
    requires = [(comp.module, comp.version)] + [(r, comp.version) for r in comp.extra_requires]
    gomod = gobuild.build_module(comp.name, requires, replaces, gobuild.go_directive(upstream_gomod, "1.25.0"))
    tools = "//go:build tools\n\npackage tools\n\nimport (\n" + "".join(f'\t_ "{p}"\n' for p in comp.packages) + ")\n"
    return gomod, tools


# --------------------------------------------------------------------------- verification


def _stamp_path(comp: Component) -> Path:
    return comp.dir / "stamp.json"


#: Component fields added for ``go-local`` builds: left out of the spec digest while empty, so the stamps of
#: every other component (written before they existed) still match.
_LOCAL_FIELDS = ("source", "requires", "verify_version")


def _spec_hash(comp: Component) -> str:
    spec = asdict(comp)
    for key in _LOCAL_FIELDS:
        if not spec.get(key):
            spec.pop(key, None)
    return digest(spec)


def _fingerprint(comp: Component) -> dict[str, list[int]] | None:
    prints = {name: fingerprint(comp.binary(name)) for name in comp.binaries}
    return None if None in prints.values() else prints


def stamped(comp: Component) -> bool:
    """True when the component's binaries are unchanged since they were last verified."""
    try:
        stamp = json.loads(_stamp_path(comp).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return stamp.get("spec") == _spec_hash(comp) and stamp.get("binaries") == _fingerprint(comp)


def verify(comp: Component) -> list[str]:
    """Check the binaries of a component; returns the problems found (empty: verified).

    Checks that each binary exists and is executable, that ``go version -m``
    names ``comp.module`` at ``comp.version`` (Go components), and that the
    ``version_probe`` output contains ``comp.version_text``.
    """
    problems = []
    for name in comp.binaries:
        path = comp.binary(name)
        if not os.access(path, os.X_OK):
            problems.append(f"{path}: missing or not executable")
        else:
            problems += verify_path(comp, path)
    return problems


def verify_path(comp: Component, path: Path) -> list[str]:
    """Like :func:`verify`, for one binary file at ``path`` (not necessarily in the cache).

    The file name selects the version probe (``comp.version_probe[path.name]``).
    """
    problems = []
    want = comp.verify_version or comp.version
    if comp.method != "apt" and not gobuild.built_from(path, comp.module, want):
        problems.append(f"{path}: go version -m does not list {comp.module} {want}")
    probe = comp.version_probe.get(path.name)
    if probe and (problem := gobuild.version_problem(path, probe, comp.version_text)):
        problems.append(problem)
    return problems


def _write_stamp(comp: Component) -> None:
    comp.dir.mkdir(parents=True, exist_ok=True)
    _stamp_path(comp).write_text(json.dumps({"spec": _spec_hash(comp), "binaries": _fingerprint(comp)}, indent=1))


def _record(comp: Component, action: str, seconds: float) -> None:
    comp.dir.mkdir(parents=True, exist_ok=True)
    rec = comp.dir / "install.json"
    try:
        data = json.loads(rec.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        data = {}
    entry = {"seconds": round(seconds, 1), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    data[action] = entry
    data.setdefault(f"first_{action}", entry)  # the cold build, for the benchmark
    rec.write_text(json.dumps(data, indent=1))


def install_record(comp: Component) -> dict[str, dict[str, float | str]]:
    """What earlier installs recorded (may be empty).

    Shape: ``{action: {"seconds": s, "finished": iso}}`` for the latest step of
    each action (``built``, ``reused``, ``installed``), plus ``first_<action>``
    for the first one (on a fresh cache: the cold build).
    """
    try:
        return json.loads((comp.dir / "install.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


# --------------------------------------------------------------------------- running builds


def foreign_builds(folder: Path) -> list[int]:
    """PIDs of ``go build``/``go install`` processes whose working directory is ``folder``."""
    found = []
    target = folder.resolve()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if len(argv) < 2 or not argv[0].endswith(b"go") or argv[1] not in (b"build", b"install"):
                continue
            if Path(os.readlink(proc / "cwd")).resolve() == target:
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def _run_logged(argv: list[str], cwd: Path, log: Path, env: dict[str, str], status, label: str) -> None:
    """Run one build command (:func:`gpufleet_admin.build.gobuild.run_logged`); show packages compiled so far on ``status``."""
    def show(count: int, seconds: float, line: str) -> None:
        if status is not None:
            status.update(f"{label}: {count} packages, {seconds:.0f}s  [dim]{line[:70]}")

    gobuild.run_logged(argv, cwd, log, env=env, progress=show)


def _wait_foreign(comp: Component, status) -> None:
    started = time.monotonic()
    while pids := foreign_builds(comp.build_dir):
        if status is not None:
            status.update(f"{comp.key}: waiting for running build (pid {pids[0]}), {time.monotonic() - started:.0f}s")
        time.sleep(5)


def _build_go_install(comp: Component, status) -> None:
    comp.bin_dir.mkdir(parents=True, exist_ok=True)
    log = comp.dir / "build.log"
    env = go_env(GOBIN=str(comp.bin_dir))
    for pkg in comp.packages:
        argv = [go_binary(), "install", "-v", "-trimpath", f"-ldflags={gobuild.ldflags(comp.ldflags)}", f"{pkg}@{comp.version}"]
        _run_logged(argv, comp.dir, log, env, status, comp.key)
    # go install names a root-module binary after the module's last element.
    for name, pkg in zip(comp.binaries, comp.packages, strict=True):
        produced = comp.bin_dir / re.sub(r"/v\d+$", "", pkg).rsplit("/", 1)[-1]
        if produced != comp.bin_dir / name and produced.exists():
            produced.replace(comp.bin_dir / name)


def _build_go_module(comp: Component, status) -> str:
    """Build into ``build_dir/bin`` (reusing a finished build there) and copy into the cache."""
    bdir = comp.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    _wait_foreign(comp, status)
    built = [bdir / "bin" / b for b in comp.binaries]
    action = "reused"
    if not all(os.access(p, os.X_OK) for p in built) or any(verify_path(comp, p) for p in built):
        action = "built"
        log = bdir / "build.log"
        env = go_env()
        upstream = Path(gobuild.module_info(comp.module, comp.version)["GoMod"]).read_text()
        gomod, tools = build_module_files(comp, upstream)
        tools_file = bdir / "tools.go"
        # A changed package list (a binary added) needs a new tools.go and a tidy go.mod.
        if not (bdir / "go.mod").exists() or not tools_file.exists() or tools_file.read_text() != tools:
            if status is not None:
                status.update(f"{comp.key}: generating build module")
            (bdir / "tools.go").write_text(tools)
            (bdir / "go.mod").write_text(gomod)
            _run_logged([go_binary(), "mod", "tidy"], bdir, log, env, status, f"{comp.key} go mod tidy")
        (bdir / "bin").mkdir(exist_ok=True)
        if len(comp.packages) == 1:
            out = str(bdir / "bin" / comp.binaries[0])
        else:
            out = str(bdir / "bin") + "/"
        argv = [go_binary(), "build", "-v", "-trimpath", f"-ldflags={gobuild.ldflags(comp.ldflags)}", "-o", out, *comp.packages]
        _run_logged(argv, bdir, log, env, status, comp.key)
    comp.bin_dir.mkdir(parents=True, exist_ok=True)
    for src in built:
        copy_atomic(src, comp.bin_dir / src.name)
    return action


def local_module_files(comp: Component) -> dict[str, str]:
    """The build module of a ``go-local`` component: its ``*.go`` sources and a ``go.mod`` (before ``go mod tidy``).

    Returns:
        file name -> text.
    """
    src = Path(comp.source)
    files = {p.name: p.read_text() for p in sorted(src.glob("*.go"))}
    module = comp.packages[0]
    lines = [f"module {module}", "", "go 1.26.0", "", "require (", *(f"\t{r}" for r in comp.requires), ")"]
    files["go.mod"] = "\n".join(lines) + "\n"
    return files


def _build_go_local(comp: Component, status) -> str:
    """Build a ``go-local`` component in ``build_dir`` (reused when finished there) and copy it into the cache."""
    bdir = comp.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    _wait_foreign(comp, status)
    built = [bdir / "bin" / b for b in comp.binaries]
    if all(os.access(p, os.X_OK) for p in built) and not any(verify_path(comp, p) for p in built):
        action = "reused"
    else:
        action = "built"
        log = bdir / "build.log"
        env = go_env()
        for name, text in local_module_files(comp).items():
            (bdir / name).write_text(text)
        _run_logged([go_binary(), "mod", "tidy"], bdir, log, env, status, f"{comp.key} go mod tidy")
        (bdir / "bin").mkdir(exist_ok=True)
        argv = [go_binary(), "build", "-v", "-trimpath", f"-ldflags={gobuild.ldflags(comp.ldflags)}", "-o",
                str(built[0]), "."]
        _run_logged(argv, bdir, log, env, status, comp.key)
    comp.bin_dir.mkdir(parents=True, exist_ok=True)
    for src in built:
        copy_atomic(src, comp.bin_dir / src.name)
    return action


def _install_apt(comp: Component, status) -> str:
    if all(os.access(comp.binary(b), os.X_OK) for b in comp.binaries):
        return "verified"
    if status is not None:
        status.update(f"{comp.key}: apt-get install {comp.module}")
    log = comp.dir / "build.log"
    comp.dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *comp.module.split()]
    if os.geteuid() != 0:
        cmd = ["sudo", "-n", *cmd]
    with open(log, "a") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        if rc != 0:
            subprocess.run([*cmd[: cmd.index("apt-get") + 1], "update"], stdout=out, stderr=subprocess.STDOUT, env=env)
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        raise InstallError(f"apt-get install {comp.module} failed (exit {rc}); log {log}:\n{tail(log)}")
    return "installed"


# --------------------------------------------------------------------------- entry points


def install(names: Iterable[str] | None = None, *, force: bool = False, console: Console | None = None) -> list[StepResult]:
    """Make every named component (default: all) present and verified, one at a time.

    A component whose stamp matches is skipped without running anything
    (``action="cached"``), so a warm call costs milliseconds. Progress (current
    package, elapsed seconds) and a per-step summary are shown on ``console``.

    Args:
        names: component names from :func:`gpufleet_workshop.local.components.components`.
        force: rebuild/reinstall even when verified binaries are present.
        console: where to show progress; a quiet default when None.

    Returns:
        One :class:`StepResult` per component, in build order.

    Raises:
        InstallError: a fetch, build or verification failed (log tail included).
        KeyError: an unknown component name.
    """
    console = console or Console(quiet=True)
    comps = components()
    wanted = list(names) if names else list(comps)
    for n in wanted:
        if n not in comps:
            raise KeyError(f"unknown component {n!r}; known: {', '.join(comps)}")
    if not force and all(stamped(comps[n]) for n in wanted):
        return [StepResult(comps[n].key, "cached", 0.0) for n in comps if n in wanted]
    results = []
    with locked(paths.cache_dir() / "components" / ".install.lock"):
        for name in comps:
            if name not in wanted:
                continue
            comp = comps[name]
            started = time.monotonic()
            if not force and stamped(comp):
                results.append(StepResult(comp.key, "cached", time.monotonic() - started))
                continue
            with console.status(f"{comp.key}: checking") as status:
                action = None
                if not force and comp.method != "apt" and _fingerprint(comp) and not verify(comp):
                    action = "verified"
                elif comp.method == "go-install":
                    if force:
                        shutil.rmtree(comp.bin_dir, ignore_errors=True)
                    _build_go_install(comp, status)
                    action = "built"
                elif comp.method == "go-module":
                    if force:
                        shutil.rmtree(comp.build_dir / "bin", ignore_errors=True)
                    action = _build_go_module(comp, status)
                elif comp.method == "go-local":
                    if force:
                        shutil.rmtree(comp.build_dir / "bin", ignore_errors=True)
                    action = _build_go_local(comp, status)
                else:
                    action = _install_apt(comp, status)
                problems = verify(comp)
                if problems:
                    raise InstallError(f"{comp.key} does not verify:\n  " + "\n  ".join(problems))
                _write_stamp(comp)
            seconds = time.monotonic() - started
            if action in ("built", "installed", "reused"):
                _record(comp, action, seconds)
            results.append(StepResult(comp.key, action, seconds))
            console.print(f"[green]✓[/] {comp.key:28} {action:9} {seconds:7.1f}s")
    return results
