"""The offload cost ledger: GPU-seconds the pods of a virtual node hold outside, and what they cost, by pool.

Each virtual kubelet keeps one :class:`Ledger` (its pod side opens and
closes the intervals, :mod:`gpufleet.virtual_kubelet.pods`); :data:`COLLECTOR`,
registered once on prometheus_client's default registry, sums every
ledger of the process on each scrape (several virtual kubelets share one
process in tests), so the counters read to the second:

* ``gpufleet_flip_external_gpu_seconds_total{pool}``: GPU-seconds held at
  the pool's provider, ``sum over pods of gpus x (stop - start)``, an open
  interval counting up to the scrape;
* ``gpufleet_flip_external_gpu_cost_total{pool,currency}``: their cost,
  ``sum over pods of gpus x (stop - start) / 3600 x price_per_gpu_hour``,
  the price the pool's provider quoted when the pod started running there
  (inventory ``virtual_kubelet_pools[].price_per_gpu_hour``, USD per
  GPU-hour: :data:`CURRENCY`).

An interval starts when the virtual kubelet first sees the pod's remote pod
Running (its status mirrored) and ends when it sees it terminal, or when the
remote pod is gone (the pod deleted or forgotten), or when the virtual
kubelet stops. Nothing is kept on disk: the counters start at 0 with the
process, as Prometheus counters do (``rate``/``increase`` handle the
reset); a restarted virtual kubelet counts the pods it adopts from the
moment it sees them running. GPUs are what the pod requests
(:func:`gpufleet.fleet.capacity.pod_gpus`), the provider's bill unit.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import REGISTRY, CounterMetricFamily
from prometheus_client.registry import Collector

from gpufleet.fleet.capacity import pod_gpus
from gpufleet.kube.quantity import GpuCountError
from gpufleet.names import PRICE_ANNOTATION
from gpufleet.prom.client import PromClient

from .provider import Provider

#: The currency of ``price_per_gpu_hour``: the inventory's pools are priced in USD per GPU-hour
#: (``roles/virtual_kubelet/defaults.yaml``); a pool carries no currency of its own.
CURRENCY = "USD"
SECONDS_PER_HOUR = 3600.0
#: The counters, as Prometheus names them (the collector adds ``_total`` to its families' names).
GPU_SECONDS_METRIC = "gpufleet_flip_external_gpu_seconds_total"
COST_METRIC = "gpufleet_flip_external_gpu_cost_total"

log = logging.getLogger(__name__)
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PoolTotals:
    """What one pool's pods held outside: ``gpu_seconds`` (GPU x s) and ``cost`` (in ``currency``)."""

    gpu_seconds: float = 0.0
    cost: float = 0.0
    currency: str = CURRENCY

    def __add__(self, other: "PoolTotals") -> "PoolTotals":
        return PoolTotals(self.gpu_seconds + other.gpu_seconds, self.cost + other.cost, self.currency)


def cost_of(gpu_seconds: float, price_per_gpu_hour: float) -> float:
    """The cost of ``gpu_seconds`` GPU-seconds at ``price_per_gpu_hour`` per GPU-hour: ``gpu_seconds / 3600 x price``."""
    return gpu_seconds / SECONDS_PER_HOUR * price_per_gpu_hour


@dataclass(frozen=True)
class _Open:
    pool: str
    gpus: int
    price_per_gpu_hour: float
    since: float


class Ledger:
    """GPU-seconds and cost of the pods one virtual kubelet runs outside (module docstring).

    A pool is a provider, by its ``name`` (the inventory pool's); its price is its
    ``capacity().price_per_gpu_hour``, read when a pod starts running there.

    Args:
        pools: the pools (provider names) of the virtual node: their series exist from the start, at 0.
        clock: monotonic seconds.
        register: add the ledger to :data:`COLLECTOR` (served on ``/metrics``).
    """

    def __init__(self, pools: Iterable[str], *, clock: Callable[[], float] = time.monotonic, register: bool = True):
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._closed: dict[str, PoolTotals] = {p: PoolTotals() for p in pools}
        self._stopped = False  # after close(): a reconcile still in flight opens nothing
        if register:
            COLLECTOR.add(self)

    def running(self, uid: str, provider: Provider, pod: dict) -> None:
        """Pod ``uid``'s remote pod runs at ``provider``: open its interval now (nothing if it is open already).

        Raises:
            gpufleet.kube.quantity.GpuCountError: a fractional GPU request, naming the pod.
        """
        with self._lock:
            if uid in self._open or self._stopped:
                return
        pool, gpus, price = provider.name, pod_gpus(pod), provider.capacity().price_per_gpu_hour
        with self._lock:
            self._open.setdefault(uid, _Open(pool, gpus, price, self.clock()))
            self._closed.setdefault(pool, PoolTotals())

    def observe(self, uid: str, provider: Provider, pod: dict, remote_phase: str | None) -> None:
        """The remote pod's phase as mirrored: Running opens the interval, Succeeded/Failed close it. Never raises:
        a pod whose GPUs cannot be counted (a fractional request) is logged and left out, the pod loop goes on."""
        if remote_phase == "Running":
            try:
                self.running(uid, provider, pod)
            except GpuCountError as exc:
                log.warning("offload ledger: %s: not counted", exc)
        elif remote_phase in TERMINAL:
            self.stopped(uid)

    def stopped(self, uid: str) -> None:
        """Pod ``uid``'s remote pod stopped (or is gone): close its interval now; nothing if none is open."""
        with self._lock:
            iv = self._open.pop(uid, None)
            if iv is not None:
                self._close(iv, self.clock())

    def close(self) -> None:
        """Close every open interval now (the virtual kubelet stops counting: it stops watching)."""
        with self._lock:
            now = self.clock()
            for iv in self._open.values():
                self._close(iv, now)
            self._open.clear()
            self._stopped = True

    def _close(self, iv: _Open, now: float) -> None:
        seconds = iv.gpus * max(now - iv.since, 0.0)
        self._closed[iv.pool] = self._closed.get(iv.pool, PoolTotals()) + PoolTotals(
            seconds, cost_of(seconds, iv.price_per_gpu_hour))

    def totals(self) -> dict[str, PoolTotals]:
        """``{pool: PoolTotals}`` up to now, open intervals counted to the clock's present."""
        with self._lock:
            now = self.clock()
            out = dict(self._closed)
            for iv in self._open.values():
                seconds = iv.gpus * max(now - iv.since, 0.0)
                out[iv.pool] = out.get(iv.pool, PoolTotals()) + PoolTotals(seconds, cost_of(seconds, iv.price_per_gpu_hour))
        return out

    def gpus_running(self) -> dict[str, int]:
        """``{pool: GPUs}`` of the pods whose interval is open now."""
        with self._lock:
            out: dict[str, int] = {}
            for iv in self._open.values():
                out[iv.pool] = out.get(iv.pool, 0) + iv.gpus
        return out


class LedgerCollector(Collector):
    """Serves the sum of the process' ledgers, by pool, as the two counters of the module docstring."""

    def __init__(self) -> None:
        self._ledgers: weakref.WeakSet[Ledger] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, ledger: Ledger) -> None:
        """Count ``ledger`` from now on (until it is garbage-collected)."""
        with self._lock:
            self._ledgers.add(ledger)

    def totals(self) -> dict[str, PoolTotals]:
        """``{pool: PoolTotals}`` summed over every ledger of the process."""
        with self._lock:
            ledgers = list(self._ledgers)
        out: dict[str, PoolTotals] = {}
        for ledger in ledgers:
            for pool, t in ledger.totals().items():
                out[pool] = out.get(pool, PoolTotals(currency=t.currency)) + t
        return out

    def collect(self) -> Iterator[CounterMetricFamily]:
        seconds = CounterMetricFamily(
            GPU_SECONDS_METRIC.removesuffix("_total"),
            "GPU-seconds pods held at the pool's provider outside the cluster: GPUs requested x seconds from the "
            "remote pod seen Running to its stop (gpufleet.virtual_kubelet.ledger); resets when the virtual kubelet restarts.",
            labels=["pool"])
        cost = CounterMetricFamily(
            COST_METRIC.removesuffix("_total"),
            "Cost of those GPU-seconds: GPU-seconds / 3600 x the pool's price per GPU-hour, in the currency label "
            "(gpufleet.virtual_kubelet.ledger); resets when the virtual kubelet restarts.",
            labels=["pool", "currency"])
        for pool, t in sorted(self.totals().items()):
            seconds.add_metric([pool], t.gpu_seconds)
            cost.add_metric([pool, t.currency], t.cost)
        yield seconds
        yield cost


#: The process' one collector of ledgers, on prometheus_client's default registry (what ``/metrics`` serves).
COLLECTOR = LedgerCollector()
REGISTRY.register(COLLECTOR)


def read_totals(prom: PromClient) -> dict[str, PoolTotals]:
    """``{pool: PoolTotals}`` as Prometheus holds the counters now: the sum over the virtual kubelets' live series
    of each pool, i.e. since each of them started (a counter restarts at 0 with its process).

    Raises:
        gpufleet.prom.client.PromError: Prometheus unreachable or answering an error.
    """
    return _read(prom, GPU_SECONDS_METRIC, COST_METRIC, None)


def read_windows(prom: PromClient, windows: Iterable[tuple[float, float]]) -> dict[str, PoolTotals]:
    """``{pool: PoolTotals}`` held outside during ``windows`` (``(start, end)``, Unix seconds), summed: each
    window is the counters' PromQL ``increase`` over it, evaluated at its end (``increase`` spans a
    virtual kubelet's restart). Prometheus' extrapolation makes a window's figure approximate to a scrape
    interval's worth at each edge.

    Raises:
        gpufleet.prom.client.PromError: Prometheus unreachable or answering an error.
    """
    out: dict[str, PoolTotals] = {}
    for start, end in windows:
        if end <= start:
            continue
        span = f"[{max(1, round(end - start))}s]"
        for pool, t in _read(prom, f"increase({GPU_SECONDS_METRIC}{span})", f"increase({COST_METRIC}{span})",
                             end).items():
            out[pool] = out[pool] + t if pool in out else t
    return out


def _read(prom: PromClient, seconds: str, cost: str, at: float | None) -> dict[str, PoolTotals]:
    """The two series summed by pool (and currency), read at ``at`` (None: now)."""
    out: dict[str, PoolTotals] = {}
    for s in prom.query(f"sum by (pool) ({seconds})", at=at):
        pool = s["metric"].get("pool", "")
        out[pool] = PoolTotals(float(s["value"][1]), 0.0)
    for s in prom.query(f"sum by (pool, currency) ({cost})", at=at):
        pool = s["metric"].get("pool", "")
        t = out.get(pool, PoolTotals())
        out[pool] = PoolTotals(t.gpu_seconds, t.cost + float(s["value"][1]), s["metric"].get("currency", CURRENCY))
    return out
