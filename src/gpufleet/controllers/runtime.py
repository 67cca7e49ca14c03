"""Running a gpufleet process: logging, signals, the metrics/health endpoint, the client, leader election.

Each command (``virtual-kubelet``, ``taint-controller``, ``quota-sync``,
``node-health``, ``exporter``) parses its flags (:mod:`~gpufleet.controllers.flags`),
builds what it runs, and hands :func:`run` a ``loop(stop)`` that works until
``stop`` is set. :func:`run` serves ``/metrics`` and ``/healthz``, stops on
SIGTERM/SIGINT and, with leader election, runs ``loop`` only while this
instance holds the Lease (:class:`gpufleet.kube.leader.LeaderElector`, on the
command's own client). The client's writes are fenced by the Lease
(:meth:`gpufleet.kube.Kube.fence_writes`): refused before it is acquired and
from the renew deadline on, by the clock, whatever a request is doing, so a
leader whose API server stops answering stops acting at its deadline, before
a follower can take over. ``/metrics`` then carries
``gpufleet_leader_is_leader`` (:class:`LeaderCollector`).

The Kubernetes client and leader election are imported only where a command
asks for them (:func:`kube_from_args`, :func:`run` with a Lease): a process
without them (the node exporter) never loads the ``kubernetes`` package.

Exit codes every command shares: 0 after SIGTERM/SIGINT, 1 when the Lease
was lost (the Deployment restarts the process as a follower) or the metrics
port is in use, 2 for bad input.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from gpufleet import cliargs

from .serve import Liveness, serve

if TYPE_CHECKING:  # loaded at run time only by the commands that talk to an API server
    from gpufleet.kube import Kube
    from gpufleet.kube.leader import LeaderElector, Timings

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """Log to stderr at ``level`` (``--log-level``) in the one format every gpufleet process uses."""
    logging.basicConfig(level=level, format=LOG_FORMAT)


def stop_on_signals(stop: threading.Event) -> None:
    """Set ``stop`` on SIGTERM and SIGINT (only the main thread may install handlers; elsewhere a no-op)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())


def port_in_use(command: str, port: int, host: str = "0.0.0.0", flag: str = "--metrics-port") -> bool:
    """Whether ``host:port`` cannot be listened on; if so, print one line ``gpufleet COMMAND: FLAG: cannot listen ...``.

    Checked before the command has side effects (a second instance must not
    touch the cluster). Port 0 (endpoint off) is never in use.
    """
    busy = cliargs.listen_error(port, host)
    if busy:
        print(f"gpufleet {command}: {flag}: {busy}", file=sys.stderr)
    return busy is not None


def kube_from_args(args: argparse.Namespace, *, user_agent: str) -> Kube:
    """The command's client from ``--kubeconfig``/``--context`` (raises :class:`gpufleet.kube.ConfigError`)."""
    from gpufleet.kube import Kube

    return Kube.from_kubeconfig(args.kubeconfig, getattr(args, "context", None), user_agent=user_agent)


class LeaderCollector:
    """``gpufleet_leader_is_leader{lease="<namespace>/<name>"}``: 1 while this process acts as the leader, else 0.

    Read from the elector at each scrape (:meth:`gpufleet.kube.leader.LeaderElector.is_leader`):
    0 from the renew deadline on, by the clock, even while a renewal is still in flight.
    """

    def __init__(self, elector: LeaderElector):
        self.elector = elector

    def collect(self):
        """One gauge family with one sample."""
        e = self.elector
        g = GaugeMetricFamily("gpufleet_leader_is_leader",
                              "1 while this process holds the leader-election Lease and its renew deadline is ahead "
                              "(it acts), else 0 (it follows, or stopped acting).", labels=["lease"])
        g.add_metric([f"{e.namespace}/{e.name}"], 1.0 if e.is_leader() else 0.0)
        yield g


def run(command: str, loop: Callable[[threading.Event], None], *, metrics_port: int, liveness: Liveness | None = None,
        registry: CollectorRegistry = REGISTRY, host: str = "0.0.0.0", kube: Kube | None = None,
        lease: tuple[str, str] | None = None, timings: Timings | None = None,
        stop: threading.Event | None = None) -> int:
    """Serve ``/metrics`` and ``/healthz`` and run ``loop(stop)`` until SIGTERM/SIGINT or ``stop``.

    Args:
        command: the command's name (logs).
        loop: the work; returns soon after its ``stop`` argument is set.
        metrics_port: ``--metrics-port`` (0: no endpoint).
        liveness: what ``/healthz`` reports (None: always healthy).
        registry: what ``/metrics`` exposes.
        host: address to listen on.
        kube / lease: with both, ``loop`` runs only while this instance
            holds Lease ``(name, namespace)``; waiting for it counts as
            healthy; ``kube``'s writes are fenced by the Lease and
            ``registry`` gets ``gpufleet_leader_is_leader``.
        timings: Lease timings (``--leader-elect-*``; None: the defaults of
            :class:`gpufleet.kube.leader.Timings`).
        stop: set it to stop from another thread (tests).

    Returns:
        0 after a stop, 1 when the Lease was lost.
    """
    stop = stop or threading.Event()
    stop_on_signals(stop)
    server = serve(registry, port=metrics_port, host=host, liveness=liveness) if metrics_port else None
    try:
        if kube is None or lease is None:
            loop(stop)
            return 0
        from gpufleet.kube.leader import LeaderElector, Timings

        name, namespace = lease
        elector = LeaderElector(kube, name, namespace, timings=timings or Timings())
        kube.fence_writes(elector.fence)
        collector = LeaderCollector(elector)
        registry.register(collector)
        beat = liveness.beat if liveness is not None else None

        def lead(leader_stop: threading.Event) -> None:
            log.info("%s: leading (Lease %s/%s)", command, namespace, name)
            loop(leader_stop)

        try:
            lost = elector.run(lead, stop, on_wait=beat)
        finally:
            registry.unregister(collector)
        if lost:
            log.warning("%s: lost the Lease %s/%s; exiting so that the new leader acts alone", command, namespace, name)
        return 1 if lost else 0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
