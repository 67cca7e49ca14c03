"""One active instance per controller, through a coordination.k8s.io Lease.

Uses the Kubernetes Python client's own leader election (LeaseLock), with
client-go's default timings (lease 15 s, renew deadline 10 s, retry 2 s).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Callable

from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

LEASE_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_SECONDS = 2


def identity() -> str:
    """This instance's holder identity: the pod name in-cluster, else host and pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def run_as_leader(name: str, namespace: str, lead: Callable[[], None], *,
                  on_lost: Callable[[], None] | None = None, stop: threading.Event | None = None) -> None:
    """Block, and run ``lead()`` while this instance holds Lease ``namespace/name``.

    ``lead`` runs in a thread once the Lease is acquired; ``on_lost`` is
    called if leadership is lost (the controller should then stop acting).
    Requires a loaded kubernetes client configuration and RBAC on leases.
    Returns when leadership is lost or ``stop`` is set.
    """
    lock = LeaseLock(name, namespace, identity())
    config = electionconfig.Config(lock, LEASE_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_SECONDS,
                                   lead, on_lost or (lambda: None))
    election = leaderelection.LeaderElection(config)
    if stop is None:
        election.run()
        return
    runner = threading.Thread(target=election.run, daemon=True, name=f"leader-{name}")
    runner.start()
    while runner.is_alive() and not stop.wait(0.5):
        pass
