"""The node checks a return runs first, for real (pytest-testinfra) against fixture nodes on this machine."""

from __future__ import annotations

import pytest

from gpufleet.ops.reads import InputError
from gpufleet.ops.nodechecks import ChecksFailed, NodeChecks

from ..node_fixtures.conftest import HOSTS, build_fleet

#: Fixture nodes named as the local cluster's kwok nodes are: one healthy, one with GPU faults.
GOOD, BAD = "gpu-rack-a-0001", "gpu-rack-a-0002"


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> NodeChecks:
    inventory, _ = build_fleet(tmp_path_factory.mktemp("return-fleet"), {GOOD: HOSTS["healthy"], BAD: HOSTS["gpu-faults"]})
    return NodeChecks(inventory)


def test_a_node_whose_checks_pass_is_cleared_with_only_its_own_results(checks):
    results = checks.check(GOOD)
    assert {r.host for r in results} == {GOOD}
    assert not [r for r in results if r.outcome == "failed"]
    assert f"test_gpu_temperature[{GOOD}-gpu0]" in {r.test for r in results if r.outcome == "passed"}
    assert f"--hosts={GOOD}" in checks.command(GOOD) and f"--ansible-inventory={checks.inventory}" in checks.command(GOOD)


def test_a_node_whose_checks_fail_is_refused_naming_the_failed_test_ids(checks):
    with pytest.raises(ChecksFailed) as err:
        checks.check(BAD)
    failed = set(err.value.failed)
    assert {f"test_gpu_temperature[{BAD}-gpu1]", f"test_gpu_reachable[{BAD}-gpu3]",
            f"test_nvlink_up[{BAD}-gpu0-nvlink3]"} <= failed
    assert not any(GOOD in t for t in failed)  # limited to that host
    msg = str(err.value)
    assert f"node {BAD}: {len(failed)} node checks failed; not returned" in msg and "--skip-checks" in msg
    assert f"test_gpu_temperature[{BAD}-gpu1]: " in msg and "temperature 91 C > threshold 78 C" in msg


def test_a_node_the_inventory_does_not_list_is_refused_not_waved_through(checks):
    # testinfra collects every test with an empty parameter set (all skipped, exit 0) for an unknown host.
    run = checks.run("gpu-rack-z-0009")
    assert run.returncode == 0 and run.results and all(r.outcome == "skipped" for r in run.results)
    with pytest.raises(ChecksFailed, match=r"no node check ran on it: inventory .* lists no host 'gpu-rack-z-0009'"):
        checks.verdict("gpu-rack-z-0009", run)


def test_a_run_that_breaks_is_refused_with_pytests_error(tmp_path):
    bad = tmp_path / "hosts.yml"
    bad.write_text("all: [not, a, mapping\n")
    with pytest.raises(ChecksFailed, match=r"the node checks could not run \(pytest exited [234]"):
        NodeChecks(bad).check(GOOD)


def test_the_checks_inventory_must_exist(tmp_path):
    with pytest.raises(InputError, match=r"--env nope: no inventory file .*inventories/nope/hosts.yml"):
        NodeChecks.for_env("nope")
    with pytest.raises(InputError, match=r"--inventory .*missing.yml: no inventory file"):
        NodeChecks.for_env("local", str(tmp_path / "missing.yml"))
    assert NodeChecks.for_env("local").inventory.name == "hosts.yml"
    assert NodeChecks.for_env("local", pytest_args="-k 'not throughput'").pytest_args == ("-k", "not throughput")
