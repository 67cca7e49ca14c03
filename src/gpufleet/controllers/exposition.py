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

Text format reference: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString

#: Content type of the text exposition format 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: gzip level for responses: 1 compresses a 125 KB exposition ~8x at a fraction of level 9's CPU.
GZIP_LEVEL = 1

_SIMPLE_TYPES = {"counter": "counter", "gauge": "gauge", "info": "gauge", "unknown": "untyped"}


class _Fallback(Exception):
    pass


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render(registry: CollectorRegistry) -> str:
    out: list[str] = []
    append = out.append
    # Label pairs repeat across samples (a GPU's uuid and pci_bus_id on each of its ~100 series):
    # each is escaped and formatted once per scrape.
    pairs: dict[tuple[str, str], str] = {}

    def pair(kv: tuple[str, str]) -> str:
        text = pairs.get(kv)
        if text is None:
            text = pairs[kv] = f'{kv[0]}="{_escape_value(kv[1])}"'
        return text

    for family in registry.collect():
        mtype = _SIMPLE_TYPES.get(family.type)
        if mtype is None:
            raise _Fallback
        name = family.name + ("_total" if family.type == "counter" else "_info" if family.type == "info" else "")
        append(f"# HELP {name} {family.documentation.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n")
        append(f"# TYPE {name} {mtype}\n")
        for sample in family.samples:
            if sample.timestamp is not None or sample.exemplar is not None or sample.name.endswith("_created"):
                raise _Fallback
            if sample.labels:
                labels = ",".join([pair(kv) for kv in sorted(sample.labels.items())])
                append(f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}\n")
            else:
                append(f"{sample.name} {floatToGoString(sample.value)}\n")
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
