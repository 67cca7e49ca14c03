"""Running one of our controllers: global client config, /metrics + /healthz, Lease, signals.

Used by ``gpufleet quota-sync`` and ``gpufleet node-health``. The controller
supplies ``loop(stop)``: it runs while this instance holds the Lease
(:func:`gpufleet.controllers.leader.run_as_leader`) and must return soon
after ``stop`` is set. Leadership lost: the loop is stopped and the process
exits non-zero so the Deployment restarts it as a follower.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

from kubernetes import config
from prometheus_client import CollectorRegistry

from gpufleet.controllers.leader import run_as_leader
from gpufleet.controllers.serve import Liveness, serve

log = logging.getLogger(__name__)


def load_global_config(kubeconfig: str | None, context: str | None) -> None:
    """Configure the kubernetes client's default configuration (the Lease lock uses it)."""
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config(config_file=kubeconfig, context=context)


def run_controller(name: str, namespace: str, loop: Callable[[threading.Event], None], *, port: int,
                   liveness: Liveness, registry: CollectorRegistry, leader_election: bool = True,
                   kubeconfig: str | None = None, context: str | None = None,
                   stop: threading.Event | None = None) -> int:
    """Serve metrics/health on ``port`` (0: none) and run ``loop`` as the leader of Lease ``namespace/name``.

    Returns the process exit code: 0 after SIGTERM/SIGINT or ``stop``, 1
    when leadership was lost.
    """
    stop = stop or threading.Event()
    lost = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    server = serve(port, liveness, registry) if port else None
    try:
        if not leader_election:
            loop(stop)
            return 0
        load_global_config(kubeconfig, context)

        def lead() -> None:
            log.info("%s: leading (Lease %s/%s)", name, namespace, name)
            loop(stop)

        def on_lost() -> None:
            log.warning("%s: lost the Lease; stopping", name)
            lost.set()
            stop.set()

        run_as_leader(name, namespace, lead, on_lost=on_lost, stop=stop)
        return 1 if lost.is_set() else 0
    finally:
        if server is not None:
            server.shutdown()
