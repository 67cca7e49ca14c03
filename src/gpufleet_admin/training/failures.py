"""The fleet's own failure rate, from node health's remediation records (pure, given the objects).

Node health (``gpufleet node-health``) records every node it takes out:
an Event ``NodeSwapRequested`` (message ``... (node-health): ...``) or
``NodeDegraded`` on the Node, and an entry in the Node's
``gpufleet.io/health-history`` annotation. Events live an hour by default
(kube-apiserver ``--event-ttl``); the annotation lives with the Node, so
both are read and one failure seen in both counts once.

Measured the way the advisor's default is calibrated (``MTTF = k / GPUs``,
:mod:`gpufleet_admin.training.checkpoint`): ``k`` = GPU-hours of the fleet's
GPU nodes over the window / failures in it. The GPUs are those of the
non-virtual nodes now (nodes that joined or left during the window make
this an approximation). Failures node health does not see (software,
silent data corruption) are not counted: the measured MTTF is an upper bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpufleet.fleet import nodes as nodeutil
from gpufleet.kube.times import parse_time
from gpufleet.names import ANN_HEALTH_HISTORY, GPU_RESOURCE, VIRTUAL_NODE_LABEL

Obj = dict[str, Any]

#: Event reasons of node health's actions that take a node out.
REMEDIATION_REASONS = ("NodeSwapRequested", "NodeDegraded")
#: Records of one node closer than this (seconds) are the same failure (Event and history entry).
SAME_FAILURE_SECONDS = 120.0


@dataclass(frozen=True)
class Measured:
    """The fleet's failure rate over a window.

    Attributes:
        failures: remediations counted.
        window_hours: the window.
        gpus: GPUs of the fleet's GPU nodes.
        gpu_hours_per_failure: ``k`` (GPU-hours per failure); None without failures.
    """

    failures: int
    window_hours: float
    gpus: int
    gpu_hours_per_failure: float | None

    def mttf_hours(self, job_gpus: int) -> float | None:
        """The MTTF of a job on ``job_gpus`` GPUs at this rate (None without failures)."""
        if self.gpu_hours_per_failure is None or job_gpus <= 0:
            return None
        return self.gpu_hours_per_failure / job_gpus

    def describe(self) -> str:
        """One line saying what was measured."""
        what = (f"{self.failures} node-health remediations in the last {self.window_hours:g} h on {self.gpus:,} GPUs")
        if self.gpu_hours_per_failure is None:
            return what
        return f"measured: {what}: {self.gpu_hours_per_failure:,.0f} GPU-hours per failure"


def _event_time(e: Obj) -> float | None:
    return parse_time(e.get("eventTime")) or parse_time(e.get("lastTimestamp")) or parse_time(e.get("firstTimestamp"))


def remediations(events: Iterable[Obj], nodes: Iterable[Obj]) -> dict[str, list[float]]:
    """Node -> times node health took it out, from Events and health-history annotations, one per failure."""
    times: dict[str, list[float]] = {}
    for e in events:
        ref = e.get("involvedObject") or {}
        reason = e.get("reason")
        if ref.get("kind") != "Node" or reason not in REMEDIATION_REASONS:
            continue
        if reason == "NodeSwapRequested" and "(node-health)" not in (e.get("message") or ""):
            continue  # a person's swap (invoke node.swap), not a failure node health found
        t = _event_time(e)
        if t is not None:
            times.setdefault(ref.get("name", ""), []).append(t)
    for n in nodes:
        for entry in nodeutil.health_history(n):
            t = nodeutil.recorded_time(entry.get("time"), f"node {nodeutil.name(n)} {ANN_HEALTH_HISTORY} time")
            if t is not None:
                times.setdefault(nodeutil.name(n), []).append(t)
    out: dict[str, list[float]] = {}
    for node, ts in times.items():
        kept: list[float] = []
        for t in sorted(ts):
            if not kept or t - kept[-1] > SAME_FAILURE_SECONDS:
                kept.append(t)
        out[node] = kept
    return out


def fleet_gpus(nodes: Iterable[Obj]) -> int:
    """GPUs (``nvidia.com/gpu`` capacity) of the fleet's own nodes (virtual nodes left out)."""
    key, value = VIRTUAL_NODE_LABEL
    total = 0
    for n in nodes:
        if nodeutil.labels(n).get(key) == value:
            continue
        cap = ((n.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
        try:
            total += int(cap) if cap is not None else 0
        except (TypeError, ValueError):
            continue
    return total


def measure(events: Iterable[Obj], nodes: Iterable[Obj], now: float, window_hours: float) -> Measured:
    """The fleet's failure rate over the ``window_hours`` before ``now`` (module docstring).

    Raises:
        ValueError: ``window_hours`` is not a finite number > 0.
    """
    if not isinstance(window_hours, (int, float)) or not 0 < window_hours < float("inf"):
        raise ValueError(f"window_hours: {window_hours!r}: expected finite hours > 0")
    nodes = list(nodes)
    start = now - window_hours * 3600
    failures = sum(1 for ts in remediations(events, nodes).values() for t in ts if start <= t <= now)
    gpus = fleet_gpus(nodes)
    k = gpus * window_hours / failures if failures and gpus else None
    return Measured(failures, float(window_hours), gpus, k)
