"""A component's configuration from the inventory: a declaration per role, and refusals named by variable.

A role that deploys a gpufleet component says, in ``roles/<role>/config.py``,
which inventory variable feeds each field of the component's configuration
model (``VARIABLES``: dotted field -> variable; None where no variable does
and the model's default stands) and how a field is computed when it is not
the variable's value as it is (``DERIVED``: field -> function of the
inventory). :func:`build` makes the model from that declaration: the model
(``gpufleet.<component>.config``) holds the defaults and does every check,
once; a value it refuses is reported as an
:class:`~gpufleet_admin.inventory.InventoryError` naming the variable, the
file that set it (an inventory file or the stack config), the value and
what was expected, before anything is declared.

The role renders the model into the component's ConfigMap as one file
(:func:`gpufleet_admin.manifests.controller`), and nothing else of the
inventory reaches the component.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpufleet.componentconfig import dotted, expected
from gpufleet_admin.inventory import Inventory, InventoryError, Problem
from gpufleet_admin.inventory.errors import MISSING
from gpufleet_admin.inventory.roles import defaults_file, role_of

M = TypeVar("M", bound=BaseModel)

#: Dotted configuration field -> the inventory variable that feeds it (None: none, the model's default).
Variables = Mapping[str, "str | None"]
#: Dotted configuration field -> how it is computed from the inventory (when not a variable's value as it is).
Derived = Mapping[str, Callable[[Inventory], Any]]


def variable_value(inv: Inventory, variable: str) -> Any:
    """The validated value of a cluster-wide variable (a role's or the fleet's).

    Raises:
        KeyError: no role or fleet variable of that name.
    """
    role = role_of(variable, inv.roles)
    if role is not None and variable in type(inv.roles[role]).model_fields:
        return getattr(inv.roles[role], variable)
    if variable in type(inv.fleet).model_fields:
        return getattr(inv.fleet, variable)
    raise KeyError(f"{variable}: not a cluster-wide variable of this inventory")


def source_file(inv: Inventory, variable: str) -> str:
    """Where ``variable`` was set: an inventory file, the stack config, else its role's defaults."""
    return inv.origin.get(variable) or defaults_file(role_of(variable, inv.roles) or "(fleet)")


def build(inv: Inventory, model: type[M], variables: Variables, derived: Derived | None = None) -> M:
    """The configuration ``model`` from the inventory, as the declaration says.

    Raises:
        gpufleet_admin.inventory.InventoryError: the model refused a value (each problem names the
            variable behind the field, the file that set it, its value and what was expected).
    """
    derived = derived or {}
    data: dict[str, Any] = {}
    for key, variable in variables.items():
        if variable is None:
            continue
        value = derived[key](inv) if key in derived else variable_value(inv, variable)
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(problems(inv, variables, exc)) from None


def problems(inv: Inventory, variables: Variables, exc: ValidationError) -> list[Problem]:
    """``exc`` (the model's refusal) as problems named by variable.

    An error on a field is put on the variable feeding it (or the nearest
    enclosing field that has one); a check across fields names them in its
    message, which is rewritten with their variables and put on the one set
    outside its role's defaults (the likely culprit), the others shown with
    their values and files.
    """
    def variable_of(key: str) -> tuple[str | None, str]:
        parts = key.split(".")
        for i in range(len(parts), 0, -1):
            head = ".".join(parts[:i])
            if variables.get(head):
                return variables[head], key[len(head):]
        return None, key

    out: list[Problem] = []
    for err in exc.errors():
        key, msg = dotted(err["loc"]), expected(err)
        prefix = f"{key}." if key else ""
        fields = {prefix + w for w in re.findall(r"\b[a-z][a-z0-9_.]*[a-z0-9]\b", msg)
                  if variables.get(prefix + w) and _cluster_wide(inv, variables[prefix + w])}
        if fields and err["type"] == "value_error":
            named = sorted({variables[f] for f in fields}, key=lambda v: min(msg.find(f[len(prefix):])
                                                                           for f in fields if variables[f] == v))
            for f in sorted(fields, key=len, reverse=True):
                msg = re.sub(rf"\b{re.escape(f[len(prefix):])}\b", variables[f], msg)
            culprit = next((v for v in named if v in inv.origin), named[0])
            others = ", ".join(f"{v} is {variable_value(inv, v)!r} from {source_file(inv, v)}"
                               for v in named if v != culprit)
            out.append(Problem(source_file(inv, culprit), culprit, variable_value(inv, culprit),
                               msg + (f" ({others})" if others else "")))
            continue
        variable, rest = variable_of(key)
        if variable is None:
            out.append(Problem("(configuration)", key or "(object)", err.get("input", MISSING), msg))
            continue
        out.append(Problem(source_file(inv, variable), variable + rest,
                           MISSING if err["type"] == "missing" else err.get("input", MISSING), msg))
    return out


def _cluster_wide(inv: Inventory, variable: str) -> bool:
    """Whether ``variable`` is a role's or the fleet's (not a host's: those are named where they are set)."""
    try:
        variable_value(inv, variable)
    except KeyError:
        return False
    return True


def check(make: Callable[[], Any]) -> list[Problem]:
    """The problems of building a configuration (``make()``), none when it builds: an inventory check."""
    try:
        make()
    except InventoryError as exc:
        return exc.problems
    return []


def highest_priority_class(inv: Inventory) -> Any:
    """The kueue role's PriorityClass of the highest value: training's (the flip-out's preemptor)."""
    return max(inv.role("kueue").kueue_priority_classes, key=lambda p: p.value)
