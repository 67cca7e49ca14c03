"""Load an environment's inventory: merge variables by Ansible precedence, validate all.

Precedence (lowest first), as in Ansible: role defaults < group_vars/all <
group_vars/<group> (parents before children) < host_vars/<host> < Pulumi
stack config. Role variables are cluster-wide, so they may only be set in
role defaults, group_vars/all or stack config; node variables (GPU model,
HCAs, capacity) follow the full chain per host.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from gpufleet.componentconfig import expected
from gpufleet.paths import INVENTORIES, ROLES

from .checks import cross_checks
from .errors import MISSING, InventoryError, Problem
from .files import InventoryFiles, Layer, read_inventory, read_yaml
from .inventory import Host, Inventory
from .models import FLEET_KEYS, HOST_KEYS, FleetVars, HostVars
from .roles import defaults_file, defaults_path, role_of

#: Role name -> the pydantic model of its variables, in the order the stack composes the roles.
RoleModels = Mapping[str, type[BaseModel]]

#: The group whose leaf groups are racks of GPU nodes.
GPU_GROUP = "gpu_nodes"


def environments() -> list[str]:
    """Names of the inventories under ``inventories/``."""
    return sorted(p.name for p in INVENTORIES.iterdir() if (p / "hosts.yml").exists())


#: A check over the whole validated inventory (a component's configuration built from it): its problems.
Check = Callable[[Inventory], list[Problem]]


def load(
    env: str,
    role_models: RoleModels,
    *,
    overrides: Mapping[str, Any] | None = None,
    overrides_file: str | None = None,
    nodes: int | None = None,
    root: Path | None = None,
    checks: Sequence[Check] = (),
) -> Inventory:
    """Load and validate ``inventories/<env>`` (or ``root``) against the given roles' variable models.

    Callers that want every role pass the registry's models; ``roles.registry.load``
    does that, and is what entry points call.

    Args:
        env: environment name (a folder of ``inventories/``).
        role_models: role name -> model of its variables (``roles/<role>/vars.py: Vars``),
            in composition order; each role's defaults are read from ``roles/<role>/defaults.yaml``.
        overrides: stack-config values, highest precedence (e.g. Pulumi config).
        overrides_file: name shown in messages for ``overrides``.
        nodes: for simulated fleets, the number of hosts (overrides
            ``fleet_simulated_nodes``).
        root: inventory folder to read instead of ``inventories/<env>``.
        checks: run once every variable is valid on its own (the roles' builders of their
            components' configurations, whose models check what spans variables).

    Raises:
        InventoryError: listing every problem (file, key, value, expected);
            nothing is returned half-valid.
    """
    root = root or INVENTORIES / env
    if not (root / "hosts.yml").exists():
        known = ", ".join(environments())
        raise InventoryError([Problem(str(root), "(environment)", env, f"an inventory folder with hosts.yml (known: {known})")])
    files = read_inventory(root)
    problems = list(files.problems)
    over_layer = Layer(overrides_file or f"Pulumi.{env}.yaml (stack config)", dict(overrides or {}))

    defaults = [_role_defaults(r, problems) for r in role_models]
    problems += _classify(files, over_layer, role_models)
    cluster_layers = defaults + files.group_layers.get("all", []) + [over_layer]
    cluster, origin = _merge(cluster_layers, lambda k: role_of(k, role_models) is not None or k in FLEET_KEYS)

    roles: dict[str, BaseModel] = {}
    for role, vars_model in role_models.items():
        keys = set(vars_model.model_fields)
        model = _validate(vars_model, {k: v for k, v in cluster.items() if k in keys}, origin, problems,
                          default_file=defaults_file(role))
        if model is not None:
            roles[role] = model
    fleet_values = {k: v for k, v in cluster.items() if k in FLEET_KEYS}
    if nodes is not None:
        fleet_values["fleet_simulated_nodes"] = nodes
        origin["fleet_simulated_nodes"] = "--nodes"
    fleet = _validate(FleetVars, fleet_values, origin, problems, default_file="group_vars/all")

    if fleet is not None and fleet.fleet_simulated_nodes:
        _simulate_hosts(files, fleet.fleet_simulated_nodes, problems)
    hosts = _hosts(files, problems)
    inventory = Inventory(env=env, root=root, hosts=hosts, fleet=fleet or FleetVars(), roles=roles,
                          origin={k: f for k, f in origin.items() if not f.startswith("roles/")})
    if not problems:
        problems += cross_checks(inventory, origin)
    if not problems:
        for check in checks:
            problems += check(inventory)
    if problems:
        raise InventoryError(problems)
    return inventory


def _role_defaults(role: str, problems: list[Problem]) -> Layer:
    path = defaults_path(role)
    data, errs = read_yaml(path, ROLES / "x")
    problems.extend(errs)
    return Layer(defaults_file(role), data or {})


def _known_keys(role_models: RoleModels) -> list[str]:
    keys = set(HOST_KEYS) | set(FLEET_KEYS)
    for vars_model in role_models.values():
        keys |= set(vars_model.model_fields)
    return sorted(keys)


def _unknown(file: str, key: str, value: Any, role_models: RoleModels) -> Problem:
    close = difflib.get_close_matches(key, _known_keys(role_models), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    if role_of(key, role_models) is None and key not in HOST_KEYS and key not in FLEET_KEYS and key.endswith("_enabled"):
        return Problem(file, key, value, f"a variable of a known role ({', '.join(role_models)}): unknown role{hint}")
    return Problem(file, key, value, f"a known variable{hint}")


def _classify(files: InventoryFiles, overrides: Layer, role_models: RoleModels) -> list[Problem]:
    """Every key of every layer must be known and set where it may be set."""
    problems: list[Problem] = []
    role_keys = {k for vars_model in role_models.values() for k in vars_model.model_fields}
    layers = [(g, layer) for g, ls in files.group_layers.items() for layer in ls]
    layers += [(None, layer) for ls in files.host_layers.values() for layer in ls]
    layers.append(("all", overrides))
    for group, layer in layers:
        for key, value in layer.values.items():
            if key in role_keys or key in FLEET_KEYS:
                if group != "all":
                    problems.append(Problem(layer.file, key, value,
                                            "to be set in group_vars/all or stack config (a cluster-wide role variable)"))
            elif key in HOST_KEYS:
                if layer is overrides:
                    problems.append(Problem(layer.file, key, value, "a cluster-wide variable (node variables belong in group_vars or host_vars)"))
            else:
                problems.append(_unknown(layer.file, key, value, role_models))
    return problems


def _merge(layers: list[Layer], wanted) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.values.items():
            if wanted(key):
                values[key] = value
                origin[key] = layer.file
    return values, origin


def _validate(model: type[BaseModel], values: dict[str, Any], origin: dict[str, str], problems: list[Problem],
              *, default_file: str, where: str = "") -> BaseModel | None:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        for err in exc.errors():
            loc = [p for p in err["loc"]]
            if not loc:  # a rule across variables: blame the one set outside the role's defaults
                problems.append(_cross_field(err, values, origin, default_file, where))
                continue
            top = str(loc[0])
            key = where + top + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
            value = err.get("input", MISSING) if err["type"] != "missing" else MISSING
            file = origin.get(top, default_file)
            problems.append(Problem(file, key, value, expected(err)))
        return None


def _cross_field(err: dict, values: dict[str, Any], origin: dict[str, str], default_file: str,
                 where: str) -> Problem:
    """A model-level error (e.g. low-water not below high-water) as a Problem on one of the variables it names.

    The variable set outside the role's defaults is the likely culprit; the
    others named in the message are shown with their values and files.
    """
    msg = expected(err)
    named = sorted((k for k in values if k in msg), key=msg.index)
    if not named:
        return Problem(default_file, where + "(object)", MISSING, msg)
    key = next((k for k in named if origin.get(k, default_file) != default_file), named[0])
    others = ", ".join(f"{k} is {values[k]!r} from {origin.get(k, default_file)}" for k in named if k != key)
    return Problem(origin.get(key, default_file), where + key, values[key], msg + (f" ({others})" if others else ""))


def _simulate_hosts(files: InventoryFiles, count: int, problems: list[Problem]) -> None:
    """Generate ``count`` hosts round-robin over the racks of ``gpu_nodes``."""
    racks = files.leaf_groups(GPU_GROUP) if GPU_GROUP in files.groups else []
    if not racks or racks == [GPU_GROUP]:
        problems.append(Problem(files.rel(files.root / "hosts.yml"), f"all.children.{GPU_GROUP}.children", None,
                                "rack groups to spread simulated nodes over"))
        return
    for i in range(count):
        rack = racks[i % len(racks)]
        host = f"gpu-{rack.replace('_', '-')}-{i // len(racks) + 1:04d}"
        files.group_hosts.setdefault(rack, []).append(host)
        files.host_order.append(host)


def _hosts(files: InventoryFiles, problems: list[Problem]) -> dict[str, Host]:
    hosts: dict[str, Host] = {}
    racks = set(files.leaf_groups(GPU_GROUP)) if GPU_GROUP in files.groups else set()
    hosts_file = files.rel(files.root / "hosts.yml")
    for name in files.host_order:
        groups = files.host_groups(name)
        in_racks = [g for g in groups if g in racks]
        if len(in_racks) > 1:
            problems.append(Problem(hosts_file, name, in_racks, "one rack group per host (duplicate host)"))
            continue
        layers = [layer for g in groups for layer in files.group_layers.get(g, [])]
        layers += files.host_layers.get(name, [])
        values, origin = _merge(layers, lambda k: k in HOST_KEYS)
        if "node_rack" not in values:
            problems.append(Problem(hosts_file, name, "(no rack)",
                                    "the host in a rack: a group whose group_vars set node_rack"))
            continue
        model = _validate(HostVars, values, origin, problems, default_file=hosts_file, where=f"{name}: ")
        if model is not None:
            hosts[name] = Host(name=name, groups=groups, vars=model)
    return hosts
