"""Run the real stack program under Pulumi's mock runtime and record what it declares.

``render(env)`` returns every Kubernetes object and Helm release the stack
declares for an environment, without an engine, a cluster or credentials;
``write(...)`` stores one YAML file per object with stable names (for review
and GitOps). What render cannot show: the contents of Helm charts (the
release and its values are written, the chart's own objects are not: they
come from the chart at install time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

from gpufleet.inventory import Inventory

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
    from gpufleet.stack.program import compose

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


def write(rendered: Rendered, out: Path) -> list[Path]:
    """Write one YAML file per object into ``out/`` and per release into ``out/helm/``.

    Files left from an earlier render that the stack no longer declares are
    removed, so the folder mirrors the stack exactly. Returns the paths written.
    """
    out.mkdir(parents=True, exist_ok=True)
    (out / "helm").mkdir(exist_ok=True)
    written: list[Path] = []
    for obj in rendered.objects:
        path = out / file_name(obj)
        if path in written:
            raise ValueError(f"two objects render to {path.name}: {obj['kind']} {obj['metadata']}")
        path.write_text(yaml.safe_dump(obj, sort_keys=False))
        written.append(path)
    for rel in rendered.releases:
        path = out / "helm" / f"release--{rel['namespace']}--{rel['name']}.yaml"
        path.write_text(yaml.safe_dump(rel, sort_keys=False))
        written.append(path)
    for stale in list(out.glob("*.yaml")) + list((out / "helm").glob("*.yaml")):
        if stale not in written:
            stale.unlink()
    return written
