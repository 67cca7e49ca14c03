"""ThreadCpu: the CPU of the calling thread and of the chosen threads, not of the others."""

from __future__ import annotations

import threading
import time

from gpufleet.controllers.threadcpu import ThreadCpu


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_only_the_caller_and_the_chosen_threads_count():
    cpu = ThreadCpu(lambda name: name.startswith("worker"))
    cpu.start()
    go, done = threading.Event(), threading.Event()

    def busy() -> None:
        go.wait()
        _spin(0.2)
        done.set()
        time.sleep(5)  # alive while read

    # A thread that is not chosen spends 0.2 s; a chosen one started after start() spends 0.1 s; so does the caller.
    other = threading.Thread(target=busy, name="informer-pods", daemon=True)
    other.start()
    go.set()
    done.wait(10)
    worker = threading.Thread(target=lambda: (_spin(0.1), time.sleep(5)), name="worker-1", daemon=True)
    worker.start()
    _spin(0.1)
    time.sleep(0.3)  # the worker has spun by now (it is alive: its clock can be read)
    spent = cpu.seconds()
    assert 0.19 <= spent < 0.35, spent


def test_a_fresh_reading_spends_nothing():
    cpu = ThreadCpu(lambda name: False)
    cpu.start()
    assert 0.0 <= cpu.seconds() < 0.05
