"""Quota sync's controller against the in-memory API server: a capacity change patches the ClusterQueues'
nominalQuota (and nothing else), a resync with nothing changed writes nothing, someone else's edit is repaired,
and a 409 is retried on a fresh read. Real informers, the real client (:mod:`gpufleet_workshop.testing`)."""

from __future__ import annotations

import pytest

from gpufleet.kube import Conflict
from gpufleet.names import KUEUE_API, SWAP_TAINT
from gpufleet.quota_sync.controller import QuotaSync
from roles.kueue.config import configuration
from gpufleet.quota_sync.resync import quota_of
from gpufleet_workshop.testing import FakeKube

from ..builders import FLAVOR, cluster_queue, local_queue, node

SWAP = {"key": SWAP_TAINT, "value": "hot", "effect": "NoSchedule"}


def gpu_quota(kube: FakeKube, queue: str) -> int:
    cq = kube.get(KUEUE_API, "clusterqueues", queue)
    return int(quota_of(cq, FLAVOR)["nominal"])


@pytest.fixture
def kube():
    k = FakeKube(bookmark_seconds=0.02)
    k.add(*[node(f"gpu-{i:02d}") for i in range(16)],
          {**cluster_queue("training", 96), "metadata": {"name": "training"}},
          {**cluster_queue("research", 32), "metadata": {"name": "research"}},
          local_queue("team-pretrain", "pretrain", "training"))
    yield k
    k.close()


@pytest.fixture
def sync(kube, local_inv):
    qs = QuotaSync(kube, configuration(local_inv).model_copy(update={"debounce_seconds": 0.0}))
    informers = [qs.cache.informer, qs.queues.informer] + ([qs.pods.informer] if qs.pods else [])
    for inf in informers:
        inf.start()
    kube.sync(*informers)
    yield qs, lambda: kube.sync(*informers)
    for inf in informers:
        inf.stop()


def test_quota_follows_schedulable_capacity_and_a_resync_without_change_writes_nothing(kube, sync):
    qs, caught_up = sync
    first = qs.resync_once()
    assert first.error is None and sorted(first.applied.patched) == ["research", "training"]
    full = {q: gpu_quota(kube, q) for q in ("training", "research")}
    assert full == {"training": 96, "research": 32}, "the local inventory's shares 3:1 of 128 GPUs"
    caught_up()
    writes = len(kube.writes())
    again = qs.resync_once()
    assert again.applied.patched == [] and len(kube.writes()) == writes, "nothing changed: no write at all"
    # Half the fleet goes out for swap: quota follows (and only nominalQuota changes).
    for i in range(8):
        kube.patch("v1", "nodes", f"gpu-{i:02d}", {"spec": {"taints": [SWAP]}})
    caught_up()
    assert qs.cache.dirty.is_set(), "a capacity change marks the cache dirty"
    before = kube.get(KUEUE_API, "clusterqueues", "training")
    out = qs.resync_once()
    assert sorted(out.applied.patched) == ["research", "training"]
    assert {q: gpu_quota(kube, q) for q in ("training", "research")} == {"training": 48, "research": 16}
    after = kube.get(KUEUE_API, "clusterqueues", "training")
    assert after["spec"]["cohortName"] == before["spec"]["cohortName"]
    patches = [a for a in kube.writes() if a.resource == "clusterqueues"][-2:]
    assert all(set(a.body) == {"spec", "metadata"} and set(a.body["metadata"]) == {"resourceVersion"}
               for a in patches), "a merge patch guarded by the read resourceVersion"


def test_a_heartbeat_is_not_a_capacity_change(kube, sync):
    qs, caught_up = sync
    qs.resync_once()
    caught_up()
    qs.cache.take()
    kube.patch("v1", "nodes", "gpu-03", {"status": {"conditions": [{"type": "Ready", "status": "True",
                                                                     "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}},
               subresource="status")
    caught_up()
    assert not qs.cache.dirty.is_set()


def test_someone_elses_edit_of_the_quota_is_repaired(kube, sync):
    qs, caught_up = sync
    qs.resync_once()
    caught_up()
    qs.cache.take()
    cq = kube.get(KUEUE_API, "clusterqueues", "training")
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = "7"
    kube.replace(KUEUE_API, "clusterqueues", "training", cq)
    caught_up()
    assert qs.cache.dirty.is_set(), "the ClusterQueue watch saw the edit"
    assert qs.resync_once().applied.patched == ["training"] and gpu_quota(kube, "training") == 96


def test_a_conflict_is_retried_on_a_fresh_read(kube, sync):
    qs, _ = sync
    kube.fail("patch", "clusterqueues", Conflict(409, "Conflict", "the object has been modified"), name="training")
    out = qs.resync_once()
    assert out.error is None and out.applied.conflicts == 1 and gpu_quota(kube, "training") == 96
