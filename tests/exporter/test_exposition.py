"""Each fixture node's exposition equals the checked-in ``fixtures/<node>.prom``.

Like node_exporter's ``collector/fixtures/``: the expected text is the
contract. After an intended change, regenerate with
``GPUFLEET_UPDATE_FIXTURES=1 .venv/bin/pytest tests/exporter/test_exposition.py``
and review the diff.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.exporter.nvml_fake import FakeNvmlBackend
from gpufleet_workshop.fixtures.node import FIXTURE_NODES
from gpufleet.exporter.main import build_registry

from .conftest import FIXTURES_DIR

UPDATE = os.environ.get("GPUFLEET_UPDATE_FIXTURES") == "1"


def exposition(paths) -> str:
    registry = build_registry(str(paths.sysfs_root), FakeNvmlBackend(paths.description))
    return generate_latest(registry).decode()


@pytest.mark.parametrize("name", sorted(FIXTURE_NODES))
def test_exposition_matches_fixture(name, fixture_node):
    text = exposition(fixture_node(name))
    expected_path = FIXTURES_DIR / f"{name}.prom"
    if UPDATE:
        expected_path.write_text(text)
    assert expected_path.exists(), f"{expected_path} missing: run with GPUFLEET_UPDATE_FIXTURES=1"
    expected = expected_path.read_text()
    if text != expected:
        import difflib

        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(expected_path), "actual", n=1))
        pytest.fail(f"exposition of {name} differs from {expected_path.name}:\n{diff[:6000]}")


@pytest.mark.parametrize("name", sorted(FIXTURE_NODES))
def test_exposition_follows_naming_conventions(name):
    """Prefix, _total on counters, units in names, one label set per metric."""
    text = (FIXTURES_DIR / f"{name}.prom").read_text()
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("gpufleet_"), family.name
        label_sets = {tuple(sorted(s.labels)) for s in family.samples}
        assert len(label_sets) <= 1, f"{family.name} has several label sets: {label_sets}"
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        if "temperature" in family.name:
            assert family.name.endswith("_celsius"), family.name
        if family.name.endswith("_id"):
            assert "=" in family.documentation, f"{family.name}: help must explain the codes"


#: promtool lint findings accepted on purpose: the saturation flag keeps the
#: name the gpu_metrics issue gave it (alerts and the node_health controller use it).
ACCEPTED_LINT = {"gpufleet_infiniband_counter_saturated metric name should not include type 'counter'"}


@pytest.mark.parametrize("name", sorted(FIXTURE_NODES))
def test_promtool_check_metrics_accepts_exposition(name):
    """promtool's linter (Debian prometheus package) finds nothing else to complain about."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: apt-get install -y prometheus"
    text = (FIXTURES_DIR / f"{name}.prom").read_text()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    findings = {line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()}
    assert findings <= ACCEPTED_LINT, findings - ACCEPTED_LINT


def test_cli_once_prints_the_same_exposition(fixture_node):
    """``gpufleet exporter --once`` (a real process) prints what the registry renders."""
    paths = fixture_node("fabric-faults")
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "exporter", "--once", "--sysfs-root", str(paths.sysfs_root), "--nvml-fake", str(paths.description)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == (FIXTURES_DIR / "fabric-faults.prom").read_text()


@pytest.mark.parametrize("name", sorted(FIXTURE_NODES))
def test_lean_writer_matches_prometheus_client(name, fixture_node):
    """The served bytes equal prometheus_client's generate_latest, process metrics included."""
    from gpufleet.controllers.exposition import render_text

    from prometheus_client import CollectorRegistry

    paths = fixture_node(name)
    live = build_registry(str(paths.sysfs_root), FakeNvmlBackend(paths.description), self_metrics=True)
    families = list(live.collect())  # collect once: error and XID counters move on every scrape

    class Frozen:
        def collect(self):
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Frozen())
    assert render_text(registry) == generate_latest(registry)


def test_lean_writer_escapes_and_falls_back():
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from gpufleet.controllers.exposition import render_text

    registry = CollectorRegistry()
    Gauge("odd_values", 'help with \\ and\nnewline', ["file"], registry=registry).labels(file='a"b\\c\nd').set(1.5)
    assert render_text(registry) == generate_latest(registry)
    Counter("with_created", "counters made by prometheus_client carry _created", registry=registry).inc()
    Histogram("latency_seconds", "a histogram", registry=registry).observe(0.2)
    assert render_text(registry) == generate_latest(registry)  # via the fallback


def test_label_sets_render_once_and_match_prometheus_client():
    """Labels carry generate_latest's text (sorted, escaped); LabelSets hands out the same object
    from scrape to scrape and starts afresh past its limit."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.samples import Sample

    from gpufleet.controllers.exposition import LabelSets, render_text

    sets = LabelSets(["zone", "file", "a"], limit=2)
    odd = sets[("z1", 'a"b\\c\nd', "")]
    assert odd is sets[("z1", 'a"b\\c\nd', "")]
    assert odd == {"zone": "z1", "file": 'a"b\\c\nd', "a": ""}
    assert odd.text == 'a="",file="a\\"b\\\\c\\nd",zone="z1"'

    class Fixed:
        def collect(self):
            family = GaugeMetricFamily("odd_labels", "help", labels=["zone", "file", "a"])
            family.samples.append(Sample("odd_labels", odd, 1))
            family.samples.append(Sample("odd_labels", sets[("z2", "", "x")], 2.5))
            family.add_metric(["z3", "plain", "dict"], 3)  # a plain dict beside Labels
            return iter([family])

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    assert render_text(registry) == generate_latest(registry)
    sets.rotate()
    assert len(sets) == 2 and sets[("z2", "", "x")].text == 'a="x",file="",zone="z2"'
    sets[("z4", "", "")]
    sets.rotate()  # 3 > limit: afresh
    assert len(sets) == 0


@pytest.mark.parametrize("name", sorted(FIXTURE_NODES))
def test_served_bytes_round_trip_through_the_text_parser(name, fixture_node):
    """What /metrics serves parses with prometheus_client's text parser and renders back to the same bytes."""
    from prometheus_client import CollectorRegistry

    from gpufleet.controllers.exposition import render_text

    paths = fixture_node(name)
    live = build_registry(str(paths.sysfs_root), FakeNvmlBackend(paths.description), self_metrics=True)
    served = render_text(live).decode()
    parsed = list(text_string_to_metric_families(served))

    class Parsed:
        def collect(self):
            return iter(parsed)

    again = CollectorRegistry(auto_describe=False)
    again.register(Parsed())
    assert generate_latest(again).decode() == served
