"""The fleet's measured failure rate for the checkpoint advisor (gpufleet_admin.training.failures), pure."""

from __future__ import annotations

import json

import pytest

from gpufleet_admin.training.failures import measure, remediations

from .builders import T0, ts


def node(name: str, gpus: int = 8, history=(), virtual: bool = False) -> dict:
    labels = {"type": "virtual-kubelet"} if virtual else {}
    ann = {"gpufleet.io/health-history": json.dumps([{"time": ts(t), "fault": "xid"} for t in history])} if history else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": ann},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)}}}


def event(node_name: str, reason: str, at: float, message: str = "cordoned and tainted gpufleet.io/swap (node-health): x") -> dict:
    return {"involvedObject": {"kind": "Node", "name": node_name}, "reason": reason, "message": message,
            "lastTimestamp": ts(at)}


def test_events_and_history_count_each_failure_once():
    nodes = [node("a", history=[1000]), node("b"), node("vk", gpus=64, virtual=True)]
    events = [event("a", "NodeSwapRequested", 1030),   # the same failure as a's history entry
              event("b", "NodeDegraded", 5000, "tainted gpufleet.io/degraded=ib_errors"),
              event("b", "NodeSwapRequested", 9000, "cordoned and tainted gpufleet.io/swap (manual): bad cable"),  # a person
              event("b", "NodeDrained", 9001),
              {"involvedObject": {"kind": "Pod", "name": "x"}, "reason": "NodeDegraded", "lastTimestamp": ts(6000)}]
    assert remediations(events, nodes) == {"a": [T0 + 1000], "b": [T0 + 5000]}
    m = measure(events, nodes, now=T0 + 10 * 3600, window_hours=10)
    assert (m.failures, m.gpus) == (2, 16)  # virtual nodes are not the fleet's GPUs
    assert m.gpu_hours_per_failure == pytest.approx(16 * 10 / 2)
    assert m.mttf_hours(8) == pytest.approx(10)
    assert "2 node-health remediations in the last 10 h on 16 GPUs" in m.describe()


def test_outside_the_window_or_none_at_all():
    nodes = [node("a", history=[100])]
    m = measure([], nodes, now=T0 + 10 * 3600, window_hours=1)
    assert m.failures == 0 and m.gpu_hours_per_failure is None and m.mttf_hours(8) is None
    with pytest.raises(ValueError, match="window_hours: 0: expected finite hours > 0"):
        measure([], nodes, now=T0, window_hours=0)


def test_checkpoint_interval_says_which_mttf_it_used(cli):
    code, out, _ = cli("train.checkpoint-interval", "--gpus", "1024", "--checkpoint-seconds", "60")
    assert code == 0 and "MTTF source: published default (Llama 3)" in out
    code, out, _ = cli("train.checkpoint-interval", "--gpus", "1024", "--checkpoint-seconds", "60", "--mttf-hours", "10")
    assert code == 0 and "MTTF source: given (--mttf-hours)" in out and "job MTTF: 10.00 h (MTTF given)" in out
    code, _, err = cli("train.checkpoint-interval", "--gpus", "1024", "--checkpoint-seconds", "60",
                       "--measured-window-hours", "-1")
    assert code == 2 and "--measured-window-hours -1: expected finite hours > 0" in err
