"""The node Lease heartbeat: ``coordination.k8s.io/v1`` Lease ``kube-node-lease/<node>``.

What the kubelet does (``pkg/kubelet/nodelease``): a Lease named after the
node, holder = node name, ``leaseDurationSeconds`` (kubelet default 40),
``renewTime`` refreshed every quarter of that, owned by the Node so it goes
with it. The node lifecycle controller reads it: a Lease older than its
grace period makes the node ``Ready=Unknown`` and its pods are evicted.
"""

from __future__ import annotations

import logging
import threading

from gpufleet.kube import Conflict, Kube, KubeError, NotFound
from gpufleet.kube.times import now_micro

log = logging.getLogger(__name__)

NAMESPACE = "kube-node-lease"
DURATION_SECONDS = 40


def lease_body(node_name: str, node_uid: str | None, duration: int = DURATION_SECONDS) -> dict:
    """The Lease object for ``node_name`` (renewTime now; owned by the Node when its UID is known)."""
    meta: dict = {"name": node_name, "namespace": NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": node_name, "leaseDurationSeconds": duration, "renewTime": now_micro()}}


class LeaseHeartbeat:
    """Renews the node Lease every ``duration / 4`` seconds in a daemon thread.

    Args:
        kube: client of the cluster the node is in.
        node_name: the node.
        node_uid: callable returning the Node's UID (for the owner reference) or None.
        duration: ``leaseDurationSeconds``.

    Attributes:
        renewals: successful renewals so far; last_error: the last failure or None.
    """

    def __init__(self, kube: Kube, node_name: str, node_uid=lambda: None, duration: int = DURATION_SECONDS):
        self.kube = kube
        self.node_name = node_name
        self.node_uid = node_uid
        self.duration = duration
        self.renewals = 0
        self.last_error: Exception | None = None
        self._stop = threading.Event()

    def renew(self) -> None:
        """Create or renew the Lease once.

        Raises:
            KubeError: the API server refused or is unreachable.
        """
        patch = {"spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": self.duration,
                          "renewTime": now_micro()}}
        try:
            self.kube.patch("coordination.k8s.io/v1", "leases", self.node_name, patch, NAMESPACE)
        except NotFound:
            try:
                self.kube.create("coordination.k8s.io/v1", "leases", lease_body(self.node_name, self.node_uid(),
                                                                                 self.duration), NAMESPACE)
            except Conflict:
                self.kube.patch("coordination.k8s.io/v1", "leases", self.node_name, patch, NAMESPACE)
        self.renewals += 1

    def run(self) -> None:
        """Renew until :meth:`stop`; failures are logged and retried at the next interval (faster at first)."""
        interval = self.duration / 4
        while not self._stop.is_set():
            try:
                self.renew()
                self.last_error = None
                wait = interval
            except KubeError as exc:
                self.last_error = exc
                log.warning("node lease %s: renewal failed: %s", self.node_name, exc)
                wait = min(interval, 2.0)
            self._stop.wait(wait)

    def start(self) -> "LeaseHeartbeat":
        """Run in a daemon thread; returns self."""
        threading.Thread(target=self.run, daemon=True, name=f"lease-{self.node_name}").start()
        return self

    def stop(self) -> None:
        """Stop renewing (the Lease then expires and the node goes NotReady)."""
        self._stop.set()
