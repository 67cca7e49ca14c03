"""Faults of gpufleet's in-cluster controllers in the middle of the flip (``invoke sim.flip``, controllers on the real node).

* The active taint controller's pod is deleted once the training is
  submitted: the standby takes the Lease and the flip completes without
  Ready inference replicas ever below the PodDisruptionBudget's minAvailable.
* The ``other`` pool's virtual-kubelet pod is deleted while inference runs
  in the pool's cluster: once its replacement runs, every pod bound to the
  virtual node has exactly one remote pod (its source UID) and every remote
  pod has its source: none lost, none duplicated, on either side.
"""

from __future__ import annotations

import threading
import time

import pytest
from gpufleet.flip.constants import LEASE_NAME
from gpufleet.kube import Kube
from gpufleet.local import cluster as local
from gpufleet.sim.flip import JOBSET_NAME, Options, run
from gpufleet.sim.incluster import pods
from gpufleet.vk.node import node_name_for
from gpufleet.vk.provider import SOURCE_UID, VIRTUAL_NODE_LABEL

pytestmark = pytest.mark.cluster

NS = "gpufleet-system"
INFERENCE_NS = "inference"
TRAINING_NS = "team-pretrain"


def _wait(what: str, check, timeout: float = 240.0, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        if result := check():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


class Flip:
    """``sim.flip`` run in a thread; :meth:`result` joins it and returns the summary (or raises its error)."""

    def __init__(self, opts: Options):
        self.out: dict = {}
        self.thread = threading.Thread(target=self._run, args=(opts,), daemon=True)
        self.thread.start()

    def _run(self, opts: Options) -> None:
        try:
            self.out["summary"] = run(opts)
        except BaseException as exc:  # re-raised in the test's thread
            self.out["error"] = exc

    def alive(self) -> bool:
        return self.thread.is_alive()

    def result(self, timeout: float = 900.0) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "sim.flip did not finish"
        if "error" in self.out:
            raise self.out["error"]
        return self.out["summary"]


def _holder(k: Kube) -> str:
    return ((k.get_or_none("coordination.k8s.io/v1", "leases", LEASE_NAME, NS) or {}).get("spec") or {}).get(
        "holderIdentity") or ""


def _ready(pod: dict) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def test_standby_takes_the_lease_mid_flip_and_the_flip_completes_within_the_pdb(local_cluster, tmp_path):
    k = local_cluster.kube
    flip = Flip(Options(env="local", cluster=local_cluster.name, pools=("rental",), duration=15, out=tmp_path,
                        timeout=300))
    _wait("the training submitted", lambda: not flip.alive() or k.get_or_none(
        "jobset.x-k8s.io/v1alpha2", "jobsets", JOBSET_NAME, TRAINING_NS) is not None)
    names = [p["metadata"]["name"] for p in pods(k, NS, "taint-controller") if _ready(p)]
    leader = next(n for n in names if n in _holder(k))
    started = time.monotonic()
    k.delete("v1", "pods", leader, NS, grace_seconds=0)
    holder = _wait("another pod holding the Lease", lambda: (h := _holder(k)) and leader not in h and h,
                   timeout=120, interval=0.2)
    takeover = time.monotonic() - started
    print(f"Lease takeover after deleting the leader mid-flip: {takeover:.1f}s (new holder {holder})")
    summary = flip.result()
    assert summary["seconds_to_served_outside"] is not None and summary["seconds_to_back_in_cluster"] is not None
    assert summary["min_ready_replicas"] >= summary["pdb_min_available"], summary
    assert takeover < 60


def test_virtual_kubelet_restart_loses_and_duplicates_no_pod(local_cluster, tmp_path):
    k = local_cluster.kube
    other = f"{local_cluster.name}-other"
    started_other = not local.main_pids(other)
    node = node_name_for("other")
    flip = Flip(Options(env="local", cluster=local_cluster.name, pools=("other",), duration=90, out=tmp_path,
                        timeout=300, other_clusters={"other": other}))
    try:
        def outside() -> list[dict]:
            return [p for p in k.list("v1", "pods", INFERENCE_NS, fieldSelector=f"spec.nodeName={node}")["items"]
                    if not p["metadata"].get("deletionTimestamp")]

        def replicas() -> int:
            return (k.get_or_none("apps/v1", "deployments", "chat", INFERENCE_NS) or {}).get("spec", {}).get("replicas", 0)

        # Served outside: every replica Ready on the virtual node (nothing moves until the training ends).
        _wait("every inference replica Ready on the virtual node", lambda: not flip.alive() or (
            k.get_or_none("jobset.x-k8s.io/v1alpha2", "jobsets", JOBSET_NAME, TRAINING_NS) is not None
            and (o := outside()) and len(o) == replicas() and all(_ready(p) for p in o)), timeout=300)
        assert flip.alive(), flip.result()
        before = {p["metadata"]["uid"] for p in outside()}
        vk = [p["metadata"]["name"] for p in pods(k, NS, "vk-other")]
        assert len(vk) == 1
        k.delete("v1", "pods", vk[0], NS, grace_seconds=0)
        _wait("a new virtual-kubelet pod Ready", lambda: any(
            _ready(p) and p["metadata"]["name"] != vk[0] for p in pods(k, NS, "vk-other")), timeout=120)
        remote = Kube.from_kubeconfig(local.get(other).kubeconfig, user_agent="gpufleet-tests")
        try:
            def matched() -> tuple[set[str], list[str]] | None:
                sources = {p["metadata"]["uid"] for p in outside()}
                uids = [((p["metadata"].get("annotations") or {}).get(SOURCE_UID)) for p in remote.list(
                    "v1", "pods", labelSelector=f"{VIRTUAL_NODE_LABEL}={node}")["items"]
                        if not p["metadata"].get("deletionTimestamp")]
                return (sources, uids) if sorted(uids) == sorted(sources) else None

            time.sleep(10)  # a few status loops of the new virtual kubelet
            sources, uids = _wait("every source pod with exactly one remote pod", matched, timeout=60)
        finally:
            remote.close()
        assert len(uids) == len(set(uids)), f"duplicated remote pods: {uids}"
        assert sources == before, f"source pods changed across the restart: lost {before - sources}, new {sources - before}"
        assert all(_ready(p) for p in outside())
        summary = flip.result()
        assert summary["seconds_to_back_in_cluster"] is not None
        assert summary["min_ready_replicas"] >= summary["pdb_min_available"], summary
    finally:
        if flip.alive():
            flip.thread.join(900)
        if started_other:
            local.down(other)
