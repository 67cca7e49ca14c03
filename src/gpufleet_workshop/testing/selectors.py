"""Label and field selectors as the API server parses and matches them (for :mod:`gpufleet_workshop.testing.fakekube`).

Label selectors: apimachinery ``labels.Parse``: comma-separated
requirements ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``,
``k`` (exists), ``!k`` (does not exist). ``!=`` and ``notin`` match objects
without the label, as upstream.

Field selectors: apimachinery ``fields.ParseSelector`` (``f=v``, ``f==v``,
``f!=v``, comma = and), over the fields each kind's registry supports
(``pkg/registry/*/strategy.go`` ``*ToSelectableFields``): every kind has
``metadata.name`` and ``metadata.namespace``; :data:`FIELDS` lists the
others. Any other field is refused as the API server refuses it: 400
``field label not supported: <field>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Obj = dict[str, Any]


class SelectorError(ValueError):
    """A selector the API server would refuse (400 BadRequest); the message is the server's."""


def _get(obj: Obj, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _str(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _path(dotted: str) -> Callable[[Obj], str]:
    return lambda o: _str(_get(o, dotted))


#: plural -> {field: getter} beyond ``metadata.name``/``metadata.namespace`` (pkg/registry/core/*/strategy.go).
FIELDS: dict[str, dict[str, Callable[[Obj], str]]] = {
    "pods": {f: _path(f) for f in ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                                   "spec.serviceAccountName", "status.phase", "status.podIP",
                                   "status.nominatedNodeName")}
    | {"spec.hostNetwork": lambda o: _str(bool(_get(o, "spec.hostNetwork")))},
    "nodes": {"spec.unschedulable": lambda o: _str(bool(_get(o, "spec.unschedulable")))},
    "events": {f: _path(f) for f in ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                                     "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                                     "involvedObject.fieldPath", "reason", "reportingComponent", "type")}
    | {"source": lambda o: _str(_get(o, "source.component") or _get(o, "reportingComponent"))},
    "secrets": {"type": _path("type")},
    "namespaces": {"status.phase": _path("status.phase")},
    "replicasets": {"status.replicas": lambda o: _str(_get(o, "status.replicas") or 0)},
    "jobs": {"status.successful": lambda o: _str(_get(o, "status.successful") or 0)},
    # resource.k8s.io: the fields the API server indexes for ResourceSlices (pkg/registry/resource/resourceslice).
    "resourceslices": {f: _path(f) for f in ("spec.nodeName", "spec.driver")},
}

_LABEL_KEY = re.compile(r"^([a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?/)?[a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?$")


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _key(key: str, selector: str) -> str:
    key = key.strip()
    if not _LABEL_KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {selector!r}")
    return key


def parse_labels(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over a label map for ``selector`` (None or empty: everything).

    Raises:
        SelectorError: not a label selector (the message names the part).
    """
    if not selector:
        return lambda labels: True
    reqs: list[Callable[[Mapping[str, str]], bool]] = []
    for part in _split_top(selector):
        m = re.match(r"^(\S+?)\s+(in|notin)\s*\((.*)\)$", part)
        if m:
            key, op, values = _key(m.group(1), selector), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                reqs.append(lambda lb, k=key, vs=values: k in lb and lb[k] in vs)
            else:
                reqs.append(lambda lb, k=key, vs=values: k not in lb or lb[k] not in vs)
            continue
        m = re.match(r"^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$", part)
        if m:
            key, op, value = _key(m.group(1), selector), m.group(2), m.group(3)
            if op == "!=":
                reqs.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                reqs.append(lambda lb, k=key, v=value: k in lb and lb[k] == v)
            continue
        if part.startswith("!"):
            key = _key(part[1:], selector)
            reqs.append(lambda lb, k=key: k not in lb)
            continue
        key = _key(part, selector)
        reqs.append(lambda lb, k=key: k in lb)
    return lambda labels: all(r(labels or {}) for r in reqs)


def parse_fields(selector: str | None, plural: str) -> Callable[[Obj], bool]:
    """A predicate over objects of ``plural`` for field ``selector`` (None or empty: everything).

    Raises:
        SelectorError: a malformed selector, or a field the API server does not support for ``plural``.
    """
    if not selector:
        return lambda obj: True
    fields = {"metadata.name": _path("metadata.name"), "metadata.namespace": _path("metadata.namespace"),
              **FIELDS.get(plural, {})}
    reqs = []
    for part in _split_top(selector):
        m = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise SelectorError(f"invalid selector: {selector!r}; can't understand {part!r}")
        field, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if field not in fields:
            raise SelectorError(f'field label not supported: {field}')
        get = fields[field]
        reqs.append((lambda o, g=get, v=value: g(o) != v) if op == "!=" else (lambda o, g=get, v=value: g(o) == v))
    return lambda obj: all(r(obj) for r in reqs)
