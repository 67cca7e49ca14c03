"""The taint controller's transition log line, read back as the flip simulation reads an in-cluster controller's log."""

from __future__ import annotations

import datetime as dt
import logging

from gpufleet.controllers.runtime import LOG_FORMAT
from gpufleet.taint_controller.controller import TRANSITION_LOG
from gpufleet_workshop.sim.incluster import transitions


def _line(when: dt.datetime, *args) -> str:
    record = logging.LogRecord("gpufleet.taint_controller.controller", logging.INFO, __file__, 1, TRANSITION_LOG, args, None)
    record.created = when.timestamp()
    record.msecs = when.microsecond // 1000
    formatter = logging.Formatter(LOG_FORMAT)
    formatter.converter = lambda secs: dt.datetime.fromtimestamp(secs, dt.timezone.utc).timetuple()  # pods log in UTC
    return formatter.format(record)


def test_transitions_come_back_from_the_log_in_order_and_after_since():
    t0 = dt.datetime(2026, 12, 1, 18, 0, 0, tzinfo=dt.timezone.utc)
    old = _line(t0 - dt.timedelta(seconds=30), "untainted", 5.0, 40, "an earlier run")
    on = _line(t0 + dt.timedelta(seconds=12.5), "tainted", 5.04, 66, "124 free GPUs > high-water 8 for 5.0s")
    off = _line(t0 + dt.timedelta(seconds=2), "untainted", 5.1, 18, "0 free GPUs < low-water 4 for 5.0s")
    text = "\n".join([old, "2026-12-01 18:00:01,000 INFO gpufleet.taint_controller.flipout: flip-out: evicted x", on])
    got = transitions([text, off], t0.timestamp(), since=t0.timestamp() - 10)
    assert [(t.at, t.tainted, t.reaction_seconds, t.latency_seconds, t.reason) for t in got] == [
        (2.0, False, 5.1, 0.018, "0 free GPUs < low-water 4 for 5.0s"),
        (12.5, True, 5.04, 0.066, "124 free GPUs > high-water 8 for 5.0s")]
    assert len(transitions([text], t0.timestamp())) == 2  # without since: the earlier run's too
