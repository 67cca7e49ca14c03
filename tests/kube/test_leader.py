"""Leader election keeps its renew deadline by the clock: the fence, the elector, and a client whose requests hang.

The elector runs on an injected clock over an in-memory double of the
client (:mod:`tests.kube.leases`); the fenced :class:`gpufleet.kube.Kube`
runs against a real server on 127.0.0.1 that accepts and never answers
(:class:`tests.netfaults.HangProxy`).
"""

from __future__ import annotations

import threading
import time

import pytest

from gpufleet.kube import Kube, LeadershipLost, Unreachable
from gpufleet.kube.config import from_dict
from gpufleet.kube.fence import Fence
from gpufleet.kube.leader import WATCH_POLL_SECONDS, LeaderElector, Timings
from gpufleet.wait import poll_until

from ..netfaults import HangProxy
from .leases import FakeLeaseApi

NS, NAME = "gpufleet-system", "gpufleet-test"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}"


class Clock:
    """Monotonic seconds that a test can move forward at once (:meth:`jump`)."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        self.offset += seconds


class Leader:
    """``elector.run`` in a thread with a ``lead`` that records its stop and writes through the client until told not to."""

    def __init__(self, elector: LeaderElector, api, *, write_every: float | None = None):
        self.elector, self.api = elector, api
        self.leading = threading.Event()
        self.stopped_at: float | None = None  # clock when lead returned
        self.returned_at: float | None = None  # clock when elector.run returned
        self.refused: list[str] = []
        self.stop = threading.Event()
        self.result: list[bool] = []
        self.write_every = write_every
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _lead(self, leader_stop: threading.Event) -> None:
        self.leading.set()
        while not leader_stop.is_set():
            if self.write_every is not None:
                try:
                    self.api.patch("v1", "nodes", "n", {"spec": {}})
                except LeadershipLost as exc:
                    self.refused.append(str(exc))
                except Unreachable:
                    pass
            leader_stop.wait(self.write_every or 1.0)
        self.stopped_at = self.elector.clock()

    def _run(self) -> None:
        self.result.append(self.elector.run(self._lead, self.stop))
        self.returned_at = self.elector.clock()

    def join(self, timeout: float) -> bool:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "elector.run did not return"
        return self.result[0]


def elector(api, clock, timings: Timings, identity: str = "a") -> LeaderElector:
    e = LeaderElector(api, NAME, NS, identity=identity, timings=timings, clock=clock)
    api.fence_writes(e.fence)
    return e


def wait_for(what: str, check, timeout: float = 5.0) -> None:
    poll_until(check, what=what, timeout=timeout, interval=0.01)


# ---------------------------------------------------------------------- the fence


def test_the_fence_admits_writes_only_while_held_and_for_the_time_left():
    clock = Clock()
    t0 = clock()
    clock.offset = -t0  # the clock reads 0 now
    fence = Fence(f"{NS}/{NAME}", exempt=(LEASE,), clock=lambda: round(clock(), 6))
    with pytest.raises(LeadershipLost, match="does not hold Lease gpufleet-system/gpufleet-test .not leading yet"):
        fence.admit("POST", "/api/v1/namespaces/x/pods/p/eviction")
    assert fence.admit("GET", "/api/v1/nodes") is None  # reads are never fenced
    assert fence.admit("PUT", LEASE) is None  # the elector bounds its own requests
    fence.hold_until(clock() + 10.0)
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert 9.0 < fence.admit(method, "/api/v1/nodes/n") <= 10.0
    clock.jump(10.0)  # the deadline passes: refused at once, no renewal needed to say so
    with pytest.raises(LeadershipLost, match="not renewed by its renew deadline .* stopped acting") as err:
        fence.admit("PATCH", "/api/v1/nodes/n")
    assert err.value.status == 0 and err.value.reason == "LeadershipLost" and "PATCH /api/v1/nodes/n" in str(err.value)
    fence.hold_until(clock() + 10.0)  # renewed after all: held again
    assert fence.holding()
    cut: list[str] = []
    fence.on_trip(lambda: cut.append("pool closed"))
    fence.trip("the Lease is held by b")
    fence.trip("again")
    fence.hold_until(clock() + 100.0)  # lost is for good
    assert cut == ["pool closed"] and fence.lost == "the Lease is held by b" and fence.time_left() == 0
    with pytest.raises(LeadershipLost, match=r"was lost \(the Lease is held by b\)"):
        fence.admit("DELETE", "/api/v1/namespaces/x/pods/p")


# ---------------------------------------------------------------------- the elector


def test_a_leader_whose_renewal_hangs_stops_acting_at_the_deadline_while_the_request_is_still_in_flight():
    """The renew deadline is the clock's: the watch ends leadership while the renewing thread is stuck."""
    clock = Clock()
    api = FakeLeaseApi(clock)
    timings = Timings(lease_duration=15, renew_deadline=10, retry_period=0.2)
    e = elector(api, clock, timings)
    with pytest.raises(LeadershipLost, match="not leading yet"):
        api.patch("v1", "nodes", "n", {})  # a follower does not write
    leader = Leader(e, api, write_every=0.05)
    assert leader.leading.wait(5) and e.is_leader()
    wait_for("a write as leader", lambda: any(w[1] == "PATCH" for w in api.writes))
    api.hang(honour_timeouts=False)  # an API server that accepts and never answers
    wait_for("a renewal in flight", lambda: api.in_flight >= 1)
    deadline = e.fence.deadline
    clock.jump(deadline - clock() + 0.001)  # the renew deadline passes; the renewal is still waiting for an answer
    assert not e.is_leader()  # by the clock, at once
    assert leader.join(timeout=2.0) is True  # lost, without the request having returned
    assert api.in_flight >= 1, "the renewal should still be hanging"
    assert leader.returned_at - deadline < 1.0
    assert e.fence.lost and "renew deadline" in e.fence.lost and not e.leading.is_set()
    # No write of the lost leader reached the server after the deadline, and every later one is refused.
    assert all(at < deadline for at, method, _ in api.writes if method == "PATCH")
    with pytest.raises(LeadershipLost, match="was lost"):
        api.patch("v1", "nodes", "n", {})
    # Each renewal was sent once and could take only the time left to the deadline.
    renewals = [c for c in api.calls if c.path == LEASE and c.sent_at > deadline - timings.renew_deadline]
    assert renewals and all(not c.retry and c.sent_at + c.timeout <= deadline + 1e-3 for c in renewals)
    api.answer_again()


def test_renewals_that_time_out_are_not_retried_past_the_deadline_and_leadership_ends_on_it():
    """Every renewal request ends by the deadline (its timeout is the time left), none is sent after it."""
    clock = Clock()
    api = FakeLeaseApi(clock)
    timings = Timings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.2)
    e = elector(api, clock, timings)
    leader = Leader(e, api)
    assert leader.leading.wait(5)
    time.sleep(0.5)  # a few renewals succeed
    api.hang(honour_timeouts=True)  # each request now ends at its own timeout, as a socket timeout does
    hung_at = clock()
    assert leader.join(timeout=timings.renew_deadline + 2.0) is True
    last_renewal = max(c.sent_at for c in api.calls if c.sent_at < hung_at and c.method == "PUT")
    lease_calls = [c for c in api.calls if c.sent_at >= hung_at]
    assert lease_calls, "renewals should have been tried while hanging"
    last_deadline = max(c.sent_at + c.timeout for c in lease_calls)
    assert all(not c.retry for c in lease_calls)
    assert last_deadline - hung_at <= timings.renew_deadline + 1e-3  # nothing may run past the deadline
    assert leader.stopped_at - last_renewal <= timings.renew_deadline + WATCH_POLL_SECONDS + 0.5


def test_a_leader_that_sees_another_holder_stops_at_once():
    clock = Clock()
    api = FakeLeaseApi(clock)
    e = elector(api, clock, Timings(lease_duration=15, renew_deadline=10, retry_period=0.2))
    leader = Leader(e, api)
    assert leader.leading.wait(5)
    api.set_holder(NAME, NS, "intruder")
    assert leader.join(timeout=2.0) is True  # not after the 10 s renew deadline
    assert e.fence.lost == "the Lease is held by intruder" and not e.is_leader()


def test_a_clean_stop_releases_the_lease_and_writes_no_more():
    clock = Clock()
    api = FakeLeaseApi(clock)
    e = elector(api, clock, Timings(lease_duration=15, renew_deadline=10, retry_period=0.2))
    leader = Leader(e, api)
    assert leader.leading.wait(5) and api.holder(NAME, NS) == "a"
    leader.stop.set()
    assert leader.join(timeout=5.0) is False
    assert api.holder(NAME, NS) == "" and api.leases[LEASE]["spec"]["leaseDurationSeconds"] == 1
    with pytest.raises(LeadershipLost, match=r"was lost \(stopped\)"):
        api.patch("v1", "nodes", "n", {})


def test_a_follower_takes_over_only_after_the_lease_duration_and_never_while_the_leader_acts():
    """Two electors on one Lease; the leader's requests hang: the leader stops before the follower starts."""
    clock = Clock()
    timings = Timings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.2)
    shared = FakeLeaseApi(clock)
    a = elector(shared, clock, timings, "a")
    leader = Leader(a, shared)
    assert leader.leading.wait(5)

    class Direct(FakeLeaseApi):
        """The follower's own client to the same Leases (its path to the API server keeps answering)."""

    b_api = Direct(clock)
    b_api.leases = shared.leases  # one store: the same API server
    b = elector(b_api, clock, timings, "b")
    follower = Leader(b, b_api)
    time.sleep(3 * timings.lease_duration)
    assert not follower.leading.is_set()  # a keeps renewing
    shared.hang(honour_timeouts=True)
    assert leader.join(timeout=5.0) is True
    assert follower.leading.wait(5)
    started = min(c.sent_at for c in b_api.calls if c.method == "PUT" and c.body["spec"]["holderIdentity"] == "b")
    assert leader.stopped_at < started, f"overlap {started - leader.stopped_at:+.3f} s"
    follower.stop.set()
    follower.join(5.0)


# ---------------------------------------------------------------------- the client against a server that never answers


def _kube(port: int, timeout: float = 30.0) -> Kube:
    doc = {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
           "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
           "users": [{"name": "u", "user": {"token": "t"}}]}
    return Kube(from_dict(doc, source="test"), timeout=timeout)


def test_a_fenced_write_in_flight_is_abandoned_at_the_deadline_and_later_ones_are_not_sent():
    with HangProxy() as server:  # accepts, never answers
        kube = _kube(server.port)
        fence = Fence(f"{NS}/{NAME}")
        kube.fence_writes(fence)
        fence.hold_until(time.monotonic() + 0.5)
        t0 = time.monotonic()
        with pytest.raises(Unreachable):
            kube.replace("v1", "nodes", "n", {"metadata": {"name": "n", "resourceVersion": "1"}})
        assert time.monotonic() - t0 < 2.0  # not the client's 30 s, three times over
        wait_for("the connection counted", lambda: server.accepted == 1)
        assert server.accepted == 1  # sent once: no transport retry past the deadline
        with pytest.raises(LeadershipLost, match="renew deadline"):
            kube.evict("ns", "p")
        with pytest.raises(LeadershipLost):
            kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}})
        time.sleep(0.1)
        assert server.accepted == 1  # refused before anything was sent
        kube.close()


def test_without_a_fence_a_hanging_put_is_sent_again_which_is_why_fenced_writes_go_once():
    with HangProxy() as server:
        kube = _kube(server.port, timeout=0.2)
        with pytest.raises(Unreachable):
            kube.replace("v1", "nodes", "n", {"metadata": {"name": "n", "resourceVersion": "1"}})
        wait_for("the retries counted", lambda: server.accepted == 3)
        kube.close()


def test_reads_are_not_fenced():
    with HangProxy() as server:
        kube = _kube(server.port, timeout=0.2)
        kube.fence_writes(Fence(f"{NS}/{NAME}"))  # never held
        with pytest.raises(Unreachable):
            kube.request("GET", "/api/v1/nodes", retry=False)
        wait_for("the read sent", lambda: server.accepted == 1)
        kube.close()
