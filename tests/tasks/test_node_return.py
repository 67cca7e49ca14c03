"""``invoke node.return``'s node checks: which inventory they use, and the refusals before anything is read."""

from __future__ import annotations

import pytest

from gpufleet.ops.reads import InputError
from gpufleet_workshop.tasks.node import return_node


def test_a_return_with_checks_needs_an_environment_or_an_inventory():
    with pytest.raises(InputError, match=r"--env is needed: the node checks run with inventories/ENV/hosts.yml.*"
                                         r"--inventory FILE.*--skip-checks"):
        return_node("gpu-rack-a-0001")


def test_without_env_inventory_or_skip_checks_the_task_exits_2(invoke_cli):
    from gpufleet_workshop.tasks.node import node

    code, _, err = invoke_cli(node)("node.return", "gpu-rack-a-0001")
    assert code == 2 and "node.return: --env is needed" in err


def test_an_unknown_checks_inventory_is_bad_input(tmp_path):
    with pytest.raises(InputError, match=r"--inventory .*nowhere.yml: no inventory file"):
        return_node("gpu-rack-a-0001", checks_inventory=str(tmp_path / "nowhere.yml"))


def test_the_task_offers_skip_checks_env_and_inventory_and_keeps_its_flags(invoke_cli):
    from gpufleet_workshop.tasks.node import node

    code, out, _ = invoke_cli(node)("--help", "node.return")
    assert code == 0
    for flag in ("--skip-checks", "-e STRING, --env=STRING", "-i STRING, --inventory=STRING",
                 "-k STRING, --kubeconfig=STRING", "-a STRING, --namespace=STRING", "-d, --dry-run", "-c, --clear-lemon"):
        assert flag in out, flag
