"""The one poll helper (:func:`gpufleet.wait.poll_until`): returns the first truthy answer, names what it awaited on
timeout, honours ``immediate``, ``ignore`` and a stop event."""

from __future__ import annotations

import threading

import pytest

from gpufleet.kube import NotFound
from gpufleet.wait import PollStopped, PollTimeout, poll_until


def counter(answers):
    calls = []

    def condition():
        calls.append(1)
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return condition, calls


def test_returns_the_first_truthy_answer():
    cond, calls = counter([None, 0, {"ready": True}])
    assert poll_until(cond, what="x", timeout=5, interval=0.001) == {"ready": True}
    assert len(calls) == 3


def test_immediate_checks_before_sleeping_and_not_immediate_sleeps_first():
    cond, calls = counter([True])
    assert poll_until(cond, what="x", timeout=5, interval=0.001) is True and len(calls) == 1
    ticks = iter([0.0, 0.0, 0.5, 1.0])
    cond, calls = counter([True])
    poll_until(cond, what="x", timeout=5, interval=0.001, immediate=False, clock=lambda: next(ticks))
    assert len(calls) == 1


def test_timeout_names_what_was_awaited_and_the_last_answer():
    cond, calls = counter([[], "", 0])
    with pytest.raises(PollTimeout, match=r"timed out after 0.05s waiting for pod x Ready; last answer: 0") as exc:
        poll_until(cond, what="pod x Ready", timeout=0.05, interval=0.01, detail=lambda: "log tail")
    assert isinstance(exc.value, TimeoutError) and exc.value.what == "pod x Ready"
    assert str(exc.value).endswith("\nlog tail")
    assert len(calls) >= 2, "checked again at the deadline"


def test_ignored_errors_count_as_not_yet_and_are_reported_others_propagate():
    cond, _ = counter([NotFound(404, "NotFound", "gone"), True])
    assert poll_until(cond, what="x", timeout=5, interval=0.001, ignore=(NotFound,)) is True
    cond, _ = counter([NotFound(404, "NotFound", "gone")])
    with pytest.raises(PollTimeout, match="last error: 404 NotFound: gone"):
        poll_until(cond, what="x", timeout=0.02, interval=0.005, ignore=(NotFound,))
    cond, calls = counter([ValueError("bad")])
    with pytest.raises(ValueError, match="bad"):
        poll_until(cond, what="x", timeout=5, interval=0.001, ignore=(NotFound,))
    assert len(calls) == 1


def test_a_stop_event_ends_the_wait_at_once():
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    with pytest.raises(PollStopped, match="stopped while waiting for the lease"):
        poll_until(lambda: False, what="the lease", timeout=30, interval=10, stop=stop)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="interval 0 > 0"):
        poll_until(lambda: True, what="x", timeout=1, interval=0)
    with pytest.raises(ValueError, match="timeout -1 must be >= 0"):
        poll_until(lambda: True, what="x", timeout=-1)


# ------------------------------------------------------------------ one owner of "wait for a condition"

#: Loops that sleep against a deadline and are not waits for a condition, by ``path::function``: the drain's
#: eviction state machine (per-pod backoffs), training submit's progress display over an injected clock, and a
#: benchmark sampling memory for a fixed time.
NOT_WAITS = {"src/gpufleet/ops/drain.py::drain", "src/gpufleet_admin/training/submit.py::follow",
             "bench/in_cluster_memory.py::main"}


def _poll_loops(root):
    """``path::function`` of every ``while`` loop that sleeps and compares against a clock or a deadline."""
    import ast
    import re

    deadline = re.compile(r"(^|_)(deadline|end|until|expires?|stop_at)($|_)")

    def clock_or_deadline(n) -> bool:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("monotonic", "time"):
            return True
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        return bool(name) and deadline.search(name.lower()) is not None

    found = set()
    for top in ("src", "bench", "tests"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("tests/nodes/"):
                continue
            tree = ast.parse(path.read_text(), rel)
            for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
                for loop in (n for n in ast.walk(fn) if isinstance(n, ast.While)):
                    body = list(ast.walk(loop))
                    sleeps = any(isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "sleep"
                                 for n in body)
                    if sleeps and any(isinstance(n, ast.Compare) and any(clock_or_deadline(x) for x in ast.walk(n))
                                      for n in body):
                        found.add(f"{rel}::{fn.name}")
    return found


def test_every_wait_for_a_condition_goes_through_poll_until():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    loops = _poll_loops(root) - NOT_WAITS
    assert not loops, "wait with gpufleet.wait.poll_until instead of a hand-written loop:\n" + "\n".join(sorted(loops))
