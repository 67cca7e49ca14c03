"""Driver and fabric manager as pinned in the inventory (``nvidia_driver_version``,
``nvidia_fabric_manager_version``), and the fabric manager running where the board needs it.

NVIDIA's fabric manager configures the NVSwitches of HGX boards: without it
running, NVLink between the GPUs does not come up and CUDA programs fail to
start. PCIe servers have no NVSwitch and need none; whether a node has
NVSwitches is read from its PCI bus (NVIDIA devices of class 0x0680).
"""

from __future__ import annotations

import pytest

from nodecheck import Node, parse_fabric_manager_version


def test_nvidia_driver_version(node: Node):
    """Every reachable GPU reports the pinned driver version."""
    expected = node.var("nvidia_driver_version")
    if not expected:
        pytest.skip(f"{node.name}: nvidia_driver_version not pinned")
    versions = {g.value("driver_version") for g in node.gpus if not g.lost}
    failure = node.smi_failure()
    assert versions, f"{node.name}: no reachable GPU to read the driver version from ({failure or node.query_gpu.stdout.strip()[:200]})"
    assert versions == {expected}, f"{node.name}: NVIDIA driver {', '.join(sorted(v or '?' for v in versions))}, pinned {expected}"


def _needs_fabric_manager(node: Node) -> None:
    if not node.nvswitches:
        pytest.skip(f"{node.name}: no NVSwitch on the PCI bus (a PCIe system): the fabric manager is not needed")


def test_fabric_manager_active(node: Node):
    """On NVSwitch systems the fabric manager service is active (``systemctl is-active``)."""
    _needs_fabric_manager(node)
    unit = node.var("nvidia_fabric_manager_service")
    state = node.fabric_manager_state
    answer = " ".join((state.stdout + " " + state.stderr).split()) or "no answer"
    assert state.rc == 0 and state.stdout.strip() == "active", (
        f"{node.name}: {len(node.nvswitches)} NVSwitches ({', '.join(node.nvswitches)}) but {unit} is not active "
        f"(`{state.command}` rc {state.rc}: {answer}): NVLink between the GPUs stays down until it runs")


def test_fabric_manager_version(node: Node):
    """nv-fabricmanager reports the pinned version (skipped where none is pinned, and on PCIe systems)."""
    expected = node.var("nvidia_fabric_manager_version")
    if not expected:
        pytest.skip(f"{node.name}: nvidia_fabric_manager_version not pinned")
    _needs_fabric_manager(node)
    result = node.run(f"{node.var('node_nv_fabricmanager')} --version")
    version = parse_fabric_manager_version(result.stdout + result.stderr)
    assert version is not None, f"{node.name}: cannot read the fabric manager version (rc {result.rc}): {(result.stdout + result.stderr).strip()[:200]}"
    assert version == expected, f"{node.name}: fabric manager {version}, pinned {expected}"
