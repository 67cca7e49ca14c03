"""The kubelet's two statistics documents from what a provider reports: resource metrics and the Summary API."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.virtual_kubelet.stats import (ContainerStats, CpuCounters, NodeCpu, NodeStats, PodStats, Rates,
                                           resource_metrics, summary)

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
    got = samples(resource_metrics([pod("a", 12.5, 300 << 20), pod("b", 2.5, 100 << 20)],
                                   NodeStats(15.0, 400 << 20, T0)))
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
    first = summary("vk-rental", T0 - 900, [pod("a", 10.0, 1000)], NodeStats(10.0, 1000, T0), rates)
    assert first["node"]["nodeName"] == "vk-rental" and first["node"]["startTime"] == "2027-01-15T07:45:00Z"
    (p,) = first["pods"]
    assert p["podRef"] == {"name": "a", "namespace": "inference", "uid": "uid-a"}
    assert p["containers"][0]["cpu"] == {"time": "2027-01-15T08:00:00Z", "usageCoreNanoSeconds": 10_000_000_000}
    assert p["containers"][0]["memory"]["workingSetBytes"] == 1000 and "usageNanoCores" not in p["cpu"]
    second = summary("vk-rental", T0 - 900, [pod("a", 10.5, 1000, at=T0 + 10)], NodeStats(10.5, 1000, T0 + 10), rates)
    assert second["pods"][0]["containers"][0]["cpu"]["usageNanoCores"] == pytest.approx(50_000_000, rel=1e-6)
    # A pod gone is forgotten: the same UID later starts over without a rate.
    summary("vk-rental", T0 - 900, [], NodeStats(10.5, 0, T0 + 15), rates)
    third = summary("vk-rental", T0 - 900, [pod("a", 11.0, 1000, at=T0 + 20)], NodeStats(11.0, 1000, T0 + 20), rates)
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


def test_the_node_counter_adds_what_its_pods_used_since_last_seen_and_never_goes_down():
    node = NodeCpu()
    assert node.observe([pod("a", 3600.0, 10)], T0).cpu_seconds == 0.0, "a pod first seen brings no past"
    assert node.observe([pod("a", 3610.0, 10), pod("b", 50.0, 5)], T0 + 10).cpu_seconds == 10.0
    # b leaves and a restarts (its counter starts over): nothing goes down.
    n = node.observe([pod("a", 2.0, 7, at=T0 + 15)], T0 + 20)
    assert (n.cpu_seconds, n.memory_working_set_bytes, n.timestamp) == (12.0, 7, T0 + 15), "stamped with the reading"
    assert node.observe([], T0 + 30).cpu_seconds == 12.0


def test_what_cannot_be_served_is_left_out_and_never_poisons_the_node_counter():
    nan = PodStats("inference", "nan", "u-nan", (ContainerStats("server", float("nan"), 5, T0 - 60, T0),))
    twice = PodStats("inference", "twice", "u-2", (ContainerStats("server", 1.0, 5, T0 - 60, T0),
                                                    ContainerStats("server", 2.0, 5, T0 - 60, T0)))
    node = NodeCpu()
    node.observe([nan, twice], T0)
    n = node.observe([nan, PodStats("inference", "twice", "u-2", (ContainerStats("server", 3.0, 5, T0 - 60,
                                                                                 T0 + 10),))], T0 + 10)
    assert n.cpu_seconds == 2.0
    got = samples(resource_metrics([nan, twice, twice], n))
    assert [k for k in got if k[0] == "container_cpu_usage_seconds_total"] == [
        ("container_cpu_usage_seconds_total", (("container", "server"), ("namespace", "inference"), ("pod", "twice")))]
    assert json.loads(json.dumps(summary("vk-rental", T0 - 900, [nan, twice], n), allow_nan=False))


def test_zeros_that_metrics_server_would_drop_are_never_served_nor_pods_without_containers():
    idle = PodStats("inference", "idle", "u-idle", (ContainerStats("sidecar", 0.0, 0, T0 - 60, T0),))
    empty = PodStats("inference", "empty", "u-empty", ())
    got = samples(resource_metrics([idle, empty], NodeStats(0.0, 0, T0)))
    lab = (("container", "sidecar"), ("namespace", "inference"), ("pod", "idle"))
    assert 0 < got[("container_cpu_usage_seconds_total", lab)][0] < 1e-5
    assert got[("container_memory_working_set_bytes", lab)][0] == 1
    assert got[("node_cpu_usage_seconds_total", ())][0] > 0 and got[("node_memory_working_set_bytes", ())][0] == 1
    assert not [k for k in got if ("pod", "empty") in k[1]]
    doc = summary("vk-rental", T0 - 900, [idle, empty], NodeStats(0.0, 0, T0))
    assert [p["podRef"]["name"] for p in doc["pods"]] == ["idle"]
    assert doc["pods"][0]["containers"][0]["cpu"]["usageCoreNanoSeconds"] > 0


def test_a_second_reader_of_the_same_reading_gets_the_same_rate():
    rates = Rates()
    n0, n1 = NodeStats(10.0, 1000, T0), NodeStats(10.5, 1000, T0 + 10)
    summary("vk-rental", T0 - 900, [pod("a", 10.0, 1000)], n0, rates)
    first = summary("vk-rental", T0 - 900, [pod("a", 10.5, 1000, at=T0 + 10)], n1, rates)
    again = summary("vk-rental", T0 - 900, [pod("a", 10.5, 1000, at=T0 + 10)], n1, rates)
    assert first["pods"][0]["cpu"]["usageNanoCores"] == again["pods"][0]["cpu"]["usageNanoCores"] == 50_000_000


def test_the_node_rate_comes_from_the_node_counter():
    rates, node = Rates(), NodeCpu()
    for at, cpu in ((T0, 10.0), (T0 + 10, 12.0)):
        pods = [pod("a", cpu, 1000, at=at)]
        doc = summary("vk-rental", T0 - 900, pods, node.observe(pods, at), rates)
    assert doc["node"]["cpu"]["usageNanoCores"] == 200_000_000
    assert doc["node"]["cpu"]["usageCoreNanoSeconds"] == 2_000_000_000
