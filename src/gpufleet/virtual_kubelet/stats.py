"""What a virtual node's pods use, as the kubelet reports it: ``/metrics/resource`` and ``/stats/summary``.

A kubelet reports its pods' CPU and memory from cAdvisor; a virtual node's
pods run elsewhere, so their figures come from the provider
(:meth:`gpufleet.virtual_kubelet.provider.Provider.pod_stats`: another
cluster's metrics, a rental's instance statistics). This module turns them
into the two documents consumers of the kubelet API read:

* :func:`resource_metrics`: the kubelet's resource metrics endpoint, what
  metrics-server scrapes for the resource metrics API (``kubectl top``, CPU
  and memory HPAs). Families, labels and help as the kubelet's
  ``pkg/kubelet/metrics/collectors/resource_metrics.go`` (Kubernetes 1.37):
  ``container_cpu_usage_seconds_total``,
  ``container_memory_working_set_bytes``, ``container_start_time_seconds``
  (``container``, ``pod``, ``namespace``), ``pod_cpu_usage_seconds_total``,
  ``pod_memory_working_set_bytes``, ``node_cpu_usage_seconds_total``,
  ``node_memory_working_set_bytes`` and ``resource_scrape_error``; samples
  carry the time they were taken, as the kubelet's do.
* :func:`summary`: the Summary API (``/stats/summary``,
  ``k8s.io/kubelet/pkg/apis/stats/v1alpha1``): the node and every pod with
  its containers' ``cpu`` (``usageCoreNanoSeconds``, and ``usageNanoCores``
  where two readings give a rate) and ``memory`` (``workingSetBytes``).

The virtual node's own usage is its pods' (a virtual node has no system
daemons of its own to count): memory their sum, CPU a counter of its own
(:class:`NodeCpu`) that adds each pod's increase since it was last seen,
so it never goes down when a pod leaves or a provider cannot answer, and a
pod seen for the first time adds nothing (its whole past is not the node's
last few seconds).

What consumers drop, and so what is never served (metrics-server v0.8.0,
``pkg/scraper/client/resource/decode.go``): a pod whose container reports a
CPU counter or a working set of 0 is left out whole, and a node whose
figures are 0; so figures are served at least :data:`MIN_CPU_SECONDS` and
:data:`MIN_MEMORY_BYTES` (a microsecond, a byte). Pods without containers
are not served.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpufleet.kube.times import rfc3339

#: The smallest CPU counter and working set served: metrics-server drops a pod or node whose figure is 0.
MIN_CPU_SECONDS = 1e-6
MIN_MEMORY_BYTES = 1


def usable(pods: Iterable[PodStats]) -> list[PodStats]:
    """The pods that can be served: with containers, every figure finite (a NaN or an infinity from a provider
    would poison the node's counter and make invalid JSON), each pod UID and container name once (a duplicate
    series is dropped by Prometheus and overwritten by metrics-server); the first of duplicates is kept."""
    out, seen = [], set()
    for p in pods:
        if p.uid in seen:
            continue
        containers, names = [], set()
        for c in p.containers:
            figures = (c.cpu_seconds, c.memory_working_set_bytes, c.start_time, c.timestamp)
            if c.name in names or not all(isinstance(f, (int, float)) and math.isfinite(f) for f in figures):
                continue
            names.add(c.name)
            containers.append(c)
        if containers:
            seen.add(p.uid)
            out.append(p if len(containers) == len(p.containers) else PodStats(p.namespace, p.name, p.uid,
                                                                               tuple(containers)))
    return out


def _cpu(value: float) -> float:
    return max(value, MIN_CPU_SECONDS)


def _mem(value: int) -> int:
    return max(value, MIN_MEMORY_BYTES)


@dataclass(frozen=True)
class ContainerStats:
    """One container's usage at one moment.

    Attributes:
        name: the container's name (the source pod's).
        cpu_seconds: CPU the container used since it started, core-seconds (cumulative).
        memory_working_set_bytes: its working set now, bytes (for a process: its resident set).
        start_time: when it started, Unix seconds.
        timestamp: when the figures were read, Unix seconds.
    """

    name: str
    cpu_seconds: float
    memory_working_set_bytes: int
    start_time: float
    timestamp: float


@dataclass(frozen=True)
class PodStats:
    """One pod's usage: the source pod's identity and its containers' :class:`ContainerStats`."""

    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerStats, ...]

    @property
    def start_time(self) -> float:
        """The earliest container start, Unix seconds."""
        return min((c.start_time for c in self.containers), default=0.0)

    @property
    def timestamp(self) -> float:
        """The latest reading, Unix seconds."""
        return max((c.timestamp for c in self.containers), default=0.0)


@dataclass(frozen=True)
class NodeStats:
    """The virtual node's figures at one moment: CPU (core-seconds, cumulative; :class:`NodeCpu`), working set
    (bytes), when (Unix seconds)."""

    cpu_seconds: float
    memory_working_set_bytes: int
    timestamp: float


class NodeCpu:
    """The virtual node's CPU counter (module docstring): the sum of its pods' increases since each was last seen.

    Thread-safe. A pod's counter that went down (its container restarted) adds its new value.
    """

    def __init__(self):
        self._total = 0.0
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe(self, pods: Iterable[PodStats], now: float) -> NodeStats:
        """Add ``pods``' increases (pods not among them are forgotten); the node's figures, stamped with the
        latest reading (a counter that moves with the readings, not with the scrapes), ``now`` without pods."""
        pods = usable(pods)
        with self._lock:
            last, self._last = self._last, {}
            for p in pods:
                cpu = sum(c.cpu_seconds for c in p.containers)
                if p.uid in last:
                    self._total += cpu - last[p.uid] if cpu >= last[p.uid] else cpu
                self._last[p.uid] = cpu
            total = self._total
        return NodeStats(total, sum(c.memory_working_set_bytes for p in pods for c in p.containers),
                         max((p.timestamp for p in pods), default=now))


class _Families:
    def __init__(self, pods: list[PodStats], node: NodeStats | None, error: bool):
        self.pods, self.node, self.error = pods, node, error

    def collect(self):
        c_cpu = CounterMetricFamily("container_cpu_usage_seconds_total",
                                    "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
                                    labels=["container", "pod", "namespace"])
        c_mem = GaugeMetricFamily("container_memory_working_set_bytes",
                                  "[STABLE] Current working set of the container in bytes",
                                  labels=["container", "pod", "namespace"])
        c_start = GaugeMetricFamily("container_start_time_seconds",
                                    "[STABLE] Start time of the container since unix epoch in seconds",
                                    labels=["container", "pod", "namespace"])
        p_cpu = CounterMetricFamily("pod_cpu_usage_seconds_total",
                                    "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
                                    labels=["pod", "namespace"])
        p_mem = GaugeMetricFamily("pod_memory_working_set_bytes", "[STABLE] Current working set of the pod in bytes",
                                  labels=["pod", "namespace"])
        n_cpu = CounterMetricFamily("node_cpu_usage_seconds_total",
                                    "[STABLE] Cumulative cpu time consumed by the node in core-seconds")
        n_mem = GaugeMetricFamily("node_memory_working_set_bytes", "[STABLE] Current working set of the node in bytes")
        for p in self.pods:
            for c in p.containers:
                labels = [c.name, p.name, p.namespace]
                c_cpu.add_metric(labels, _cpu(c.cpu_seconds), timestamp=c.timestamp)
                c_mem.add_metric(labels, _mem(c.memory_working_set_bytes), timestamp=c.timestamp)
                c_start.add_metric(labels, c.start_time)
            p_cpu.add_metric([p.name, p.namespace], _cpu(sum(c.cpu_seconds for c in p.containers)),
                             timestamp=p.timestamp)
            p_mem.add_metric([p.name, p.namespace], _mem(sum(c.memory_working_set_bytes for c in p.containers)),
                             timestamp=p.timestamp)
        if self.node is not None:
            n_cpu.add_metric([], _cpu(self.node.cpu_seconds), timestamp=self.node.timestamp)
            n_mem.add_metric([], _mem(self.node.memory_working_set_bytes), timestamp=self.node.timestamp)
        err = GaugeMetricFamily("resource_scrape_error",
                                "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise")
        err.add_metric([], 1.0 if self.error else 0.0)
        return [c_cpu, c_mem, c_start, n_cpu, n_mem, p_cpu, p_mem, err]


def resource_metrics(pods: Iterable[PodStats], node: NodeStats | None = None, *, error: bool = False) -> bytes:
    """The kubelet's ``/metrics/resource`` page (Prometheus text 0.0.4) for ``pods`` (those without containers
    left out) and the virtual node's figures ``node`` (None: no node series).

    Args:
        error: the provider could not report (``resource_scrape_error`` 1; the pods it did report are kept).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(usable(pods), node, error))
    return generate_latest(registry)


class Rates:
    """CPU rates from successive readings: ``usageNanoCores`` of the Summary API, per (pod UID, container).

    Thread-safe. The rate stays what it was while the reading has not moved on (a second reader of the same
    provider reading gets it too); an older reading, or a counter that went down, gives none.
    """

    def __init__(self):
        self._last: dict[tuple[str, str], tuple[float, float, int | None]] = {}
        self._lock = threading.Lock()

    def nano_cores(self, uid: str, c: ContainerStats) -> int | None:
        """The container's CPU rate between its last two readings, nano-cores (None on the first)."""
        key = (uid, c.name)
        with self._lock:
            prev = self._last.get(key)
            if prev is not None and c.timestamp == prev[0]:
                return prev[2]
            if prev is not None and c.timestamp < prev[0]:
                return None
            rate = (None if prev is None or c.cpu_seconds < prev[1]
                    else int((c.cpu_seconds - prev[1]) / (c.timestamp - prev[0]) * 1e9))
            self._last[key] = (c.timestamp, c.cpu_seconds, rate)
            return rate

    def forget(self, live_uids: set[str]) -> None:
        """Drop the readings of pods not in ``live_uids``."""
        with self._lock:
            for key in [k for k in self._last if k[0] not in live_uids]:
                del self._last[key]


class CpuCounters:
    """Cumulative CPU counters rebuilt from rate readings, per (pod UID, container); the inverse of :class:`Rates`.

    Why: the resource metrics API (``metrics.k8s.io`` PodMetrics, what another
    cluster's metrics-server serves) gives a container's CPU as a rate over a
    window, while the kubelet's endpoint carries a counter
    (``container_cpu_usage_seconds_total``). Each reading adds ``rate x`` the
    seconds since the previous one; the first starts at ``rate x`` the seconds
    since the container started. A consumer that takes the counter's rate
    (metrics-server: the difference of two scrapes over their interval) gets
    the remote rates back. A reading not newer than the last adds nothing.
    Thread-safe.

    Counting starts at ``origin`` (when this process began counting): a
    container older than that is reported as started then (:meth:`start`),
    so a restarted virtual kubelet's counters, rebuilt from scratch, read to
    metrics-server as a restarted container rather than as a counter that went
    down (which it would skip).
    """

    def __init__(self, origin: float | None = None):
        self.origin = time.time() if origin is None else origin
        self._state: dict[tuple[str, str], tuple[float, float]] = {}
        self._lock = threading.Lock()

    def start(self, start_time: float) -> float:
        """The start a container is reported with: its own, or :attr:`origin` if it is older."""
        return max(start_time, self.origin)

    def add(self, uid: str, container: str, cores: float, timestamp: float, start_time: float) -> float:
        """The counter after a reading of ``cores`` (CPU cores, >= 0) at ``timestamp`` (Unix seconds), core-seconds."""
        key = (uid, container)
        with self._lock:
            prev = self._state.get(key)
            if prev is None:
                total = cores * max(0.0, timestamp - self.start(start_time))
            elif timestamp <= prev[1]:
                return prev[0]
            else:
                total = prev[0] + cores * (timestamp - prev[1])
            self._state[key] = (total, timestamp)
            return total

    def forget(self, live_uids: set[str]) -> None:
        """Drop the counters of pods not in ``live_uids``."""
        with self._lock:
            for key in [k for k in self._state if k[0] not in live_uids]:
                del self._state[key]


def _cpu_memory(cpu_seconds: float, memory: int, at: float, nano_cores: int | None) -> dict:
    cpu = {"time": rfc3339(at), "usageCoreNanoSeconds": int(_cpu(cpu_seconds) * 1e9)}
    if nano_cores is not None:
        cpu["usageNanoCores"] = nano_cores
    return {"cpu": cpu, "memory": {"time": rfc3339(at), "workingSetBytes": _mem(memory)}}


#: The key :class:`Rates` keeps the node's own counter under (no pod has an empty UID).
_NODE_KEY = ""


def summary(node_name: str, node_start: float, pods: Iterable[PodStats], node: NodeStats,
            rates: Rates | None = None) -> dict:
    """The Summary API document (``stats/v1alpha1`` ``Summary``) of virtual node ``node_name`` for ``pods``.

    Args:
        node_start: when the virtual kubelet started, Unix seconds (the node's ``startTime``).
        node: the node's own figures (:meth:`NodeCpu.observe`), whose counter never goes down.
        rates: keeps the previous readings to give ``usageNanoCores`` (None: cumulative figures only).
    """
    out_pods = []
    pods = usable(pods)
    for p in pods:
        containers, pod_rate, rated = [], 0, True
        for c in p.containers:
            rate = rates.nano_cores(p.uid, c) if rates is not None else None
            rated = rated and rate is not None
            pod_rate += rate or 0
            containers.append({"name": c.name, "startTime": rfc3339(c.start_time),
                               **_cpu_memory(c.cpu_seconds, c.memory_working_set_bytes, c.timestamp, rate)})
        cpu = sum(c.cpu_seconds for c in p.containers)
        mem = sum(c.memory_working_set_bytes for c in p.containers)
        out_pods.append({"podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
                         "startTime": rfc3339(p.start_time), "containers": containers,
                         **_cpu_memory(cpu, mem, p.timestamp, pod_rate if rated else None)})
    node_rate = (rates.nano_cores(_NODE_KEY, ContainerStats("node", node.cpu_seconds, 0, node_start, node.timestamp))
                 if rates is not None else None)
    if rates is not None:
        rates.forget({p.uid for p in pods} | {_NODE_KEY})
    return {"node": {"nodeName": node_name, "startTime": rfc3339(node_start),
                     **_cpu_memory(node.cpu_seconds, node.memory_working_set_bytes, node.timestamp, node_rate)},
            "pods": out_pods}
