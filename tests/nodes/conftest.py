"""pytest-testinfra node checks: hosts, variables and per-GPU/HCA/NVLink parametrization.

Run on real nodes::

    pytest tests/nodes --connection=ansible --ansible-inventory inventories/prod/hosts.yml [--hosts=rack_a]
    pytest tests/nodes --hosts=ssh://gpu-a-001 --node-var gpu_count=8 --node-var gpu_model=H100-SXM-80GB \\
        --node-var 'node_hcas=[{name: mlx5_0, port: 1, rate_gbps: 400}]'

Expected values come from the inventory (``host.ansible.get_variables()``, as
ceph-ansible's ``tests/conftest.py`` does); without an Ansible inventory they
come from ``--node-vars-file``/``--node-var``. Tests take ``node``, ``gpu``,
``nvlink`` or ``hca_port``: this file parametrizes them per host, GPU, link
and port, so one failure is one test id (``test_gpu_temperature[gpu-a-001-gpu3]``).
``--node-report FILE`` writes one JSON record per test (host, area, outcome,
message) for ``invoke health.nodes``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import testinfra
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from nodecheck import DEFAULTS, Node, coerce, gpu_refs, nvlink_refs, port_refs, role_defaults  # noqa: E402

_NODES = pytest.StashKey[list[Node]]()
_RESULTS = pytest.StashKey[list[dict[str, Any]]]()

#: fixture name -> function expanding a node into its parameters
_EXPANSIONS = {
    "gpu": gpu_refs,
    "nvlink": nvlink_refs,
    "hca_port": port_refs,
    "node": lambda node: [node],
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpufleet node checks")
    group.addoption(
        "--node-var",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="variable for every host, value parsed as YAML; overrides the inventory (use with --hosts)",
    )
    group.addoption("--node-vars-file", metavar="FILE", help="YAML mapping of variables for every host (use with --hosts)")
    group.addoption("--node-report", metavar="FILE", help="write a JSON list of {host, area, test, outcome, message}")


def _host_name(host: Any) -> str:
    backend = host.backend
    name = getattr(backend, "host", None)
    if isinstance(name, str) and name:
        return name
    if name is not None and getattr(name, "name", None):
        return str(name.name)
    return str(backend.get_pytest_id()).replace("://", "-").strip("-") or "local"


def _cli_vars(config: pytest.Config) -> dict[str, Any]:
    values: dict[str, Any] = {}
    path = config.getoption("--node-vars-file")
    if path:
        values.update(yaml.safe_load(Path(path).read_text()) or {})
    for item in config.getoption("--node-var"):
        key, sep, value = item.partition("=")
        if not sep:
            raise pytest.UsageError(f"--node-var expects KEY=VALUE, got {item!r}")
        values[key.strip()] = coerce(value)
    return values


def resolve_nodes(config: pytest.Config) -> list[Node]:
    """The hosts under test (same resolution as testinfra's plugin), each with merged variables."""
    if _NODES in config.stash:
        return config.stash[_NODES]
    opt = config.option
    specs = opt.hosts.split(",") if opt.hosts else [None]
    hosts = testinfra.get_hosts(
        specs,
        connection=opt.connection,
        ssh_config=opt.ssh_config,
        ssh_identity_file=opt.ssh_identity_file,
        sudo=opt.sudo,
        sudo_user=opt.sudo_user,
        ansible_inventory=opt.ansible_inventory,
        force_ansible=opt.force_ansible,
    )
    base = {**DEFAULTS, **role_defaults()}
    cli = _cli_vars(config)
    nodes = []
    for host in hosts:
        inventory = dict(host.backend.get_variables()) if host.backend.NAME == "ansible" else {}
        nodes.append(Node(_host_name(host), host, {**base, **inventory, **cli}))
    nodes.sort(key=lambda n: n.name)
    config.stash[_NODES] = nodes
    return nodes


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for argname, expand in _EXPANSIONS.items():
        if argname in metafunc.fixturenames:
            params = [ref for node in resolve_nodes(metafunc.config) for ref in expand(node)]
            metafunc.parametrize(argname, params, ids=[p.name if isinstance(p, Node) else p.id for p in params])
            return


def _node_of(item: pytest.Item) -> Node | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for value in callspec.params.values():
        if isinstance(value, Node):
            return value
        if isinstance(getattr(value, "node", None), Node):
            return value.node
    return None


@pytest.fixture(scope="session", autouse=True)
def _start_nvlink_windows(request: pytest.FixtureRequest) -> None:
    """Take every node's first NVLink error reading up front, so the windows overlap."""
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        ref = callspec.params.get("nvlink") if callspec else None
        if ref is not None and item.name.startswith("test_nvlink_no_error_growth"):
            ref.node.start_nvlink_window()


_RESULT_LIST: list[dict[str, Any]] = []


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS] = _RESULT_LIST


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    node = _node_of(item)
    report.user_properties.append(("gpufleet_host", node.name if node else ""))
    report.user_properties.append(("gpufleet_area", item.path.parent.name))


def _message(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        # The check's own message, without pytest's assertion rewriting detail.
        return str(crash.message).removeprefix("AssertionError: ").removeprefix("Failed: ").split("\nassert ")[0].strip()
    return str(report.longrepr or "")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record the call phase of each test (and failed/skipped setups) for --node-report."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        props = dict(report.user_properties)
        _RESULT_LIST.append(
            {
                "host": props.get("gpufleet_host", ""),
                "area": props.get("gpufleet_area", ""),
                "test": report.nodeid.split("::", 1)[-1],
                "outcome": report.outcome,
                "message": "" if report.passed else _message(report),
            }
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--node-report")
    if path:
        Path(path).write_text(json.dumps(session.config.stash[_RESULTS], indent=1))
