"""The testinfra node checks on fixture nodes: pass on the healthy one, fail precisely on broken ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit
from rich.console import Console

from gpufleet_workshop.tasks import health
from gpufleet_workshop.tasks.health import run_node_checks, summary_table

#: Every check that must fail on the fixture fleet: test id -> words its message must contain.
EXPECTED_FAILURES: dict[str, list[str]] = {
    # GPU faults
    "test_gpu_temperature[gpu-faults-gpu1]": ["GPU 1", "2A:00.0", "temperature 91 C > threshold 78 C"],
    "test_gpu_memory_temperature[gpu-faults-gpu0]": ["GPU 0", "memory temperature 97 C", "85 C"],
    "test_gpu_reachable[gpu-faults-gpu3]": ["GPU 3", "5D:00.0", "GPU is lost"],
    "test_gpu_no_uncorrectable_ecc[gpu-faults-gpu2]": ["GPU 2", "2 uncorrectable ECC errors"],
    "test_gpu_retired_memory[gpu-faults-gpu2]": ["GPU 2", "row remap pending", "2 rows remapped for uncorrectable errors > limit 0"],
    "test_gpu_no_recent_xid[gpu-faults-gpu2]": ["GPU 2", "XID 48"],
    "test_gpu_no_recent_xid[gpu-faults-gpu3]": ["GPU 3", "XID 79", "fallen off the bus"],
    "test_nvlink_up[gpu-faults-gpu0-nvlink3]": ["GPU 0 NVLink 3", "<inactive>"],
    "test_nvlink_no_error_growth[gpu-faults-gpu1-nvlink2]": ["GPU 1 NVLink 2", "CRC Errors +"],
    "test_nvidia_driver_version[gpu-faults]": ["550.90.07", "pinned 550.54.15"],
    # Fabric faults
    "test_port_active[fabric-faults-mlx5_0-p1]": ["mlx5_0 port 1", "'1: DOWN'"],
    "test_port_link_up[fabric-faults-mlx5_0-p1]": ["mlx5_0 port 1", "'2: Polling'"],
    "test_port_rate[fabric-faults-mlx5_1-p1]": ["mlx5_1 port 1", "200 Gb/sec", "expected 400 Gb/sec"],
    "test_port_rate[fabric-faults-mlx5_2-p1]": ["mlx5_2 port 1", "200 Gb/sec", "expected 400 Gb/sec"],
    "test_port_link_layer[fabric-faults-mlx5_2-p1]": ["mlx5_2 port 1", "'Ethernet'", "'InfiniBand'"],
    "test_fabric_manager_version[fabric-faults]": ["fabric manager 535.161.08", "pinned 550.54.15"],
    "test_checkpoint_fs_type[fabric-faults]": ["is nfs4", "expected wekafs"],
    "test_checkpoint_fs_write_throughput[fabric-faults]": ["MiB/s < floor 1e+09 MiB/s"],
    # One GPU the driver no longer lists (still on the PCI bus), checkpoint FS not mounted
    "test_gpu_count[missing-gpu]": ["lists 7 GPUs", "gpu_count is 8", "H100-SXM-80GB"],
    "test_gpu_reachable[missing-gpu-gpu7]": ["GPU 7 (0000:db:00.0)", "missing", "on the PCI bus, but the driver no longer lists it",
                                             "lists only 7"],
    "test_gpu_no_recent_xid[missing-gpu-gpu7]": ["GPU 7 (0000:db:00.0)", "XID 79", "PCI:0000:DB:00"],
    "test_checkpoint_fs_mounted[missing-gpu]": ["nothing mounted at"],
    # NVML errors other than lost: nvidia-smi exits 255; 79 C is above 78 C; fabric manager stopped; a stray XID
    "test_gpu_reachable[nvml-errors-gpu1]": ["GPU 1 (0000:2A:00.0)", "Unknown Error"],
    "test_gpu_reachable[nvml-errors-gpu2]": ["GPU 2 (00000000:3A:00.0)", "every value nvidia-smi reads is an error",
                                            "[Unknown Error]"],
    "test_gpu_temperature[nvml-errors-gpu3]": ["GPU 3", "temperature 79 C > threshold 78 C"],
    "test_fabric_manager_active[nvml-errors]": ["4 NVSwitches", "0000:05:00.0", "nvidia-fabricmanager is not active",
                                                "rc 3: failed"],
    "test_no_recent_xid_on_an_unknown_gpu[nvml-errors]": ["PCI 0000:c1:00 XID 79", "fallen off the bus"],
    # The driver is not loaded: nvidia-smi fails as a whole; one failure per GPU, with its bus id and the tool's words
    "test_gpu_count[no-driver]": ["failed (rc 9)", "couldn't communicate with the NVIDIA driver"],
    "test_gpu_reachable[no-driver-gpu0]": ["GPU 0 (0000:18:00.0)", "failed (rc 9)", "couldn't communicate with the NVIDIA driver"],
    "test_gpu_reachable[no-driver-gpu1]": ["GPU 1 (0000:2a:00.0)", "failed (rc 9)", "couldn't communicate with the NVIDIA driver"],
    "test_nvidia_driver_version[no-driver]": ["no reachable GPU", "failed (rc 9)"],
}


def by_id(run):
    return {r.test: r for r in run.results}


def test_healthy_node_passes_every_check(checks):
    healthy = [r for r in checks.results if r.host == "healthy"]
    problems = [(r.test, r.outcome, r.message) for r in healthy if r.outcome == "failed"]
    assert not problems
    # 8 GPUs x 18 NVLinks, each up and quiet, and the other per-GPU checks ran (not skipped).
    passed = {r.test for r in healthy if r.outcome == "passed"}
    assert sum(t.startswith("test_nvlink_up[healthy-") for t in passed) == 8 * 18
    assert sum(t.startswith("test_nvlink_no_error_growth[healthy-") for t in passed) == 8 * 18
    for name in ("test_gpu_temperature", "test_gpu_memory_temperature", "test_gpu_no_uncorrectable_ecc", "test_gpu_retired_memory", "test_gpu_no_recent_xid"):
        assert {f"{name}[healthy-gpu{i}]" for i in range(8)} <= passed, name
    for port in ("mlx5_0-p1", "mlx5_1-p1", "mlx5_2-p1"):
        for name in ("test_port_active", "test_port_link_up", "test_port_rate", "test_port_link_layer"):
            assert f"{name}[healthy-{port}]" in passed
    for name in ("test_gpu_count", "test_checkpoint_fs_mounted", "test_checkpoint_fs_type", "test_checkpoint_fs_writable",
                 "test_checkpoint_fs_write_throughput", "test_nvidia_driver_version", "test_fabric_manager_version"):
        assert f"{name}[healthy]" in passed


def test_application_xid_only_warns(checks):
    assert "non-fatal XID 31" in checks.output
    assert by_id(checks)["test_gpu_no_recent_xid[healthy-gpu0]"].outcome == "passed"


def test_each_area_is_reported(checks):
    assert {r.area for r in checks.results} == {"gpu", "fabric", "storage", "software"}
    assert {r.host for r in checks.results} == {"healthy", "gpu-faults", "fabric-faults", "missing-gpu", "nvml-errors",
                                                "no-driver", "pcie"}


def test_at_the_threshold_is_not_above_it(checks):
    """78 C with a 78 C threshold passes (the alert is ``> 78``, node health counts samples ``> 78``)."""
    assert by_id(checks)["test_gpu_temperature[nvml-errors-gpu0]"].outcome == "passed"


def test_fabric_manager_required_on_nvswitch_systems_only(checks):
    results = by_id(checks)
    assert results["test_fabric_manager_active[healthy]"].outcome == "passed"
    pcie = results["test_fabric_manager_active[pcie]"]
    assert pcie.outcome == "skipped" and "no NVSwitch on the PCI bus" in pcie.message
    assert results["test_fabric_manager_version[pcie]"].outcome == "skipped"
    assert not [r for r in checks.results if r.host == "pcie" and r.outcome == "failed"]


def test_no_check_crashes_on_a_failing_tool(checks):
    """Any nvidia-smi exit code gives named failures, never an error (traceback) in a check."""
    assert not [r for r in checks.results if r.outcome == "error"]
    assert "Traceback" not in checks.output and "RuntimeError" not in checks.output


@pytest.mark.parametrize("test_id", sorted(EXPECTED_FAILURES))
def test_broken_node_fails_with_a_precise_message(checks, test_id):
    result = by_id(checks).get(test_id)
    assert result is not None, f"{test_id} did not run"
    assert result.outcome == "failed", f"{test_id}: {result.outcome} {result.message}"
    host = test_id.split("[", 1)[1].split("-gpu")[0].split("-mlx")[0].rstrip("]")
    assert result.message.startswith(host), result.message
    for word in EXPECTED_FAILURES[test_id]:
        assert word in result.message, f"{test_id}: {word!r} not in {result.message!r}"


def test_nothing_else_fails(checks):
    assert {r.test for r in checks.failed} == set(EXPECTED_FAILURES)


def test_unreachable_gpus_skip_their_detail_checks_with_a_pointer(checks):
    results = by_id(checks)
    for test_id in ("test_gpu_temperature[gpu-faults-gpu3]", "test_nvlink_up[gpu-faults-gpu3-nvlink0]", "test_gpu_temperature[missing-gpu-gpu7]"):
        assert results[test_id].outcome == "skipped"
        assert "see test_gpu_reachable" in results[test_id].message
    na = results["test_gpu_memory_temperature[gpu-faults-gpu2]"]
    assert na.outcome == "skipped" and "[N/A]" in na.message


def test_summary_table_has_a_row_per_host_and_area(checks):
    console = Console(record=True, width=200)
    console.print(summary_table(checks, "fixture fleet"))
    text = console.export_text()
    for host in ("healthy", "gpu-faults", "fabric-faults", "missing-gpu"):
        assert host in text
    assert "temperature 91 C > threshold 78 C" in text


def test_limit_and_pytest_args_select_hosts_and_checks(fleet):
    run = run_node_checks(fleet[0], limit="gpu-faults", pytest_args=["-k", "driver_version or manager_version"], timeout=120)
    assert {r.host for r in run.results} == {"gpu-faults"}
    assert {r.test for r in run.results} == {"test_nvidia_driver_version[gpu-faults]", "test_fabric_manager_version[gpu-faults]"}


def test_invoke_task_prints_summary_and_exits_nonzero_on_failures(fleet, checks, monkeypatch, tmp_path, capsys):
    """The task resolves inventories/ENV/hosts.yml, passes --limit/pytest args on, prints, sets the exit code.

    (The subprocess it starts is the session's ``checks`` run, exercised above.)
    """
    envs = tmp_path / "inventories"
    (envs / "fixtures").mkdir(parents=True)
    (envs / "fixtures" / "hosts.yml").write_text(Path(fleet[0]).read_text())
    monkeypatch.setattr(health, "INVENTORIES", envs)
    calls = []

    def fake_run(inventory, limit=None, pytest_args=()):
        calls.append((Path(inventory), limit, list(pytest_args)))
        results = [r for r in checks.results if limit is None or r.host == limit]
        return health.NodeCheckRun(returncode=1 if any(r.outcome == "failed" for r in results) else 0, results=results)

    monkeypatch.setattr(health, "run_node_checks", fake_run)
    with pytest.raises(Exit) as failed:
        health.nodes(Context(), env="fixtures", limit="fabric-faults", pytest_args="-k 'port_rate or fs_type'")
    assert failed.value.code == 1
    assert calls[-1] == (envs / "fixtures" / "hosts.yml", "fabric-faults", ["-k", "port_rate or fs_type"])
    out = capsys.readouterr().out
    assert "health.nodes --env fixtures --limit fabric-faults" in out
    assert "fabric-faults" in out and "8 failed" in out
    health.nodes(Context(), env="fixtures", limit="healthy")  # all pass: no Exit
    with pytest.raises(Exit) as missing:
        health.nodes(Context(), env="nowhere")
    assert missing.value.code == 2


def test_simulated_fleet_is_refused_with_where_to_run_instead(capsys):
    with pytest.raises(Exit) as refused:
        health.nodes(Context(), env="local")
    assert refused.value.code == 2
    assert "inventories/local/hosts.yml lists no hosts to connect to" in refused.value.message
    assert "--hosts=local://" in refused.value.message


def test_an_inventory_that_is_not_yaml_is_refused(monkeypatch, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "hosts.yml").write_text("all: [\n")
    monkeypatch.setattr(health, "INVENTORIES", tmp_path)
    with pytest.raises(Exit) as refused:
        health.nodes(Context(), env="broken")
    assert refused.value.code == 2 and "hosts.yml: not valid YAML" in refused.value.message


def test_hosts_mode_takes_expectations_from_options(fleet):
    """Without an Ansible inventory (``--hosts``), --node-var supplies what the inventory would."""
    paths = fleet[1]["healthy"]
    nodes_dir = Path(__file__).parents[1] / "nodes"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(nodes_dir / "fabric"), str(nodes_dir / "software"), "--hosts=local://",
         "-p", "no:cacheprovider", "-q", "-o", "addopts=",
         f"--node-var=node_sysfs_root={paths.sysfs_root}",
         f"--node-var=node_nvidia_smi={paths.nvidia_smi}",
         f"--node-var=node_nv_fabricmanager={paths.nv_fabricmanager}",
         f"--node-var=node_systemctl={paths.systemctl}",
         "--node-var=nvidia_driver_version='550.54.15'",
         "--node-var=nvidia_fabric_manager_version='550.54.15'",
         "--node-var=node_hcas=[{name: mlx5_0, port: 1, rate_gbps: 400}, {name: mlx5_2, port: 1, rate_gbps: 200, link_layer: Ethernet}]"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "11 passed" in result.stdout
    assert "test_port_rate[local-mlx5_2-p1]" not in result.stdout  # ids carry the host: passing ids are not listed in -q
