"""API times: the one parser (RFC 3339 with ``Z``, offsets and fractions) and its one error behaviour; Go durations."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest

from gpufleet.kube.times import now_micro, now_rfc3339, parse_duration, parse_time

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("text, seconds", [
    ("2026-01-02T03:04:05Z", T0),  # metav1.Time
    ("2026-01-02T03:04:05.123456Z", T0 + 0.123456),  # MicroTime
    ("2026-01-02T03:04:05.5Z", T0 + 0.5),
    ("2026-01-02T03:04:05.123456789Z", T0 + 0.123456789),  # RFC3339Nano
    ("2026-01-02T05:04:05+02:00", T0),
    ("2026-01-01T22:04:05-05:00", T0),
    ("2026-01-02t03:04:05z", T0),
], ids=["Time", "MicroTime", "tenths", "nano", "east", "west", "lower-case"])
def test_api_times_parse_to_epoch_seconds(text, seconds):
    assert parse_time(text) == pytest.approx(seconds, abs=1e-6)


@pytest.mark.parametrize("text", [None, ""])
def test_an_absent_time_is_none(text):
    assert parse_time(text) is None


@pytest.mark.parametrize("text", ["yesterday", "2026-01-02T03:04:05", "2026-01-02", "2026-13-02T03:04:05Z",
                                  "2026-02-30T03:04:05Z", "2026-01-02T03:04:05Z trailing", 1767323045])
def test_anything_else_is_refused_quoting_the_value(text):
    with pytest.raises(ValueError, match=r"is not an RFC 3339 time") as info:
        parse_time(text)
    assert repr(text) in str(info.value)


def test_what_we_write_reads_back():
    assert abs(parse_time(now_rfc3339()) - datetime.now(timezone.utc).timestamp()) < 2
    assert abs(parse_time(now_micro()) - datetime.now(timezone.utc).timestamp()) < 2


def test_a_recorded_time_people_may_edit_is_logged_and_read_as_absent(caplog):
    from gpufleet.fleet.nodes import recorded_time

    assert recorded_time("2026-01-02T03:04:05Z", "node n1 annotation x") == T0
    with caplog.at_level(logging.WARNING):
        assert recorded_time("soon", "node n1 annotation x") is None
    assert "node n1 annotation x: 'soon' is not an RFC 3339 time" in caplog.text


@pytest.mark.parametrize("value, seconds", [
    ("15s", 15.0), ("15.043s", 15.043), ("1m0.5s", 60.5), ("250ms", 0.25), ("1h2m3s", 3723.0), ("-2h", -7200.0),
    ("0", 0.0), ("0s", 0.0), ("1.5µs", 1.5e-6), ("3us", 3e-6), ("7ns", 7e-9), (".5s", 0.5), ("+1m", 60.0)])
def test_go_durations_are_read_as_go_reads_them(value, seconds):
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "15", "s", "1x", "1m 2s", "1s2", "--1s", "1.2.3s", None])
def test_what_is_not_a_go_duration_is_refused_naming_the_value(value):
    with pytest.raises(ValueError, match="is not a Go duration"):
        parse_duration(value)
