"""NVLink checks through ``nvidia-smi nvlink``: every link up, no error growth over a short window.

The expected links per GPU come from ``gpu_nvlink_count`` or the GPU model
(H100/H200 SXM: 18). The window is ``node_health_nvlink_window_seconds`` (5 s);
both readings are taken once per node and shared by all its link tests.
"""

from __future__ import annotations

import pytest

from nodecheck import NvLinkRef, parse_nvlink_errors


def _skip_unreachable(ref: NvLinkRef) -> None:
    row = ref.node.gpu(ref.gpu)
    if row is None or row.lost or row.erroring:
        pytest.skip(f"{ref.node.name} GPU {ref.gpu} is not reachable: see test_gpu_reachable")


def test_nvlink_up(nvlink: NvLinkRef):
    """The link is reported with a speed, not ``<inactive>``."""
    _skip_unreachable(nvlink)
    links = nvlink.node.nvlink_status.get(nvlink.gpu)
    assert links is not None, f"{nvlink.node.name} GPU {nvlink.gpu}: `nvidia-smi nvlink -s` lists no links"
    state = links.get(nvlink.link)
    assert state is not None, f"{nvlink.node.name} GPU {nvlink.gpu} NVLink {nvlink.link}: not listed (GPU has {len(links)} links)"
    assert "inactive" not in state.lower(), f"{nvlink.node.name} GPU {nvlink.gpu} NVLink {nvlink.link}: {state}"


def test_nvlink_no_error_growth(nvlink: NvLinkRef):
    """Replay, recovery and CRC error counters do not grow over the window."""
    _skip_unreachable(nvlink)
    before, after, window = nvlink.node.nvlink_error_window
    first = parse_nvlink_errors(before.get(nvlink.gpu, {}).get(nvlink.link, ""))
    second = parse_nvlink_errors(after.get(nvlink.gpu, {}).get(nvlink.link, ""))
    assert second, f"{nvlink.node.name} GPU {nvlink.gpu} NVLink {nvlink.link}: no error counters in `nvidia-smi nvlink -e`"
    grown = {name: (first.get(name, 0), value) for name, value in second.items() if value > first.get(name, value)}
    assert not grown, f"{nvlink.node.name} GPU {nvlink.gpu} NVLink {nvlink.link}: " + ", ".join(
        f"{name} +{b - a} in {window:g} s ({a} -> {b})" for name, (a, b) in grown.items()
    )
