"""Run the real stack program under Pulumi's mock runtime and record what it declares.

``render(env)`` returns every Kubernetes object and Helm release the stack
declares for an environment, without an engine, a cluster or credentials;
``write(...)`` stores one YAML file per object with stable names (for review
and GitOps). What render cannot show: the contents of Helm charts (the
release and its values are written, the chart's own objects are not: they
come from the chart at install time).
"""

from __future__ import annotations

import json

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

from gpufleet_admin.inventory import Inventory

_SKIP_TYPES = ("pulumi:providers:kubernetes", "kubernetes:helm.sh/v3:Release")


@dataclass
class Rendered:
    """What a stack declares: Kubernetes ``objects`` (manifest dicts) and Helm ``releases``."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    releases: list[dict[str, Any]] = field(default_factory=list)
    components: list[tuple[str, str]] = field(default_factory=list)


class _Recorder(pulumi.runtime.Mocks):
    """Pulumi mocks that record every registered resource and echo its inputs as outputs."""

    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        return f"{args.name}-id", args.inputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def render(inv: Inventory) -> Rendered:
    """Declare the stack for ``inv`` under mocks; return the declared objects and releases."""
    from gpufleet_admin.stack.program import compose

    recorder = _Recorder()
    pulumi.runtime.set_mocks(recorder, project="gpufleet", stack=inv.env, preview=False)

    @pulumi.runtime.test
    def _declare():
        compose(inv)

    _declare()
    out = Rendered()
    for r in recorder.resources:
        if r.typ == "kubernetes:helm.sh/v3:Release":
            out.releases.append(_release(r.inputs))
        elif r.typ.startswith("kubernetes:") and r.typ not in _SKIP_TYPES:
            out.objects.append(_object(r.typ, r.inputs))
        elif r.typ.startswith("gpufleet:"):
            out.components.append((r.typ, r.name))
    return out


def _object(typ: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """Rebuild a manifest from a typed resource's inputs (type token gives apiVersion/kind)."""
    _, gv, kind = typ.split(":")
    obj = {"apiVersion": gv.removeprefix("core/"), "kind": kind}
    obj.update({k: _ints(v) for k, v in inputs.items() if k not in ("apiVersion", "kind")})
    return obj


def _ints(value: Any) -> Any:
    """Pulumi carries numbers as floats; give back integers where they were integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def _release(inputs: dict[str, Any]) -> dict[str, Any]:
    keep = ("name", "namespace", "chart", "version", "repositoryOpts", "values")
    return {k: _ints(inputs[k]) for k in keep if k in inputs}


def file_name(obj: dict[str, Any]) -> str:
    """Stable file name: ``<kind>--[<namespace>--]<name>.yaml``, lower-case, ':' as '-'."""
    md = obj["metadata"]
    parts = [obj["kind"].lower(), md.get("namespace"), md["name"].replace(":", "-")]
    return "--".join(p for p in parts if p) + ".yaml"


#: The files an earlier render wrote into its folder (relative paths, JSON list).
INDEX = ".gpufleet-render.json"


def check_out(out: Path) -> None:
    """Make sure ``out`` (and ``out/helm``) can be written: create them, refusing a file in the way.

    Raises:
        NotADirectoryError: ``out``, ``out/helm`` or a folder above is a file (names it), or the
            folder cannot be created (the system's reason).
    """
    for folder in (out, out / "helm"):
        blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise NotADirectoryError(f"--out {out}: {blocker} exists and is not a folder")
    try:
        (out / "helm").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NotADirectoryError(f"--out {out}: cannot create the folder: {exc.strerror or exc}") from None


def _earlier_files(out: Path) -> set[str]:
    """The files an earlier render listed in ``out/INDEX``: only plain relative paths inside ``out``.

    An unreadable or hand-edited index never makes a render delete anything
    outside ``out`` (``../x``, absolute paths) or a folder.
    """
    try:
        listed = json.loads((out / INDEX).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(listed, list):
        return set()
    root = out.resolve()
    keep = set()
    for name in listed:
        if not isinstance(name, str) or not name.endswith(".yaml") or Path(name).is_absolute() or ".." in Path(name).parts:
            continue
        path = (out / name).resolve()
        if path.parent in (root, root / "helm") and not path.is_dir():
            keep.add(name)
    return keep


def write(rendered: Rendered, out: Path) -> list[Path]:
    """Write one YAML file per object into ``out/`` and per release into ``out/helm/``.

    Files that an earlier render wrote (listed in ``out/.gpufleet-render.json``)
    and that the stack no longer declares are removed, so the folder mirrors
    the stack; other files in ``out`` are never touched. Returns the paths written.

    Raises:
        NotADirectoryError: ``out`` (or ``out/helm``) exists and is not a folder.
        ValueError: two objects would be written to one file.
    """
    check_out(out)
    names = [file_name(obj) for obj in rendered.objects]
    names += [f"helm/release--{rel['namespace']}--{rel['name']}.yaml" for rel in rendered.releases]
    for name, obj in zip(names, rendered.objects):
        if names.count(name) > 1:
            raise ValueError(f"two objects render to {name}: {obj['kind']} {obj['metadata']}")
    for name, doc in zip(names, [*rendered.objects, *rendered.releases], strict=True):
        (out / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    for stale in sorted(_earlier_files(out) - set(names)):
        (out / stale).unlink(missing_ok=True)
    (out / INDEX).write_text(json.dumps(sorted(names), indent=1))
    return [out / name for name in names]
