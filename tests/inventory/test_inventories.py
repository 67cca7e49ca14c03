"""The shipped inventories: sizes, precedence, and that Ansible itself reads them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.paths import INVENTORIES
from roles.registry import load


def test_prod_is_the_realistic_fleet() -> None:
    inv = load("prod")
    assert len(inv.hosts) == 128
    assert {h.vars.node_rack for h in inv.hosts.values()} == {"rack-a", "rack-b", "rack-c", "rack-d"}
    flavor = inv.flavors()["h100-sxm-80gb"]
    assert (flavor.nodes, flavor.gpus) == (128, 1024)
    assert all(len(h.vars.node_hcas) == 8 and h.vars.node_hcas[0].rate_gbps == 400 for h in inv.hosts.values())
    assert inv.hosts["gpu-a-001"].vars.node_memory == "2Ti"
    pools = inv.role("virtual_kubelet").virtual_kubelet_pools
    assert [(p.name, p.price_per_gpu_hour) for p in pools] == [("burst-cluster", 2.10), ("gpu-rental", 2.85)]
    assert [lq.namespace for lq in inv.role("kueue").kueue_local_queues] == ["team-pretrain", "team-research"]


def test_host_vars_beat_group_vars() -> None:
    inv = load("prod")
    assert inv.hosts["gpu-c-017"].vars.nvidia_driver_version == "570.195.03"
    assert inv.hosts["gpu-c-016"].vars.nvidia_driver_version == "570.172.08"


def test_staging_mixes_two_gpu_models() -> None:
    assert set(load("staging").flavors()) == {"a100-sxm-80gb", "h100-sxm-80gb"}


def test_local_fleet_size_is_one_variable() -> None:
    assert len(load("local").hosts) == 16
    inv = load("local", nodes=5)
    assert len(inv.hosts) == 5
    assert [h.vars.node_rack for h in inv.hosts.values()] == ["rack-a", "rack-b", "rack-c", "rack-d", "rack-a"]
    assert [h.vars.node_block for h in inv.hosts.values()] == ["block-1", "block-1", "block-2", "block-2", "block-1"]


def test_node_spec_carries_flavor_labels_taint_and_capacity() -> None:
    spec = load("local", nodes=1).node_specs()[0]
    assert spec.labels["gpufleet.io/flavor"] == "h100-sxm-80gb"
    assert spec.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert spec.capacity == {"nvidia.com/gpu": "8", "cpu": "224", "memory": "2Ti", "pods": "110"}
    assert spec.taints == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


@pytest.mark.parametrize("env", ["prod", "staging"])
def test_ansible_reads_the_inventory(env: str) -> None:
    """testinfra's --ansible-inventory uses Ansible's parser: it must see the same hosts and variables."""
    cli = Path(sys.executable).with_name("ansible-inventory")
    out = subprocess.run([str(cli), "-i", str(INVENTORIES / env / "hosts.yml"), "--list"],
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    inv = load(env)
    hostvars = data["_meta"]["hostvars"]
    assert set(hostvars) == set(inv.hosts)
    for name, host in inv.hosts.items():
        assert hostvars[name]["gpu_model"] == host.vars.gpu_model
        assert hostvars[name]["node_rack"] == host.vars.node_rack
