"""``invoke status`` per topology domain: GPUs free and held by training, gangs across domains (pure)."""

from __future__ import annotations

from rich.console import Console

from gpufleet.fleet import topology
from gpufleet_workshop.tasks import fleet_status as st
from roles.registry import load

from ..builders import node, pod

LEVELS = [("block", "gpufleet.io/block"), ("rack", "gpufleet.io/rack")]


def placed(name: str, rack: str, block: str, **kw) -> dict:
    return node(name, labels={"gpufleet.io/rack": rack, "gpufleet.io/block": block}, **kw)


def scene() -> tuple[list[dict], list[dict]]:
    nodes = [placed("a1", "rack-a", "block-1"), placed("a2", "rack-a", "block-1"),
             placed("b1", "rack-b", "block-1", taints=[{"key": "gpufleet.io/swap", "value": "fan", "effect": "NoSchedule"}]),
             placed("c1", "rack-c", "block-2"), node("x1")]  # x1: a node the provisioner did not label
    train = {"priority_class": "gpufleet-training"}
    pods = [
        pod("one-0", "a1", gpus=8, ns="team", labels={"gpufleet.io/job": "one"}, **train),
        pod("one-1", "a2", gpus=8, ns="team", labels={"gpufleet.io/job": "one"}, **train),
        pod("two-0", "a2", gpus=0, ns="team", labels={"gpufleet.io/job": "two"}, **train),  # no GPUs: not counted
        pod("spread-0", "a1", gpus=0, ns="team", **train),
        pod("wide-0", "c1", gpus=4, ns="team", labels={"gpufleet.io/job": "wide"}, **train),
        pod("wide-1", "x1", gpus=4, ns="team", labels={"gpufleet.io/job": "wide"}, **train),
        pod("serve-0", "c1", gpus=2, ns="inference", priority_class="gpufleet-inference"),
    ]
    return nodes, pods


def test_gpus_per_domain():
    nodes, pods = scene()
    status = st.build(load("local"), nodes, pods, [])
    rows = {(r.level, r.domain): (r.nodes, r.schedulable, r.training, r.free) for r in status.domains}
    assert rows == {
        ("block", "block-1"): (3, 16, 16, 0),   # b1 is out for swap: not schedulable
        ("block", "block-2"): (1, 8, 4, 2),     # 4 training + 2 inference on c1
        ("block", topology.UNLABELLED): (1, 8, 4, 4),
        ("rack", "rack-a"): (2, 16, 16, 0),
        ("rack", "rack-b"): (1, 0, 0, 0),
        ("rack", "rack-c"): (1, 8, 4, 2),
        ("rack", topology.UNLABELLED): (1, 8, 4, 4),
    }
    assert [r.domain for r in status.domains][:3] == ["block-1", "block-2", topology.UNLABELLED]


def test_gangs_across_domains():
    nodes, pods = scene()
    status = st.build(load("local"), nodes, pods, [])
    assert [g.gang for g in status.gangs] == ["team/one", "team/wide"]
    (wide,) = status.spanning
    assert wide.gang == "team/wide" and wide.pods == 2
    assert wide.domains == {"block": {"block-2": 1, topology.UNLABELLED: 1}, "rack": {"rack-c": 1, topology.UNLABELLED: 1}}
    one = status.gangs[0]
    assert not one.spans("rack") and one.domains["rack"] == {"rack-a": 2}


def test_a_gang_is_found_by_its_kueue_workload_too():
    pod_ = pod("p", "a1", gpus=8, ns="team", priority_class="gpufleet-training")
    pod_["metadata"]["annotations"] = {"kueue.x-k8s.io/workload": "jobset-x-1234"}
    assert st.gang_of(pod_) == "team/jobset-x-1234"
    assert st.gang_of(pod("q", "a1")) is None


def test_status_screen_shows_domains_and_spanning_gangs():
    nodes, pods = scene()
    console = Console(width=160, record=True)
    console.print(st.render(st.build(load("local"), nodes, pods, [])))
    text = console.export_text()
    assert "GPUs per topology domain" in text
    assert "Training gangs across domains (1 of 2)" in text
    assert "team/wide" in text and "rack-c (1)" in text


def test_domain_rows_skip_virtual_and_gpu_less_nodes():
    vk = node("vk-rental", labels={"type": "virtual-kubelet"})
    cpu = placed("cpu-1", "rack-a", "block-1", gpus=0)
    assert topology.domain_rows([vk, cpu], {}, LEVELS, {}) == []


def test_status_screen_shows_the_flip_out_mode():
    nodes, pods = scene()
    console = Console(width=160, record=True)
    console.print(st.render(st.build(load("local", overrides={"taint_controller_flip_mode": "evict_first"}), nodes, pods, [])))
    assert "flip-out mode: evict_first" in " ".join(console.export_text().split())
    console = Console(width=160, record=True)
    console.print(st.render(st.build(load("local"), nodes, pods, [])))
    assert "flip-out mode: make_before_break" in " ".join(console.export_text().split())


def test_status_shows_node_healths_circuit_breaker():
    """The share out of service (the classifier's count), the room left, and the state node health wrote."""
    nodes = [node(f"n{i}") for i in range(4)]
    nodes[0] = node("n0", taints=[{"key": "gpufleet.io/swap", "value": "fan", "effect": "NoSchedule"}])
    nodes[1] = node("n1", cordoned=True)
    cm = {"data": {"state": "open", "since": "2027-01-15T08:00:00Z", "held": "n2,n3", "out": "2", "total": "4",
                   "limit": "0.5", "resume-until": ""}}
    status = st.build(load("local"), nodes, [], [], cm)
    b = status.breaker
    assert (b.out, b.total, b.limit, b.room, b.state, b.held) == (2, 4, 0.5, 0, "open", ("n2", "n3"))
    console = Console(width=200, record=True)
    console.print(st.render(status))
    text = console.export_text()
    assert "Node health circuit breaker" in text and "OPEN since 2027-01-15T08:00:00Z" in text
    assert "2 of 4 GPU nodes (50%)" in text and "none: new faults are held" in text and "n2, n3" in text
    calm = st.build(load("local"), [node(f"n{i}") for i in range(4)], [], [])
    assert calm.breaker.room == 2 and calm.breaker.state == "-"
    assert st.build(load("local", overrides={"node_health_enabled": False}), nodes, [], []).breaker is None
