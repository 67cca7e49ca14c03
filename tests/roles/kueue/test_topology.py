"""The fabric's topology: from the inventory to node labels, Kueue's Topology and the ResourceFlavors that name it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gpufleet_admin.inventory import InventoryError
from gpufleet.paths import INVENTORIES
from roles.kueue.manifests import objects as kueue_objects
from roles.registry import load


@pytest.fixture
def prod(tmp_path: Path) -> Path:
    """A copy of the prod inventory to break (kept under an inventories/ folder for messages)."""
    root = tmp_path / "inventories" / "prod"
    shutil.copytree(INVENTORIES / "prod", root)
    return root


def problems(root: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load("prod", root=root)
    return str(info.value)


def test_prod_has_blocks_of_racks() -> None:
    inv = load("prod")
    assert [lv.name for lv in inv.topology_levels()] == ["block", "rack", "hostname"]
    blocks = {b: sorted({h.vars.node_rack for h in hs}) for b, hs in inv.domains("block").items()}
    assert blocks == {"block-1": ["rack-a", "rack-b"], "block-2": ["rack-c", "rack-d"]}
    assert {r: len(hs) for r, hs in inv.domains("rack").items()} == {f"rack-{x}": 32 for x in "abcd"}


@pytest.mark.parametrize("env", ["prod", "staging", "local"])
def test_every_gpu_node_carries_every_level_label(env: str) -> None:
    inv = load(env)
    labels = [lv.label for lv in inv.topology_levels()]
    assert labels[-1] == "kubernetes.io/hostname"
    for spec in inv.node_specs():
        assert all(spec.labels.get(label) for label in labels), spec.name
    host = next(iter(inv.hosts.values()))
    spec = inv.node_spec(host)
    assert (spec.labels["gpufleet.io/block"], spec.labels["gpufleet.io/rack"]) == (host.vars.node_block,
                                                                                   host.vars.node_rack)


def test_kueue_role_declares_the_topology_and_flavors_name_it() -> None:
    inv = load("prod")
    objs = kueue_objects(inv)
    (topo,) = [o for o in objs if o["kind"] == "Topology"]
    assert topo["apiVersion"] == "kueue.x-k8s.io/v1beta2" and topo["metadata"]["name"] == "gpu-fabric"
    assert topo["spec"]["levels"] == [{"nodeLabel": "gpufleet.io/block"}, {"nodeLabel": "gpufleet.io/rack"},
                                      {"nodeLabel": "kubernetes.io/hostname"}]
    flavors = [o for o in objs if o["kind"] == "ResourceFlavor"]
    assert flavors and all(f["spec"]["topologyName"] == "gpu-fabric" for f in flavors)
    # The Topology comes before the flavors that name it.
    kinds = [o["kind"] for o in objs]
    assert kinds.index("Topology") < kinds.index("ResourceFlavor")


def test_without_blocks_the_topology_is_rack_and_hostname(prod: Path) -> None:
    for f in ("block_1.yml", "block_2.yml"):
        (prod / "group_vars" / f).unlink()
    inv = load("prod", root=prod)
    (topo,) = [o for o in kueue_objects(inv) if o["kind"] == "Topology"]
    assert topo["spec"]["levels"] == [{"nodeLabel": "gpufleet.io/rack"}, {"nodeLabel": "kubernetes.io/hostname"}]
    assert "gpufleet.io/block" not in inv.node_specs()[0].labels


def test_topology_can_be_switched_off() -> None:
    inv = load("prod", overrides={"kueue_topology_enabled": False, "training_topology": "none"})
    objs = kueue_objects(inv)
    assert not [o for o in objs if o["kind"] == "Topology"]
    assert all("topologyName" not in o["spec"] for o in objs if o["kind"] == "ResourceFlavor")


def test_switching_off_the_topology_needs_training_topology_none() -> None:
    with pytest.raises(InventoryError) as info:
        load("prod", overrides={"kueue_topology_enabled": False})
    assert "training_topology: 'rack': expected 'none' while kueue_topology_enabled is false" in str(info.value)


def test_a_rack_in_two_blocks_is_refused(prod: Path) -> None:
    # gpu-c-* claim rack-a, which block-1 already has.
    (prod / "group_vars" / "rack_c.yml").write_text("node_rack: rack-a\n")
    message = problems(prod)
    assert ("inventories/prod/hosts.yml: gpu-c-001: node_block: 'block-2': expected block-1: rack rack-a is in "
            "block block-1 (gpu-a-001), a rack belongs to one block") in message


def test_some_hosts_without_a_block_are_refused(prod: Path) -> None:
    (prod / "group_vars" / "block_2.yml").unlink()
    message = problems(prod)
    assert ("inventories/prod/hosts.yml: rack rack-c (gpu-c-001 .. gpu-c-032, 32 hosts): node_block: (missing): "
            "expected a block like every other GPU node (block-1)") in message
    assert "rack rack-d (gpu-d-001 .. gpu-d-032, 32 hosts): node_block" in message
    assert len(message.splitlines()) == 3  # the header and one line per rack, not one per host


def test_training_topology_block_needs_blocks(prod: Path) -> None:
    for f in ("block_1.yml", "block_2.yml"):
        (prod / "group_vars" / f).unlink()
    data = {"training_topology": "block"}
    (prod / "group_vars" / "all" / "training.yml").write_text(yaml.safe_dump(data))
    message = problems(prod)
    assert ("inventories/prod/group_vars/all/training.yml: training_topology: 'block': expected 'rack' or 'none': "
            "inventories/prod/hosts.yml gives no node_block, so there is no block level") in message


@pytest.mark.parametrize(("value", "expected"), [("Rack-A", "should match pattern"), ("-a", "should match pattern"),
                                                 ("x" * 64, "at most 63 characters")])
def test_level_values_must_be_label_values(prod: Path, value: str, expected: str) -> None:
    (prod / "group_vars" / "block_1.yml").write_text(yaml.safe_dump({"node_block": value}))
    message = problems(prod)
    assert "gpu-a-001: node_block" in message and expected in message


def test_unknown_training_topology_is_refused(prod: Path) -> None:
    (prod / "group_vars" / "all" / "training.yml").write_text("training_topology: spine\n")
    assert "training_topology: 'spine': expected 'block', 'rack' or 'none'" in problems(prod)
