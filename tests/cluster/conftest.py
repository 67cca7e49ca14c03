"""The ``local_cluster`` fixture: one real local cluster per test session.

Usage::

    @pytest.mark.cluster
    def test_something(local_cluster):
        local_cluster.kube.get("v1", "nodes", "gpu-000")
        ...

The cluster is named ``$GPUFLEET_TEST_CLUSTER`` (default ``gpufleet-test``),
built from the ``local`` inventory, started once (a warm start takes well
under a minute once ``invoke local.install`` has cached the components) and
stopped at the end of the session if this session started it (it then
starts from empty etcd data, so nothing of an earlier run survives);
``GPUFLEET_KEEP_CLUSTER=1`` leaves it running for inspection. Set
``GPUFLEET_TEST_CLUSTER`` to a name of your own when several people run
cluster tests on one machine. Certificates and ports persist under
``gpufleet.paths.state_dir()/<name>``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.kube import Kube
from gpufleet_workshop.local import cluster as local


@dataclass
class LocalCluster:
    """What the fixture yields.

    Attributes:
        name: cluster name.
        kubeconfig: admin kubeconfig path.
        kube: :class:`gpufleet.kube.Kube` authenticated as admin (the client
            every gpufleet part uses; field manager ``gpufleet``).
        cluster: the :class:`gpufleet_workshop.local.cluster.Cluster` (ports, PKI, state paths).
    """

    name: str
    kubeconfig: Path
    kube: Kube
    cluster: local.Cluster


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """A running local cluster (see the module docstring); errors carry the failing component's log tail."""
    name = os.environ.get("GPUFLEET_TEST_CLUSTER", "gpufleet-test")
    try:
        was_up = local.status(name).up
    except LookupError:
        was_up = False
    # A cluster this session starts begins empty: objects left by an earlier
    # run (queues, workloads, stack resources) would change what tests see.
    c = local.up(name, env="local", fresh=not was_up)
    kube = Kube.from_kubeconfig(c.kubeconfig, user_agent="gpufleet-tests")
    try:
        yield LocalCluster(name=name, kubeconfig=c.kubeconfig, kube=kube, cluster=c)
    finally:
        kube.close()
        # Leave a cluster this session did not start (another session may be using it).
        if not was_up and os.environ.get("GPUFLEET_KEEP_CLUSTER") != "1":
            local.down(name)


@pytest.fixture(scope="session")
def other_cluster(local_cluster) -> Iterator[local.Cluster]:
    """The ``other`` pool's cluster (``<session cluster>-other``): the ``kubernetes`` provider's remote side.

    Started once per session with the nodes the ``local`` inventory's
    ``other`` pool needs (:func:`gpufleet_workshop.sim.incluster.pool_node_specs`,
    so ``sim.flip`` and the in-cluster stack find it ready and reuse it), from
    empty state unless it already runs, and shared by every module that
    needs it; each module removes what it created there. Stopped at the end
    of the session if this session started it (``GPUFLEET_KEEP_CLUSTER=1``
    leaves it running).
    """
    from gpufleet_workshop.sim.incluster import pool_node_specs
    from roles.registry import load

    inv = load("local")
    pool = next(p for p in inv.role("virtual_kubelet").virtual_kubelet_pools if p.name == "other")
    name = f"{local_cluster.name}-other"
    was_up = bool(local.main_pids(name))
    c = local.up(name, env="local", specs=pool_node_specs(inv, pool), fresh=not was_up)
    try:
        yield c
    finally:
        if not was_up and os.environ.get("GPUFLEET_KEEP_CLUSTER") != "1":
            local.down(name)


@pytest.fixture(scope="module")
def local_queues(local_cluster):
    """The ``local`` inventory, its Kueue objects present in the cluster (created when absent, left in place).

    These are the environment's own objects as ``pulumi up`` declares them
    (team namespaces, PriorityClasses, WorkloadPriorityClasses, the
    ResourceFlavor, ClusterQueues in one cohort, LocalQueues).
    """
    from roles.registry import load

    from .helpers import ensure_kueue_objects

    inventory = load("local")
    ensure_kueue_objects(local_cluster.kube, inventory)
    return inventory


@pytest.fixture
def train(local_cluster, invoke_cli) -> Callable[..., tuple[int, str, str]]:
    """``train(task, *argv) -> (exit code, stdout, stderr)``: ``invoke train.<task> ... --kubeconfig <cluster>`` in-process."""
    from gpufleet_workshop.tasks.train import train as collection

    cli = invoke_cli(collection)
    return lambda task, *argv: cli(f"train.{task}", *argv, "--kubeconfig", str(local_cluster.kubeconfig))


@pytest.fixture
def scratch(local_cluster, local_queues):
    """``(namespace, jobs)``: a namespace for filler pods, and the jobs a test submits in ``TEAM_NAMESPACE``
    (deleted afterwards, with the fillers)."""
    from .helpers import TEAM_NAMESPACE, delete_job, wait

    api = local_cluster.kube
    ns = f"fill-{uuid.uuid4().hex[:6]}"
    api.create("v1", "namespaces", {"metadata": {"name": ns}})
    jobs: list[str] = []
    yield ns, jobs
    for name in jobs:
        delete_job(api, TEAM_NAMESPACE, name)
    api.delete("v1", "namespaces", ns)
    wait("filler pods gone", lambda: not api.list("v1", "pods", ns)["items"], timeout=90)
