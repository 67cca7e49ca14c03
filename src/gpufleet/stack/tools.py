"""The Pulumi CLI and the pulumi-kubernetes provider, built from the Go module proxy and cached.

This machine reaches no download site, so neither the CLI nor the provider
plugin can be fetched the usual way (``get.pulumi.com``, GitHub releases).
Both are Go programs whose source modules the Go module proxy serves; they
are built here the way the local cluster's components are (see
:mod:`gpufleet.local.install`) and kept under
``cache_dir()/components/<name>-<version>/bin``: verified once (``go version
-m`` names the pinned module and version; the CLI's ``pulumi version`` output
matches), stamped (sizes and mtimes), and reused without running anything
while the stamp matches.

Both modules have ``replace`` directives, so ``go install mod@version`` is
refused; each gets a generated build module of its own under
``cache_dir()/build/<name>-<version>``:

``pulumi`` (the CLI)
    requires ``github.com/pulumi/pulumi/pkg/v3`` and its sibling
    ``sdk/v3`` at the same version (upstream replaces ``sdk/v3 => ../sdk``)
    and copies pkg's other replace lines (forks such as clipboard); builds
    ``pkg/v3/cmd/pulumi`` with the version linked in.
``pulumi-kubernetes`` (the provider plugin ``pulumi-resource-kubernetes``)
    the proxy serves ``provider/v4`` only as a pseudo-version (a commit),
    whose ``replace sdk/v4 => ../sdk`` becomes the ``sdk_version`` pin. The
    upstream main package embeds ``schema-embed.json`` and
    ``terraform-mapping-embed.json``, which ``go generate`` makes from the
    ``schema.json`` and ``terraform-mapping.json`` in the module zip; the
    build module holds a copy of that main package plus the two generated
    files (what ``generate.go`` does: the schema with ``version`` set, both
    re-serialised compactly).

The Python language host (``pulumi-language-python``) is not needed: the
engine runs the program through the Automation API's inline program, which
serves the language runtime from the calling Python process (see
:mod:`gpufleet.stack.engine`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from gpufleet import paths
from gpufleet.versions import pin


class ToolError(RuntimeError):
    """A tool could not be fetched, built or verified; the message ends with the build log's tail."""


@dataclass(frozen=True)
class GoTool:
    """One Go program built from a pinned module through a generated build module.

    Attributes:
        name: cache name (``"pulumi"``, ``"pulumi-kubernetes"``).
        version: the pinned module version.
        module: the upstream module.
        binary: file name of the built program.
        package: main package to build from the module cache; ``""`` when the
            main package is generated into the build module (``main_dir``).
        main_dir: the upstream main package's folder inside ``module`` whose
            ``.go`` files are copied into the build module (embeds generated).
        requires: further ``(module, version)`` requirements (sibling modules).
        replaces: ``module => "target version"`` for upstream local-path replaces.
        ldflags: ``-X`` settings so the program reports its version.
        version_probe: argv after the binary whose output must contain ``version_text``.
        version_text: expected substring of the probe output.
        reports: the version the program reports about itself (plugin version).
        plugin: a Pulumi plugin: verified by asking it (``GetPluginInfo``) for its version.
    """

    name: str
    version: str
    module: str
    binary: str
    package: str = ""
    main_dir: str = ""
    requires: tuple[tuple[str, str], ...] = ()
    replaces: tuple[tuple[str, str], ...] = ()
    ldflags: tuple[str, ...] = ()
    version_probe: tuple[str, ...] = ()
    version_text: str = ""
    reports: str = ""
    plugin: bool = False

    @property
    def key(self) -> str:
        """``<name>-<version>``: the cache folder name."""
        return f"{self.name}-{self.version}"

    @property
    def dir(self) -> Path:
        """``cache_dir()/components/<name>-<version>``: ``bin/``, ``stamp.json``, ``install.json``."""
        return paths.cache_dir() / "components" / self.key

    @property
    def path(self) -> Path:
        """The cached program: ``<dir>/bin/<binary>``."""
        return self.dir / "bin" / self.binary

    @property
    def build_dir(self) -> Path:
        """The generated build module: ``cache_dir()/build/<name>-<version>``."""
        return paths.cache_dir() / "build" / self.key


@cache
def cli() -> GoTool:
    """The Pulumi CLI at the ``pulumi`` pin of ``versions.yaml``."""
    version, module = pin("pulumi"), pin("pulumi", "module")
    return GoTool(
        name="pulumi",
        version=version,
        module=module,
        binary="pulumi",
        package=f"{module}/cmd/pulumi",
        requires=((pin("pulumi", "sdk_module"), version),),
        ldflags=(f"{pin('pulumi', 'sdk_module')}/go/common/version.Version={version}",),
        version_probe=("version",),
        version_text=version,
        reports=version.lstrip("v"),
    )


@cache
def provider() -> GoTool:
    """The pulumi-kubernetes provider plugin at the ``pulumi_kubernetes`` pin of ``versions.yaml``."""
    version, module = pin("pulumi_kubernetes"), pin("pulumi_kubernetes", "module")
    sdk = pin("pulumi_kubernetes", "sdk_module")
    return GoTool(
        name="pulumi-kubernetes",
        version=version,
        module=module,
        binary="pulumi-resource-kubernetes",
        main_dir="cmd/pulumi-resource-kubernetes",
        replaces=((sdk, f"{sdk} {pin('pulumi_kubernetes', 'sdk_version')}"),),
        ldflags=(f"{module}/pkg/version.Version={version.lstrip('v')}",),
        reports=version.lstrip("v"),
        plugin=True,
    )


def tools() -> list[GoTool]:
    """Everything the engine needs, in build order (the CLI first: it is needed first)."""
    return [cli(), provider()]


# --------------------------------------------------------------------------- go helpers


def go_binary() -> str:
    """Path of the ``go`` tool.

    Raises:
        ToolError: no ``go`` on PATH nor in /usr/local/go/bin.
    """
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if not found:
        raise ToolError("the Go toolchain is needed to build the Pulumi CLI and provider (go not found on PATH)")
    return found


def _go_env() -> dict[str, str]:
    """The environment of go commands (no VCS stamping: module builds have no checkout)."""
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def module_dir(module: str, version: str) -> Path:
    """Folder of ``module@version`` in the Go module cache, downloaded through the proxy if missing.

    Raises:
        ToolError: with go's message (not served, no network and not cached).
    """
    proc = subprocess.run([go_binary(), "mod", "download", "-json", f"{module}@{version}"],
                          capture_output=True, text=True, env=_go_env(), cwd="/")
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        raise ToolError(f"go mod download {module}@{version}: {info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"])


_REPLACE = re.compile(r"^(\S+)(?:\s+v\S+)?\s+=>\s+(\S+)(?:\s+(v\S+))?$")


def upstream_replaces(gomod: str) -> list[tuple[str, str, str]]:
    """``(old, new, new_version)`` for each replace directive of a go.mod text (``""`` for a path).

    Handles the one-line form and ``replace ( ... )`` blocks; ignores comments.
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


def build_files(tool: GoTool, upstream_gomod: str, upstream_dir: Path | None = None) -> dict[str, str | bytes]:
    """The files of the generated build module (before ``go mod tidy``), by name.

    ``go.mod`` requires ``tool.module`` and ``tool.requires``; upstream
    version replaces are copied, local-path ones must be covered by
    ``tool.requires`` (a sibling required at a version) or ``tool.replaces``.
    With ``package`` set, ``tools.go`` imports it; with ``main_dir`` set,
    the upstream main package's ``.go`` files (from ``upstream_dir``) and its
    generated embeds are included.

    Raises:
        ToolError: an upstream local-path replace this tool does not cover.
    """
    covered = {m for m, _ in tool.requires} | {m for m, _ in tool.replaces}
    replaces = dict(tool.replaces)
    for old, new, new_version in upstream_replaces(upstream_gomod):
        if new_version:
            replaces.setdefault(old, f"{new} {new_version}")
        elif old not in covered:
            raise ToolError(f"{tool.module}@{tool.version} replaces {old} => {new} (a local path); "
                            f"pin it in versions.yaml and add it to the {tool.name} tool")
    m = re.search(r"^go\s+(\S+)", upstream_gomod, re.M)
    lines = [f"module gpufleet.local/build/{tool.name}", "", f"go {m.group(1) if m else '1.24'}", "", "require ("]
    lines += [f"\t{mod} {ver}" for mod, ver in ((tool.module, tool.version), *tool.requires)]
    lines += [")"]
    if replaces:
        lines += ["", "replace (", *(f"\t{k} => {v}" for k, v in sorted(replaces.items())), ")"]
    files: dict[str, str | bytes] = {"go.mod": "\n".join(lines) + "\n"}
    if tool.package:
        files["tools.go"] = f'//go:build tools\n\npackage tools\n\nimport _ "{tool.package}"\n'
    if tool.main_dir:
        if upstream_dir is None:
            raise ToolError(f"{tool.name}: the upstream module folder is needed to copy {tool.main_dir}")
        files.update(main_package(tool, upstream_dir / tool.main_dir))
    return files


def main_package(tool: GoTool, src: Path) -> dict[str, str | bytes]:
    """The upstream main package's ``.go`` files plus what its ``go generate`` step makes.

    pulumi-kubernetes' ``generate.go`` writes ``schema-embed.json`` (the
    schema with ``version`` set to the build's version) and
    ``terraform-mapping-embed.json`` (the mapping, compact); both are
    embedded by ``main.go``.
    """
    files: dict[str, str | bytes] = {}
    for f in sorted(src.glob("*.go")):
        text = f.read_text()
        if "//go:build ignore" in text:
            continue  # generate.go itself
        files[f.name] = text
    schema = json.loads((src / "schema.json").read_text())
    schema["version"] = tool.reports
    files["schema-embed.json"] = json.dumps(schema, separators=(",", ":"))
    mapping = json.loads((src / "terraform-mapping.json").read_text())
    files["terraform-mapping-embed.json"] = json.dumps(mapping, separators=(",", ":"))
    return files


# --------------------------------------------------------------------------- verification and cache


def verify(tool: GoTool, path: Path | None = None) -> list[str]:
    """Problems with the program at ``path`` (default: the cached one); empty when verified.

    Checks that it is executable, that ``go version -m`` lists ``tool.module``
    at ``tool.version`` (``-trimpath`` builds do not record ``-ldflags``, so
    the linked version is checked by running the program), and the version
    it reports: the probe's output, or a plugin's ``GetPluginInfo``.
    """
    path = path or tool.path
    if not os.access(path, os.X_OK):
        return [f"{path}: missing or not executable"]
    problems = []
    info = subprocess.run([go_binary(), "version", "-m", str(path)], capture_output=True, text=True).stdout
    fields = [line.split() for line in info.splitlines()]
    if not any(len(f) >= 3 and f[0] in ("mod", "dep") and (f[1], f[2]) == (tool.module, tool.version) for f in fields):
        problems.append(f"{path}: go version -m does not list {tool.module} {tool.version}")
    if tool.version_probe:
        out = subprocess.run([str(path), *tool.version_probe], capture_output=True, text=True, timeout=60)
        if tool.version_text not in out.stdout + out.stderr:
            problems.append(f"{path} {' '.join(tool.version_probe)}: expected {tool.version_text!r}, "
                            f"got {(out.stdout + out.stderr).strip()[:200]!r}")
    if tool.plugin:
        try:
            reported = plugin_version(path)
        except (OSError, RuntimeError) as exc:
            problems.append(f"{path}: GetPluginInfo failed: {exc}")
        else:
            if reported != tool.reports:
                problems.append(f"{path}: reports version {reported!r}, expected {tool.reports!r}")
    return problems


def plugin_version(path: Path, timeout: float = 30.0) -> str:
    """Start a Pulumi resource plugin, ask its version over gRPC (``GetPluginInfo``), stop it.

    A plugin prints the port it serves on as its first line of output.

    Raises:
        RuntimeError: it printed no port, or the call failed.
    """
    import grpc
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import provider_pb2_grpc

    proc = subprocess.Popen([str(path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"expected a port on its first line, got {port!r} (exit {proc.poll()})")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            try:
                return stub.GetPluginInfo(empty_pb2.Empty(), timeout=timeout).version
            except grpc.RpcError as exc:
                raise RuntimeError(str(exc)) from None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _spec_hash(tool: GoTool) -> str:
    """A short hash of the tool's definition: a changed pin or flag invalidates the stamp."""
    return hashlib.sha256(json.dumps(asdict(tool), sort_keys=True).encode()).hexdigest()[:16]


def _fingerprint(path: Path) -> list[int] | None:
    """``[size, mtime_ns]`` of a file, None when it is missing."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


def stamped(tool: GoTool) -> bool:
    """True when the cached program is unchanged since it was last verified (nothing is run)."""
    try:
        stamp = json.loads((tool.dir / "stamp.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return stamp.get("spec") == _spec_hash(tool) and stamp.get("binary") == _fingerprint(tool.path)


def _write_stamp(tool: GoTool) -> None:
    """Record that the cached program verified (see :func:`stamped`)."""
    (tool.dir / "stamp.json").write_text(json.dumps({"spec": _spec_hash(tool), "binary": _fingerprint(tool.path)}))


def build_record(tool: GoTool) -> dict[str, dict[str, float | str]]:
    """What builds recorded in ``<dir>/install.json``.

    ``{"built": {"seconds": wall, "cpu_seconds": user+sys of the go commands, "finished": iso}}``;
    CPU seconds do not depend on what else the machine was doing.
    """
    try:
        return json.loads((tool.dir / "install.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _children_cpu() -> float:
    """User+system CPU seconds of finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _record(tool: GoTool, action: str, seconds: float, cpu: float) -> None:
    """Add one step's wall and CPU seconds to ``install.json``."""
    data = build_record(tool)
    data[action] = {"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (tool.dir / "install.json").write_text(json.dumps(data, indent=1))


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive file lock: one build at a time, across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log (``""`` when it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def _run(argv: list[str], cwd: Path, log: Path, progress: Callable[[str], None]) -> None:
    """Run one build step, appending its output to ``log``; ``progress`` gets a line now and then."""
    started = time.monotonic()
    with open(log, "a") as out:
        out.write(f"\n$ (cd {cwd} && {' '.join(argv)})\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=cwd, env=_go_env(), stdout=out, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        count, shown = 0, 0.0
        for line in proc.stderr:
            out.write(line)
            count += not line.startswith(("go: ", "#"))
            if time.monotonic() - shown > 30:
                shown = time.monotonic()
                progress(f"  {argv[1]}: {count} packages, {shown - started:.0f}s ({line.strip()[:60]})")
        rc = proc.wait()
    if rc != 0:
        raise ToolError(f"{' '.join(argv[:2])} failed (exit {rc}) in {cwd}; log {log}:\n{_tail(log)}")


def _build(tool: GoTool, progress: Callable[[str], None]) -> None:
    """Generate the build module, ``go mod tidy``, ``go build`` into ``build_dir/bin``, copy into the cache."""
    bdir = tool.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    log = bdir / "build.log"
    upstream = module_dir(tool.module, tool.version)
    files = build_files(tool, (upstream / "go.mod").read_text(), upstream)
    # `go mod tidy` rewrites go.mod, so what was generated is remembered by hash.
    digest = hashlib.sha256()
    for name, content in sorted(files.items()):
        digest.update(name.encode() + b"\0" + (content.encode() if isinstance(content, str) else content))
    marker = bdir / ".generated"
    if not (bdir / "go.sum").exists() or not marker.exists() or marker.read_text() != digest.hexdigest():
        for name, content in files.items():
            (bdir / name).write_bytes(content.encode() if isinstance(content, str) else content)
        progress(f"{tool.key}: go mod tidy")
        _run([go_binary(), "mod", "tidy"], bdir, log, progress)
        marker.write_text(digest.hexdigest())
    progress(f"{tool.key}: go build {tool.package or '.'}")
    out = bdir / "bin" / tool.binary
    ldflags = " ".join(["-s", "-w", *(f"-X {x}" for x in tool.ldflags)])
    _run([go_binary(), "build", "-v", "-trimpath", f"-ldflags={ldflags}", "-o", str(out), tool.package or "."],
         bdir, log, progress)
    tool.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tool.path.with_suffix(".tmp")
    shutil.copy2(out, tmp)
    tmp.replace(tool.path)


def ensure(tool: GoTool, *, force: bool = False, progress: Callable[[str], None] = lambda _: None) -> Path:
    """The cached, verified program of ``tool``, built first if needed; returns its path.

    A matching stamp returns at once (nothing is run). Otherwise the cached
    program is verified, else rebuilt (a finished build in ``build_dir`` is
    reused when it verifies). Builds are serialised by a lock; a build's wall
    time is recorded in ``<dir>/install.json``.

    Raises:
        ToolError: download, build or verification failed (with the log tail).
    """
    if not force and stamped(tool):
        return tool.path
    with _lock(paths.cache_dir() / "components" / ".pulumi-tools.lock"):
        if not force and stamped(tool):
            return tool.path
        tool.dir.mkdir(parents=True, exist_ok=True)
        started, cpu = time.monotonic(), _children_cpu()
        action = "verified"
        if force or verify(tool):
            built = tool.build_dir / "bin" / tool.binary
            if not force and built.exists() and not verify(tool, built):
                action = "reused"
                tool.path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, tool.path)
            else:
                action = "built"
                progress(f"{tool.key}: building (cold builds take minutes; log {tool.build_dir / 'build.log'})")
                _build(tool, progress)
            problems = verify(tool)
            if problems:
                raise ToolError(f"{tool.key} does not verify:\n  " + "\n  ".join(problems))
            _record(tool, action, time.monotonic() - started, _children_cpu() - cpu)
        _write_stamp(tool)
        progress(f"{tool.key}: {action} in {time.monotonic() - started:.1f}s")
        return tool.path


def ensure_all(*, force: bool = False, progress: Callable[[str], None] = lambda _: None) -> dict[str, Path]:
    """:func:`ensure` every tool; returns ``{name: path}``."""
    return {t.name: ensure(t, force=force, progress=progress) for t in tools()}
