"""What every component's configuration file shares: value kinds, reading, writing, flags over a file.

Each component that takes settings has one typed, frozen configuration
model in its own package (``gpufleet.<component>.config.Configuration``,
after Kueue's ``apis/config/v1beta2/configuration_types.go``): its
defaults and its checks are written there and nowhere else. The role that
deploys the component builds that model from the inventory (stack config
included) and renders it into one file, which the component reads with
``--config FILE`` (kube-scheduler's ``--config``); flags stay for the
process (metrics port, log level, kubeconfig, leader election) and for
runs by hand, where a flag given overrides the file.

A file is YAML: ``apiVersion`` :data:`gpufleet.names.CONFIG_API_VERSION`,
``kind`` the component's (``TaintControllerConfiguration``...), then the
model's fields in snake_case, as the inventory spells its variables.
Reading refuses unknown keys and bad values, every one named with the
file, its key, the value and what was expected (:class:`ConfigFileError`).

**Where a default is written, and why there.** In the component's model,
once: the component runs where there is no inventory and no role (gpufleet's
image), by hand as in the cluster, so its defaults must be its own. The
roles' ``defaults.yaml`` keep Ansible's convention (every variable
documented with its default) as documentation of those values, and
``tests/roles/test_component_config.py`` fails when one says otherwise
(the configurations built from the roles' defaults alone must equal the
models' defaults). A role's ``vars.py`` types such a variable with the
field's own kind, so the value is checked by one rule.

**One rule per kind of value.** A setting a flag can also set takes a
kind built here from the :mod:`gpufleet.cliargs` check of that flag
(:func:`checked`): the flag (argparse ``type=``, :func:`flag_type`), the
file and the inventory variable (roles type their variables with these
kinds) are all checked by the same function, with the same wording
(``expected a finite number of seconds >= 0``).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, Strict, ValidationError

from gpufleet import cliargs
from gpufleet.kube.validation import dns_label
from gpufleet.names import CONFIG_API_VERSION

#: Every configuration model forbids unknown keys (a typo is an error, not a no-op) and is frozen.
STRICT = ConfigDict(extra="forbid", frozen=True)

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Rule:
    """The :mod:`gpufleet.cliargs` check a kind of value follows (an argparse ``type=``), kept on the field."""

    parse: Callable[[str], Any]


def checked(base: type, parse: Callable[[str], Any]) -> Any:
    """A value kind: ``base`` (strict: ``"5"`` is not a number, ``true`` not a count) checked by ``parse``.

    ``parse`` is a :mod:`gpufleet.cliargs` argparse type; a value it refuses
    fails validation with its wording (``a finite number of seconds >= 0``).
    A float kind takes whole numbers too (YAML ``60`` is 60.0).
    """
    def check(value: Any) -> Any:
        try:
            return parse(value if base is str else str(value))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc).split("expected ", 1)[-1]) from None

    return Annotated[base, Strict(), AfterValidator(check), Rule(parse)]


#: Seconds >= 0 (hold times, waits, debounce).
Seconds = checked(float, cliargs.nonnegative_seconds)
#: Seconds > 0 (intervals, windows, timeouts).
PositiveSeconds = checked(float, cliargs.positive_seconds)
#: A finite number >= 0 (GPU marks).
NonNegativeNumber = checked(float, cliargs.nonnegative_number)
#: A finite number > 0 (rates).
PositiveNumber = checked(float, cliargs.positive_number)
#: A whole number >= 0 (counts, thresholds).
Count = checked(int, cliargs.integer_type(0))
#: A whole number >= 1.
PositiveCount = checked(int, cliargs.integer_type(1))
#: A TCP port 1..65535, or 0 for "not served".
Port0 = checked(int, cliargs.port_type(allow_zero=True))
#: A share of a whole, 0..1.
Share = checked(float, cliargs.share)
#: A base URL ``http(s)://host[:port][/path]``.
HttpUrl = checked(str, cliargs.http_url)

DnsLabel = Annotated[str, AfterValidator(dns_label)]


def set_of(item: Any) -> Any:
    """A frozenset of ``item`` written sorted, so a file's text (and its checksum) is the same every time."""
    return Annotated[frozenset[item], PlainSerializer(sorted, return_type=list, when_used="json")]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
#: A temperature threshold in degrees Celsius; beyond 30..110 it is a typo, not a policy.
Celsius = Annotated[float, Field(ge=30, le=110)]


class ConfigFileError(ValueError):
    """A configuration file (or a flag over it) could not be used; one line per bad value.

    Each line reads ``FILE: KEY: VALUE: expected ...`` (a flag: ``--FLAG VALUE: expected ...``).
    """

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


def yaml_problem(exc: Exception) -> str:
    """``line L, column C: <what the parser was doing>: <what it found>`` from a PyYAML error, for messages."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = ": ".join(filter(None, [getattr(exc, "context", None), getattr(exc, "problem", None)]))
    return where + (what or str(exc).splitlines()[0])


def expected(err: Mapping[str, Any]) -> str:
    """What a pydantic error says was expected, without pydantic's prefixes."""
    msg: str = err["msg"]
    for prefix in ("Value error, ", "Input should be ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if err["type"] == "missing":
        return "a value (required, no default)"
    if err["type"] == "extra_forbidden":
        return "a known field (unknown key)"
    return msg


def dotted(loc: tuple) -> str:
    """A pydantic location as a key: ``("pools", 0, "name")`` -> ``pools[0].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def problems(exc: ValidationError, label: Callable[[str], str], value_of: Callable[[str], Any],
             name: Callable[[str], str] = lambda key: key) -> list[str]:
    """One line per error of ``exc``: ``LABEL: VALUE: expected ...``.

    ``label(key)`` says where a key was set (``FILE: key`` or ``--flag``);
    an error across fields (a model check, no location) is put on the field
    it names first, and shows the others it names with their values;
    ``name(key)`` is how a field is called inside such a message (its flag, its variable).
    """
    lines = []
    for err in exc.errors():
        key, msg = dotted(err["loc"]), expected(err)
        prefix = f"{key}." if key else ""
        # A check across fields (a model's own validator) names them in its message: put it on the first.
        named = [] if err["type"] == "missing" else sorted(
            {prefix + w for w in re.findall(r"\b[a-z][a-z0-9_]*\b", msg) if value_of(prefix + w) is not _ABSENT},
            key=lambda k: msg.index(k[len(prefix):]))
        if named and err["type"] == "value_error":
            msg = re.sub(r"\b[a-z][a-z0-9_]*\b", lambda m: name(prefix + m.group(0)) if prefix + m.group(0) in named
                         else m.group(0), msg)
            others = ", ".join(f"{label(k)} is {value_of(k)!r}" for k in named[1:])
            lines.append(f"{label(named[0])}: {value_of(named[0])!r}: expected {msg}" + (f" ({others})" if others else ""))
            continue
        value = "(missing)" if err["type"] == "missing" else repr(err.get("input"))
        lines.append(f"{label(key or '(object)')}: {value}: expected {msg}")
    return lines


_ABSENT = object()


def field_value(model: BaseModel | Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key`` of a model or a mapping (``rules.hot_samples``); a sentinel when absent."""
    node: Any = model
    for part in key.split("."):
        if isinstance(node, BaseModel) and part in type(node).model_fields:
            node = getattr(node, part)
        elif isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            return _ABSENT
    return node


def default_value(model: type[BaseModel], key: str) -> Any:
    """The default of dotted field ``key`` of ``model``; a sentinel when it has none (or is no field)."""
    *parents, last = key.split(".")
    for part in parents:
        info = model.model_fields.get(part)
        if info is None or not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)):
            return _ABSENT
        model = info.annotation
    info = model.model_fields.get(last)
    if info is None or info.is_required():
        return _ABSENT
    return info.get_default(call_default_factory=True)


def header(kind: str) -> dict[str, str]:
    """The two keys every configuration file starts with."""
    return {"apiVersion": CONFIG_API_VERSION, "kind": kind}


def dump(config: BaseModel, kind: str) -> str:
    """The configuration as its file's text: the header, then every field (defaults included), in model order."""
    data = {**header(kind), **config.model_dump(mode="json")}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def checksum(text: str) -> str:
    """SHA-256 hex digest of a configuration file's text (the pod template annotation that rolls the pods)."""
    return hashlib.sha256(text.encode()).hexdigest()


def parse(text: str, model: type[M], kind: str, source: str) -> M:
    """A configuration from its file's text; ``source`` names the file in messages.

    Raises:
        ConfigFileError: not YAML, not a mapping, another ``apiVersion``/``kind``, unknown keys or bad values.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError([f"{source}: (file): {yaml_problem(exc)}: expected valid YAML"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError([f"{source}: (top level): {type(data).__name__}: expected a mapping of settings"])
    lines = []
    for key, want in header(kind).items():
        if data.get(key, want) != want:
            lines.append(f"{source}: {key}: {data[key]!r}: expected {want!r}")
        data.pop(key, None)
    if lines:
        raise ConfigFileError(lines)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        def default(key: str) -> bool:  # named in a message, not in the file: its default stood
            return "[" not in key and field_value(data, key) is _ABSENT and default_value(model, key) is not _ABSENT

        def value_of(key: str) -> Any:
            return default_value(model, key) if default(key) else field_value(data, key)

        raise ConfigFileError(problems(exc, lambda k: f"{k} (default)" if default(k) else f"{source}: {k}",
                                       value_of)) from None


def load(path: str | Path, model: type[M], kind: str) -> M:
    """Read a configuration file (:func:`parse`).

    Raises:
        ConfigFileError: the file cannot be read, or :func:`parse` refuses it.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError([f"--config {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}"]) from None
    return parse(text, model, kind, str(path))


def override(config: M, flags: Mapping[str, tuple[str, Any]], source: str = "defaults") -> M:
    """``config`` with the flags given (``{dotted field: (flag, value)}``; None values are not given) applied.

    The result is validated as a whole, so a flag that breaks a check across
    fields (``--low-water`` above the file's high-water mark) is refused; a
    field the flags did not set is named with ``source`` (the file).

    Raises:
        ConfigFileError: naming the flag (or ``source: key``), the value and what was expected.
    """
    given = {key: value for key, (_, value) in flags.items() if value is not None}
    if not given:
        return config
    data = config.model_dump()
    for key, value in given.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    names = {key: flag for key, (flag, value) in flags.items() if value is not None}
    try:
        return type(config).model_validate(data)
    except ValidationError as exc:
        raise ConfigFileError(problems(exc, lambda k: names.get(k) or f"{source}: {k}", lambda k: field_value(data, k),
                                       lambda k: names.get(k, k))) from None


def field_annotation(model: type[BaseModel], key: str) -> Any:
    """The annotation of dotted field ``key`` of ``model`` (with its metadata)."""
    *parents, last = key.split(".")
    for part in parents:
        model = model.model_fields[part].annotation
    info = model.model_fields[last]
    return Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation


def flag_type(model: type[BaseModel], key: str) -> Callable[[str], Any]:
    """The argparse ``type=`` of the flag that sets field ``key``: the field's own :class:`Rule`.

    Raises:
        TypeError: the field's kind has no rule (it is not one of this module's checked kinds).
    """
    *parents, last = key.split(".")
    for part in parents:
        model = model.model_fields[part].annotation
    info = model.model_fields[last]
    found = [m for m in info.metadata if isinstance(m, Rule)] + _rules(info.annotation)
    if not found:
        raise TypeError(f"{model.__name__}.{last}: no flag rule (use a kind of gpufleet.componentconfig)")
    return found[0].parse


def _rules(annotation: Any) -> list[Rule]:
    """The :class:`Rule` markers inside an annotation (``Seconds | None`` has one in its first member)."""
    out = [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Rule)]
    for arg in typing.get_args(annotation):
        out += _rules(arg)
    return out


def flag_choices(model: type[BaseModel], key: str) -> tuple[str, ...]:
    """The values a ``Literal`` field takes, as argparse ``choices=``."""
    *parents, last = key.split(".")
    for part in parents:
        model = model.model_fields[part].annotation
    return tuple(typing.get_args(model.model_fields[last].annotation))


def leaf_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field of ``model`` as a dotted key, nested models' fields in place of the model (lists stay whole)."""
    out: list[str] = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += leaf_fields(ann, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


@dataclass(frozen=True)
class ConfigFile(Generic[M]):
    """One component's configuration file: its model and ``kind``, declared once in the component's ``config``
    module, which exposes :meth:`load` and :meth:`dump` as its own ``load`` and ``dump``.

    Attributes:
        model: the component's frozen configuration model.
        kind: the file's ``kind`` (``apiVersion`` is :data:`CONFIG_API_VERSION`).
    """

    model: type[M]
    kind: str

    def load(self, path: str | Path) -> M:
        """The configuration in file ``path``.

        Raises:
            ConfigFileError: unreadable, another kind, unknown keys or bad values (each named with the file, the
                key, the value and what was expected).
        """
        return load(path, self.model, self.kind)

    def dump(self, config: M) -> str:
        """``config`` as its file's text (every field, defaults included)."""
        return dump(config, self.kind)

    def with_flags(self, args: Any, field_flags: Mapping[str, tuple[str, str]], defaults: M) -> M:
        """The configuration a command runs with: ``--config FILE`` (``args.config``; else ``defaults``) with the
        flags given applied over it (:func:`override`).

        Args:
            args: the parsed command line (an ``argparse.Namespace``); ``args.config`` is the file or None.
            field_flags: ``{flag: (args attribute, dotted field)}``; a flag left at None is not given.
            defaults: what runs without a file.

        Raises:
            ConfigFileError: a bad file, or a flag that breaks a check (names the flag).
        """
        base = self.load(args.config) if args.config else defaults
        return override(base, {field: (flag, getattr(args, dest)) for flag, (dest, field) in field_flags.items()},
                        source=args.config or "defaults")
