"""The work queue keeps one pending entry per key, and its rate limiters pace each key, capped, for any count."""

from __future__ import annotations

import pytest

from gpufleet.kube.ratelimit import (
    BucketRateLimiter, ItemExponentialFailureRateLimiter, MaxOfRateLimiter, TokenBucket,
    default_controller_rate_limiter,
)
from gpufleet.kube.retry import conflict_wait
from gpufleet.kube.workqueue import RateLimitingQueue, WorkQueue


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def drain(q: WorkQueue) -> list:
    """Every key ready now, each marked done."""
    out = []
    while (key := q.get(timeout=0)) is not None:
        out.append(key)
        q.done(key)
    return out


# ------------------------------------------------------------------ one pending entry per key


def test_a_key_added_after_a_delay_twice_waits_once_and_the_earlier_ready_time_wins():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add_after("a", 5)
    q.add_after("a", 30)  # later: ignored
    assert len(q) == 1 and q.ready_at("a") == 105
    q.add_after("a", 2)  # earlier: moves it
    assert len(q) == 1 and q.ready_at("a") == 102
    clock.t = 101.9
    assert drain(q) == []
    clock.t = 102
    assert drain(q) == ["a"]
    clock.t = 200  # past every ready time asked for: no second entry comes out
    assert drain(q) == [] and len(q) == 0 and q.ready_at("a") is None


def test_adding_a_waiting_key_makes_it_ready_now_and_drops_the_wait():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add_after("a", 10)
    q.add("a")
    assert len(q) == 1 and q.ready_at("a") is None
    assert drain(q) == ["a"]
    clock.t += 60
    assert drain(q) == []


def test_periodic_resyncs_of_a_retried_key_never_stack_up_retries():
    """A resync every 3 s of a key that is retried after 10 s each time: one entry, one try per resync."""
    clock = Clock(0)
    q: WorkQueue[str] = WorkQueue(clock)
    tries = 0
    for step in range(3000):  # 300 s in 0.1 s steps
        clock.t = step / 10
        if step % 30 == 0:
            q.add("pod")
        for key in drain(q):
            tries += 1
            q.add_after(key, 10)
        assert len(q) <= 1
    assert tries == 100  # one per resync


def test_a_key_dropped_and_waited_on_forever_keeps_the_queue_small():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock)
    for i in range(10_000):
        q.add_after(f"k{i % 10}", 1000 - i * 0.01)  # each one earlier than the last
        if i % 3 == 0:
            q.add(f"k{i % 10}")
    assert len(q._heap) <= 2 * len(q._waiting) + 64


def test_a_key_waiting_while_a_worker_holds_it_is_handed_out_once_after_done():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add_after("a", 1)
    clock.t += 2
    assert q.get(timeout=0) is None  # held by the worker
    q.done("a")
    assert drain(q) == ["a"] and drain(q) == []


# ------------------------------------------------------------------ rate limiters


def test_per_key_backoff_doubles_to_its_cap_and_forget_starts_over():
    clock = Clock()
    q: RateLimitingQueue[str] = RateLimitingQueue(clock=clock)
    assert [q.add_rate_limited("a") for _ in range(7)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert q.num_requeues("a") == 7
    assert q.add_rate_limited("b") == 0.5  # per key
    assert len(q) == 2 and q.ready_at("a") == clock.t + 0.5  # one entry, the earliest asked for
    q.forget("a")
    assert q.num_requeues("a") == 0 and q.add_rate_limited("a") == 0.5


def test_backoff_is_capped_at_attempt_ten_thousand_without_overflow():
    ours = ItemExponentialFailureRateLimiter()
    delays = [ours.when("pod") for _ in range(10_000)]
    assert delays[-1] == 10.0 and max(delays) == 10.0 and ours.num_requeues("pod") == 10_000
    client_go = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    assert client_go.delay(0) == 0.005 and client_go.delay(10_000) == 1000.0 and client_go.delay(10**100) == 1000.0
    assert client_go.max_exponent == 18  # 0.005 * 2**18 = 1310.72 s >= 1000 s > 0.005 * 2**17
    assert conflict_wait(10_000) == 1.0 and conflict_wait(0) == 0.05


def test_bad_limiter_settings_are_named():
    with pytest.raises(ValueError, match=r"base 0 s, cap 10 s: expected 0 < base <= cap"):
        ItemExponentialFailureRateLimiter(0, 10)
    with pytest.raises(ValueError, match=r"base 5 s, cap 1 s"):
        ItemExponentialFailureRateLimiter(5, 1)
    with pytest.raises(ValueError, match=r"rate_per_minute 0.0, burst 100: expected rate_per_minute > 0"):
        BucketRateLimiter(qps=0)


def test_the_overall_bucket_lets_a_burst_through_then_paces_every_key():
    clock = Clock()
    bucket = BucketRateLimiter(qps=10, burst=2, clock=clock)
    assert [bucket.when(k) for k in "abcd"] == [0, 0, pytest.approx(0.1), pytest.approx(0.2)]
    clock.t += 1.3  # 13 tokens' worth: pays the two reserved ahead and fills the burst again
    assert [bucket.when(k) for k in "efg"] == [0, 0, pytest.approx(0.1)]
    assert bucket.num_requeues("a") == 0


def test_the_default_limiter_takes_the_longer_of_the_key_and_the_bucket():
    clock = Clock()
    lim = default_controller_rate_limiter(qps=1, burst=1, clock=clock)
    assert isinstance(lim, MaxOfRateLimiter)
    assert lim.when("a") == 0.5  # the key's backoff; the bucket had a token
    assert lim.when("b") == pytest.approx(1.0)  # the bucket is empty: 1 s to the next token
    assert lim.num_requeues("a") == 1
    lim.forget("a")
    assert lim.num_requeues("a") == 0


def test_a_failure_storm_leaves_no_debt_beyond_the_cap():
    """Every one of 1,000 pods failing on each of 360 resyncs (an hour's outage) books at most 10 s ahead."""
    clock = Clock(0)
    lim = default_controller_rate_limiter(clock=clock)
    for resync in range(360):
        clock.t = resync * 10.0
        waits = [lim.when(f"pod-{i}") for i in range(1000)]
        assert max(waits) == 10.0
    clock.t += 10.0 + 10.0  # the outage is over: the booked 10 s pass, and 100 tokens refill
    assert lim.when("a-new-failure") == 0.5  # its own first backoff, not hours of the others' debt


def test_token_bucket_reservations_queue_up_at_its_rate():
    b = TokenBucket(60, burst=1, now=0)  # one a second
    assert b.reserve(0) == 0 and b.reserve(0) == pytest.approx(1) and b.reserve(0.5) == pytest.approx(1.5)
    assert not b.take(1.0) and b.available(3.0) == pytest.approx(1.0)
    assert [b.reserve(3.0, max_wait=2) for _ in range(4)] == [0, pytest.approx(1), pytest.approx(2), pytest.approx(2)]
    assert b.available(3.0) == pytest.approx(-2)  # the fourth booked nothing


# ------------------------------------------------------------------ the worker step


class Flaky(RuntimeError):
    pass


class Routine(Flaky):
    pass


@pytest.mark.parametrize("answer, level, requeues, ready_at", [
    (None, None, 0, None),  # done: forgotten, not queued again
    (30.0, None, 0, 130.0),  # done for now: forgotten, looked at again after 30 s
    ("backoff", None, 2, 100.01),  # not done: at the key's pace (its second failure: 2 x 5 ms)
    (Flaky("backend down"), "WARNING", 2, 100.01),  # expected failure: one line, no traceback
    (Routine("stale write"), "DEBUG", 2, 100.01),  # routine failure: a debug line
    (KeyError("bug"), "ERROR", 2, 100.01),  # anything else: a traceback, and the worker lives on
], ids=["done", "after", "backoff", "expected", "quiet", "unexpected"])
def test_process_requeues_as_the_reconcile_answers_and_always_marks_done(caplog, answer, level, requeues, ready_at):
    from gpufleet.kube.ratelimit import ItemExponentialFailureRateLimiter
    from gpufleet.kube.workqueue import BACKOFF

    clock = Clock()
    q: RateLimitingQueue[str] = RateLimitingQueue(ItemExponentialFailureRateLimiter(0.005, 10), clock)
    q.add_rate_limited("ns/p")  # one failure before this step
    q.add("ns/p")
    assert q.get(timeout=0) == "ns/p"

    def reconcile(key: str):
        assert key == "ns/p"
        if isinstance(answer, BaseException):
            raise answer
        return BACKOFF if answer == "backoff" else answer

    caplog.set_level("DEBUG", logger="gpufleet.kube.workqueue")
    q.process("ns/p", reconcile, what="vk-a: ns/p", retry_on=(Flaky,), quiet=(Routine,))
    assert q.num_requeues("ns/p") == requeues
    assert q.ready_at("ns/p") == (pytest.approx(ready_at) if ready_at else None)
    records = [r for r in caplog.records if r.name == "gpufleet.kube.workqueue"]
    assert [r.levelname for r in records] == ([level] if level else [])
    assert [r.getMessage().startswith("vk-a: ns/p: ") for r in records] == [True] * len(records)
    assert [r.exc_info is not None for r in records] == [level == "ERROR"] * len(records)
    q.add("ns/p")  # done was called: queued again now, not held back as still being processed
    assert q.get(timeout=0) == "ns/p"
