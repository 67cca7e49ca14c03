"""Fixture nodes for the node checks: built in tmp, listed in a generated Ansible inventory.

Every node is a fakenode (:mod:`gpufleet_workshop.fixtures.node`) materialised
under tmp with ``ansible_connection: local`` and override variables pointing
the checks at its sysfs tree, ``proc/mounts``, checkpoint directory and
``nvidia-smi``/``nv-fabricmanager``/kernel-log stand-ins. The node checks run
once per session (one pytest subprocess through ``invoke health.nodes``'s
code path) and the tests assert on its report.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet_workshop.fixtures.node import FIXTURE_NODES, FakeNodePaths, write_node
from gpufleet_workshop.tasks.health import NodeCheckRun, run_node_checks

# The node checks' helpers, for unit tests of the parsers.
sys.path.insert(0, str(Path(__file__).parents[1] / "nodes"))

#: fixture host -> (fakenode catalogue entry, description changes, inventory changes)
HOSTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # Healthy, with an application XID (31: a user's bad memory access) that must only warn.
    "healthy": ("healthy", {"kernel_log": [
        "2025-01-01T00:00:00+0000 node kernel: NVRM: Xid (PCI:0000:18:00): 31, pid=4242, name=python3, MMU Fault: ENGINE GRAPHICS",
    ]}, {}),
    "gpu-faults": ("gpu-faults", {}, {}),
    # Fabric faults, plus the checkpoint FS mounted as the wrong type and an unreachable throughput floor.
    "fabric-faults": ("fabric-faults", {"checkpoint_fs_type": "nfs4"}, {"parallel_fs_min_write_mib_per_second": 10**9}),
    # One GPU gone from the bus, and the checkpoint FS not mounted at all.
    "missing-gpu": ("missing-gpu", {"checkpoint_fs_type": None}, {}),
    # Handle and read errors, 78 C (passes) and 79 C (fails), a stopped fabric manager, a stray XID.
    "nvml-errors": ("nvml-errors", {}, {}),
    # The driver is not loaded: nvidia-smi fails as a whole.
    "no-driver": ("no-driver", {}, {}),
    # A PCIe server: no NVSwitch, no fabric manager, and nothing fails.
    "pcie": ("pcie", {}, {}),
}


def host_vars(desc: dict[str, Any], paths: FakeNodePaths, changes: dict[str, Any]) -> dict[str, Any]:
    """Inventory variables of one fixture host: its expectations plus the override paths."""
    return {
        **desc["inventory"],
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "node_sysfs_root": str(paths.sysfs_root),
        "node_proc_root": str(paths.proc_root),
        "node_nvidia_smi": str(paths.nvidia_smi),
        "node_nv_fabricmanager": str(paths.nv_fabricmanager),
        "node_systemctl": str(paths.systemctl),
        "node_kernel_log_command": str(paths.kernel_log),
        "parallel_fs_mount_path": str(paths.checkpoint_dir),
        "parallel_fs_type": "wekafs",
        "parallel_fs_min_write_mib_per_second": 1,
        "parallel_fs_probe_mib": 4,
        "node_health_nvlink_window_seconds": 1,
        **changes,
    }


def build_fleet(root: Path, hosts: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = HOSTS) -> tuple[Path, dict[str, FakeNodePaths]]:
    """Write every fixture host under ``root`` and an inventory ``root/hosts.yml``; return both."""
    entries, paths = {}, {}
    for host, (entry, desc_changes, inventory_changes) in hosts.items():
        desc = FIXTURE_NODES[entry]()
        desc.update(desc_changes)
        paths[host] = write_node(desc, root / host)
        entries[host] = host_vars(desc, paths[host], inventory_changes)
    inventory = root / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": entries}}}}, sort_keys=False))
    return inventory, paths


@pytest.fixture(scope="session")
def fleet(tmp_path_factory) -> tuple[Path, dict[str, FakeNodePaths]]:
    """The fixture fleet: (inventory path, paths per host)."""
    return build_fleet(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="session")
def checks(fleet) -> NodeCheckRun:
    """One run of all node checks on the fixture fleet."""
    run = run_node_checks(fleet[0], timeout=300)
    assert run.returncode in (0, 1), run.output[-4000:]
    return run
