"""The real Pulumi engine against the local cluster: up, no-op preview, a one-variable change, destroy.

Runs :mod:`gpufleet_admin.stack.engine` (the Pulumi CLI and the Kubernetes
provider built from the Go module proxy, a file backend in ``tmp_path``, a
project folder of its own so the checkout's ``Pulumi.local.yaml`` is never
touched). The tests share one stack and run in file order:

1. ``up`` creates exactly what the stack declares (the render under mocks
   is the reference), and the objects are on the cluster;
2. a second ``preview`` shows no changes, nor one whose Deployment selector
   differs from the one the object was created with (immutable: kept, not replaced);
3. ``gpufleet:kueue_reserve_gpus`` in stack config updates only the
   objects that depend on it (the ClusterQueues), in place;
4. after quota-sync rewrote a queue's quota, the next such change still applies;
5. a PriorityClass whose value changes is replaced (the API server refuses to change it);
6. ``destroy`` removes everything: the cluster's objects are those it had
   before ``up`` (a snapshot of every listable API object, events excluded).

The stack is destroyed at the end of the module even when a test fails.

The controllers' Deployments need a node without the GPU taint (the engine
waits for them to become available). ``inventories/local`` places them on
the real node, which needs stack config of its cluster
(``test_in_cluster_stack.py`` runs that); this module keeps the engine's
checks apart from it (``gpufleet_node_selector: {}``), adds one kwok node
of its own (outside the snapshots) and removes it at the end.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet_admin.inventory import NodeSpec
from gpufleet.kube import Kube, NotFound
from gpufleet_workshop.local import kwok
from gpufleet.names import SIMULATED_LABEL
from gpufleet_admin.build import pulumi as tools
from gpufleet_admin.stack import engine
from gpufleet_admin.stack.render import render
from gpufleet_admin.stack.role import object_id
from gpufleet.wait import poll_until
from roles.registry import load

pytestmark = pytest.mark.cluster

ENV = "local"
VARIABLE, VALUE = "kueue_reserve_gpus", 8
#: Stack config of every run of this module: the controllers on the module's kwok node, not the real node.
BASE = {"gpufleet_node_selector": {}}
BASE_CONFIG = {"gpufleet:gpufleet_node_selector": "{}"}
#: Objects nobody declares that come and go on their own (ComponentStatus: computed on each read, no uid).
VOLATILE = {("v1", "Event"), ("events.k8s.io/v1", "Event"), ("v1", "ComponentStatus")}
#: Namespaces whose objects their owners renew on their own (kube-node-lease: each kubelet's heartbeat Lease).
VOLATILE_NAMESPACES = {"kube-node-lease"}

Ident = tuple[str, str, str, str, str]  # apiVersion, kind, namespace, name, uid


def snapshot(kube: Kube) -> set[Ident]:
    """Every object of every stored resource type (listable and deletable: built-in and custom, preferred
    versions; not what an aggregated API computes, such as the resource metrics API's PodMetrics), as identities
    with uid."""
    out: set[Ident] = set()
    versions = ["v1"] + [g["preferredVersion"]["groupVersion"] for g in kube.request("GET", "/apis")["groups"]]
    for gv in versions:
        base = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        for res in kube.request("GET", base)["resources"]:
            if not {"list", "delete"} <= set(res.get("verbs") or []) or "/" in res["name"] or (gv, res["kind"]) in VOLATILE:
                continue
            for item in kube.list_all(f"{base}/{res['name']}")[0]:
                md = item["metadata"]
                if md.get("namespace") in VOLATILE_NAMESPACES:
                    continue
                out.add((gv, res["kind"], md.get("namespace") or "", md["name"], md.get("uid", "")))  # not every kind's items carry a uid
    return out


def declared_ids(overrides: dict | None = None) -> dict[str, dict]:
    """``object_id`` -> manifest of every object the stack declares (render under mocks)."""
    return {object_id(o): o for o in render(load(ENV, overrides={**BASE, **(overrides or {})})).objects}


def urn_name(urn: str) -> str:
    """The object id (``Kind/[ns/]name``) a URN stands for.

    Role objects are named by their object id; the shared Namespaces by
    their plain name.
    """
    name = urn.rsplit("::", 1)[-1]
    return f"Namespace/{name}" if urn_type(urn) == "kubernetes:core/v1:Namespace" else name


def urn_type(urn: str) -> str:
    """The type token of a URN's resource (last element of the type chain)."""
    return urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1]


SYSTEM_NODE = "pulumi-test-system"


def _schedulable_untainted(kube: Kube) -> bool:
    """True when some Ready node takes pods that tolerate nothing."""
    for node in kube.list("v1", "nodes")["items"]:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or [])
        hard = [t for t in node["spec"].get("taints") or [] if t["effect"] in ("NoSchedule", "NoExecute")]
        if ready and not hard and not node["spec"].get("unschedulable"):
            return True
    return False


@pytest.fixture(scope="module")
def system_node(local_cluster) -> Iterator[str | None]:
    """An untainted kwok node for the controllers when the inventory gives none; its name or None."""
    kube = local_cluster.kube
    if _schedulable_untainted(kube):
        yield None
        return
    spec = NodeSpec(name=SYSTEM_NODE, labels={"node-role.kubernetes.io/system": ""}, taints=[],
                    capacity={"cpu": "32", "memory": "128Gi", "pods": "110"})
    node = kwok.node_manifest(spec, local_cluster.name)
    del node["metadata"]["labels"][SIMULATED_LABEL]  # local.up keeps only inventory nodes with that label
    kube.create("v1", "nodes", node)
    try:
        poll_until(lambda: _schedulable_untainted(kube), what=f"kwok making {SYSTEM_NODE} Ready", timeout=60,
                   interval=0.5)
        yield SYSTEM_NODE
    finally:
        kube.delete("v1", "nodes", SYSTEM_NODE)


def remove_leftovers(kube: Kube, timeout: float = 120.0) -> None:
    """Delete objects the stack declares that already exist (another module's ``local_queues``, say), and wait.

    Otherwise ``up`` adopts them and ``destroy`` deletes what was there before, which the
    last test rightly reports. Namespaces go last: their deletion waits for their content.
    """
    objs = sorted(declared_ids().values(), key=lambda o: o["kind"] == "Namespace")
    present = []
    for obj in objs:
        try:
            kube.delete_object(obj)
            present.append(obj)
        except NotFound:
            pass
    deadline = time.monotonic() + timeout
    for obj in present:
        poll_until(lambda obj=obj: kube.get_or_none(obj["apiVersion"], kube.resource(obj["apiVersion"], obj["kind"])[0],
                                                    obj["metadata"]["name"], obj["metadata"].get("namespace")) is None,
                   what=f"leftover {obj['kind']} {obj['metadata']['name']} gone",
                   timeout=max(0.0, deadline - time.monotonic()), interval=0.5)


@dataclasses.dataclass
class Deployed:
    """The module's stack: its target, what ``up`` returned, and the cluster before it."""

    target: engine.Target
    before: set[Ident]
    up: engine.Result
    seconds: dict[str, float]


@pytest.fixture(scope="module")
def deployed(local_cluster, system_node, tmp_path_factory) -> Iterator[Deployed]:
    """``pulumi up`` of the local stack into a fresh backend; destroyed (and removed) at module end.

    Builds the Pulumi CLI and provider first when ``invoke install``
    has not (a cold build takes many minutes: see the first test's timeout).
    """
    tools.ensure_all(progress=print)
    root: Path = tmp_path_factory.mktemp("pulumi")
    target = engine.Target(env=ENV, kubeconfig=local_cluster.kubeconfig, work_dir=root / "project",
                           backend=root / "backend", config=dict(BASE_CONFIG))
    target.work_dir.mkdir()
    remove_leftovers(local_cluster.kube)
    before = snapshot(local_cluster.kube)
    seconds: dict[str, float] = {}
    try:
        started = time.monotonic()
        result = engine.up(target, printer=print)
        seconds["up"] = time.monotonic() - started
        yield Deployed(target, before, result, seconds)
    finally:
        engine.destroy(target, printer=print, remove=True)
        print("engine seconds:", {k: round(v, 1) for k, v in seconds.items()})


# Covers the fixture, which builds the CLI and provider on a machine where
# `invoke install` (make install) has not: a cold build is long.
@pytest.mark.timeout(3600)
def test_up_creates_exactly_what_the_stack_declares(deployed, local_cluster):
    declared = declared_ids()
    created = {urn_name(u): op for u, op in deployed.up.changes.items()
               if urn_type(u).startswith("kubernetes:") and urn_type(u) != "pulumi:providers:kubernetes"}
    assert set(created) == set(declared)
    assert set(created.values()) == {"create"}
    assert deployed.up.outputs["environment"] == ENV
    # Every declared object is on the cluster now.
    for oid, obj in declared.items():
        assert local_cluster.kube.request("GET", local_cluster.kube.path_of(obj))["metadata"]["uid"], oid


def test_second_preview_shows_no_changes(deployed):
    started = time.monotonic()
    result = engine.preview(deployed.target, printer=print)
    deployed.seconds["preview"] = time.monotonic() - started
    assert result.changes == {}
    assert set(result.summary) == {"same"}


def test_a_selector_declared_differently_later_is_kept_not_replaced(deployed, monkeypatch):
    """A Deployment's selector is immutable: a release that declares another one (the inference role's,
    which leaves surge pods out, over an earlier release's matchLabels alone) must not make the engine
    delete and recreate the Deployment, every replica at once. The declared selector is ignored after
    creation (``gpufleet_admin.stack.role.declare``)."""
    from gpufleet_admin.stack import program
    from roles.inference import manifests as inference

    def earlier(inv):
        out = inference.objects(inv)
        for o in out:
            if o["kind"] == "Deployment":
                o["spec"]["selector"] = {"matchLabels": o["spec"]["selector"]["matchLabels"]}
        return out

    assert any(o["kind"] == "Deployment" for o in inference.objects(load(ENV, overrides=BASE)))
    monkeypatch.setattr(program, "ROLES", tuple(dataclasses.replace(r, objects=earlier) if r.name == "inference"
                                                else r for r in program.ROLES))
    result = engine.preview(deployed.target, printer=print)
    assert result.changes == {}


def test_one_variable_updates_only_its_dependents(deployed, local_cluster):
    before, after = declared_ids(), declared_ids({VARIABLE: VALUE})
    expected = {oid for oid in before if before[oid] != after[oid]}
    assert expected, f"{VARIABLE}={VALUE} changes no object; pick another value"
    changed = dataclasses.replace(deployed.target, config={**BASE_CONFIG, f"gpufleet:{VARIABLE}": str(VALUE)})

    preview = engine.preview(changed, printer=print)
    assert {urn_name(u): op for u, op in preview.changes.items()} == {oid: "update" for oid in expected}
    assert preview.summary["update"] == len(expected)

    started = time.monotonic()
    up = engine.up(changed, printer=print)
    deployed.seconds["update"] = time.monotonic() - started
    assert {urn_name(u): op for u, op in up.changes.items()} == {oid: "update" for oid in expected}
    # The quotas, and quota sync's configuration file (it follows the same policy) with the Deployment its
    # checksum rolls: each as declared.
    assert {oid.split("/")[0] for oid in expected} == {"ClusterQueue", "ConfigMap", "Deployment"}, expected
    for oid in expected:
        obj = after[oid]
        live = local_cluster.kube.request("GET", local_cluster.kube.path_of(obj))
        part = {"ClusterQueue": lambda o: o["spec"]["resourceGroups"], "ConfigMap": lambda o: o["data"],
                "Deployment": lambda o: o["spec"]["template"]["metadata"].get("annotations")}[obj["kind"]]
        assert part(live) == part(obj), oid


def test_quota_sync_rewrites_do_not_block_a_later_up(deployed, local_cluster):
    """quota-sync co-owns nominalQuota after its merge patch; ClusterQueues carry pulumi.com/patchForce,
    so the next up that changes them applies instead of failing on a server-side apply conflict."""
    from gpufleet.quota_sync import resync as rs

    api = local_cluster.kube
    live = api.request("GET", f"{rs.CQ_PATH}/training")
    groups = live["spec"]["resourceGroups"]
    for res in (r for f in groups[0]["flavors"] for r in f["resources"] if r["name"] == "nvidia.com/gpu"):
        res["nominalQuota"] = "40"  # what quota-sync writes with nodes out
    api.request("PATCH", f"{rs.CQ_PATH}/training", body={"spec": {"resourceGroups": groups}})
    value = VALUE // 2
    again = dataclasses.replace(deployed.target, config={**BASE_CONFIG, f"gpufleet:{VARIABLE}": str(value)})
    engine.up(again, printer=print)
    want = next(o for o in declared_ids({VARIABLE: value}).values()
                if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "training")
    assert api.request("GET", f"{rs.CQ_PATH}/training")["spec"]["resourceGroups"] == want["spec"]["resourceGroups"]


def test_a_priority_class_whose_value_changes_is_replaced(deployed, local_cluster):
    """A PriorityClass's value is immutable (the API server answers 422): a release that raises training's class
    replaces it, deleted first since its name stays, and the classes whose value follows it with it (the flip's
    surge class, one above the highest); what else reads the classes is updated in place
    (``gpufleet_admin.stack.role.declare``)."""
    import json

    inv = load(ENV, overrides=BASE)
    classes = [{"name": c.name, "value": c.value + (1 if i == 0 else 0), "description": c.description,
                "preemption_policy": c.preemption_policy} for i, c in enumerate(inv.role("kueue").kueue_priority_classes)]
    overrides = {"kueue_priority_classes": classes}
    before, after = declared_ids(), declared_ids(overrides)
    changed = {oid for oid in before if before[oid] != after[oid]}
    replaced = {oid for oid in changed if oid.startswith("PriorityClass/")}
    assert f"PriorityClass/{classes[0]['name']}" in replaced
    uids = {oid: local_cluster.kube.request("GET", local_cluster.kube.path_of(before[oid]))["metadata"]["uid"]
            for oid in replaced}
    target = dataclasses.replace(deployed.target, config={**BASE_CONFIG,
                                                          "gpufleet:kueue_priority_classes": json.dumps(classes)})
    up = engine.up(target, printer=print)
    ops = {urn_name(u): op for u, op in up.changes.items()}
    assert set(ops) == changed
    assert all(ops[oid] != "update" for oid in replaced), ops
    assert all(ops[oid] == "update" for oid in changed - replaced), ops
    for oid in replaced:
        live = local_cluster.kube.request("GET", local_cluster.kube.path_of(after[oid]))
        assert live["value"] == after[oid]["value"] and live["metadata"]["uid"] != uids[oid], oid


def test_destroy_leaves_the_cluster_as_it_was(deployed, local_cluster):
    started = time.monotonic()
    result = engine.destroy(deployed.target, printer=print)
    deployed.seconds["destroy"] = time.monotonic() - started
    assert set(result.summary) == {"delete"}
    after = snapshot(local_cluster.kube)
    assert after - deployed.before == set(), "left behind"
    assert deployed.before - after == set(), "removed objects the stack did not create"
