"""What gpufleet's own controllers cost during a simulated flip: memory, CPU, and the taint controller's tick.

Why: the flip's controllers must stay small at fleet size (a taint
controller tick in tens of milliseconds, a few hundred MiB per process at
a thousand nodes); a run that reports only what serving saw hides what it
took to get there.

How: every ``interval`` seconds, each pod of the named Deployments is read
at its ``/metrics`` through the API server's pod proxy
(:meth:`gpufleet.kube.Kube.pod_proxy_text`), the way ``kubectl get --raw``
would, parsed with ``prometheus_client``'s parser: the standard process
collector's ``process_resident_memory_bytes`` and
``process_cpu_seconds_total``, and the taint controller's
``gpufleet_taint_controller_tick_cpu_seconds`` (its tick's own threads)
and ``gpufleet_taint_controller_tick_process_cpu_seconds`` (the whole
process during the tick, watch decoding included) histograms. A pod that does
not answer (restarting, a proxy error) is skipped for that round. The
figures per Deployment (:meth:`ControllerMeter.figures`):

* ``rss_max_mib``: the highest resident set of any of its pods, MiB;
* ``cpu_seconds``: CPU seconds its pods used while metered (the counter's
  last value minus its first, per pod, summed);
* ``restarts``: its pods' container restarts as last seen (a liveness
  probe that killed a controller under load shows here);
* for the taint controller, ``tick_cpu_ms_p50`` / ``tick_cpu_ms_p99``: the
  quantiles of its ticks' own CPU while metered (the histogram's increase
  over the run, interpolated inside a bucket as PromQL's
  ``histogram_quantile`` does), ``tick_process_cpu_ms_p50`` /
  ``tick_process_cpu_ms_p99`` the same of the process's CPU during a tick,
  and ``ticks``; ``surges``: the increase of
  ``gpufleet_flip_out_surges_total`` by event while metered
  (``{"created": 510, "handed over": 510, ...}``: both directions' surges,
  the flip-out's and the flip-back's).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.kube import Kube, KubeError

log = logging.getLogger(__name__)

RSS = "process_resident_memory_bytes"
CPU = "process_cpu_seconds_total"
TICK_CPU = "gpufleet_taint_controller_tick_cpu_seconds"
TICK_PROCESS_CPU = "gpufleet_taint_controller_tick_process_cpu_seconds"
SURGES = "gpufleet_flip_out_surges_total"
#: The metered histograms and the figure each gives (``<prefix>_p50``, ``<prefix>_p99``, milliseconds).
HISTOGRAMS = {TICK_CPU: "tick_cpu_ms", TICK_PROCESS_CPU: "tick_process_cpu_ms"}
MIB = 1024 * 1024


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) of a histogram given as ``(le, cumulative count)`` pairs, as PromQL's
    ``histogram_quantile`` computes it: linear inside the bucket that holds it, the highest finite bound
    when it falls in ``+Inf``; None without observations.

    Raises:
        ValueError: ``q`` outside [0, 1].
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q}: expected 0..1")
    pairs = sorted(buckets)
    if not pairs or pairs[-1][1] <= 0:
        return None
    rank = q * pairs[-1][1]
    lower, below = 0.0, 0.0
    for le, count in pairs:
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = le, count
    return lower


@dataclass
class _Pod:
    first: dict[str, Any] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    rss_max: float = 0.0
    restarts: int = 0


def read(text: str) -> dict[str, Any]:
    """The metered values of one ``/metrics`` page: ``{RSS: bytes, CPU: seconds, <histogram>: {le: count},
    SURGES: {event: count}}`` (those present; the histograms of :data:`HISTOGRAMS`)."""
    out: dict[str, Any] = {}
    buckets = {h + "_bucket": h for h in HISTOGRAMS}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (RSS, CPU):
                out[s.name] = s.value
            elif s.name in buckets:
                out.setdefault(buckets[s.name], {})[float(s.labels["le"])] = s.value
            elif s.name == SURGES:
                out.setdefault(SURGES, {})[s.labels.get("event", "")] = s.value
    return out


class ControllerMeter:
    """Meters the pods of ``deployments`` (``(namespace, name)``, their metrics on ``port``) in a thread."""

    def __init__(self, kube: Kube, deployments: Iterable[tuple[str, str]], *, port: int = 8080,
                 interval: float = 10.0):
        self.kube, self.port, self.interval = kube, port, interval
        self.deployments = list(deployments)
        self.pods: dict[tuple[str, str], dict[str, _Pod]] = {d: {} for d in self.deployments}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ControllerMeter":
        """Take the first reading now, then one every ``interval`` seconds until :meth:`stop`."""
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="controller-meter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and take a last reading."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """One reading of every pod of the metered Deployments; never raises for API errors."""
        for ns, name in self.deployments:
            try:
                pods = self.kube.list("v1", "pods", ns, labelSelector=f"app.kubernetes.io/name={name}")["items"]
            except KubeError as exc:
                log.info("meter: pods of %s/%s: %s", ns, name, exc)
                continue
            for p in pods:
                pod = p["metadata"]["name"]
                status = p.get("status") or {}
                restarts = sum(c.get("restartCount", 0) for c in status.get("containerStatuses") or [])
                self.pods[(ns, name)].setdefault(pod, _Pod()).restarts = restarts
                if status.get("phase") != "Running":
                    continue
                try:
                    values = read(self.kube.pod_proxy_text(ns, pod, self.port, "metrics", timeout=5))
                except (KubeError, ValueError) as exc:
                    log.info("meter: %s/%s metrics: %s", ns, pod, exc)
                    continue
                seen = self.pods[(ns, name)][pod]
                if not seen.first:
                    seen.first = values
                seen.last = values
                seen.rss_max = max(seen.rss_max, values.get(RSS, 0.0))

    def figures(self) -> dict[str, dict[str, Any]]:
        """Per Deployment name: ``rss_max_mib``, ``cpu_seconds``, ``restarts``, ``surges`` where counted and,
        where ticks were metered, ``tick_cpu_ms_p50``, ``tick_cpu_ms_p99``, ``tick_process_cpu_ms_p50``,
        ``tick_process_cpu_ms_p99`` and ``ticks`` (module docstring); None where no pod answered."""
        out: dict[str, dict[str, Any]] = {}
        for (_, name), pods in self.pods.items():
            read_ = [p for p in pods.values() if p.first]
            fig: dict[str, Any] = {
                "rss_max_mib": round(max(p.rss_max for p in read_) / MIB, 1) if read_ else None,
                "cpu_seconds": round(sum(p.last.get(CPU, 0.0) - p.first.get(CPU, 0.0) for p in read_), 2) if read_ else None,
                "restarts": sum(p.restarts for p in pods.values())}
            surges: dict[str, int] = {}
            for p in read_:
                for event, count in (p.last.get(SURGES) or {}).items():
                    surges[event] = surges.get(event, 0) + int(count - (p.first.get(SURGES) or {}).get(event, 0.0))
            if surges:
                fig["surges"] = surges
            for histogram, prefix in HISTOGRAMS.items():
                ticks: dict[float, float] = {}
                for p in pods.values():
                    for le, count in (p.last.get(histogram) or {}).items():
                        ticks[le] = ticks.get(le, 0.0) + count - (p.first.get(histogram) or {}).get(le, 0.0)
                if not ticks:
                    continue
                pairs = sorted(ticks.items())
                fig["ticks"] = int(pairs[-1][1])
                for q in (0.5, 0.99):
                    v = histogram_quantile(q, pairs)
                    fig[f"{prefix}_p{int(q * 100)}"] = None if v is None else round(v * 1000, 1)
            out[name] = fig
        return out
