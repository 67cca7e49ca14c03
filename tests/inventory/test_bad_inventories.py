"""Broken inventories fail before anything is declared, naming file, key, value and what was expected."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gpufleet_admin.inventory import InventoryError
from gpufleet.paths import INVENTORIES
from roles.registry import load


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    """A copy of the staging inventory to break (kept under an inventories/ folder for messages)."""
    root = tmp_path / "inventories" / "staging"
    shutil.copytree(INVENTORIES / "staging", root)
    return root


def edit(path: Path, **changes) -> None:
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    data = data or {}
    data.update(changes)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


def problems(root: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load("staging", root=root)
    return str(info.value)


CASES = {
    "wrong type": (lambda r: edit(r / "group_vars/all/kueue.yml", kueue_reserve_gpus="four"),
                   ["inventories/staging/group_vars/all/kueue.yml", "kueue_reserve_gpus", "'four'", "valid integer"]),
    "unknown key": (lambda r: edit(r / "group_vars/all/kueue.yml", kueue_reserv_gpus=4),
                    ["group_vars/all/kueue.yml", "kueue_reserv_gpus", "did you mean kueue_reserve_gpus"]),
    "unknown role": (lambda r: edit(r / "group_vars/all/addons.yml", fancy_scheduler_enabled=True),
                     ["group_vars/all/addons.yml", "fancy_scheduler_enabled", "unknown role"]),
    "negative gpu count": (lambda r: edit(r / "group_vars/gpu_nodes.yml", gpu_count=-8),
                           ["group_vars/gpu_nodes.yml", "gpu_count", "-8", "greater than or equal to 0"]),
    "non-integer gpu count": (lambda r: edit(r / "group_vars/gpu_nodes.yml", gpu_count=7.5),
                              ["group_vars/gpu_nodes.yml", "gpu_count", "7.5", "valid integer"]),
    "fractional pool capacity": (lambda r: edit(r / "group_vars/all/virtual_kubelet.yml", virtual_kubelet_pools=[
                                     {"name": "burst", "provider": "simulated", "gpu_model": "H100-SXM-80GB",
                                      "capacity_gpus": 7.5, "price_per_gpu_hour": 2.0}]),
                                 ["group_vars/all/virtual_kubelet.yml", "virtual_kubelet_pools[0].capacity_gpus", "7.5",
                                  "valid integer"]),
    "fractional reserve": (lambda r: edit(r / "group_vars/all/kueue.yml", kueue_reserve_gpus=0.5),
                           ["group_vars/all/kueue.yml", "kueue_reserve_gpus", "0.5", "valid integer"]),
    "bad quantity": (lambda r: edit(r / "group_vars/rack_a.yml", node_memory="8Gib"),
                     ["group_vars/rack_a.yml", "node_memory", "'8Gib'", "Kubernetes quantity"]),
    "temperature out of range": (lambda r: edit(r / "group_vars/all/metrics.yml", gpu_metrics_gpu_temp_threshold_celsius=780),
                                 ["group_vars/all/metrics.yml", "gpu_metrics_gpu_temp_threshold_celsius", "780",
                                  "less than or equal to 110"]),
    "unknown gpu model": (lambda r: edit(r / "group_vars/rack_b.yml", gpu_model="H1000"),
                          ["group_vars/rack_b.yml", "gpu_model", "'H1000'", "one of A100-SXM-80GB"]),
    "duplicate host": (lambda r: (r / "hosts.yml").write_text((r / "hosts.yml").read_text().replace(
                           "stg-a100-[1:2]:", "stg-a100-[1:2]:\n                stg-h100-1:")),
                       ["inventories/staging/hosts.yml", "stg-h100-1", "duplicate host"]),
    "host in no rack": (lambda r: (r / "hosts.yml").write_text(
                            (r / "hosts.yml").read_text() + "    spares:\n      hosts:\n        stg-spare-1:\n"),
                        ["inventories/staging/hosts.yml", "stg-spare-1", "rack"]),
    "pool with no price": (lambda r: edit(r / "group_vars/all/virtual_kubelet.yml", virtual_kubelet_pools=[
                               {"name": "burst", "provider": "simulated", "gpu_model": "H100-SXM-80GB", "capacity_gpus": 8}]),
                           ["group_vars/all/virtual_kubelet.yml", "virtual_kubelet_pools[0].price_per_gpu_hour",
                            "required"]),
    "local queue names missing cluster queue": (
        lambda r: edit(r / "group_vars/all/kueue.yml",
                       kueue_local_queues=[{"namespace": "team-x", "name": "x", "cluster_queue": "nope"}]),
        ["group_vars/all/kueue.yml", "kueue_local_queues[0].cluster_queue", "'nope'", "a ClusterQueue of kueue_cluster_queues"]),
    "quota above inventory capacity": (
        lambda r: edit(r / "group_vars/all/kueue.yml",
                       kueue_cluster_queues=[{"name": "staging", "nominal_gpus": {"h100-sxm-80gb": 17}}]),
        ["group_vars/all/kueue.yml", "kueue_cluster_queues[0].nominal_gpus.h100-sxm-80gb", "17", "at most 16 GPUs"]),
    "role variable set per group": (lambda r: edit(r / "group_vars/rack_a.yml", kueue_reserve_gpus=2),
                                    ["group_vars/rack_a.yml", "kueue_reserve_gpus", "group_vars/all"]),
    "duplicate yaml key": (lambda r: (r / "group_vars/rack_b.yml").write_text("node_rack: rack-b\nnode_rack: rack-c\n"),
                           ["group_vars/rack_b.yml", "line 2, column 1: duplicate key 'node_rack'"]),
    "yaml syntax": (lambda r: (r / "group_vars/rack_b.yml").write_text("node_rack: rack-b\nnode_hcas: [mlx5_0,\n"),
                    ["group_vars/rack_b.yml", "line 3, column 1: while parsing a flow node"]),
    # The value set in the inventory is blamed, the other one shown with the file it comes from.
    "hysteresis inverted": (lambda r: edit(r / "group_vars/all/taint_controller.yml", taint_controller_low_water_gpus=20),
                            ["inventories/staging/group_vars/all/taint_controller.yml: taint_controller_low_water_gpus: "
                             "20: expected taint_controller_low_water_gpus below taint_controller_high_water_gpus",
                             "taint_controller_high_water_gpus is"]),
    "host_vars for unknown host": (lambda r: edit(r / "host_vars/stg-h100-9.yml", gpu_count=8),
                                   ["host_vars/stg-h100-9.yml", "a host of hosts.yml"]),
    "bad namespace name": (lambda r: edit(r / "group_vars/all/inference.yml", inference_namespace="Inference_NS"),
                           ["inference_namespace", "'Inference_NS'", "DNS label"]),
    "negative memory": (lambda r: edit(r / "group_vars/rack_a.yml", node_memory="-2Ti"),
                        ["group_vars/rack_a.yml", "node_memory", "'-2Ti'", "a quantity >= 0"]),
    "not UTF-8": (lambda r: (r / "group_vars/rack_b.yml").write_bytes(b"node_rack: rack-b\n# \xff\xfe\n"),
                  ["group_vars/rack_b.yml", "expected a UTF-8 text file"]),
    "one flavor allocated two ways": (lambda r: edit(r / "host_vars/stg-h100-2.yml", gpu_allocation="dra"),
                                      ["inventories/staging/hosts.yml", "stg-h100-2.gpu_allocation", "'dra'",
                                       "'device_plugin' like stg-h100-1: every host of flavor h100-sxm-80gb"]),
    "unknown gpu allocation": (lambda r: edit(r / "group_vars/rack_a.yml", gpu_allocation="mig"),
                               ["group_vars/rack_a.yml", "gpu_allocation", "'mig'", "'device_plugin' or 'dra'"]),
    "group cycle": (lambda r: (r / "hosts.yml").write_text((r / "hosts.yml").read_text().replace(
                        "            rack_b:\n", "            rack_b:\n              children:\n                gpu_nodes:\n")),
                    ["inventories/staging/hosts.yml", "'block_1'", "(a cycle of groups)"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_inventory_is_refused_with_file_and_key(staging: Path, case: str) -> None:
    breaker, expected = CASES[case]
    breaker(staging)
    message = problems(staging)
    for fragment in expected:
        assert fragment in message, f"{case}: {fragment!r} not in:\n{message}"


def test_all_problems_are_reported_at_once(staging: Path) -> None:
    edit(staging / "group_vars/all/kueue.yml", kueue_reserve_gpus=-1)
    edit(staging / "group_vars/rack_a.yml", node_cpu="many")
    message = problems(staging)
    assert "kueue_reserve_gpus" in message and "node_cpu" in message


def test_unknown_environment_names_the_known_ones() -> None:
    with pytest.raises(InventoryError, match=r"known: local, local-dra, prod, staging"):
        load("qa")


def test_stack_config_overrides_with_highest_precedence() -> None:
    inv = load("staging", overrides={"kueue_reserve_gpus": 3})
    assert inv.role("kueue").kueue_reserve_gpus == 3
    with pytest.raises(InventoryError, match=r"Pulumi.staging.yaml \(stack config\): kueue_reserve_gpus: 'x'"):
        load("staging", overrides={"kueue_reserve_gpus": "x"})
