"""The ``gpufleet`` entry point and the exporter's HTTP serving."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from gpufleet import cli
from gpufleet.exporter.nvml_fake import FakeNvmlBackend
from gpufleet_workshop.fixtures.node import healthy_node, write_node
from gpufleet.controllers.serve import serve
from gpufleet.exporter.main import build_registry
from gpufleet.prom.server import free_port


def test_help_lists_exporter_and_only_imports_the_chosen_command(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    assert "exporter" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["exporter", "--help"])
    out = capsys.readouterr().out
    for flag in ("--listen-address", "--metrics-port", "--sysfs-root", "--nvml-fake", "--once"):
        assert flag in out


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["no-such-command"])
    assert done.value.code == 2


def test_console_script_runs_once(tmp_path):
    paths = write_node(healthy_node(gpus=1, hcas=1, nvlinks=2, roce=False), tmp_path / "n")
    exe = [sys.executable, "-c", "import sys; from gpufleet.cli import main; sys.exit(main())"]
    result = subprocess.run([*exe, "exporter", "--once", "--sysfs-root", str(paths.sysfs_root), "--nvml-fake", str(paths.description)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert 'gpufleet_infiniband_port_state_id{hca="mlx5_0",link_layer="InfiniBand",port="1"} 4.0' in result.stdout
    assert "gpufleet_gpu_nvml_available 1.0" in result.stdout


def test_serve_answers_plain_and_gzip(tmp_path):
    paths = write_node(healthy_node(gpus=1, hcas=1, nvlinks=2, roce=False), tmp_path / "n")
    registry = build_registry(str(paths.sysfs_root), FakeNvmlBackend(paths.description), self_metrics=True)
    port = free_port()
    httpd = serve(registry, port=port, host="127.0.0.1")
    try:
        plain = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "identity"})
        assert plain.status_code == 200 and "gpufleet_gpu_temperature_celsius" in plain.text
        assert "process_resident_memory_bytes" in plain.text  # self metrics when serving
        assert "gpufleet_exporter_collector_duration_seconds" in plain.text
        raw = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
        assert raw.headers.get("content-encoding") == "gzip"
        assert "gpufleet_infiniband_port_state_id" in raw.text  # httpx decodes
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("argv, code, message", [
    (["--sysfs-root", "/nonexistent", "--no-nvml", "--once"], 2, "--sysfs-root /nonexistent: expected a folder"),
    (["--nvml-fake", "/nonexistent.json", "--once"], 2, "--nvml-fake /nonexistent.json: [Errno 2]"),
    (["--metrics-port", "99999", "--no-nvml"], 2, "argument --metrics-port: '99999': expected a TCP port, 1 to 65535"),
    (["--port", "99999", "--no-nvml"], 2, "argument --port: '99999': expected a TCP port, 1 to 65535"),
])
def test_bad_flags_exit_with_the_flag_and_value(argv, code, message, capsys):
    try:
        got = cli.main(["exporter", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        got = exc.code
    assert got == code and message in capsys.readouterr().err


def test_a_port_in_use_is_reported_not_raised(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["exporter", "--no-nvml", "--listen-address", "127.0.0.1", "--metrics-port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
