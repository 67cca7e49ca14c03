"""``invoke sim.flip`` refuses bad flags before any cluster starts (exit 2, naming the flag, value and what was expected)."""

from __future__ import annotations

import pytest
from invoke import Context
from invoke.exceptions import Exit

from gpufleet_workshop.tasks.sim import flip


@pytest.mark.parametrize("flags, message", [
    ({"rate": -1}, "--rate -1: expected requests per second >= 0"),
    ({"latency_ms": -5}, "--latency-ms -5: expected milliseconds > 0 (0: the default)"),
    ({"mode": "nope"}, "--mode 'nope': expected one of make_before_break, evict_first or both"),
    # A stand-in slower than the stream's timeout would fail every request.
    ({"latency_ms": 2000}, "--latency-ms 2000: expected milliseconds below 2000"),
    ({"pdb_max_unavailable": "10.5%"}, "--pdb-max-unavailable: '10.5%' is not a number of pods or a percentage"),
    ({"pool_gpus": -8}, "--pool-gpus -8: expected a number >= 0"),
    ({"migration_pods_per_minute": -1.5}, "--migration-pods-per-minute -1.5: expected a number >= 0"),
    ({"load_step": -80}, "--load-step -80: expected requests per second >= 0"),
])
def test_a_bad_flag_exits_2_naming_it(flags, message):
    # --pools nope: should a flag pass, the run stops at the pool check, before any cluster starts.
    with pytest.raises(Exit) as exc:
        flip(Context(), pools="nope", **flags)
    assert exc.value.code == 2 and message in exc.value.message


@pytest.mark.parametrize("flags, message", [
    ({"rate": 20, "load_step": 20}, "--load-step 20: expected requests per second above --rate 20"),
    ({"rate": 0, "load_step": 80}, "--load-step 80: a load step needs requests to step from"),
])
def test_a_load_step_that_steps_nowhere_exits_2_before_any_cluster_starts(flags, message):
    with pytest.raises(Exit) as exc:
        flip(Context(), **flags)
    assert exc.value.code == 2 and message in exc.value.message


def test_latency_is_free_when_no_requests_are_sent():
    with pytest.raises(Exit, match="--pools nope: known pools"):
        flip(Context(), pools="nope", rate=0, latency_ms=5000)


def test_the_flip_mode_is_read_from_the_taint_controllers_configuration_file():
    from gpufleet_workshop.sim import incluster
    from gpufleet_workshop.sim.flip import _config_map, _flip_mode
    from roles.registry import load

    for mode in ("make_before_break", "evict_first"):
        objs = incluster.controller_objects(load("local", overrides={"taint_controller_flip_mode": mode}), ["rental"])
        assert _flip_mode(_config_map(objs)) == mode
    assert _flip_mode(None) == ""


def test_both_modes_are_refused_before_the_first_run_when_a_stack_runs_one():
    """A stack's taint controller runs one flip mode: `--mode both` says so at once, not after a first run."""
    from gpufleet_workshop.sim import incluster
    from gpufleet_workshop.sim.flip import Options, check_both
    from gpufleet_workshop.testing import FakeKube
    from roles.registry import load

    kube = FakeKube()
    objs = incluster.controller_objects(load("local", overrides={"taint_controller_flip_mode": "make_before_break"}), [])
    check_both(Options(), kube)  # nothing deployed: both runs can go
    for o in objs:
        if o["kind"] in ("Deployment", "ConfigMap") and (o["kind"] == "ConfigMap" or o["metadata"]["name"] ==
                                                          "taint-controller"):
            kube.add(o)
    with pytest.raises(ValueError, match="--mode both: --mode evict_first: the taint controller deployed in "
                                         "gpufleet-system runs flip_mode make_before_break"):
        check_both(Options(), kube)


def test_fleet_size_flags_reach_the_pools_and_the_way_backs_pace():
    from gpufleet_workshop.sim import incluster
    from gpufleet_workshop.sim.flip import Options
    from roles.registry import load

    import yaml

    opts = Options(pool_gpus=160, migration_pods_per_minute=60)
    inv = load("local", overrides=opts.overrides(load("local")))
    assert {p.capacity_gpus for p in inv.role("virtual_kubelet").virtual_kubelet_pools} == {160}
    configs = {o["metadata"]["name"]: yaml.safe_load(o["data"]["config.yaml"])
               for o in incluster.controller_objects(inv, ["other", "rental"]) if o["kind"] == "ConfigMap"}
    assert configs["vk-rental-config"]["pool"]["capacity_gpus"] == 160
    assert configs["taint-controller-config"]["flip_back_pods_per_minute"] == 60
    # Left out, the inventory's own values stay.
    assert Options().overrides(inv) == {}


def test_a_priority_class_the_api_server_refuses_to_change_is_created_again():
    """A PriorityClass's value is immutable: one an earlier run (or a test) left with another value is deleted and
    applied again; a refusal for another cause, or of another kind, stands."""
    from gpufleet.kube import KubeError
    from gpufleet_workshop.sim import incluster
    from gpufleet_workshop.testing import FakeKube

    pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "gpufleet-flip-surge"},
          "value": 100001, "preemptionPolicy": "Never"}
    kube = FakeKube({**pc, "value": 1000001})
    kube.fail("patch", "priorityclasses", KubeError(422, "Invalid", "value: Forbidden: may not be changed"))
    assert incluster.apply(kube, pc)["value"] == 100001
    assert [a.verb for a in kube.writes()] == ["patch", "delete", "patch"]
    # Refused for another cause, with the immutable fields as wanted: the class stays.
    kube.fail("patch", "priorityclasses", KubeError(422, "Invalid", "description: Too long"))
    with pytest.raises(KubeError, match="description: Too long"):
        incluster.apply(kube, pc)
    assert [a.verb for a in kube.writes()] == ["patch", "delete", "patch", "patch"]
    kube.fail("patch", "configmaps", KubeError(422, "Invalid", "data: Invalid value"))
    with pytest.raises(KubeError, match="data: Invalid value"):
        incluster.apply(kube, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "d"}})
