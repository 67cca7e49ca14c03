"""Bad inputs fail before anything is rendered or submitted, naming the flag, the value and what was expected."""

from __future__ import annotations

import pytest

from gpufleet_admin.training.render import TrainingInputError, build_context


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"nodes": 17}, "--nodes 17: expected at most 16 (nodes of flavor h100-sxm-80gb in inventories/local)"),
        ({"nodes": 0}, "--nodes 0 (or not given): expected an integer >= 1"),
        ({"queue": "team-x/nope"},
         "--queue 'team-x/nope': expected a LocalQueue of inventories/local: team-pretrain/pretrain, team-research/research"),
        ({"queue": "pretrain"}, "--queue 'pretrain': expected namespace/name"),
        ({"template": "mpijob"}, "--template 'mpijob': expected one of jobset, pytorchjob, job"),
        ({"gpus_per_node": 4},
         "--gpus-per-node 4: expected 8 (GPUs per node of flavor h100-sxm-80gb): training jobs take whole nodes"),
        ({"flavor": "b200"}, "--flavor 'b200': expected one of h100-sxm-80gb"),
        ({"name": "My_Job"}, "--name 'My_Job': expected a DNS label (RFC 1035)"),
        ({"name": "1job"}, "--name '1job': expected a DNS label (RFC 1035)"),
        ({"name": ""}, "--name: required"),
        ({"sets": ["image"]}, "--set 'image': expected key=value"),
        ({"sets": ["=3"]}, "--set '=3': expected key=value"),
        ({"sets": ["gpus=8"]}, "--set 'gpus=8': unknown key 'gpus': expected one of"),
        ({"sets": ["checkpoint_interval_seconds=0"]}, "--set checkpoint_interval_seconds=0: expected an integer > 0"),
        ({"sets": ["checkpoint_interval_seconds=ten"]}, "--set checkpoint_interval_seconds=ten: expected an integer > 0"),
        ({"sets": ["priority_class=urgent"]},
         "--set priority_class=urgent: expected a WorkloadPriorityClass of the inventory"),
        ({"sets": ["memory=2TB"]}, "--set memory=2TB: expected a Kubernetes quantity"),
        ({"sets": ["master_port=70000"]}, "--set master_port=70000: expected a port number 1..65535"),
    ],
)
def test_bad_input(inventory, kwargs, expected):
    args = {"template": "jobset", "name": "run1", "nodes": 2} | kwargs
    with pytest.raises(TrainingInputError) as err:
        build_context(inventory("local"), args.pop("template"), args.pop("name"), args.pop("nodes"), **args)
    assert any(p.startswith(expected) for p in err.value.problems), err.value.problems


def test_name_must_leave_room_for_pod_hostnames(inventory):
    # JobSet pod hostnames are <name>-workers-0-<index>: 63 - len("-workers-0-15") = 50 characters.
    build_context(inventory("local"), "jobset", "a" * 50, 16)
    with pytest.raises(TrainingInputError, match=r"at most 50 characters .*'<name>-workers-0-15'"):
        build_context(inventory("local"), "jobset", "a" * 51, 16)


def test_every_problem_is_reported_at_once(inventory):
    with pytest.raises(TrainingInputError) as err:
        build_context(inventory("prod"), "jobset", "Bad", 129, gpus_per_node=2, sets=["x"])
    flags = [p.split()[0] for p in err.value.problems]
    assert flags == ["--set", "--gpus-per-node", "--nodes", "--name"]


def test_staging_flavors_have_their_own_hcas_and_sizes(inventory):
    inv = inventory("staging")
    assert build_context(inv, "jobset", "a", 2, flavor="a100-sxm-80gb")["nccl_env"]["NCCL_IB_HCA"] == "=mlx5_0:1"
    with pytest.raises(TrainingInputError, match="--nodes 3: expected at most 2"):
        build_context(inv, "jobset", "a", 3, flavor="h100-sxm-80gb")
