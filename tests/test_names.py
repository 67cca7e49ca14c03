"""Shared names are spelled once, in gpufleet.names: no ``gpufleet.io/`` or ``kueue.x-k8s.io/`` label,
taint or annotation literal elsewhere in gpufleet's packages or the roles, and no module-level alias of a name
defined there."""

from __future__ import annotations

import ast
from pathlib import Path

import gpufleet
from gpufleet import names

#: The checkout: the three packages under src/ and the roles.
ROOT = Path(gpufleet.__file__).parents[2]
TREES = (ROOT / "src" / "gpufleet", ROOT / "src" / "gpufleet_admin", ROOT / "src" / "gpufleet_workshop", ROOT / "roles")
PREFIXES = ("gpufleet.io/", "kueue.x-k8s.io/")
#: Modules that may keep their own aliases of shared names, and why.
ALIASES_ALLOWED = {
    # the inventory's LABEL_* names are its public API (roles and templates read them from the inventory)
    "src/gpufleet_admin/inventory/inventory.py",
}


def modules() -> list[Path]:
    return sorted(p for tree in TREES for p in tree.rglob("*.py") if p != Path(names.__file__))


def literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants (f-string parts included) that begin like a shared label, taint or annotation."""
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith(PREFIXES)]


def test_no_shared_name_is_spelled_outside_names():
    found = [f"{p.relative_to(ROOT)}:{line}: {value!r}" for p in modules()
             for line, value in literals(ast.parse(p.read_text(), str(p)))]
    assert not found, "spell these through gpufleet.names:\n" + "\n".join(found)


def test_no_module_renames_a_shared_name():
    shared = {k for k in vars(names) if k.isupper()}
    found = []
    for p in modules():
        rel = str(p.relative_to(ROOT))
        if rel in ALIASES_ALLOWED:
            continue
        for node in ast.parse(p.read_text(), str(p)).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in shared
                    and all(isinstance(t, ast.Name) for t in node.targets)):
                found.append(f"{rel}:{node.lineno}: {node.targets[0].id} = {node.value.id}")
            if isinstance(node, ast.ImportFrom) and node.module == "gpufleet.names":
                found += [f"{rel}:{node.lineno}: {a.name} as {a.asname}" for a in node.names if a.asname]
    assert not found, "use gpufleet.names' own names:\n" + "\n".join(found)


def test_names_defines_each_name_once():
    tree = ast.parse(Path(names.__file__).read_text())
    assigned = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    assert sorted({a for a in assigned if assigned.count(a) > 1}) == []
    values = [getattr(names, a) for a in dict.fromkeys(assigned) if isinstance(getattr(names, a), str)]
    assert sorted({v for v in values if values.count(v) > 1 and v.startswith(PREFIXES)}) == []
