"""The goodput accountant's configuration: its default (written once, in the model) and its file."""

from __future__ import annotations

import pytest

from gpufleet import cli
from gpufleet.componentconfig import ConfigFileError
from gpufleet.goodput.config import DEFAULTS, Configuration, dump, load
from gpufleet.goodput.main import configuration


def test_defaults():
    assert DEFAULTS.model_dump() == {"interval_seconds": 15.0}


def test_the_file_and_the_flag_over_it(tmp_path):
    path = tmp_path / "goodput.yaml"
    path.write_text(dump(Configuration(interval_seconds=30)))
    assert load(path).interval_seconds == 30
    parse = cli.build_parser("goodput").parse_args
    assert configuration(parse(["goodput", "--config", str(path)])).interval_seconds == 30
    assert configuration(parse(["goodput", "--config", str(path), "--interval", "5"])).interval_seconds == 5
    assert configuration(parse(["goodput"])) == DEFAULTS
    path.write_text("interval_seconds: 0\n")
    with pytest.raises(ConfigFileError, match="interval_seconds: 0: expected a finite number of seconds > 0"):
        load(path)
