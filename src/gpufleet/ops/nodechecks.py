"""The testinfra node checks (``tests/nodes``) run from gpufleet: for ``invoke health.nodes`` and before a node returns.

The checks are pytest-testinfra tests; this module runs them in a pytest
subprocess with Ansible's connection on an inventory
(``--connection=ansible --ansible-inventory=<hosts.yml>``), optionally
limited to hosts (testinfra's ``--hosts``), and reads their
``--node-report`` JSON: one :class:`CheckResult` per test id.

:class:`NodeChecks` is the gate a return goes through
(:func:`gpufleet.ops.swap.return_node`): the checks of one host, and
:meth:`NodeChecks.verdict` turns a run into "passed" or
:class:`ChecksFailed` naming the failed test ids. What the checks connect
to is the inventory's business: real nodes over SSH (``ansible_host``,
``ansible_user``), or, where a node is a simulation (the local cluster's
kwok nodes), a fixture node on this machine (``ansible_connection:
local`` and the ``node_*`` path variables pointing at its sysfs tree and
tool stand-ins, :mod:`gpufleet_workshop.fixtures.node`). pytest-testinfra and
ansible-core must be installed where the checks run (the ``tools``
extra; gpufleet's image does not carry them).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.ops.reads import OpsError
from gpufleet.paths import INVENTORIES, REPO_ROOT

#: The node checks folder (a product: users run it on real nodes too).
NODE_CHECKS = REPO_ROOT / "tests" / "nodes"
#: Seconds a return waits for the node checks of one host (8 GPUs x 18 NVLinks, a 256 MiB write probe).
RETURN_CHECKS_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class CheckResult:
    """One node check outcome.

    Attributes:
        host: inventory host name.
        area: ``gpu``, ``fabric``, ``storage`` or ``software`` (the tests/nodes folder).
        test: test id, e.g. ``test_gpu_temperature[gpu-a-001-gpu3]``.
        outcome: ``passed``, ``failed`` or ``skipped``.
        message: the check's message for failures and skips (names GPU/HCA/port and value).
    """

    host: str
    area: str
    test: str
    outcome: str
    message: str = ""


@dataclass
class NodeCheckRun:
    """A finished run of the node checks.

    Attributes:
        returncode: pytest's exit code (0 all passed, 1 failures, 2-4 usage/collection problems, 5 no test ran).
        results: one :class:`CheckResult` per test.
        command: the pytest command line.
        output: pytest's combined stdout/stderr (for diagnosing rc >= 2).
    """

    returncode: int
    results: list[CheckResult] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def failed(self) -> list[CheckResult]:
        """The failed checks."""
        return [r for r in self.results if r.outcome == "failed"]


def check_command(inventory: str | os.PathLike[str], report: str | os.PathLike[str], limit: str | None = None,
                  pytest_args: Sequence[str] = (), node_checks: str | os.PathLike[str] = NODE_CHECKS) -> list[str]:
    """The pytest command line that runs ``node_checks`` on ``inventory``'s hosts (``limit``: testinfra's ``--hosts``)."""
    command = [sys.executable, "-m", "pytest", str(node_checks), "--connection=ansible",
               f"--ansible-inventory={inventory}", f"--node-report={report}", "-p", "no:cacheprovider", "-q",
               "--no-header"]
    if limit:
        command.append(f"--hosts={limit}")
    return command + list(pytest_args)


def run_node_checks(
    inventory: str | os.PathLike[str],
    limit: str | None = None,
    pytest_args: Sequence[str] = (),
    node_checks: str | os.PathLike[str] = NODE_CHECKS,
    timeout: float | None = None,
) -> NodeCheckRun:
    """Run ``tests/nodes`` against every host of ``inventory`` (or those matching ``limit``).

    Args:
        inventory: Ansible inventory file (``inventories/<env>/hosts.yml``).
        limit: host or group pattern, passed to testinfra as ``--hosts``.
        pytest_args: extra pytest arguments (e.g. ``-k temperature``).
        node_checks: the node checks folder.
        timeout: seconds before the run is killed (``None``: no limit).

    Returns:
        A :class:`NodeCheckRun`; never raises for failing checks.

    Raises:
        subprocess.TimeoutExpired: when ``timeout`` passes.
    """
    with tempfile.TemporaryDirectory(prefix="gpufleet-health-") as tmp:
        report = Path(tmp) / "report.json"
        command = check_command(inventory, report, limit, pytest_args, node_checks)
        env = dict(os.environ)
        # testinfra calls `ansible-inventory`: use the one installed beside this interpreter.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        results = []
        if report.exists():
            results = [CheckResult(**r) for r in json.loads(report.read_text())]
    return NodeCheckRun(returncode=proc.returncode, results=results, command=command, output=proc.stdout + proc.stderr)


class ChecksFailed(OpsError):
    """The node checks of a node about to return failed, or could not run; nothing was changed.

    Attributes:
        node: the node.
        failed: the failed test ids (empty when the run itself broke or ran no check).
        run: the run (None when it timed out).
    """

    def __init__(self, message: str, node: str, failed: Sequence[str] = (), run: NodeCheckRun | None = None):
        super().__init__(message)
        self.node, self.failed, self.run = node, list(failed), run


@dataclass(frozen=True)
class NodeChecks:
    """The node checks a return runs first: ``tests/nodes`` on one host of an Ansible inventory.

    Attributes:
        inventory: the Ansible inventory the checks connect with and read expected values from
            (``inventories/<env>/hosts.yml``; for simulated nodes, one listing fixture nodes).
        pytest_args: extra pytest arguments (e.g. ``("-k", "not throughput")``).
        timeout_seconds: seconds the run may take (:data:`RETURN_CHECKS_TIMEOUT_SECONDS`).
        node_checks: the node checks folder.
    """

    inventory: Path
    pytest_args: tuple[str, ...] = ()
    timeout_seconds: float = RETURN_CHECKS_TIMEOUT_SECONDS
    node_checks: Path = NODE_CHECKS

    @classmethod
    def for_env(cls, env: str, inventory: str | None = None, pytest_args: str = "",
                timeout_seconds: float = RETURN_CHECKS_TIMEOUT_SECONDS) -> NodeChecks:
        """The checks of ``env`` (``inventories/<env>/hosts.yml``, or ``inventory`` when given).

        Args:
            env: a folder of ``inventories/``.
            inventory: another Ansible inventory file (``node.return --inventory``).
            pytest_args: extra pytest arguments as one shell-quoted string.

        Raises:
            gpufleet.ops.reads.InputError: the inventory file does not exist, or ``pytest_args`` does not parse.
        """
        from gpufleet.ops.reads import InputError

        path = Path(inventory) if inventory else INVENTORIES / env / "hosts.yml"
        if not path.is_file():
            flag = f"--inventory {inventory}" if inventory else f"--env {env}"
            raise InputError(f"{flag}: no inventory file {path} for the node checks")
        try:
            args = tuple(shlex.split(pytest_args))
        except ValueError as exc:
            raise InputError(f"node checks arguments {pytest_args!r}: {exc}") from None
        if timeout_seconds <= 0:
            raise InputError(f"node checks timeout {timeout_seconds:g}: expected seconds > 0")
        return cls(path.resolve(), args, timeout_seconds)

    def command(self, node: str) -> str:
        """The command line that checks ``node`` (for dry runs and messages)."""
        return shlex.join(check_command(self.inventory, "REPORT.json", node, self.pytest_args, self.node_checks))

    def run(self, node: str) -> NodeCheckRun:
        """Run the checks of ``node`` (testinfra ``--hosts=<node>``).

        Raises:
            ChecksFailed: the run took longer than ``timeout_seconds``.
        """
        try:
            return run_node_checks(self.inventory, limit=node, pytest_args=self.pytest_args,
                                   node_checks=self.node_checks, timeout=self.timeout_seconds)
        except subprocess.TimeoutExpired:
            raise ChecksFailed(f"node {node}: the node checks did not finish within {self.timeout_seconds:g}s "
                               f"({self.command(node)}); not returned", node) from None

    def verdict(self, node: str, run: NodeCheckRun) -> list[CheckResult]:
        """The results of ``node``'s checks, when none failed and at least one passed.

        Only results whose host is ``node`` count: testinfra given a host the
        inventory does not list collects every test with an empty parameter
        set (all skipped), which is no evidence about the node.

        Raises:
            ChecksFailed: a check failed (message: the failed test ids and their messages), the run
                broke (pytest exit 2-4: its ``E`` lines), or no check of ``node`` passed (the
                inventory does not list it, or the arguments selected none).
        """
        mine = [r for r in run.results if r.host == node]
        failed = [r for r in mine if r.outcome == "failed"]
        if failed:
            shown = "\n  ".join(f"{r.test}: {r.message}" if r.message else r.test for r in failed[:20])
            more = f"\n  (+{len(failed) - 20} more)" if len(failed) > 20 else ""
            raise ChecksFailed(f"node {node}: {len(failed)} node checks failed; not returned (fix the node, or pass "
                               f"--skip-checks to return it anyway):\n  {shown}{more}", node,
                               [r.test for r in failed], run)
        if run.returncode not in (0, 1, 5):
            errors = [line[1:].strip() for line in run.output.splitlines() if line.startswith("E ")]
            tail = "; ".join(errors[-5:]) if errors else " ".join(run.output.split())[-1500:]
            raise ChecksFailed(f"node {node}: the node checks could not run (pytest exited {run.returncode}: "
                               f"{shlex.join(run.command)}): {tail}; not returned", node, run=run)
        if not any(r.outcome == "passed" for r in mine):
            raise ChecksFailed(f"node {node}: no node check ran on it: inventory {self.inventory} lists no host "
                               f"{node!r} (or the checks selected none of its tests); not returned. Pass --inventory "
                               f"with an inventory that lists it, or --skip-checks", node, run=run)
        return mine

    def check(self, node: str) -> list[CheckResult]:
        """:meth:`run` then :meth:`verdict`: the results when the node passed.

        Raises:
            ChecksFailed: see :meth:`run` and :meth:`verdict`.
        """
        return self.verdict(node, self.run(node))
