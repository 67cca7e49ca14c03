"""The shared flag checks of :mod:`gpufleet.cliargs` (the exporter's port check, generalised)."""

from __future__ import annotations

import argparse
import socket

import pytest

from gpufleet import cliargs


@pytest.mark.parametrize("kind, good, bad", [
    (cliargs.port, ["1", "65535"], ["0", "65536", "-1", "x", ""]),
    (cliargs.port_or_off, ["0", "8080"], ["65536", "-1", "1.5"]),
    (cliargs.integer_type(1), ["1", "8"], ["0", "-1", "nan", "2.0"]),
    (cliargs.positive_seconds, ["0.5", "30", "1e3"], ["0", "-1", "nan", "inf", "-inf", "1e400", "x"]),
    (cliargs.nonnegative_seconds, ["0", "2.5"], ["-0.1", "nan", "inf"]),
    (cliargs.http_url, ["http://p:9090", "https://p/x", "http://[::1]"],
     ["p:9090", "http://", "ftp://p", "http://p:0x", " http://p", "http://p q"]),
])
def test_types_accept_and_refuse(kind, good, bad):
    for text in good:
        kind(text)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            kind(text)


def test_the_message_names_the_flag_value_and_expectation(capsys):
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--resync", type=cliargs.positive_seconds)
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--resync", "nan"])
    assert done.value.code == 2
    assert "argument --resync: 'nan': expected a finite number of seconds > 0" in capsys.readouterr().err


def test_check_applies_a_type_to_inventory_values():
    assert cliargs.check("--hold-seconds", cliargs.nonnegative_seconds, 0) == 0.0
    with pytest.raises(ValueError, match=r"--hold-seconds '-5': expected a finite number of seconds >= 0"):
        cliargs.check("--hold-seconds", cliargs.nonnegative_seconds, -5)
    with pytest.raises(ValueError, match="--prometheus-url 'x': expected an http"):
        cliargs.check("--prometheus-url", cliargs.http_url, "x")


def test_listen_error():
    assert cliargs.listen_error(0) is None
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cliargs.listen_error(port, "127.0.0.1").startswith(f"cannot listen on 127.0.0.1:{port}: ")
    assert cliargs.listen_error(port, "127.0.0.1") is None
