"""The kubelet's two statistics documents from what a provider reports: resource metrics and the Summary API."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.virtual_kubelet.stats import ContainerStats, CpuCounters, PodStats, Rates, resource_metrics, summary

T0 = 1_800_000_000.0


def pod(name: str, cpu: float, mem: int, at: float = T0, uid: str | None = None) -> PodStats:
    return PodStats("inference", name, uid or f"uid-{name}", (ContainerStats("server", cpu, mem, T0 - 600, at),))


def samples(text: bytes) -> dict[tuple[str, tuple], tuple[float, float | None]]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            ts = None if s.timestamp is None else float(s.timestamp)
            out[(s.name, tuple(sorted(s.labels.items())))] = (s.value, ts)
    return out


def test_resource_metrics_are_the_kubelets_families_with_the_times_they_were_read():
    got = samples(resource_metrics([pod("a", 12.5, 300 << 20), pod("b", 2.5, 100 << 20)]))
    lab = (("container", "server"), ("namespace", "inference"), ("pod", "a"))
    assert got[("container_cpu_usage_seconds_total", lab)] == (12.5, T0)
    assert got[("container_memory_working_set_bytes", lab)] == (300 << 20, T0)
    assert got[("container_start_time_seconds", lab)][0] == T0 - 600
    assert got[("pod_cpu_usage_seconds_total", (("namespace", "inference"), ("pod", "b")))] == (2.5, T0)
    # The virtual node's usage is its pods'.
    assert got[("node_cpu_usage_seconds_total", ())] == (15.0, T0)
    assert got[("node_memory_working_set_bytes", ())] == (400 << 20, T0)
    assert got[("resource_scrape_error", ())] == (0.0, None)
    assert samples(resource_metrics([], error=True))[("resource_scrape_error", ())] == (1.0, None)


def test_summary_gives_cumulative_cpu_and_a_rate_from_the_second_reading():
    rates = Rates()
    first = summary("vk-rental", T0 - 900, [pod("a", 10.0, 1000)], rates)
    assert first["node"]["nodeName"] == "vk-rental" and first["node"]["startTime"] == "2027-01-15T07:45:00Z"
    (p,) = first["pods"]
    assert p["podRef"] == {"name": "a", "namespace": "inference", "uid": "uid-a"}
    assert p["containers"][0]["cpu"] == {"time": "2027-01-15T08:00:00Z", "usageCoreNanoSeconds": 10_000_000_000}
    assert p["containers"][0]["memory"]["workingSetBytes"] == 1000 and "usageNanoCores" not in p["cpu"]
    second = summary("vk-rental", T0 - 900, [pod("a", 10.5, 1000, at=T0 + 10)], rates)
    assert second["pods"][0]["containers"][0]["cpu"]["usageNanoCores"] == pytest.approx(50_000_000, rel=1e-6)
    assert second["pods"][0]["cpu"]["usageNanoCores"] == second["node"]["cpu"]["usageNanoCores"]
    # A pod gone is forgotten: the same UID later starts over without a rate.
    summary("vk-rental", T0 - 900, [], rates)
    third = summary("vk-rental", T0 - 900, [pod("a", 11.0, 1000, at=T0 + 20)], rates)
    assert "usageNanoCores" not in third["pods"][0]["containers"][0]["cpu"]


def test_cpu_counters_sum_rates_back_into_the_counter_a_scraper_differentiates():
    counters = CpuCounters()
    # First reading: 2 cores over the 100 s since the container started.
    assert counters.add("u1", "server", 2.0, T0, T0 - 100) == pytest.approx(200.0)
    assert counters.add("u1", "server", 0.5, T0 + 15, T0 - 100) == pytest.approx(207.5)
    # The same reading again (a scrape before the remote window moved) adds nothing; an older one neither.
    assert counters.add("u1", "server", 9.0, T0 + 15, T0 - 100) == pytest.approx(207.5)
    assert counters.add("u1", "server", 9.0, T0, T0 - 100) == pytest.approx(207.5)
    # What metrics-server takes from two scrapes is the remote rate.
    assert (counters.add("u1", "server", 1.25, T0 + 45, T0 - 100) - 207.5) / 30 == pytest.approx(1.25)
    counters.forget({"u2"})
    assert counters.add("u1", "server", 1.0, T0 + 60, T0 + 50) == pytest.approx(10.0)  # started over
