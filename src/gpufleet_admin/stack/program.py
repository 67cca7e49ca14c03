"""The stack program: read config and inventory, compose roles, export.

Thin on purpose (Pulumi's examples): environments differ by data only. The
stack name selects ``inventories/<stack>/`` unless the stack config sets
``gpufleet:inventory``; every other ``gpufleet:<variable>`` stack-config key
overrides that variable with the highest precedence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi

from gpufleet_admin.inventory import Inventory
from gpufleet_admin.stack.role import Namespaces, NamespacesArgs, RoleArgs, RoleComponent
from roles.registry import ROLES, load

PROJECT = "gpufleet"


def stack_config() -> dict[str, Any]:
    """``gpufleet:*`` stack-config values (JSON-decoded where they are JSON), keyed without the prefix.

    The engine hands config to the program in its Run request, which the SDK
    keeps in ``pulumi.runtime.config.CONFIG`` (inline programs of the
    Automation API get it only that way); ``PULUMI_CONFIG`` in the
    environment is the older channel. The request wins, as in
    ``pulumi.runtime.config.get_config``.
    """
    from pulumi.runtime import config as runtime_config

    raw = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    return _decode(raw)


def _decode(raw: dict[str, Any]) -> dict[str, Any]:
    """``gpufleet:`` keys of ``raw`` without the prefix, string values JSON-decoded where they are JSON."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not key.startswith(f"{PROJECT}:"):
            continue
        try:
            out[key.split(":", 1)[1]] = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            out[key.split(":", 1)[1]] = value
    return out


#: Top-level keys of a Pulumi stack settings file (Pulumi's project/stack file reference).
STACK_FILE_KEYS = frozenset({"config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment"})


def file_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The ``gpufleet:*`` values of a stack config file (``Pulumi.<stack>.yaml``), as the program sees them.

    Returns ``(values, secret keys left out)``: ``secure:`` values can only
    be decrypted by the engine. A missing file gives no values.

    Raises:
        ValueError: the file is not YAML with a ``config:`` mapping, has a top-level key
            Pulumi does not know (a typo such as ``confg:``), or a config key without a
            namespace (names the file and the key).
    """
    import yaml

    from gpufleet.componentconfig import yaml_problem

    if not path.is_file():
        return {}, []
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({yaml_problem(exc)})") from None
    config = doc.get("config", {}) if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a Pulumi stack config file with a config: mapping")
    unknown = sorted(set(doc) - STACK_FILE_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown top-level key {unknown[0]!r}: expected one of {', '.join(sorted(STACK_FILE_KEYS))}")
    bare = sorted(k for k in config if ":" not in str(k))
    if bare:
        raise ValueError(f"{path}: config key {bare[0]!r} is not namespaced: expected {PROJECT}:{bare[0]}")
    secrets = sorted(k for k, v in config.items() if isinstance(v, dict) and "secure" in v)
    return _decode({k: v for k, v in config.items() if k not in secrets}), secrets


def namespaces(inv: Inventory) -> list[str]:
    """Every Namespace any enabled role declares, once, in role order."""
    names: list[str] = []
    for role in ROLES:
        names += [o["metadata"]["name"] for o in role.objects(inv) if o["kind"] == "Namespace"]
    return list(dict.fromkeys(names))


def compose(inv: Inventory, provider: pulumi.ProviderResource | None = None) -> dict[str, RoleComponent]:
    """Declare the Namespaces and every enabled role, in registry order; returns role name -> component.

    A role's component depends on the Namespaces and on the components of
    the roles it waits for (``Role.after``) that are enabled.
    """
    ns = Namespaces("namespaces", NamespacesArgs(tuple(namespaces(inv)), provider))
    components: dict[str, RoleComponent] = {}
    for role in ROLES:
        if not inv.enabled(role.name):
            continue
        deps: list[pulumi.Resource] = [ns] + [components[d] for d in role.after if d in components]
        components[role.name] = RoleComponent(role.component_name, RoleArgs(role, inv, provider),
                                              pulumi.ResourceOptions(depends_on=deps))
    return components


def main(provider: pulumi.ProviderResource | None = None) -> None:
    """The program: entry point of ``stacks/__main__.py`` and of the engine's inline program.

    Args:
        provider: the Kubernetes provider every resource uses (the engine
            passes an explicit one pointed at the target cluster); None uses
            Pulumi's default provider.
    """
    config = stack_config()
    env = config.pop("inventory", None) or pulumi.get_stack()
    inv = load(env, overrides=config, overrides_file=f"Pulumi.{pulumi.get_stack()}.yaml")
    components = compose(inv, provider)
    pulumi.export("environment", env)
    pulumi.export("nodes", len(inv.hosts))
    pulumi.export("gpus", sum(f.gpus for f in inv.flavors().values()))
    pulumi.export("roles", sorted(components))
