"""Reading an Ansible-format inventory folder into layers of variables.

What this module knows is Ansible's inventory layout, not our variables:
``hosts.yml`` (YAML inventory: ``all.children.<group>.hosts`` with host
patterns such as ``gpu-a-[001:032]``), ``group_vars/all.yml`` or
``group_vars/all/*.yml``, ``group_vars/<group>.yml`` and
``host_vars/<host>.yml``. Each value keeps the file it came from so a bad
value can be reported where it was written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.componentconfig import yaml_problem

from .errors import Problem
from .hostranges import HostRangeError, expand


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: Path, root: Path) -> tuple[Any, list[Problem]]:
    """Parse one YAML file, refusing duplicate keys.

    Returns ``(data, problems)``; on a parse error ``data`` is None and the
    problem names the file and line.
    """
    rel = _rel(path, root)
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader), []
    except UnicodeDecodeError as exc:
        return None, [Problem(rel, "(file)", f"byte {exc.start}: {exc.reason}", "a UTF-8 text file")]
    except yaml.YAMLError as exc:
        return None, [Problem(rel, "(file)", yaml_problem(exc), "valid YAML (and no key twice in one mapping)")]


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root.parent.parent))
    except ValueError:
        return str(path)


@dataclass
class Layer:
    """Variables from one file: ``values`` by key, all from ``file``."""

    file: str
    values: dict[str, Any]


@dataclass
class InventoryFiles:
    """The raw inventory: groups, host membership and variable layers, unvalidated.

    ``groups`` maps group -> direct child groups; ``group_hosts`` maps group ->
    hosts listed directly in it; ``host_order`` keeps hosts in file order.
    """

    root: Path
    groups: dict[str, list[str]] = field(default_factory=dict)
    group_hosts: dict[str, list[str]] = field(default_factory=dict)
    host_order: list[str] = field(default_factory=list)
    group_layers: dict[str, list[Layer]] = field(default_factory=dict)
    host_layers: dict[str, list[Layer]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def rel(self, path: Path) -> str:
        """Path as shown in messages: ``inventories/<env>/...``."""
        return _rel(path, self.root)

    def parents(self) -> dict[str, list[str]]:
        """Group -> its parent groups."""
        out: dict[str, list[str]] = {g: [] for g in self.groups}
        for parent, children in self.groups.items():
            for child in children:
                out.setdefault(child, []).append(parent)
        return out

    def depth(self, group: str) -> int:
        """Distance from ``all``: Ansible applies group_vars parents-first by depth."""
        parents = self.parents()
        seen, frontier, d = {group}, [group], 0
        while frontier and "all" not in frontier:
            frontier = [p for g in frontier for p in parents.get(g, []) if p not in seen]
            seen.update(frontier)
            d += 1
        return d

    def leaf_groups(self, group: str) -> list[str]:
        """Groups under ``group`` with no children of their own, in file order."""
        children = self.groups.get(group, [])
        if not children:
            return [group]
        return [leaf for c in children for leaf in self.leaf_groups(c)]

    def host_groups(self, host: str) -> list[str]:
        """Every group the host belongs to, directly or through a parent, ``all`` first."""
        direct = [g for g, hs in self.group_hosts.items() if host in hs]
        parents = self.parents()
        found: list[str] = []
        frontier = direct
        while frontier:
            found.extend(g for g in frontier if g not in found)
            frontier = [p for g in frontier for p in parents.get(g, []) if p not in found]
        if "all" not in found:
            found.append("all")
        return sorted(found, key=self.depth)


def read_inventory(root: Path) -> InventoryFiles:
    """Read ``root`` (an inventory folder) into an :class:`InventoryFiles`.

    Problems (unparsable YAML, a malformed group, a host listed twice under
    the same group) are collected in ``.problems`` rather than raised, so all
    of them can be reported at once.
    """
    inv = InventoryFiles(root=root)
    hosts_file = root / "hosts.yml"
    data, inv.problems = read_yaml(hosts_file, root) if hosts_file.exists() else (None, [
        Problem(inv.rel(hosts_file), "(file)", None, "an Ansible YAML inventory")
    ])
    if isinstance(data, dict):
        for name, body in data.items():
            _read_group(inv, name, body, inv.rel(hosts_file), "")
    elif data is not None:
        inv.problems.append(Problem(inv.rel(hosts_file), "(top level)", type(data).__name__, "a mapping of groups"))
    inv.groups.setdefault("all", [])
    _break_cycles(inv, inv.rel(hosts_file))
    _read_vars(inv)
    return inv


def _break_cycles(inv: InventoryFiles, file: str) -> None:
    """Report (and drop) every child link that makes a group its own descendant, as Ansible refuses them."""
    def reaches(start: str, target: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            g = todo.pop()
            if g == target:
                return True
            if g not in seen:
                seen.add(g)
                todo.extend(inv.groups.get(g, []))
        return False

    for parent in list(inv.groups):
        for child in list(inv.groups[parent]):
            if reaches(child, parent):
                inv.groups[parent].remove(child)
                inv.problems.append(Problem(file, f"{parent}.children", child,
                                            f"a group that does not contain {parent!r} (a cycle of groups)"))


def _read_group(inv: InventoryFiles, name: str, body: Any, file: str, path: str) -> None:
    key = f"{path}{name}"
    inv.groups.setdefault(name, [])
    inv.group_hosts.setdefault(name, [])
    if body is None:
        return
    if not isinstance(body, dict) or set(body) - {"hosts", "children", "vars"}:
        inv.problems.append(Problem(file, key, body if not isinstance(body, dict) else sorted(body),
                                    "a group with only 'hosts', 'children' and 'vars'"))
        return
    for pattern, host_vars in (body.get("hosts") or {}).items():
        try:
            names = expand(pattern)
        except HostRangeError as exc:
            inv.problems.append(Problem(file, f"{key}.hosts", pattern, exc.expected))
            continue
        for host in names:
            if host in inv.group_hosts[name]:
                inv.problems.append(Problem(file, f"{key}.hosts", host, "each host once per group (duplicate host)"))
                continue
            inv.group_hosts[name].append(host)
            if host not in inv.host_order:
                inv.host_order.append(host)
            if host_vars:
                inv.host_layers.setdefault(host, []).append(Layer(file, dict(host_vars)))
    if body.get("vars"):
        inv.group_layers.setdefault(name, []).append(Layer(file, dict(body["vars"])))
    for child, child_body in (body.get("children") or {}).items():
        if child not in inv.groups[name]:
            inv.groups[name].append(child)
        _read_group(inv, child, child_body, file, f"{key}.children.")


def _read_vars(inv: InventoryFiles) -> None:
    """Collect group_vars and host_vars files, in Ansible's file order."""
    for kind, target in (("group_vars", inv.group_layers), ("host_vars", inv.host_layers)):
        base = inv.root / kind
        if not base.is_dir():
            continue
        for entry in sorted(base.iterdir()):
            files = sorted(entry.glob("*.yml")) + sorted(entry.glob("*.yaml")) if entry.is_dir() else [entry]
            name = entry.name if entry.is_dir() else entry.stem
            if not entry.is_dir() and entry.suffix not in (".yml", ".yaml"):
                continue
            known = inv.groups if kind == "group_vars" else inv.host_order
            if name not in known and not (kind == "group_vars" and name == "all"):
                what = "group" if kind == "group_vars" else "host"
                inv.problems.append(Problem(inv.rel(entry), "(file)", name, f"a {what} of hosts.yml"))
                continue
            for f in files:
                data, problems = read_yaml(f, inv.root)
                inv.problems.extend(problems)
                if data is None:
                    continue
                if not isinstance(data, dict):
                    inv.problems.append(Problem(inv.rel(f), "(top level)", type(data).__name__, "a mapping of variables"))
                    continue
                target.setdefault(name, []).append(Layer(inv.rel(f), data))
