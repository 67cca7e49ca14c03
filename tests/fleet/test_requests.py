"""What a pod requests: the one function quota, status and the controllers count with (Kubernetes' PodRequests rule)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufleet.fleet.capacity import Requests, pod_requests, pod_spec_request
from gpufleet.kube.quantity import GpuCountError


def _resource(keyword: str) -> str:
    """``nvidia_com_gpu`` -> ``nvidia.com/gpu`` (a keyword cannot spell it); others as they are."""
    return "nvidia.com/gpu" if keyword == "nvidia_com_gpu" else keyword


def c(name: str, restart: str | None = None, **requests: str) -> dict:
    out = {"name": name, "resources": {"requests": {_resource(k): v for k, v in requests.items()}}}
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


def limits(name: str, **values: str) -> dict:
    return {"name": name, "resources": {"limits": {_resource(k): v for k, v in values.items()}}}


#: (spec, nvidia.com/gpu the scheduler counts): Kubernetes' PodRequests, case by case.
RULE_TABLE = {
    "containers-add-up": ({"containers": [c("a", nvidia_com_gpu="2"), c("b", nvidia_com_gpu="3")]}, 5),
    "no-request-is-zero": ({"containers": [c("a", cpu="1")]}, 0),
    "limits-stand-for-requests": ({"containers": [limits("a", nvidia_com_gpu="4")]}, 4),
    "requests-win-over-limits": ({"containers": [{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "2"},
                                                                             "limits": {"nvidia.com/gpu": "2", "cpu": "9"}}}]}, 2),
    "larger-init-wins": ({"initContainers": [c("i", nvidia_com_gpu="8")], "containers": [c("a", nvidia_com_gpu="2")]}, 8),
    "smaller-init-hidden": ({"initContainers": [c("i", nvidia_com_gpu="1")], "containers": [c("a", nvidia_com_gpu="2")]}, 2),
    "inits-run-one-at-a-time": ({"initContainers": [c("i1", nvidia_com_gpu="3"), c("i2", nvidia_com_gpu="3")],
                                 "containers": [c("a", nvidia_com_gpu="1")]}, 3),
    "sidecar-adds-to-main": ({"initContainers": [c("s", "Always", nvidia_com_gpu="1")],
                              "containers": [c("a", nvidia_com_gpu="2")]}, 3),
    "sidecar-before-init-adds-to-it": ({"initContainers": [c("s", "Always", nvidia_com_gpu="1"), c("i", nvidia_com_gpu="4")],
                                        "containers": [c("a", nvidia_com_gpu="1")]}, 5),
    "sidecar-after-init-does-not": ({"initContainers": [c("i", nvidia_com_gpu="4"), c("s", "Always", nvidia_com_gpu="1")],
                                     "containers": [c("a", nvidia_com_gpu="1")]}, 4),
    "init-restart-on-failure-is-not-a-sidecar": ({"initContainers": [c("i", "OnFailure", nvidia_com_gpu="1")],
                                                  "containers": [c("a", nvidia_com_gpu="1")]}, 1),
    "overhead-added": ({"containers": [c("a", nvidia_com_gpu="1")], "overhead": {"nvidia.com/gpu": "1"}}, 2),
    "overhead-only": ({"containers": [c("a", cpu="1")], "overhead": {"nvidia.com/gpu": "1"}}, 1),
}


@pytest.mark.parametrize("spec, gpus", RULE_TABLE.values(), ids=RULE_TABLE.keys())
def test_the_scheduler_rule_case_by_case(spec, gpus):
    from gpufleet.fleet.capacity import pod_gpus

    assert pod_spec_request(spec, "nvidia.com/gpu") == gpus
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}
    assert pod_gpus(pod) == gpus


@pytest.mark.parametrize("spec, where", [
    ({"containers": [c("a", nvidia_com_gpu="500m")]}, "container a: nvidia.com/gpu '500m'"),
    ({"containers": [limits("a", nvidia_com_gpu="1.5")]}, "container a: nvidia.com/gpu '1.5'"),
    ({"initContainers": [c("i", nvidia_com_gpu="0.5")], "containers": [c("a", nvidia_com_gpu="1")]},
     "container i: nvidia.com/gpu '0.5'"),
    ({"containers": [c("a", nvidia_com_gpu="1")], "overhead": {"nvidia.com/gpu": "250m"}}, ": nvidia.com/gpu '1.25"),
], ids=["request", "limit", "init", "overhead"])
def test_a_fractional_gpu_count_is_refused_naming_the_pod_and_value(spec, where):
    from gpufleet.fleet.capacity import pod_gpus, pod_resource_requests
    from gpufleet.virtual_kubelet.provider import pod_requests as vk_pod_requests

    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}
    for count in (pod_gpus, pod_resource_requests, vk_pod_requests):
        with pytest.raises(GpuCountError, match=r"^pod ns/p.*" + where.replace(".", r"\.")):
            count(pod)


def test_every_resource_named_is_counted_by_the_same_rule():
    from gpufleet.fleet.capacity import pod_resource_requests
    from gpufleet.virtual_kubelet.provider import pod_requests as vk_pod_requests

    spec = {"initContainers": [c("proxy", "Always", cpu="500m", memory="1Gi")],
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "2"},
                                                          "limits": {"memory": "4Gi", "nvidia.com/gpu": "1"}}}],
            "overhead": {"cpu": "100m"}}
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}
    assert pod_resource_requests(pod) == {"cpu": Decimal("2.6"), "memory": 5 * 2**30, "nvidia.com/gpu": 1}
    assert vk_pod_requests(pod) == {"cpu": 2.6, "memory": 5.0 * 2**30, "nvidia.com/gpu": 1.0}
    spec["overhead"] = {"cpu": "lots"}
    with pytest.raises(ValueError, match="pod ns/p: .*lots"):
        pod_resource_requests(pod)


def test_the_flip_signal_refuses_a_fraction_rather_than_rounding_it(caplog):
    from gpufleet.taint_controller.signal import pod_view

    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1", "containers": [c("a", nvidia_com_gpu="1500m")]}}
    assert pod_view(pod)["gpus"] == 0
    assert "pod ns/p container a: nvidia.com/gpu '1500m'" in caplog.text
    pod["spec"]["initContainers"] = [c("s", "Always", nvidia_com_gpu="1")]
    pod["spec"]["containers"] = [c("a", nvidia_com_gpu="2")]
    assert pod_view(pod)["gpus"] == 3
