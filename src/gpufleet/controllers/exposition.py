"""A lean Prometheus text-format (0.0.4) writer, what every gpufleet ``/metrics`` endpoint serves.

prometheus_client's ``generate_latest`` re-validates and escapes every label
*name* of every sample and its server gzips at level 9: for a large node
(~1,500 series) that is two thirds of an exporter scrape's CPU. gpufleet's
families only carry valid legacy names (fixed in code), so this writer
escapes label *values* only, and the server
(:mod:`gpufleet.controllers.serve`) gzips at level 1. The output is
byte-identical to ``generate_latest`` (tests compare both on every fixture
node); a registry holding anything beyond counters, gauges, info and untyped
families (histograms, summaries, ``_created`` samples, timestamps) falls back
to ``generate_latest``.

Collectors that build many series (the exporter) label their samples with
:class:`Labels` from :class:`LabelSets`: each label set is sorted, escaped
and joined once while it exists, not once per sample and scrape, and the
writer does no per-sample sorting for them.

Text format reference: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString

#: Content type of the text exposition format 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: gzip level for responses: 1 compresses a 125 KB exposition ~8x at a fraction of level 9's CPU.
GZIP_LEVEL = 1

_SIMPLE_TYPES = {"counter": "counter", "gauge": "gauge", "info": "gauge", "unknown": "untyped"}
#: Samples generate_latest moves out of a family's order (OpenMetrics-only): the writer falls back on them.
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
#: Text of the small integers seen before (0 and 1 above all: flags, error counters, states);
#: at most _SMALL_INT entries, so growing counters do not fill it.
_INT_TEXT: dict[int, str] = {}
_SMALL_INT = 4096


class _Fallback(Exception):
    pass


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Labels(dict):
    """A sample's label set that carries its exposition text, rendered once.

    A plain ``dict`` to everything else (prometheus_client, parsers, tests);
    :func:`render_text` uses :attr:`text` instead of sorting and escaping the
    pairs of every sample on every scrape. Built once per label set by
    :class:`LabelSets` and never mutated afterwards.

    Attributes:
        text: ``name="value",...`` sorted by label name, values escaped, as
            ``generate_latest`` writes them.
    """

    __slots__ = ("text",)

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self.text = ",".join([f'{k}="{_escape_value(v)}"' for k, v in sorted(self.items())])


class LabelSets(dict):
    """The :class:`Labels` of one label-name tuple, kept from one scrape to the next.

    ``sets[values]`` (one value per name, a tuple) is the label set of those
    values, made on first use and reused on later scrapes: a plain dict
    lookup on the hot path. Label sets that stop being used (a port gone, a
    firmware version changed) stay until :meth:`rotate` finds more than
    ``limit`` and starts afresh, which bounds the memory.

    Args:
        names: the label names, in the order values are given.
        limit: most label sets kept between scrapes.
    """

    __slots__ = ("names", "limit")

    def __init__(self, names: Iterable[str], limit: int = 16384) -> None:
        super().__init__()
        self.names = tuple(names)
        self.limit = limit

    def __missing__(self, values: tuple[str, ...]) -> Labels:
        labels = self[values] = Labels(zip(self.names, values, strict=True))
        return labels

    def rotate(self) -> None:
        """End a scrape: start afresh when more than ``limit`` label sets accumulated."""
        if len(self) > self.limit:
            self.clear()


def _value_text(value: float) -> str:
    """``floatToGoString(value)``, remembered for small integers (the same few values recur every scrape)."""
    if type(value) is int and 0 <= value < _SMALL_INT:
        text = _INT_TEXT.get(value)
        if text is None:
            text = _INT_TEXT[value] = floatToGoString(value)
        return text
    return floatToGoString(value)


def _render(registry: CollectorRegistry) -> str:
    out: list[str] = []
    append = out.append
    value_text = _value_text
    # Label pairs of plain dicts repeat across samples (a GPU's uuid and pci_bus_id on each of its
    # ~100 series): each is escaped and formatted once per scrape. Labels carry their text already.
    pairs: dict[tuple[str, str], str] = {}

    def pair(kv: tuple[str, str]) -> str:
        text = pairs.get(kv)
        if text is None:
            text = pairs[kv] = f'{kv[0]}="{_escape_value(kv[1])}"'
        return text

    for family in registry.collect():
        ftype = family.type
        mtype = _SIMPLE_TYPES.get(ftype)
        if mtype is None:
            raise _Fallback
        name = family.name + ("_total" if ftype == "counter" else "_info" if ftype == "info" else "")
        append(f"# HELP {name} {family.documentation.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n")
        append(f"# TYPE {name} {mtype}\n")
        om_names = [family.name + suffix for suffix in _OM_SUFFIXES]
        checked = None
        for sample in family.samples:
            sname, labels, value, timestamp, exemplar = sample[:5]
            if timestamp is not None or exemplar is not None:
                raise _Fallback
            if sname is not checked:  # one name per family, as a rule the same string object
                if sname in om_names:
                    raise _Fallback
                checked = sname
            if type(labels) is Labels:
                append(f"{sname}{{{labels.text}}} {value_text(value)}\n")
            elif labels:
                text = ",".join([pair(kv) for kv in sorted(labels.items())])
                append(f"{sname}{{{text}}} {value_text(value)}\n")
            else:
                append(f"{sname} {value_text(value)}\n")
    return "".join(out)


def render_text(registry: CollectorRegistry) -> bytes:
    """The registry's exposition in text format 0.0.4, UTF-8 (same bytes as ``generate_latest``).

    Collects the registry once. Falls back to ``prometheus_client.generate_latest``
    (collecting again) when a family is not a counter, gauge, info or untyped.
    """
    try:
        return _render(registry).encode()
    except _Fallback:
        return generate_latest(registry)
