"""Local cluster lifecycle: a second cluster beside the session one, down then up again."""

from __future__ import annotations

import contextlib
import json

import pytest

from gpufleet import names
from gpufleet_admin.build import image as images
from gpufleet_workshop.local import cluster as local
from gpufleet_workshop.local import keda
from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.local.apply import apply_changed, wait_for
from gpufleet_workshop.local import ports as portblocks
from gpufleet_workshop.local import prometheus
from gpufleet.prom.client import PromClient
from gpufleet.wait import PollTimeout, poll_until
from roles.registry import node_specs

pytestmark = pytest.mark.cluster



@pytest.fixture
def other(local_cluster) -> str:
    """A second cluster's name, derived from the session cluster's (``$GPUFLEET_TEST_CLUSTER``), so that
    two test sessions on one machine each have their own; not the ``other`` pool's (``other_cluster``, which
    other modules share and this test would stop)."""
    return f"{local_cluster.name}-lc"


def test_down_then_up_again_beside_the_session_cluster(local_cluster, other):
    specs = node_specs("local", 2)
    try:
        first = local.up(other, specs=specs)
        assert first.ports.base != local_cluster.cluster.ports.base
        assert local.status(other).up
        with first.kube() as k:
            apply_changed(k, [{"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "survives-restart", "namespace": "default"}}])
            _running_pod_on_real_node(first, k)

        stopped = local.down(other)
        assert set(stopped) == set(local.COMPONENTS) | set(keda.COMPONENTS)  # KEDA runs beside the real node
        # The real node leaves no process, cgroup, mount or interface behind, though a pod ran.
        assert realnode.leftovers(other, realnode.NodePaths.of(first.layout)) == []
        assert local.main_pids(other) == {}
        assert portblocks.busy_ports(first.ports) == []
        assert local.status(local_cluster.name).up  # the session cluster is untouched

        again = local.up(other, specs=specs)
        assert again.ports == first.ports
        st = local.status(other)
        assert st.up and st.nodes == (2, 2)
        # up is idempotent: nothing restarts
        pids = local.main_pids(other)
        local.up(other, specs=specs)
        assert local.main_pids(other) == pids
        assert _configmaps(again) == {"kube-root-ca.crt", "survives-restart"}

        with pytest.raises(ValueError, match="run local.down first"):
            local.up(other, specs=specs, fresh=True)
        local.down(other)
        fresh = local.up(other, specs=specs, fresh=True)
        assert "survives-restart" not in _configmaps(fresh)
    finally:
        local.down(other, purge=True)
    assert portblocks.lookup(other) is None


def _running_pod_on_real_node(c: local.Cluster, k) -> None:
    """A pod that sleeps on the real node (from gpufleet's image), waited for until it runs."""
    key, value, effect = names.SYSTEM_NODE_TAINT
    apply_changed(k, [{
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper", "namespace": "default"},
        "spec": {"nodeName": realnode.node_name(c.name), "automountServiceAccountToken": False,
                 "tolerations": [{"key": key, "value": value, "effect": effect}],
                 "containers": [{"name": "main", "image": images.built()["reference"],
                                 "command": ["python3", "-c", "import time; time.sleep(3600)"]}]}}])
    wait_for("the sleeper pod Running",
             lambda: (k.get_or_none("v1", "pods", "sleeper", "default") or {}).get("status", {}).get("phase") == "Running",
             timeout=60)


def _configmaps(c: local.Cluster) -> set[str]:
    with c.kube() as k:
        return {o["metadata"]["name"] for o in k.list("v1", "configmaps", "default")["items"]}


def test_nodes_come_from_the_inventory(local_cluster):
    items = local_cluster.kube.list("v1", "nodes", labelSelector="gpufleet.io/simulated=true")["items"]
    nodes = {n["metadata"]["name"]: n for n in items}
    for spec in node_specs("local"):
        node = nodes[spec.name]
        assert {k: node["metadata"]["labels"].get(k) for k in spec.labels} == spec.labels
        assert {(t["key"], t.get("value"), t["effect"]) for t in node["spec"].get("taints") or []} == {
            (t["key"], t.get("value"), t["effect"]) for t in spec.taints
        }
        assert {k: node["status"]["allocatable"][k] for k in spec.capacity} == spec.capacity
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def test_prometheus_scrapes_file_sd_targets_and_control_plane(local_cluster):
    c = local_cluster.cluster
    prom = PromClient(f"http://127.0.0.1:{c.ports.prometheus}")
    prometheus.write_targets(c.layout.scrape_targets, "self-check", [f"127.0.0.1:{c.ports.prometheus}"], {"team": "test"})

    def targets() -> dict[str, str]:
        return {t["labels"]["job"]: t["health"] for t in prom.targets()}

    with contextlib.suppress(PollTimeout):  # the assertions below say what was missing
        poll_until(lambda: (f := targets()).get("self-check") == "up" and f.get("kube-apiserver") == "up",
                   what="self-check and kube-apiserver targets up", timeout=60, interval=1)
    found = targets()
    (c.layout.scrape_targets / "self-check.json").unlink()
    assert found.get("self-check") == "up", json.dumps(found)
    assert found.get("kube-apiserver") == "up", json.dumps(found)


def test_a_failing_component_stops_up_with_its_log_tail(local_cluster, other):
    broken = {"apiVersion": "descheduler/v1alpha2", "kind": "DeschedulerPolicy",
              "profiles": [{"name": "broken", "plugins": {"deschedule": {"enabled": ["NoSuchPlugin"]}}}]}
    try:
        with pytest.raises(local.ComponentFailed) as err:
            local.up(other, specs=node_specs("local", 1), descheduler_policy=broken)
        assert err.value.component == "descheduler"
        assert "NoSuchPlugin" in str(err.value)  # from the descheduler's own log
    finally:
        local.down(other, purge=True)
    assert portblocks.lookup(other) is None

