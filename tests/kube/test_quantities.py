"""Canonical quantity strings, as the API server (and Kueue's webhook) store them."""

from __future__ import annotations

import pytest
from gpufleet.kube.quantity import canonical, number, parse_quantity


@pytest.mark.parametrize("value, binary, expected", [
    (0, False, "0"),
    (756, False, "756"),
    (21504, False, "21504"),
    (21000, False, "21k"),  # Kueue's webhook turns "21000" into "21k"
    (1500, False, "1500"),  # no fractional mantissa
    (3_000_000, True, "3M"),  # not a multiple of 1024: decimal form
    (211106232532992, True, "192Ti"),
    (2**40 * 10, True, "10Ti"),
    (1536 * 2**20, True, "1536Mi"),
    (1023, True, "1023"),
])
def test_canonical(value: int, binary: bool, expected: str) -> None:
    assert canonical(value, binary=binary) == expected
    assert parse_quantity(expected) == value


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True])
def test_canonical_refuses_what_is_not_a_count(bad) -> None:
    with pytest.raises(ValueError, match="integer >= 0"):
        canonical(bad)


def test_number_reads_quantities_as_floats() -> None:
    assert number("500m") == 0.5 and number("2Gi") == 2 * 2**30 and number("1k") == 1000 and number(3) == 3
    assert number(None) == 0 and number("") == 0
    with pytest.raises(ValueError, match="not a Kubernetes quantity: '8Gib'"):
        number("8Gib")


# --------------------------------------------------------------------------- whole GPUs


@pytest.mark.parametrize("value, expected", [("8", 8), (8, 8), ("0", 0), ("1k", 1000), (8.0, 8), ("8000m", 8)])
def test_whole_gpus(value, expected) -> None:
    from gpufleet.kube.quantity import whole_gpus

    assert whole_gpus(value, "here") == expected


@pytest.mark.parametrize("value", ["7.5", "500m", 0.5, "-1", "eight", True])
def test_a_fractional_or_bad_gpu_count_is_refused_naming_where_and_value(value) -> None:
    from gpufleet.kube.quantity import GpuCountError, whole_gpus

    with pytest.raises(GpuCountError) as info:
        whole_gpus(value, "node gpu-a-001 status.allocatable")
    assert str(info.value).startswith("node gpu-a-001 status.allocatable: nvidia.com/gpu ")
    assert repr(str(value)) in str(info.value) or repr(value) in str(info.value)


def test_fractional_gpus_in_pod_specs_workloads_and_queue_status_are_refused() -> None:
    from gpufleet.fleet.capacity import pod_gpus
    from gpufleet.kube.quantity import GpuCountError
    from gpufleet.quota_sync.resync import reserved_gpus, workload_gpus
    from gpufleet.virtual_kubelet.provider import pod_requests as vk_pod_requests

    pod = {"metadata": {"name": "p", "namespace": "team"},
           "spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1500m"}}}]}}
    with pytest.raises(GpuCountError, match=r"pod team/p container trainer: nvidia.com/gpu '1500m'"):
        pod_gpus(pod)
    with pytest.raises(GpuCountError, match=r"pod team/p container trainer: nvidia.com/gpu '1500m'"):
        vk_pod_requests(pod)
    wl = {"metadata": {"name": "w", "namespace": "team"},
          "spec": {"podSets": [{"name": "workers", "count": 2, "template": {"spec": pod["spec"]}}]}}
    with pytest.raises(GpuCountError, match=r"Workload team/w podSet workers container trainer: nvidia.com/gpu '1500m'"):
        workload_gpus(wl)
    cq = {"metadata": {"name": "training"},
          "status": {"flavorsReservation": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "7.5"}]}]}}
    with pytest.raises(GpuCountError, match=r"ClusterQueue training status.flavorsReservation\[h100\]: nvidia.com/gpu '7.5'"):
        reserved_gpus(cq)
