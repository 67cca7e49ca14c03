"""The integration tier: a real etcd and kube-apiserver, nothing else (marker ``integration``).

Usage::

    @pytest.mark.integration
    def test_something(apiserver):
        apiserver.kube.get("v1", "namespaces", "default")

One control plane per test session (:func:`gpufleet_workshop.local.cluster.control_plane`),
named ``$GPUFLEET_TEST_CLUSTER-api`` (default ``gpufleet-test-api``), started
from empty etcd data in a few seconds once ``invoke local.install`` has
cached etcd and Kubernetes, and stopped at the end of the session if this
session started it (``GPUFLEET_KEEP_CLUSTER=1`` leaves it running). There
is no controller-manager, scheduler or node: what a test sees is the API
server's own behaviour (storage, admission, validation, selectors,
patches, watches, the Eviction API over the budget status a test writes).
Each test works in namespaces of its own; namespaces are never deleted
(without the namespace controller they would stay Terminating).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpufleet.kube import Kube
from gpufleet_workshop.local import cluster as local


@dataclass
class ApiServer:
    """What the fixture yields: the cluster's ``name``, an admin :class:`~gpufleet.kube.Kube` and the ``cluster``."""

    name: str
    kube: Kube
    cluster: local.Cluster

    def namespace(self, prefix: str = "it") -> str:
        """A new namespace (with its ``default`` ServiceAccount, which the missing controller would create)."""
        ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.kube.create("v1", "namespaces", {"metadata": {"name": ns}})
        self.kube.create("v1", "serviceaccounts", {"metadata": {"name": "default"}}, ns)
        return ns


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ApiServer]:
    """A running etcd + kube-apiserver (module docstring)."""
    name = os.environ.get("GPUFLEET_TEST_CLUSTER", "gpufleet-test") + "-api"
    try:
        was_up = bool(local.main_pids(name))
    except (LookupError, ValueError):
        was_up = False
    c = local.control_plane(name, fresh=not was_up)
    kube = Kube.from_kubeconfig(c.kubeconfig, user_agent="gpufleet-tests")
    try:
        yield ApiServer(name, kube, c)
    finally:
        kube.close()
        if not was_up and os.environ.get("GPUFLEET_KEEP_CLUSTER") != "1":
            local.down(name)
