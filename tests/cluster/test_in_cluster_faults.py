"""Faults of gpufleet's in-cluster controllers in the middle of the flip (``invoke sim.flip``, controllers on the real node).

* The active taint controller's pod is deleted once the training is
  submitted: the standby takes the Lease and the flip completes without
  Ready inference replicas ever below the PodDisruptionBudget's minAvailable.
* The ``other`` pool's virtual-kubelet pod is deleted while inference runs
  in the pool's cluster: once its replacement runs, every pod bound to the
  virtual node has exactly one remote pod (its source UID) and every remote
  pod has its source: none lost, none duplicated, on either side.
* The real node's containerd, then its kubelet, are killed (SIGKILL) for a
  few seconds in the middle of the flip and restarted as ``invoke local.up``
  restarts a stopped component: the flip completes within the
  PodDisruptionBudget, every controller Deployment is Available again with
  exactly its replicas (one Lease holder among them), their logs show no 403
  and no traceback after the restart, and the virtual node carries the taint
  exactly as the taint controller last decided.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import threading
import time

import pytest
from gpufleet.taint_controller.constants import LEASE_NAME
from gpufleet.kube import Kube
from gpufleet_workshop.local import cluster as local
from gpufleet_workshop.local.processes import running
from gpufleet.names import FREE_GPUS_TAINT, SURGE_FOR_LABEL
from gpufleet_workshop.sim import incluster
from gpufleet_workshop.sim.flip import JOBSET_NAME, Options, run
from gpufleet_workshop.sim.incluster import pods
from gpufleet.virtual_kubelet.node import node_name_for
from gpufleet.virtual_kubelet.provider import SOURCE_UID, REMOTE_NODE_LABEL
from gpufleet.wait import poll_until
from roles.registry import load

pytestmark = pytest.mark.cluster

NS = "gpufleet-system"
INFERENCE_NS = "inference"
TRAINING_NS = "team-pretrain"


def _wait(what: str, check, timeout: float = 240.0, interval: float = 0.5):
    return poll_until(check, what=what, timeout=timeout, interval=interval)


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
    flip = Flip(Options(env="local", cluster=local_cluster.name, pools=("rental",), duration=15, out=tmp_path, rate=0,
                        timeout=300))
    try:
        _wait("the training submitted", lambda: not flip.alive() or k.get_or_none(
            "jobset.x-k8s.io/v1alpha2", "jobsets", JOBSET_NAME, TRAINING_NS) is not None)
        # A leader that missed its renew deadline (a loaded machine) restarts as a follower: wait for a Ready holder.
        leader = _wait("a Ready taint controller holding the Lease", lambda: next(
            (p["metadata"]["name"] for p in pods(k, NS, "taint-controller")
             if _ready(p) and p["metadata"]["name"] in _holder(k)), None), timeout=120)
        started = time.monotonic()
        k.delete("v1", "pods", leader, NS, grace_seconds=0)
        holder = _wait("another pod holding the Lease", lambda: (h := _holder(k)) and leader not in h and h,
                       timeout=120, interval=0.2)
        takeover = time.monotonic() - started
        print(f"Lease takeover after deleting the leader mid-flip: {takeover:.1f}s (new holder {holder})")
    finally:
        flip.thread.join(900)  # never leave a run behind for the next test
    summary = flip.result()
    assert summary["seconds_to_served_outside"] is not None and summary["seconds_to_back_in_cluster"] is not None
    assert summary["min_ready_replicas"] >= summary["pdb_min_available"], summary
    assert takeover < 60


def test_virtual_kubelet_restart_loses_and_duplicates_no_pod(local_cluster, other_cluster, tmp_path):
    k = local_cluster.kube
    other = other_cluster.name  # the session's, shared (conftest.other_cluster)
    node = node_name_for("other")
    flip = Flip(Options(env="local", cluster=local_cluster.name, pools=("other",), duration=120, out=tmp_path,
                        timeout=300, other_clusters={"other": other}, rate=0))
    try:
        def outside() -> list[dict]:
            return [p for p in k.list("v1", "pods", INFERENCE_NS, fieldSelector=f"spec.nodeName={node}")["items"]
                    if not p["metadata"].get("deletionTimestamp")]

        def replicas() -> int:
            return (k.get_or_none("apps/v1", "deployments", "chat", INFERENCE_NS) or {}).get("spec", {}).get("replicas", 0)

        def surges() -> list[dict]:
            return k.list("apps/v1", "replicasets", INFERENCE_NS, labelSelector=SURGE_FOR_LABEL)["items"]

        # The clock starts at the submission: setting up (images, the second cluster) waits for what others build.
        _wait("the training submitted", lambda: not flip.alive() or k.get_or_none(
            "jobset.x-k8s.io/v1alpha2", "jobsets", JOBSET_NAME, TRAINING_NS) is not None, timeout=600)
        # Served outside: every replica Ready on the virtual node and the flip-out's make-before-break surges
        # gone (nothing moves until the training ends).
        _wait("every inference replica Ready on the virtual node, no surge left", lambda: not flip.alive() or (
            k.get_or_none("jobset.x-k8s.io/v1alpha2", "jobsets", JOBSET_NAME, TRAINING_NS) is not None
            and (o := outside()) and len(o) == replicas() and all(_ready(p) for p in o) and not surges()),
              timeout=300)
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
                    "v1", "pods", labelSelector=f"{REMOTE_NODE_LABEL}={node}")["items"]
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


#: The controllers' log lines start with their UTC time (``logging``'s default ``asctime``).
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _lines_since(text: str, since: float) -> list[str]:
    """The lines of a controller log written at wall-clock ``since`` or later (a traceback goes with its record)."""
    out, after = [], False
    for line in text.splitlines():
        if m := _LOG_TIME.match(line):
            after = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").replace(
                tzinfo=dt.timezone.utc).timestamp() >= since
        if after:
            out.append(line)
    return out


def _kill_and_restart(local_cluster, component: str, down_seconds: float = 5.0) -> None:
    """SIGKILL the real node's ``component`` (its main process only, as a crash would), leave it down
    ``down_seconds``, then restart it the way ``invoke local.up`` does."""
    pidfile = local_cluster.cluster.layout.pid(component)
    pid = running(pidfile)
    assert pid is not None, f"{component} is not running"
    os.kill(pid, signal.SIGKILL)
    _wait(f"{component} gone", lambda: running(pidfile) is None, timeout=30, interval=0.1)
    killed = time.monotonic()
    time.sleep(down_seconds)  # the outage itself
    local.up(local_cluster.name, env="local", timeout=300)
    assert running(pidfile) not in (None, pid)
    print(f"{component} killed, back after {time.monotonic() - killed:.1f}s")


def test_containerd_and_kubelet_killed_mid_flip_the_controllers_come_back_and_nothing_is_half_applied(
        local_cluster, tmp_path):
    k = local_cluster.kube
    # Deployed before the flip (as a stack would), so they outlive it and are checked after the restarts.
    objs = incluster.controller_objects(
        load("local", overrides=incluster.overrides(incluster.stack_config(local_cluster.cluster))), ["rental"])
    deps = incluster.deployments(objs)
    for ns in sorted({o["metadata"]["namespace"] for o in objs if o["metadata"].get("namespace")}):
        if k.get_or_none("v1", "namespaces", ns) is None:  # sim.flip's own objects come later
            k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    created = incluster.deploy(k, objs)
    flip = None
    try:
        incluster.wait_available(k, deps, timeout=300)
        before = {d: {p["metadata"]["uid"] for p in pods(k, *d)} for d in deps}
        flip = Flip(Options(env="local", cluster=local_cluster.name, pools=("rental",), duration=30, out=tmp_path, rate=0,
                            timeout=600))
        _wait("the training submitted", lambda: not flip.alive() or k.get_or_none(
            "jobset.x-k8s.io/v1alpha2", "jobsets", JOBSET_NAME, TRAINING_NS) is not None)
        for component in ("containerd", "kubelet"):
            _kill_and_restart(local_cluster, component)
        restarted = time.time()
        summary = flip.result()
        assert summary["seconds_to_served_outside"] is not None and summary["seconds_to_back_in_cluster"] is not None
        assert summary["min_ready_replicas"] >= summary["pdb_min_available"], summary

        # The controllers are back: Available, exactly their replicas (the same pods: nothing restarted them
        # as new pods), one Lease holder among them.
        incluster.wait_available(k, deps, timeout=300)
        for ns, name in deps:
            live = [p for p in pods(k, ns, name) if not p["metadata"].get("deletionTimestamp")]
            want = k.get("apps/v1", "deployments", name, ns)["spec"]["replicas"]
            assert len(live) == want and all(_ready(p) for p in live), incluster.pod_states(k, ns, name)
            assert {p["metadata"]["uid"] for p in live} == before[(ns, name)], f"{ns}/{name}: pods replaced"
            print(f"{ns}/{name}: container restarts {[c['restartCount'] for p in live for c in p['status']['containerStatuses']]}")
        names = [p["metadata"]["name"] for p in pods(k, NS, "taint-controller")]
        assert sum(n in _holder(k) for n in names) == 1, (_holder(k), names)

        # No 403 and no traceback once the node is back.
        for ns, name in deps:
            for pod, text in incluster.logs(k, ns, name).items():
                lines = "\n".join(_lines_since(text, restarted))
                assert " 403" not in lines and "Forbidden" not in lines and "Traceback" not in lines, \
                    f"{ns}/{pod} after the restarts:\n{lines[-3000:]}"

        # Nothing half-applied: the virtual node carries the taint exactly as the controller last decided.
        decided = incluster.transitions(list(incluster.logs(k, NS, "taint-controller").values()), 0.0)
        assert decided, "the taint controller logged no transition"
        node = k.get("v1", "nodes", node_name_for("rental"))
        tainted = any(t["key"] == FREE_GPUS_TAINT for t in node["spec"].get("taints") or [])
        assert tainted == decided[-1].tainted, (decided[-1], node["spec"].get("taints"))
    finally:
        if flip is not None and flip.alive():
            flip.thread.join(900)
        incluster.remove(k, created)
        incluster.orphan_virtual_nodes(k, load("local"))
