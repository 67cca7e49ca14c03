"""Driver and fabric manager versions as pinned in the inventory
(``nvidia_driver_version``, ``nvidia_fabric_manager_version``)."""

from __future__ import annotations

import pytest

from nodecheck import Node, parse_fabric_manager_version


def test_nvidia_driver_version(node: Node):
    """Every reachable GPU reports the pinned driver version."""
    expected = node.var("nvidia_driver_version")
    if not expected:
        pytest.skip(f"{node.name}: nvidia_driver_version not pinned")
    versions = {g.value("driver_version") for g in node.gpus if not g.lost}
    assert versions, f"{node.name}: no reachable GPU to read the driver version from ({node.query_gpu.stdout.strip()[:200]})"
    assert versions == {expected}, f"{node.name}: NVIDIA driver {', '.join(sorted(v or '?' for v in versions))}, pinned {expected}"


def test_fabric_manager_version(node: Node):
    """nv-fabricmanager reports the pinned version (skipped where none is pinned, e.g. PCIe nodes)."""
    expected = node.var("nvidia_fabric_manager_version")
    if not expected:
        pytest.skip(f"{node.name}: nvidia_fabric_manager_version not pinned")
    result = node.run(f"{node.var('node_nv_fabricmanager')} --version")
    version = parse_fabric_manager_version(result.stdout + result.stderr)
    assert version is not None, f"{node.name}: cannot read the fabric manager version (rc {result.rc}): {(result.stdout + result.stderr).strip()[:200]}"
    assert version == expected, f"{node.name}: fabric manager {version}, pinned {expected}"
