"""The patch flavours the API server applies, for the in-memory fake (:mod:`gpufleet_workshop.testing.fakekube`).

* :func:`merge_patch`: JSON merge patch (RFC 7386): maps merge, ``null``
  deletes, anything else (lists included) replaces.
* :func:`json_patch`: JSON patch (RFC 6902): add, remove, replace, move,
  copy, test, with JSON pointers (RFC 6901, ``-`` appends).
* :func:`strategic_merge_patch`: Kubernetes' strategic merge patch for the
  built-in kinds gpufleet patches, from their ``patchStrategy`` /
  ``patchMergeKey`` tags in ``k8s.io/api`` (:data:`MERGE_KEYS`): lists of
  maps with a merge key merge by it, ``merge`` lists of scalars are unions,
  every other list is replaced; the ``$patch: replace|delete|merge``
  directives in maps and lists. Directives it does not model
  (``$retainKeys``, ``$setElementOrder/...``, ``$deleteFromPrimitiveList/...``)
  raise :class:`Unmodelled` rather than being guessed.
* :func:`apply_merge`: the merge of server-side apply (structured-merge-diff),
  for the shapes gpufleet applies: maps merge, lists with a merge key
  (:data:`MERGE_KEYS`, the same ``listMapKeys``) merge by it, other lists
  are atomic.

Errors the API server answers with are :class:`PatchError` (its ``status``:
422 for a failed ``test`` or a bad path, 400 for a malformed patch).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer

Obj = dict[str, Any]


class PatchError(ValueError):
    """A patch the API server refuses: ``status`` (400 or 422) and the message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Unmodelled(NotImplementedError):
    """The fake does not model this request (the message names it); a real API server would answer it."""


#: Path of a list inside an object (``*`` for any map key, list items are transparent) -> its merge key,
#: or "" for a ``merge`` list of scalars. From ``k8s.io/api`` ``patchStrategy:"merge" patchMergeKey``.
MERGE_KEYS: dict[str, dict[str, str]] = {
    "*": {
        "metadata.ownerReferences": "uid",
        "metadata.finalizers": "",
    },
    "pods": {
        "spec.containers": "name", "spec.initContainers": "name", "spec.ephemeralContainers": "name",
        "spec.volumes": "name", "spec.imagePullSecrets": "name", "spec.hostAliases": "ip",
        "spec.containers.ports": "containerPort", "spec.containers.env": "name",
        "spec.containers.volumeMounts": "mountPath", "spec.containers.volumeDevices": "devicePath",
        "spec.initContainers.ports": "containerPort", "spec.initContainers.env": "name",
        "spec.initContainers.volumeMounts": "mountPath",
        "status.conditions": "type", "status.podIPs": "ip", "status.hostIPs": "ip",
        "status.resourceClaimStatuses": "name",
    },
    "nodes": {"status.conditions": "type", "status.addresses": "type", "spec.podCIDRs": ""},
    "services": {"spec.ports": "port"},
    "deployments": {"status.conditions": "type", "spec.template.spec.containers": "name",
                    "spec.template.spec.volumes": "name", "spec.template.spec.containers.env": "name"},
    "replicasets": {"status.conditions": "type", "spec.template.spec.containers": "name",
                    "spec.template.spec.volumes": "name"},
    "daemonsets": {"status.conditions": "type", "spec.template.spec.containers": "name"},
    "statefulsets": {"status.conditions": "type", "spec.template.spec.containers": "name"},
    "jobs": {"status.conditions": "type", "spec.template.spec.containers": "name"},
    "namespaces": {"status.conditions": "type"},
    "poddisruptionbudgets": {"status.conditions": "type"},
}


def merge_keys(plural: str) -> dict[str, str]:
    """The merge keys of ``plural``'s lists (those of every kind included)."""
    return {**MERGE_KEYS["*"], **MERGE_KEYS.get(plural, {})}


# ------------------------------------------------------------------ RFC 7386


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with JSON merge patch ``patch`` applied (RFC 7386); neither argument is changed."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# ------------------------------------------------------------------ RFC 6902


def json_patch(target: Any, ops: Any) -> Any:
    """``target`` with the RFC 6902 operations ``ops`` applied (all or nothing); ``target`` is not changed.

    Each operation is applied by the ``jsonpatch`` library, one at a time so that an error names its
    operation. As kube-apiserver answers (``staging/.../handlers/patch.go``): a patch that does not decode
    (not a list of objects) is 400; any operation that fails to apply, an unknown or incomplete one
    included, is 422.

    Raises:
        PatchError: 400 or 422, as above.
    """
    if not isinstance(ops, list) or not all(isinstance(o, dict) for o in ops):
        raise PatchError(400, "json patch: expected a list of operations (objects)")
    doc = copy.deepcopy(target)
    for o in ops:
        try:
            doc = jsonpatch.JsonPatch([o]).apply(doc, in_place=True)
        except jsonpatch.JsonPatchTestFailed:
            raise PatchError(422, f"testing value {o.get('path')} failed") from None
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError, IndexError,
                TypeError) as exc:
            raise PatchError(422, f"{o.get('op')} operation does not apply: {o.get('path')}: {exc}") from None
    return doc


# ------------------------------------------------------------------ strategic merge patch

_UNMODELLED_PREFIXES = ("$setElementOrder/", "$deleteFromPrimitiveList/", "$retainKeys")


def strategic_merge_patch(target: Any, patch: Any, plural: str) -> Any:
    """``target`` with strategic merge patch ``patch`` for a ``plural`` object; ``target`` is not changed.

    Raises:
        Unmodelled: a directive the fake does not model.
        PatchError: a malformed directive (400).
    """
    return _smp(copy.deepcopy(target), patch, merge_keys(plural), "")


def _smp(target: Any, patch: Any, keys: dict[str, str], path: str) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise PatchError(400, f"strategic merge patch: unknown $patch {directive!r} at {path or '.'}")
    out = target if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k == "$patch":
            continue
        if k.startswith(_UNMODELLED_PREFIXES):
            raise Unmodelled(f"strategic merge patch directive {k!r} at {path or '.'} is not modelled by the fake")
        sub = f"{path}.{k}" if path else k
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and sub in keys:
            out[k] = _smp_list(out.get(k) if isinstance(out.get(k), list) else [], v, keys, sub)
        elif isinstance(v, dict):
            merged = _smp(out.get(k), v, keys, sub)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        else:
            out[k] = copy.deepcopy(v)
    return out


def _smp_list(live: list, patch: list, keys: dict[str, str], path: str) -> list:
    key = keys[path]
    directives = [p for p in patch if isinstance(p, dict) and "$patch" in p and (not key or key not in p)]
    items = [p for p in patch if p not in directives]
    for d in directives:
        if d.get("$patch") == "replace":
            return [{k: v for k, v in i.items() if k != "$patch"} if isinstance(i, dict) else i for i in items]
        raise PatchError(400, f"strategic merge patch: list directive {d!r} at {path}")
    if not key:  # a merge list of scalars: the union, in order
        out = list(live)
        out += [i for i in items if i not in out]
        return out
    out = [copy.deepcopy(i) for i in live]
    for item in items:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(400, f"strategic merge patch: {path}: item {item!r} lacks merge key {key!r}")
        at = next((n for n, cur in enumerate(out) if isinstance(cur, dict) and cur.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                out.pop(at)
            continue
        body = {k: v for k, v in item.items() if k != "$patch"}
        if at is None:
            out.append(_smp({}, body, keys, path))
        else:
            out[at] = _smp(out[at], body, keys, path)
    return out


# ------------------------------------------------------------------ server-side apply


def leaf_paths(obj: Any, plural: str, path: tuple = ()) -> set[tuple]:
    """The field paths ``obj`` sets, as server-side apply records them: map keys, list items by merge key
    (``("k", key, value)``), atomic lists and scalars as leaves."""
    keys = merge_keys(plural)
    out: set[tuple] = set()
    dotted = ".".join(p for p in path if isinstance(p, str))
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            out |= leaf_paths(v, plural, path + (k,))
    elif isinstance(obj, list) and keys.get(dotted):
        key = keys[dotted]
        for item in obj:
            if isinstance(item, dict) and key in item:
                sub = path + (("k", key, item[key]),)
                out.add(sub)
                out |= leaf_paths({k: v for k, v in item.items()}, plural, sub)
    else:
        out.add(path)
    return out


def apply_merge(live: Any, applied: Any, plural: str, path: str = "") -> Any:
    """``applied`` merged into ``live`` as server-side apply merges (module docstring); returns a new object."""
    keys = merge_keys(plural)
    if isinstance(applied, dict):
        out = copy.deepcopy(live) if isinstance(live, dict) else {}
        for k, v in applied.items():
            sub = f"{path}.{k}" if path else k
            out[k] = apply_merge(out.get(k), v, plural, sub)
        return out
    if isinstance(applied, list) and keys.get(path) and isinstance(live, list):
        key = keys[path]
        out = [copy.deepcopy(i) for i in live]
        for item in applied:
            at = next((n for n, cur in enumerate(out) if isinstance(cur, dict) and isinstance(item, dict)
                       and cur.get(key) == item.get(key)), None)
            if at is None:
                out.append(copy.deepcopy(item))
            else:
                out[at] = apply_merge(out[at], item, plural, path)
        return out
    return copy.deepcopy(applied)


def remove_path(obj: Any, path: tuple) -> None:
    """Remove the field at ``path`` (as :func:`leaf_paths` names it) from ``obj`` in place; absent: nothing."""
    if not path:
        return
    parent = obj
    for p in path[:-1]:
        parent = _step(parent, p)
        if parent is None:
            return
    last = path[-1]
    if isinstance(last, tuple) and isinstance(parent, list):
        _, key, value = last
        parent[:] = [i for i in parent if not (isinstance(i, dict) and i.get(key) == value)]
    elif isinstance(parent, dict):
        parent.pop(last, None)


def _step(cur: Any, p: Any) -> Any:
    if isinstance(p, tuple):
        _, key, value = p
        return next((i for i in cur or [] if isinstance(i, dict) and i.get(key) == value), None) \
            if isinstance(cur, list) else None
    return cur.get(p) if isinstance(cur, dict) else None


def value_at(obj: Any, path: tuple) -> Any:
    """The value at ``path`` (as :func:`leaf_paths` names it), or None."""
    cur = obj
    for p in path:
        cur = _step(cur, p)
        if cur is None:
            return None
    return cur
