"""What a pod requests: the one function quota, status and the controllers count with (Kubernetes' PodRequests rule)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufleet.fleet.capacity import Requests, pod_requests, pod_spec_request
from gpufleet.kube.quantity import GpuCountError


def c(name: str, restart: str | None = None, **requests: str) -> dict:
    out = {"name": name, "resources": {"requests": {k.replace("_", "/"): v for k, v in requests.items()}}}
    if restart:
        out["restartPolicy"] = restart
    return out


def test_containers_add_up_and_a_larger_init_container_wins():
    spec = {"containers": [c("a", cpu="1500m"), c("b", cpu="2")], "initContainers": [c("init", cpu="3")]}
    assert pod_spec_request(spec, "cpu") == Decimal("3.5")
    spec["initContainers"] = [c("init", cpu="5")]
    assert pod_spec_request(spec, "cpu") == 5


def test_sidecars_run_beside_everything_started_after_them_and_overhead_is_added():
    spec = {"initContainers": [c("big-init", cpu="4"), c("proxy", restart="Always", cpu="1"), c("late-init", cpu="3")],
            "containers": [c("main", cpu="2")], "overhead": {"cpu": "250m"}}
    # main 2 + sidecar 1 = 3; big-init 4 alone; late-init 3 + sidecar 1 = 4: the pod needs 4, plus 0.25 overhead
    assert pod_spec_request(spec, "cpu") == Decimal("4.25")


def test_limits_stand_for_missing_requests_and_the_pod_is_named_in_errors():
    pod = {"metadata": {"name": "p", "namespace": "ns"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]}}
    assert pod_requests(pod) == Requests(1, Decimal(2), 2**30)
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = "lots"
    with pytest.raises(ValueError, match="pod ns/p: "):
        pod_requests(pod)
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "500m"}
    with pytest.raises(GpuCountError, match="pod ns/p container c"):
        pod_requests(pod)
