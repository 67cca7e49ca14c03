"""The ``gpufleet`` controllers refuse bad flag values up front.

virtual-kubelet, taint-controller, quota-sync and node-health: argparse exits 2
naming the flag, the value and what is expected (:mod:`gpufleet.cliargs`, the
rule of the configuration field the flag sets), before the configuration file
or any cluster is read; a metrics port in use is one line, exit 1.
"""

from __future__ import annotations

import socket

import pytest

from gpufleet import cli

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--metrics-port", "70000"], "argument --metrics-port: '70000': expected a TCP port, 0 (off) to 65535"),
    (["--metrics-port", "-1"], "argument --metrics-port: '-1': expected a TCP port, 0 (off) to 65535"),
    (["--metrics-port", "http"], "argument --metrics-port: 'http': expected a TCP port"),
    (["--log-level", "chatty"], "argument --log-level: invalid choice: 'chatty'"),
    (["--workers", "0"], "argument --workers: '0': expected a whole number >= 1"),
    (["--workers", "-3"], "argument --workers: '-3': expected a whole number >= 1"),
    (["--workers", "2.5"], "argument --workers: '2.5': expected a whole number >= 1"),
    (["--register-with-taints", "gpufleet.io/x"], "argument --register-with-taints: 'gpufleet.io/x': expected "
                                                  "key[=value]:Effect"),
    (["--register-with-taints", "a:Never"], "argument --register-with-taints: 'a:Never': expected key[=value]:Effect"),
    (["--register-with-taints", "bad key:NoSchedule"], "'bad key:NoSchedule': expected key[=value]:Effect"),
])
def test_virtual_kubelet_bad_flags(argv, message, capsys):
    assert message in _usage_error(["virtual-kubelet", "--config", "vk.yaml", *argv], capsys)


@pytest.mark.parametrize("argv, message", [
    (["--metrics-port", "70000"], "argument --metrics-port: '70000': expected a TCP port, 0 (off) to 65535"),
    (["--log-level", "chatty"], "argument --log-level: invalid choice: 'chatty'"),
    (["--prometheus-url", "not-a-url"], "argument --prometheus-url: 'not-a-url': expected an http:// or https:// URL"),
    (["--prometheus-url", "ftp://prom:9090"], "argument --prometheus-url: 'ftp://prom:9090': expected an http://"),
    (["--prometheus-url", "http://"], "argument --prometheus-url: 'http://': expected an http://"),
    (["--prometheus-url", "http://prom:99999"], "argument --prometheus-url: 'http://prom:99999': expected an http://"),
    (["--hold-seconds", "-5"], "argument --hold-seconds: '-5': expected a finite number of seconds >= 0"),
    (["--hold-seconds", "nan"], "argument --hold-seconds: 'nan': expected a finite number of seconds >= 0"),
    (["--high-water", "inf"], "argument --high-water: 'inf': expected a whole number >= 0"),
    (["--low-water", "-1"], "argument --low-water: '-1': expected a whole number >= 0"),
    (["--flip-out-max-wait", "-1"], "argument --flip-out-max-wait: '-1': expected a finite number of seconds >= 0"),
    (["--pods-per-minute", "0"], "argument --pods-per-minute: '0': expected a finite number > 0"),
    (["--pods-per-minute", "nan"], "argument --pods-per-minute: 'nan': expected a finite number > 0"),
])
def test_taint_controller_bad_flags(argv, message, capsys):
    assert message in _usage_error(["taint-controller", *argv, "--kubeconfig", "/nonexistent"], capsys)


@pytest.mark.parametrize("url", ["http://prometheus.monitoring:9090", "https://prom.example/sub/path", "http://[::1]:9090"])
def test_good_prometheus_urls_pass_the_parser(url, capsys):
    # Past argparse: fails later on the missing kubeconfig (2), not on the URL.
    assert cli.main(["taint-controller", "--signal", "prometheus", "--prometheus-url", url,
                     "--kubeconfig", "/nonexistent"]) == 2
    assert "kubeconfig /nonexistent does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--port", "70000"], "argument --port: '70000': expected a TCP port, 0 (off) to 65535"),
    (["--port", "-1"], "argument --port: '-1': expected a TCP port, 0 (off) to 65535"),
    (["--resync", "0"], "argument --resync: '0': expected a finite number of seconds > 0"),
    (["--resync", "-10"], "argument --resync: '-10': expected a finite number of seconds > 0"),
    (["--resync", "inf"], "argument --resync: 'inf': expected a finite number of seconds > 0"),
    (["--debounce", "-1"], "argument --debounce: '-1': expected a finite number of seconds >= 0"),
    (["--debounce", "nan"], "argument --debounce: 'nan': expected a finite number of seconds >= 0"),
    (["--debounce", "soon"], "argument --debounce: 'soon': expected a finite number of seconds >= 0"),
    (["--log-level", "chatty"], "argument --log-level: invalid choice: 'chatty'"),
])
def test_quota_sync_bad_flags(argv, message, capsys):
    assert message in _usage_error(["quota-sync", *argv], capsys)


@pytest.mark.parametrize("argv, message", [
    (["--port", "70000"], "argument --port: '70000': expected a TCP port, 0 (off) to 65535"),
    (["--hot-samples", "-2"], "argument --hot-samples: '-2': expected a whole number >= 1"),
    (["--hot-samples", "0"], "argument --hot-samples: '0': expected a whole number >= 1"),
    (["--max-nodes-out", "-1"], "argument --max-nodes-out: '-1': expected a whole number >= 0"),
    (["--interval", "0"], "argument --interval: '0': expected a finite number of seconds > 0"),
    (["--interval", "nan"], "argument --interval: 'nan': expected a finite number of seconds > 0"),
    (["--scrape-interval", "-15"], "argument --scrape-interval: '-15': expected a finite number of seconds > 0"),
    (["--error-window", "inf"], "argument --error-window: 'inf': expected a finite number of seconds > 0"),
    (["--event-window", "0"], "argument --event-window: '0': expected a finite number of seconds > 0"),
    (["--nvlink-error-threshold", "-1"], "argument --nvlink-error-threshold: '-1': expected a whole number >= 0"),
    (["--ib-error-threshold", "1.5"], "argument --ib-error-threshold: '1.5': expected a whole number >= 0"),
    (["--drain-timeout", "-600"], "argument --drain-timeout: '-600': expected a finite number of seconds > 0"),
    (["--degraded-clear", "nan"], "argument --degraded-clear: 'nan': expected a finite number of seconds > 0"),
    (["--prometheus-url", "prometheus:9090"], "argument --prometheus-url: 'prometheus:9090': expected an http://"),
    (["--log-level", "chatty"], "argument --log-level: invalid choice: 'chatty'"),
    (["--max-unhealthy-share", "1.5"], "argument --max-unhealthy-share: '1.5': expected a share from 0 to 1"),
    (["--max-unhealthy-share", "nan"], "argument --max-unhealthy-share: 'nan': expected a share from 0 to 1"),
    (["--telemetry-stale", "0"], "argument --telemetry-stale: '0': expected a finite number of seconds > 0"),
])
def test_node_health_bad_flags(argv, message, capsys):
    assert message in _usage_error(["node-health", *argv], capsys)


def test_a_flag_is_checked_by_the_rule_of_the_field_it_sets_and_so_is_the_inventory_variable():
    """--hot-samples >= 1 and --max-nodes-out >= 0: the flag's type, the file's field and node_health_* share one rule."""
    from gpufleet import componentconfig as cc
    from gpufleet.node_health.config import Configuration
    from gpufleet.node_health.main import FIELD_FLAGS
    from roles.node_health.vars import Vars

    parser = cli.build_parser("node-health")
    sub = next(a for a in parser._actions if a.dest == "command").choices["node-health"]
    types = {a.option_strings[0]: a.type for a in sub._actions if a.option_strings}
    for flag, (_, field) in FIELD_FLAGS.items():
        if field not in ("dry_run", "namespace", "rules.node_label"):
            assert types[flag] is cc.flag_type(Configuration, field), flag
    assert cc.flag_type(Configuration, "rules.hot_samples")("1") == 1
    with pytest.raises(ValueError, match="a whole number >= 1"):
        Vars.model_validate({**{k: None for k in Vars.model_fields}, "node_health_hot_samples": 0})


@pytest.fixture
def busy_port():
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        yield busy.getsockname()[1]


CONTROLLERS = [["virtual-kubelet", "--config", "VK_CONFIG"], ["taint-controller"], ["quota-sync"], ["node-health"]]


@pytest.mark.parametrize("argv", CONTROLLERS)
def test_port_in_use_is_one_line(argv, busy_port, tmp_path, capsys):
    from gpufleet.virtual_kubelet.config import Configuration, Pool, dump

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    vk = tmp_path / "vk.yaml"
    vk.write_text(dump(Configuration(pool=Pool(name="rental", provider="simulated", gpu_model="H100-SXM-80GB",
                                               capacity_gpus=8, price_per_gpu_hour=2.0))))
    argv = [str(vk) if a == "VK_CONFIG" else a for a in argv]
    assert cli.main([*argv, "--kubeconfig", str(kubeconfig), "--metrics-port", str(busy_port)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--metrics-port: cannot listen on 0.0.0.0:{busy_port}:" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["quota-sync"], ["node-health"], ["exporter", "--no-nvml"]])
def test_old_port_flag_still_works_with_a_deprecation_note(argv, busy_port, tmp_path, capsys):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    kube = ["--kubeconfig", str(kubeconfig)] if argv[0] != "exporter" else []
    assert cli.main([*argv, *kube, "--port", str(busy_port)]) == 1  # the old flag reached the port check
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"gpufleet {argv[0]}: --port is deprecated; use --metrics-port (same meaning)"
    assert f"cannot listen on 0.0.0.0:{busy_port}" in err[1]


@pytest.mark.parametrize("argv", CONTROLLERS[1:])
def test_every_controller_shares_the_runtime_flags(argv):
    from gpufleet.controllers import flags

    args = cli.build_parser(argv[0]).parse_args([*argv, "--kubeconfig", "k", "--context", "c", "--log-level", "DEBUG",
                                                 "--metrics-port", "9", "--no-leader-elect",
                                                 "--leader-elect-lease-duration", "30"])
    assert (args.kubeconfig, args.context, args.log_level, args.metrics_port, args.leader_elect) == \
        ("k", "c", "DEBUG", 9, False)
    assert flags.timings(args).lease_duration == 30


def test_old_no_leader_election_flag_still_works(capsys):
    args = cli.build_parser("quota-sync").parse_args(["quota-sync", "--no-leader-election"])
    assert args.leader_elect is False
    assert "--no-leader-election is deprecated; use --no-leader-elect" in capsys.readouterr().err


def test_inconsistent_lease_timings_are_bad_input(tmp_path, capsys):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    assert cli.main(["quota-sync", "--kubeconfig", str(kubeconfig), "--leader-elect-lease-duration",
                     "5", "--leader-elect-renew-deadline", "10"]) == 2
    assert "expected lease duration (5 s) > renew deadline (10 s)" in capsys.readouterr().err


def test_the_inference_stand_in_left_gpufleet_with_a_note(capsys):
    from gpufleet.cli import COMMANDS, main

    assert "inference-standin" not in COMMANDS
    assert main(["inference-standin", "--port", "8000"]) == 2
    err = capsys.readouterr().err
    assert "deprecated" in err and "gpufleet-standin" in err


@pytest.mark.parametrize("command", ["taint-controller", "quota-sync", "node-health", "virtual-kubelet", "goodput"])
def test_a_bad_configuration_file_is_bad_input_naming_file_key_and_value(command, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("apiVersion: config.gpufleet.io/v1alpha1\nbogus_setting: 3\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    assert cli.main([command, "--config", str(path), "--kubeconfig", str(kubeconfig), "--metrics-port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"gpufleet {command}: " in err and f"{path}: bogus_setting: 3: expected a known field (unknown key)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["taint-controller", "quota-sync", "node-health", "virtual-kubelet"])
def test_env_still_parses_and_says_what_replaced_it(command, capsys):
    args = cli.build_parser(command).parse_args([command, "--env", "prod", "--config", "c.yaml"])
    assert not hasattr(args, "env") or args.env is None  # it does nothing
    err = capsys.readouterr().err
    assert f"gpufleet {command}: --env is deprecated and has no effect: settings come from --config FILE" in err
    assert "invoke config --env ENV --component" in err
