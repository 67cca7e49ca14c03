"""Run the stack with the real Pulumi engine: preview, up, destroy.

The program is :func:`gpufleet_admin.stack.program.main`, run as an Automation API
*inline program*: the CLI is started with ``--client`` and talks to a
language runtime served from this Python process, so the Python language
host (``pulumi-language-python``, which the Go module proxy does not serve)
is never needed. The CLI and the Kubernetes provider plugin come from
:mod:`gpufleet_admin.build.pulumi` (built from the Go module proxy, cached).

What the engine is given, and why:

* **State**: a local file backend, ``PULUMI_BACKEND_URL=file://<backend>``
  (default ``state_dir()/pulumi/backend``); no cloud login.
* **Secrets**: ``PULUMI_CONFIG_PASSPHRASE`` (or ``..._FILE``) from the
  environment when set; otherwise a random passphrase generated once into
  ``state_dir()/pulumi/passphrase`` (mode 0600), whatever the backend, since
  the salt it is checked against lives in ``Pulumi.<stack>.yaml`` of the
  project folder. Set the variable to share a stack between machines.
* **Plugins**: ``PULUMI_HOME`` is ``cache_dir()/pulumi-home``; the provider
  built here is installed there (``pulumi plugin install resource kubernetes
  <version> --file``) under the version it really is (the
  ``pulumi_kubernetes`` pin), and the program's explicit provider asks for
  exactly that version. Automatic plugin downloads are off
  (``PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION``), so a resource that
  slipped past the explicit provider fails loudly (no plugin for the SDK's
  default version) instead of reaching whatever cluster ``KUBECONFIG`` names.
* **Cluster**: the explicit provider's ``kubeconfig`` is the file given to
  :class:`Target` (for the local environment, the local cluster's admin
  kubeconfig, ``invoke local.kubeconfig``).
* **Config**: the project folder (``work_dir``, default the checkout root
  with ``Pulumi.yaml``) holds ``Pulumi.<stack>.yaml``; its ``gpufleet:*``
  values override inventory variables (see :mod:`gpufleet_admin.stack.program`).
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulumi import automation as auto

from gpufleet import paths
from gpufleet_admin.build import pulumi as tools

PROJECT = "gpufleet"
#: Provider resource name in every stack (its URN is ``...::pulumi:providers:kubernetes::kubernetes``).
PROVIDER_NAME = "kubernetes"

Printer = Callable[[str], None]


class EngineError(RuntimeError):
    """A preview, update or destroy failed; the message carries the engine's own words."""


#: gpufleet's Pulumi project file: its project-level ``config`` is what ``pulumi up``'s default provider reads.
PROJECT_FILE = paths.REPO_ROOT / "Pulumi.yaml"


def project_setting(key: str, project_file: Path = PROJECT_FILE) -> Any:
    """The value of ``key`` (``kubernetes:enableConfigMapMutable``) in the project file's ``config``, in
    either of the forms Pulumi accepts: ``key: value``, or ``key: {value: ...}`` / ``{default: ...}``.

    Raises:
        EngineError: the file cannot be read, or sets no value for ``key``.
    """
    import yaml

    try:
        entry = ((yaml.safe_load(project_file.read_text()) or {}).get("config") or {})[key]
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError) as exc:
        raise EngineError(f"{project_file}: expected config.{key} ({type(exc).__name__}: {exc})") from None
    if not isinstance(entry, dict):
        return entry
    for field_ in ("value", "default"):
        if field_ in entry:
            return entry[field_]
    raise EngineError(f"{project_file}: config.{key}: expected a value (or value:/default:), got {entry!r}")


def default_backend() -> Path:
    """The file backend's folder: ``state_dir()/pulumi/backend``."""
    return paths.state_dir() / "pulumi" / "backend"


def pulumi_home() -> Path:
    """``PULUMI_HOME`` of every engine run: ``cache_dir()/pulumi-home`` (plugins live there)."""
    return paths.cache_dir() / "pulumi-home"


@dataclass(frozen=True)
class Target:
    """Which stack runs against which cluster, and where its state and config live.

    Attributes:
        env: environment, i.e. the inventory folder; also the stack name.
        kubeconfig: kubeconfig of the target cluster (the provider reads this file).
        work_dir: the project folder holding ``Pulumi.yaml`` and ``Pulumi.<env>.yaml``.
        backend: folder of the local file backend (created if missing).
        config: stack-config values to set before running, e.g.
            ``{"gpufleet:kueue_reserve_gpus": "8"}``.
        refresh: read the live objects into the stack's state before the
            operation (``pulumi up --refresh``), so objects deleted or
            changed outside Pulumi are seen; a local cluster started afresh
            (``local.up --fresh``, ``local.down --purge``) has none of the
            objects the state still records.
    """

    env: str
    kubeconfig: Path
    work_dir: Path = paths.REPO_ROOT
    backend: Path = field(default_factory=default_backend)
    config: dict[str, str] = field(default_factory=dict)
    refresh: bool = False


@dataclass
class Result:
    """What one engine operation did (or, for a preview, would do).

    Attributes:
        changes: URN -> operation (``create``, ``update``, ``replace``,
            ``delete``, ...) of every resource whose step is not ``same``.
        summary: operation -> count, the engine's own change summary
            (``same`` included).
        outputs: stack outputs after an update (empty otherwise).
        stdout: the engine's full output.
    """

    changes: dict[str, str] = field(default_factory=dict)
    summary: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    stdout: str = ""

    @property
    def changed(self) -> bool:
        """True when any resource is created, updated, replaced or deleted."""
        return bool(self.changes)


def passphrase_env() -> dict[str, str]:
    """``PULUMI_CONFIG_PASSPHRASE(_FILE)``: the caller's when set, else this machine's generated one.

    The generated passphrase is ``state_dir()/pulumi/passphrase`` (mode
    0600), created on first use.
    """
    if os.environ.get("PULUMI_CONFIG_PASSPHRASE") is not None or os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        return {}
    path = paths.state_dir() / "pulumi" / "passphrase"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(24))
    return {"PULUMI_CONFIG_PASSPHRASE_FILE": str(path)}


def engine_env(target: Target) -> dict[str, str]:
    """Environment of every CLI call: file backend, passphrase, no update check, no plugin downloads."""
    target.backend.mkdir(parents=True, exist_ok=True)
    return {
        "PULUMI_BACKEND_URL": target.backend.resolve().as_uri(),
        "PULUMI_HOME": str(pulumi_home()),
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
        **passphrase_env(),
    }


def install_provider(cli: Path, provider: Path, version: str, printer: Printer = lambda _: None) -> Path:
    """Make ``provider`` the ``kubernetes`` resource plugin ``version`` in :func:`pulumi_home`.

    Skipped when the installed plugin has the same size and mtime as
    ``provider``; otherwise ``pulumi plugin install resource kubernetes
    <version> --file <provider> --reinstall``.

    Returns:
        The installed plugin folder.

    Raises:
        EngineError: the CLI refused (its stderr is the message).
    """
    plugin_dir = pulumi_home() / "plugins" / f"resource-kubernetes-v{version}"
    installed = plugin_dir / provider.name
    src = provider.stat()
    try:
        dst = installed.stat()
        if (dst.st_size, dst.st_mtime_ns) == (src.st_size, src.st_mtime_ns):
            return plugin_dir
    except FileNotFoundError:
        pass
    printer(f"installing {provider} as resource plugin kubernetes v{version}")
    env = dict(os.environ, PULUMI_HOME=str(pulumi_home()), PULUMI_SKIP_UPDATE_CHECK="true")
    proc = subprocess.run([str(cli), "plugin", "install", "resource", "kubernetes", version, "--file", str(provider),
                           "--reinstall", "--non-interactive"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise EngineError(f"pulumi plugin install resource kubernetes {version} failed: {proc.stderr.strip()}")
    os.utime(installed, ns=(src.st_atime_ns, src.st_mtime_ns))
    return plugin_dir


def _config_map_mutable(pulumi) -> bool:
    """``kubernetes:enableConfigMapMutable`` as the stack sees it (Pulumi.yaml's value, or a stack's own in
    ``Pulumi.<stack>.yaml``), else Pulumi.yaml's read directly (a work folder without the project file)."""
    value = pulumi.Config("kubernetes").get_bool("enableConfigMapMutable")
    return bool(project_setting("kubernetes:enableConfigMapMutable")) if value is None else value


def program(target: Target) -> Callable[[], None]:
    """The inline program: an explicit Kubernetes provider for ``target``, then the stack program."""

    def run() -> None:
        """Runs inside the engine's Run request, in this process."""
        import pulumi
        import pulumi_kubernetes as k8s

        from gpufleet_admin.stack.program import main

        provider = k8s.Provider(
            PROVIDER_NAME,
            kubeconfig=str(target.kubeconfig),
            # A component's configuration ConfigMap keeps its name (its Deployment mounts it) and is updated in
            # place; the Deployment's checksum annotation rolls its pods. The provider's default replaces a
            # changed ConfigMap (delete, then create: a window without it). Set in Pulumi.yaml, for `pulumi up`'s
            # default provider and this one alike.
            enable_config_map_mutable=_config_map_mutable(pulumi),
            opts=pulumi.ResourceOptions(version=tools.provider().reports),
        )
        main(provider)

    return run


def stack(target: Target, printer: Printer = lambda _: None) -> auto.Stack:
    """Create or select the stack ``target.env`` (tools built and plugin installed first).

    Sets ``target.config`` in the stack's config file before returning.
    """
    if not target.kubeconfig.is_file():
        raise EngineError(f"kubeconfig {target.kubeconfig} does not exist (is the cluster up?)")
    cli = tools.ensure(tools.cli(), progress=printer)
    provider = tools.ensure(tools.provider(), progress=printer)
    install_provider(cli, provider, tools.provider().reports, printer)
    opts = auto.LocalWorkspaceOptions(
        work_dir=str(target.work_dir),
        pulumi_home=str(pulumi_home()),
        env_vars=engine_env(target),
        pulumi_command=auto.PulumiCommand(root=str(cli.parent.parent)),
    )
    if not (target.work_dir / "Pulumi.yaml").exists():
        opts.project_settings = auto.ProjectSettings(name=PROJECT, runtime="python")
    st = auto.create_or_select_stack(stack_name=target.env, project_name=PROJECT, program=program(target), opts=opts)
    if target.config:
        st.set_all_config({k: auto.ConfigValue(v) for k, v in target.config.items()})
    return st


class _Recorder:
    """Collects each resource step of an operation from the engine's events."""

    def __init__(self) -> None:
        """Start with no changes recorded."""
        self.changes: dict[str, str] = {}

    def __call__(self, event: auto.EngineEvent) -> None:
        """Record a resource step that is not ``same`` (URN -> operation)."""
        pre = event.resource_pre_event
        if pre is not None and pre.metadata.op != auto.OpType.SAME:
            self.changes[pre.metadata.urn] = pre.metadata.op.value


def _summary(counts: dict[Any, int] | None) -> dict[str, int]:
    """The engine's change counts keyed by plain operation names (``"create"``)."""
    return {getattr(k, "value", str(k)): v for k, v in (counts or {}).items()}


def _fail(op: str, exc: auto.CommandError) -> EngineError:
    """An EngineError carrying the CLI's diagnostics and stderr.

    The full output has already gone to the printer; repeating it would
    bury the cause, so only the ``Diagnostics:`` block is kept when there is one.
    """
    text = str(exc)
    stdout, _, stderr = text.partition("\n stderr:")
    start = stdout.find("Diagnostics:")
    if start < 0:
        return EngineError(f"pulumi {op} failed:\n{text}")
    diag = stdout[start:]
    for end in ("\nOutputs:", "\nResources:"):
        if end in diag:
            diag = diag[:diag.index(end)]
    return EngineError(f"pulumi {op} failed:\n{diag.rstrip()}\n{stderr.strip()}".rstrip())


def preview(target: Target, printer: Printer = print) -> Result:
    """``pulumi preview``: what an update would change; the engine's output goes to ``printer``."""
    st = stack(target, printer)
    rec = _Recorder()
    try:
        res = st.preview(on_output=printer, on_event=rec, diff=False, color="never", refresh=target.refresh)
    except auto.CommandError as exc:
        raise _fail("preview", exc) from None
    return Result(changes=rec.changes, summary=_summary(res.change_summary), stdout=res.stdout)


def up(target: Target, printer: Printer = print) -> Result:
    """``pulumi up --yes``: create or update the stack's resources on the target cluster."""
    st = stack(target, printer)
    rec = _Recorder()
    try:
        res = st.up(on_output=printer, on_event=rec, color="never", refresh=target.refresh)
    except auto.CommandError as exc:
        raise _fail("up", exc) from None
    return Result(changes=rec.changes, summary=_summary(res.summary.resource_changes),
                  outputs={k: v.value for k, v in res.outputs.items()}, stdout=res.stdout)


def destroy(target: Target, printer: Printer = print, *, remove: bool = False) -> Result:
    """``pulumi destroy --yes``: delete every resource of the stack; ``remove`` also deletes the stack."""
    st = stack(target, printer)
    rec = _Recorder()
    try:
        res = st.destroy(on_output=printer, on_event=rec, color="never", remove=remove, refresh=target.refresh)
    except auto.CommandError as exc:
        raise _fail("destroy", exc) from None
    return Result(changes=rec.changes, summary=_summary(res.summary.resource_changes), stdout=res.stdout)


def destroy_preview(target: Target, printer: Printer = print) -> Result:
    """``pulumi destroy --preview-only``: what a destroy would delete (used by ``invoke destroy`` without ``--yes``)."""
    st = stack(target, printer)
    rec = _Recorder()
    try:
        res = st.preview_destroy(on_output=printer, on_event=rec, color="never", refresh=target.refresh)
    except auto.CommandError as exc:
        raise _fail("destroy --preview-only", exc) from None
    return Result(changes=rec.changes, summary=_summary(res.change_summary), stdout=res.stdout)
