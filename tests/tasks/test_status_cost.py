"""``invoke status``'s outside capacity cost: burn rate from the virtual nodes' Running pods and prices, totals
only from Prometheus (pure build and render; the read of the counters against a real Prometheus)."""

from __future__ import annotations

import pytest
from rich.console import Console

from gpufleet_workshop.tasks import fleet_status as st
from gpufleet.names import PRICE_ANNOTATION
from gpufleet.virtual_kubelet.ledger import PoolTotals
from roles.registry import load

from ..builders import node, pod


def virtual(name: str, pool: str, price: str | None) -> dict:
    return node(name, gpus=32, flavor=None, labels={"type": "virtual-kubelet", "gpufleet.io/pool": pool},
                annotations={PRICE_ANNOTATION: price} if price is not None else {})


def scene() -> tuple[list[dict], list[dict]]:
    nodes = [node("a1"), virtual("vk-other", "other", "2.1"), virtual("vk-rental", "rental", None)]
    inf = {"ns": "inference", "priority_class": "gpufleet-inference"}
    pods = [
        pod("chat-0", "vk-other", gpus=2, **inf),
        pod("chat-1", "vk-other", gpus=2, **inf),
        pod("chat-2", "vk-other", gpus=2, phase="Pending", **inf),  # not running there yet: not billed
        pod("chat-3", "vk-rental", gpus=1, **inf),
        pod("chat-4", "a1", gpus=2, **inf),
    ]
    return nodes, pods


def render(status: st.FleetStatus) -> str:
    console = Console(width=200, record=True)
    console.print(st.render(status))
    return console.export_text()


def test_the_burn_rate_is_gpus_running_outside_times_the_nodes_price_and_no_totals_without_prometheus():
    nodes, pods = scene()
    status = st.build(load("local"), nodes, pods, [])
    rows = {r.node: r for r in status.outside_cost}
    assert (rows["vk-other"].gpus_running, rows["vk-other"].price_per_gpu_hour) == (4, 2.1)
    assert rows["vk-other"].burn_per_hour == pytest.approx(8.4)
    assert rows["vk-rental"].price_per_gpu_hour is None and rows["vk-rental"].burn_per_hour is None
    assert all(r.gpu_seconds is None and r.cost is None for r in status.outside_cost)
    text = render(status)
    assert "Outside capacity cost" in text and "8.40 USD" in text and "totals: give --prometheus-url" in text


def test_totals_come_from_the_ledger_read_from_prometheus():
    nodes, pods = scene()
    status = st.build(load("local"), nodes, pods, [], ledger={"other": PoolTotals(7200.0, 4.2)})
    status.prometheus_url = "http://prometheus.monitoring:9090"
    rows = {r.node: r for r in status.outside_cost}
    assert (rows["vk-other"].gpu_seconds, rows["vk-other"].cost) == (7200.0, 4.2)
    assert rows["vk-rental"].gpu_seconds is None  # no series for the pool: none, not 0
    text = render(status)
    assert "7,200" in text and "4.20 USD" in text and "since each virtual kubelet started" in text


def test_an_unreachable_prometheus_is_said_not_hidden():
    nodes, pods = scene()
    status = st.build(load("local"), nodes, pods, [])
    status.prometheus_url, status.prometheus_error = "http://127.0.0.1:1", "connection refused"
    assert "totals unavailable: connection refused" in render(status)


def test_a_bad_prometheus_url_exits_2_naming_the_flag():
    from invoke import Context
    from invoke.exceptions import Exit

    from gpufleet_workshop.tasks.status import status

    with pytest.raises(Exit) as exc:
        status(Context(), env="local", prometheus_url="prometheus:9090")
    assert exc.value.code == 2 and "--prometheus-url 'prometheus:9090'" in exc.value.message
