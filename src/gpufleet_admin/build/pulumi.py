"""The Pulumi CLI and the pulumi-kubernetes provider, built from the Go module proxy and cached.

This machine reaches no download site, so neither the CLI nor the provider
plugin can be fetched the usual way (``get.pulumi.com``, GitHub releases).
Both are Go programs whose source modules the Go module proxy serves; they
are built here the way the local cluster's components are (see
:mod:`gpufleet_workshop.local.install`) and kept under
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
:mod:`gpufleet_admin.stack.engine`).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from gpufleet import paths
from gpufleet_admin.build import gobuild
from gpufleet_admin.files import copy_atomic, digest, fingerprint, locked
from gpufleet_admin.build.gobuild import Cached, GoError
from gpufleet_admin.versions import pin


class ToolError(GoError):
    """A tool could not be built or verified; the message ends with the build log's tail.

    Go download and build steps raise :class:`gpufleet_admin.build.gobuild.GoError`, its
    base class; catch that to handle both.
    """


@dataclass(frozen=True)
class GoTool(Cached):
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
    def path(self) -> Path:
        """The cached program: ``<dir>/bin/<binary>``."""
        return self.dir / "bin" / self.binary


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


# --------------------------------------------------------------------------- build module


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
    for old, new, new_version in gobuild.parse_replaces(upstream_gomod):
        if new_version:
            replaces.setdefault(old, f"{new} {new_version}")
        elif old not in covered:
            raise ToolError(f"{tool.module}@{tool.version} replaces {old} => {new} (a local path); "
                            f"pin it in versions.yaml and add it to the {tool.name} tool")
    gomod = gobuild.build_module(tool.name, [(tool.module, tool.version), *tool.requires], replaces,
                                 gobuild.go_directive(upstream_gomod, "1.24"))
    files: dict[str, str | bytes] = {"go.mod": gomod}
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
    if not gobuild.built_from(path, tool.module, tool.version):
        problems.append(f"{path}: go version -m does not list {tool.module} {tool.version}")
    if tool.version_probe and (problem := gobuild.version_problem(path, tool.version_probe, tool.version_text)):
        problems.append(problem)
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
    return digest(asdict(tool))


def stamped(tool: GoTool) -> bool:
    """True when the cached program is unchanged since it was last verified (nothing is run)."""
    try:
        stamp = json.loads((tool.dir / "stamp.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return stamp.get("spec") == _spec_hash(tool) and stamp.get("binary") == fingerprint(tool.path)


def _write_stamp(tool: GoTool) -> None:
    """Record that the cached program verified (see :func:`stamped`)."""
    (tool.dir / "stamp.json").write_text(json.dumps({"spec": _spec_hash(tool), "binary": fingerprint(tool.path)}))


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


def _run(argv: list[str], cwd: Path, log: Path, progress: Callable[[str], None]) -> None:
    """Run one build step (:func:`gpufleet_admin.build.gobuild.run_logged`); ``progress`` gets a line every 30 s."""
    shown = [0.0]

    def every_30s(count: int, seconds: float, line: str) -> None:
        if seconds - shown[0] > 30:
            shown[0] = seconds
            progress(f"  {argv[1]}: {count} packages, {seconds:.0f}s ({line[:60]})")

    gobuild.run_logged(argv, cwd, log, progress=every_30s)


def _build(tool: GoTool, progress: Callable[[str], None]) -> None:
    """Generate the build module, ``go mod tidy``, ``go build`` into ``build_dir/bin``, copy into the cache."""
    bdir = tool.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    log = bdir / "build.log"
    upstream = gobuild.module_dir(tool.module, tool.version)
    files = build_files(tool, (upstream / "go.mod").read_text(), upstream)
    # `go mod tidy` rewrites go.mod, so what was generated is remembered by hash.
    generated = hashlib.sha256()
    for name, content in sorted(files.items()):
        generated.update(name.encode() + b"\0" + (content.encode() if isinstance(content, str) else content))
    marker = bdir / ".generated"
    if not (bdir / "go.sum").exists() or not marker.exists() or marker.read_text() != generated.hexdigest():
        for name, content in files.items():
            (bdir / name).write_bytes(content.encode() if isinstance(content, str) else content)
        progress(f"{tool.key}: go mod tidy")
        _run([gobuild.go_binary(), "mod", "tidy"], bdir, log, progress)
        marker.write_text(generated.hexdigest())
    progress(f"{tool.key}: go build {tool.package or '.'}")
    out = bdir / "bin" / tool.binary
    _run([gobuild.go_binary(), "build", "-v", "-trimpath", f"-ldflags={gobuild.ldflags(tool.ldflags)}",
          "-o", str(out), tool.package or "."], bdir, log, progress)
    copy_atomic(out, tool.path)


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
    with locked(paths.cache_dir() / "components" / ".pulumi-tools.lock"):
        if not force and stamped(tool):
            return tool.path
        tool.dir.mkdir(parents=True, exist_ok=True)
        started, cpu = time.monotonic(), _children_cpu()
        action = "verified"
        if force or verify(tool):
            built = tool.build_dir / "bin" / tool.binary
            if not force and built.exists() and not verify(tool, built):
                action = "reused"
                copy_atomic(built, tool.path)
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
