"""gpufleet's taint controller as production runs it: a Deployment from gpufleet's image on the real node.

The objects are the taint_controller role's own for the ``local``
environment (rendered through the stack program, the API endpoint set to the
real node's apiserver forward): two replicas, one leading through the Lease,
with the ServiceAccount token and least-privilege RBAC, and no 403 in the
logs. Deleting the leader hands the Lease to the standby.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from gpufleet import names
from gpufleet.taint_controller.constants import LEASE_NAME
from gpufleet.kube import Kube
from gpufleet_workshop.local.apply import apply_changed
from gpufleet_workshop.local import node as realnode
from gpufleet_admin.stack.render import render
from gpufleet.wait import poll_until
from roles.registry import load

pytestmark = pytest.mark.cluster

NS = "gpufleet-system"
KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
         "Deployment"}


def _wait(what: str, check, timeout: float = 180.0, interval: float = 1.0):
    return poll_until(check, what=what, timeout=timeout, interval=interval)


@pytest.fixture(scope="module")
def taint_controller(local_cluster):
    """The role's objects applied; the two pods Ready. Yields the pod names; removes the Deployment after."""
    key, value = names.SYSTEM_NODE_LABEL
    inv = load("local", overrides={"gpufleet_api_server": local_cluster.cluster.in_cluster_api,
                                   "gpufleet_node_selector": {key: value}})
    rendered = render(inv).objects
    objs = [o for o in rendered
            if o["kind"] in KINDS and o["metadata"].get("labels", {}).get("app.kubernetes.io/name") in
            ("taint-controller", NS)]
    # The Namespaces those objects live in (the surge Role is in the inference namespace), as the stack declares them.
    spaces = {o["metadata"].get("namespace") for o in objs}
    objs += [o for o in rendered if o["kind"] == "Namespace" and o["metadata"]["name"] in spaces - {NS}]
    assert {o["kind"] for o in objs} >= {"Deployment", "ServiceAccount", "ClusterRole", "ConfigMap"}
    with local_cluster.cluster.kube() as k:
        apply_changed(k, sorted(objs, key=lambda o: (o["kind"] != "Namespace", o["kind"] == "Deployment")))
    k = local_cluster.kube

    def ready() -> list[str]:
        ok = [p["metadata"]["name"] for p in _pods(k) if not p["metadata"].get("deletionTimestamp") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions") or [])]
        return ok if len(ok) == 2 else []

    pod_names = _wait("two taint-controller pods Ready", ready)
    yield k, pod_names, ready
    # Every object applied goes (the Namespaces stay): a later `pulumi up` of the stack on this cluster must not
    # find fields this test's field manager owns (its ConfigMap holds the file the stack renders differently).
    from gpufleet.kube import NotFound

    for o in reversed(objs):
        if o["kind"] != "Namespace":
            try:
                k.delete_object(o)
            except NotFound:
                pass


def _pods(k: Kube) -> list[dict]:
    return k.list("v1", "pods", NS, labelSelector="app.kubernetes.io/name=taint-controller")["items"]


def _holder(k: Kube) -> str | None:
    lease = k.get_or_none("coordination.k8s.io/v1", "leases", LEASE_NAME, NS) or {}
    return lease.get("spec", {}).get("holderIdentity")


def test_two_replicas_on_the_real_node_one_leads(local_cluster, taint_controller):
    k, names, _ = taint_controller
    node = realnode.node_name(local_cluster.name)
    pods = {p["metadata"]["name"]: p for p in _pods(k)}
    assert {pods[n]["spec"]["nodeName"] for n in names} == {node}
    assert all(pods[n]["spec"]["containers"][0]["image"] == load("local").fleet.gpufleet_image for n in names)
    # A Lease left by an earlier run expires first (15 s); then one of these two holds it.
    holder = _wait("one of the two pods leading", lambda: (h := _holder(k)) and any(n in h for n in names) and h,
                   timeout=90)
    assert sum(n in holder for n in names) == 1


def test_controller_logs_come_through_the_kubelet_without_403(local_cluster, taint_controller):
    k, names, _ = taint_controller
    time.sleep(5)  # a few ticks of the controller loop
    for name in names:
        logs = k.pod_log(NS, name)
        assert "403" not in logs and "Forbidden" not in logs, logs[-2000:]


def test_standby_takes_the_lease_when_the_leader_goes(local_cluster, taint_controller):
    k, names, ready = taint_controller
    leader = _wait("one of the two pods leading", lambda: (h := _holder(k)) and any(n in h for n in names) and h,
                   timeout=90)
    leader_pod = next(n for n in names if n in leader)
    standby = next(n for n in names if n != leader_pod)
    started = time.monotonic()
    k.delete("v1", "pods", leader_pod, NS, grace_seconds=0)
    # The standby and the leader's replacement pod both try once the Lease expires: either may win the race.
    new = _wait("another pod holding the Lease", lambda: (h := _holder(k)) and leader_pod not in h and h, timeout=60,
                interval=0.2)
    takeover = time.monotonic() - started
    print(f"Lease takeover: {takeover:.1f}s (lease {15}s) by {'the standby' if standby in new else 'the replacement'}")
    assert leader_pod not in new and takeover < 60
    _wait("two pods Ready again", ready)
