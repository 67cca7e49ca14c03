"""Local cluster lifecycle: a second cluster beside the session one, down then up again."""

from __future__ import annotations

import json

import pytest

from gpufleet.inventory import node_specs
from gpufleet.local import cluster as local
from gpufleet.local.apply import apply_changed
from gpufleet.local import ports as portblocks
from gpufleet.local import prometheus
from gpufleet.prom.client import PromClient

pytestmark = pytest.mark.cluster

OTHER = "gpufleet-test-other"


def test_down_then_up_again_beside_the_session_cluster(local_cluster):
    specs = node_specs("local", 2)
    try:
        first = local.up(OTHER, specs=specs)
        assert first.ports.base != local_cluster.cluster.ports.base
        assert local.status(OTHER).up
        with first.kube() as k:
            apply_changed(k, [{"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "survives-restart", "namespace": "default"}}])

        stopped = local.down(OTHER)
        assert set(stopped) == set(local.COMPONENTS)
        assert local.main_pids(OTHER) == {}
        assert portblocks.busy_ports(first.ports) == []
        assert local.status(local_cluster.name).up  # the session cluster is untouched

        again = local.up(OTHER, specs=specs)
        assert again.ports == first.ports
        st = local.status(OTHER)
        assert st.up and st.nodes == (2, 2)
        # up is idempotent: nothing restarts
        pids = local.main_pids(OTHER)
        local.up(OTHER, specs=specs)
        assert local.main_pids(OTHER) == pids
        assert _configmaps(again) == {"kube-root-ca.crt", "survives-restart"}

        with pytest.raises(ValueError, match="run local.down first"):
            local.up(OTHER, specs=specs, fresh=True)
        local.down(OTHER)
        fresh = local.up(OTHER, specs=specs, fresh=True)
        assert "survives-restart" not in _configmaps(fresh)
    finally:
        local.down(OTHER, purge=True)
    assert portblocks.lookup(OTHER) is None


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

    import time
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = targets()
        if found.get("self-check") == "up" and found.get("kube-apiserver") == "up":
            break
        time.sleep(1)
    found = targets()
    (c.layout.scrape_targets / "self-check.json").unlink()
    assert found.get("self-check") == "up", json.dumps(found)
    assert found.get("kube-apiserver") == "up", json.dumps(found)


def test_a_failing_component_stops_up_with_its_log_tail(local_cluster):
    broken = {"apiVersion": "descheduler/v1alpha2", "kind": "DeschedulerPolicy",
              "profiles": [{"name": "broken", "plugins": {"deschedule": {"enabled": ["NoSuchPlugin"]}}}]}
    try:
        with pytest.raises(local.ComponentFailed) as err:
            local.up(OTHER, specs=node_specs("local", 1), descheduler_policy=broken)
        assert err.value.component == "descheduler"
        assert "NoSuchPlugin" in str(err.value)  # from the descheduler's own log
    finally:
        local.down(OTHER, purge=True)
    assert portblocks.lookup(OTHER) is None

