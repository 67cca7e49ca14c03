"""Checkpoint filesystem checks: mounted at ``parallel_fs_mount_path`` with ``parallel_fs_type``,
writable, and a short write probe at or above ``parallel_fs_min_write_mib_per_second``.

The probe writes ``parallel_fs_probe_mib`` MiB with ``dd ... conv=fsync`` (data
on the filesystem, not in the page cache) and removes the file.
"""

from __future__ import annotations

import shlex

import pytest

from nodecheck import Node, parse_dd


def _mount(node: Node) -> tuple[str, tuple[str, str] | None]:
    path = str(node.var("parallel_fs_mount_path")).rstrip("/") or "/"
    return path, node.mounts.get(path)


def _require_mounted(node: Node) -> str:
    path, entry = _mount(node)
    if entry is None:
        pytest.skip(f"{node.name}: {path} not mounted: see test_checkpoint_fs_mounted")
    return path


def test_checkpoint_fs_mounted(node: Node):
    """The checkpoint filesystem is mounted at ``parallel_fs_mount_path``."""
    path, entry = _mount(node)
    assert entry is not None, f"{node.name}: nothing mounted at {path}"


def test_checkpoint_fs_type(node: Node):
    """It is the expected filesystem type (e.g. wekafs), not a local disk or a stale NFS."""
    path = _require_mounted(node)
    _, fstype = node.mounts[path]
    assert fstype == node.var("parallel_fs_type"), f"{node.name}: {path} is {fstype}, expected {node.var('parallel_fs_type')}"


def test_checkpoint_fs_writable(node: Node):
    """A file can be created and removed there."""
    path = _require_mounted(node)
    result = node.run(f'f=$(mktemp -p {shlex.quote(path)} .gpufleet-check.XXXXXX) && rm -f "$f"')
    assert result.rc == 0, f"{node.name}: cannot write to {path}: {result.stderr.strip() or result.stdout.strip()}"


def test_checkpoint_fs_write_throughput(node: Node):
    """Sequential write (fsync'ed) at or above ``parallel_fs_min_write_mib_per_second``."""
    floor = node.var("parallel_fs_min_write_mib_per_second")
    if floor is None:
        pytest.skip(f"{node.name}: parallel_fs_min_write_mib_per_second not set")
    path = _require_mounted(node)
    mib = int(node.var("parallel_fs_probe_mib"))
    target = shlex.quote(f"{path}/.gpufleet-probe-{node.name}")
    result = node.run(f"dd if=/dev/zero of={target} bs=1M count={mib} conv=fsync 2>&1; rc=$?; rm -f {target}; exit $rc")
    assert result.rc == 0, f"{node.name}: write probe on {path} failed: {result.stdout.strip()[-300:]}"
    speed = parse_dd(result.stdout)
    assert speed is not None, f"{node.name}: cannot read dd's summary: {result.stdout.strip()[-300:]}"
    assert speed >= float(floor), f"{node.name}: {path} wrote {mib} MiB at {speed:.0f} MiB/s < floor {float(floor):g} MiB/s"
