"""A pod outside that waits for a ConfigMap is retried at a flat, bounded pace for as long as it waits.

The pod controller's own queue, worker step and resync, on a fake clock:
an hour of simulated time in 0.1 s steps, the in-memory client of
``test_reflect`` as the API server.
"""

from __future__ import annotations

import logging

import pytest

from gpufleet.kube import ServerError
from gpufleet.kube.ratelimit import FAILURE_CAP_SECONDS
from gpufleet.kube.workqueue import BACKOFF
from gpufleet.virtual_kubelet.pods import PodController

from .test_reflect import Clock, full_pod, kube, sim  # noqa: F401 (kube: the fixture)

HOUR = 3600.0
STEP = 0.1
WINDOW = 600.0


def run(ctl: PodController, clock: Clock, until: float, resync_seconds: float, next_resync: float) -> float:
    """Advance ``clock`` to ``until`` in :data:`STEP` s, resyncing every ``resync_seconds`` and working every
    key that is ready, as the controller's resync loop and workers do; returns the next resync time."""
    while clock.t < until - 1e-9:
        clock.t = round(clock.t + STEP, 6)
        if clock.t >= next_resync - 1e-9:
            ctl.resync()
            next_resync += resync_seconds
        while (key := ctl.queue.get(timeout=0)) is not None:
            ctl.process(key)
    return next_resync


@pytest.mark.parametrize("resync_seconds", [3.0, 10.0, 30.0])
def test_a_pod_waiting_an_hour_for_a_configmap_is_retried_at_a_flat_bounded_pace(kube, caplog, resync_seconds):
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    prov = sim(clock=clock, wall=lambda: 1_700_000_000.0)
    ctl = PodController(kube, "vk-rental", {"rental": prov}, publish_endpoints=False, clock=clock,
                        resync_seconds=resync_seconds)
    ctl.reflector.watch = False  # no informer of ConfigMaps here: only retries and resyncs find it
    kube.remove("configmaps", "settings", "inference")
    reads: list[float] = []  # when the missing ConfigMap was read: one per attempt
    real_get = kube.get

    def get(api_version, plural, name, namespace=None, subresource=None):
        if (plural, name) == ("configmaps", "settings"):
            reads.append(clock.t)
        return real_get(api_version, plural, name, namespace, subresource)

    kube.get = get
    ctl.pods.apply("ADDED", kube.add_one(full_pod()))  # stored: the controller writes its status
    ctl.pods.synced.set()

    run(ctl, clock, HOUR, resync_seconds, resync_seconds)

    def tries(start: float, end: float) -> int:
        return sum(start <= t < end for t in reads)

    last = tries(HOUR - WINDOW, HOUR + 1)
    bound = WINDOW / FAILURE_CAP_SECONDS + WINDOW / resync_seconds + 1
    assert last <= bound, f"{last} tries in the last 10 minutes: more than the cap's pace plus resyncs ({bound:.0f})"
    assert last >= WINDOW / max(FAILURE_CAP_SECONDS, resync_seconds) - 1  # still tried: it waits without a deadline
    assert abs(last - tries(WINDOW, 2 * WINDOW)) <= 2  # flat: the last 10 minutes as the second ones
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert ctl.queue.num_requeues("inference/p") == len(reads)
    # One Event, updated in place with the attempt count; the pod still Pending, nothing created there.
    (event,) = kube.events
    assert event["reason"] == "CreateContainerConfigError" and 'configmap "settings" not found' in event["message"]
    updates = [a.body for a in kube.patches if a.resource == "events"]
    assert updates[-1]["count"] == len(reads) and f"(attempt {len(reads)}, retrying)" in updates[-1]["message"]
    assert prov.get_pods() == []

    # The ConfigMap appears: the next try (a resync at the latest) creates the pod, and its failures are forgotten.
    kube.put("configmaps", "settings", {"k": "settings"})
    run(ctl, clock, HOUR + max(FAILURE_CAP_SECONDS, resync_seconds) + 1, resync_seconds, HOUR + resync_seconds)
    assert len(prov.get_pods()) == 1
    assert ctl.queue.num_requeues("inference/p") == 0


def test_waiting_for_an_object_is_a_rate_limited_retry(kube):
    ctl = PodController(kube, "vk-rental", {"rental": sim()}, publish_endpoints=False)
    ctl.reflector.watch = False
    kube.remove("secrets", "api", "inference")
    p = kube.add_one(full_pod())
    assert ctl._create(p) is BACKOFF
    ctl.pods.apply("ADDED", p)
    assert ctl.queue.get(timeout=0) == "inference/p"
    ctl.process("inference/p")
    assert ctl.queue.num_requeues("inference/p") == 1 and ctl.queue.ready_at("inference/p") is not None


def test_a_service_whose_endpoints_cannot_be_published_is_retried_at_its_own_pace_and_forgotten_once_published(kube):
    ctl = PodController(kube, "vk-rental", {"rental": sim()})
    pub = ctl.endpoints
    outcomes = [ServerError(503, "ServiceUnavailable", "etcd is slow"), RuntimeError("a bug"), None]

    def sync_service(key):
        if (exc := outcomes.pop(0)) is not None:
            raise exc

    pub.sync_service = sync_service
    waits = []
    for _ in range(2):
        pub.queue.add("inference/chat")
        assert pub.queue.get(timeout=0) == "inference/chat"
        pub.process("inference/chat")
        waits.append(pub.queue.ready_at("inference/chat"))
    assert pub.queue.num_requeues("inference/chat") == 2 and None not in waits
    pub.queue.add("inference/chat")  # ready now
    assert pub.queue.get(timeout=0) == "inference/chat"
    pub.process("inference/chat")
    assert pub.queue.num_requeues("inference/chat") == 0
