"""``invoke sim.flip``: the whole flip on the local cluster, recorded second by second.

What it does (:func:`run`):

1. Starts (or completes) the local cluster ``cluster`` with ``nodes`` GPU
   nodes and the descheduler running the descheduler role's policy, gated
   on the flip-back release label (:func:`gated_policy`); starts the second
   cluster for every ``kubernetes`` pool (named after the pool, as
   ``invoke local.up --name other`` does) with enough nodes for the pool,
   and stores its kubeconfig (reachable from the real node's pods) in the
   pool's Secret.
2. Applies the kueue role's queues and priority classes and the inference
   role's Deployment, HPA and PodDisruptionBudget (``replicas`` replicas),
   from the inventory. The training PriorityClass gets
   ``preemptionPolicy: Never`` (the flip-out preempts for it, PDB-respecting;
   see ``src/gpufleet/taint_controller/README.md``).
3. Uses the taint controller (with flip-out and flip-back) and one virtual
   kubelet per pool as production runs them: the roles' Deployments, from
   gpufleet's image, on the cluster's real node (:mod:`gpufleet_workshop.sim.incluster`).
   Those a stack deployed (``invoke up --env local``, the demo) are used as
   they are; missing ones are applied here and removed at the end (unless
   ``keep``). Waits until they are Available, inference is Ready in-cluster
   and the virtual nodes are tainted. The timeline's transitions come from
   the taint controller's log (the kubelet serves it).
4. Submits a JobSet through Kueue (LocalQueue of the ``training`` cluster
   queue, PriorityClass ``gpufleet-training``, the highest
   WorkloadPriorityClass) with one 8-GPU pod per node: every GPU. Its pods
   run until ``duration`` seconds after the last one started, then end
   together, as a gang does: the simulation then sets
   ``gpufleet.io/simulated-duration-seconds: "0"`` on all of them and kwok
   makes them Succeed.
5. Samples the cluster every second until inference is back in-cluster
   (or ``timeout``), then writes ``timeline.json``, ``flip.png`` and
   ``summary.json`` to ``out``, and the controllers' logs to ``out/logs/``
   (``<pod>.log``: a restarted container's previous log first), and returns
   the summary.

Summary (``summary.json``, exactly these keys):

* ``seconds_to_served_outside``: from the submission to every inference
  replica Ready outside the cluster;
* ``seconds_to_back_in_cluster``: from the training's end (its last pod
  finished) to every replica Ready in-cluster and none outside;
* ``min_ready_replicas``: fewest Ready inference replicas at any sample
  from the submission to the end;
* ``pdb_min_available``: the PodDisruptionBudget's minAvailable (under a
  maxUnavailable budget, the fewest Ready replicas it allows: replicas less
  maxUnavailable scaled up, as the disruption controller scales it);
* ``external_gpu_seconds_after_training``: GPU-seconds held on virtual
  nodes by inference after the training's end;
* ``external_gpu_seconds_during_flip``: GPU-seconds held on virtual nodes
  by inference from the submission until inference is back in-cluster;
* ``external_gpu_cost_during_flip``: their cost, each virtual node's
  GPU-seconds / 3600 x its pool's ``price_per_gpu_hour`` (USD, as the
  inventory prices pools), and ``external_gpu_cost_during_flip_by_pool``:
  ``{pool: cost}``; the virtual kubelets count the same in production
  (``gpufleet_flip_external_gpu_cost_total``, :mod:`gpufleet.virtual_kubelet.ledger`).

* ``controllers``: what gpufleet's own controllers cost while the run was
  metered (from the controllers' Available to the end,
  :mod:`gpufleet_workshop.sim.meter`): per Deployment (``taint-controller``,
  ``vk-<pool>``) ``rss_max_mib`` and ``cpu_seconds``, and the taint
  controller's ``tick_cpu_ms_p50``, ``tick_cpu_ms_p99`` (its tick's own
  threads), ``tick_process_cpu_ms_p50``, ``tick_process_cpu_ms_p99`` (the
  whole process during a tick, watch decoding included) and ``ticks``; with
  the figures the fleet-size goals name flat beside it:
  ``taint_controller_tick_cpu_ms_p99``,
  ``taint_controller_tick_process_cpu_ms_p99``,
  ``taint_controller_rss_max_mib`` and ``virtual_kubelet_rss_max_mib`` (the
  largest of the pools').

* ``seconds_hpa_scale_up_lag_outside`` and ``seconds_hpa_scale_down_lag_outside``
  (with ``load_step``; None without): how many seconds longer the inference
  HPA took to follow a load step up, and back down, with every replica
  outside than with every replica in-cluster
  (:mod:`gpufleet_workshop.sim.loadstep`; each step's own figures are in
  ``timeline.json``'s ``load_steps``, and the chart marks where each began).

* ``seconds_provider_start_p50_by_pool``, ``seconds_provider_start_max_by_pool``
  and ``seconds_slowest_provider_start_p50`` (:func:`provider_start_times`):
  how long each pool's provider took to start the inference pods bound to
  it, as the cluster saw it; the fleet-size goal bounds
  ``seconds_training_waited_for_flip`` by the slowest of them plus 60 s.
  ``seconds_outside_pod_bind_p50`` and ``seconds_outside_pod_bind_max``
  (:func:`outside_bind_times`): how long the inference pods that went
  outside waited from their creation to their binding to a virtual node
  (kube-scheduler's queue, which serves the training gang's higher-priority
  pods first): the part of a replacement's start that is neither the
  provider's nor gpufleet's.

* ``seconds_training_pods_created``, ``seconds_training_pod_waited_max``
  and ``seconds_training_bound_on_free_nodes`` (:func:`training_pod_times`):
  how ``seconds_training_waited_for_flip`` splits between the Job
  controller creating the training pods, the scheduler placing them (the
  last pod bound on a node inference did not hold: what the gang would
  have waited with no flip at all) and the flip freeing nodes for the rest.

The other keys (``flip_mode``, ``serving_capacity_min_ratio``,
``seconds_training_waited_for_flip``, the request figures) are described at
:func:`summarize` and :func:`gpufleet_workshop.sim.serving.summarize`.

Errors: :class:`SimError` (a phase did not finish in time; the message says
which and what the cluster looked like; the timeline is still written).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.taint_controller.controller import Transition
from gpufleet.taint_controller.signal import ApiServerSignal, reservation_leads
from gpufleet.kube import Kube, KubeError, NotFound
from gpufleet.kube.validation import IMMUTABLE_SELECTOR_KINDS
from gpufleet.kube.times import parse_time
from gpufleet.names import (FIELD_MANAGER_SIM, FLIP_MODES, FREE_GPUS_TAINT, GPU_RESOURCE, KUEUE_PRIORITY_LABEL,
                            KUEUE_QUEUE_LABEL, RELEASE_LABEL, RESERVED_TAINT, SIMULATED_DURATION_ANNOTATION,
                            WORKLOAD_LABEL, WORKLOAD_TRAINING)
from gpufleet_workshop.local.dataplane import netns_name as dataplane_name
from gpufleet_workshop.local.node import node_name as real_node_name
from gpufleet_workshop.local import workshop_image
from gpufleet_workshop.sim import incluster, loadstep, serving
from gpufleet_workshop.sim.meter import ControllerMeter
from gpufleet.virtual_kubelet.node import node_name_for
from gpufleet.wait import PollTimeout, poll_until

log = logging.getLogger(__name__)

#: The load step's figures (None without ``--load-step``): :func:`gpufleet_workshop.sim.loadstep.summary_keys`.
LOAD_STEP_KEYS = ("seconds_hpa_scale_up_lag_outside", "seconds_hpa_scale_down_lag_outside")
#: The request figures (None when no requests were sent: ``--rate 0``).
REQUEST_KEYS = ("requests_total", "requests_failed", "latency_p99_ms_steady", "latency_p99_ms_flip")
SUMMARY_KEYS = ("seconds_to_served_outside", "seconds_to_back_in_cluster", "min_ready_replicas", "pdb_min_available",
                "external_gpu_seconds_after_training", "flip_mode", "serving_capacity_min_ratio",
                "seconds_training_waited_for_flip", "seconds_training_pods_created", "seconds_training_pod_waited_max",
                "seconds_training_bound_on_free_nodes",
                "external_gpu_seconds_during_flip", "external_gpu_cost_during_flip",
                "external_gpu_cost_during_flip_by_pool", *REQUEST_KEYS, "taint_controller_tick_cpu_ms_p99",
                "taint_controller_tick_process_cpu_ms_p99", "taint_controller_rss_max_mib", "virtual_kubelet_rss_max_mib",
                *LOAD_STEP_KEYS, "seconds_provider_start_p50_by_pool", "seconds_provider_start_max_by_pool",
                "seconds_slowest_provider_start_p50", "seconds_outside_pod_bind_p50", "seconds_outside_pod_bind_max",
                "controllers")
#: The keys of the summary tables (``controllers``, a nested figure, has lines of its own).
TABLE_KEYS = tuple(k for k in SUMMARY_KEYS if k != "controllers")
JOBSET_NAME = "gpufleet-sim-flip"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_SELECTOR = f"{JOBSET_NAME_LABEL}={JOBSET_NAME}"

#: What the simulation applies of the kueue role.
QUEUE_KINDS = {"Namespace", "PriorityClass", "WorkloadPriorityClass", "Topology", "ResourceFlavor", "ClusterQueue",
               "LocalQueue"}


class SimError(RuntimeError):
    """A phase of the simulation did not complete in time (the message says which and the last sample)."""


# ------------------------------------------------------------------------------- objects


def gated_policy(inv) -> dict:
    """The descheduler role's policy, with DefaultEvictor limited to pods the flip-back released.

    The label selector makes the descheduler evict only pods labelled
    ``gpufleet.io/flip-back=released``; the flip-back budget decides which.
    """
    from roles.descheduler.manifests import policy

    pol = policy(inv)
    for profile in pol["profiles"]:
        for pc in profile["pluginConfig"]:
            if pc["name"] == "DefaultEvictor":
                pc.setdefault("args", {})["labelSelector"] = {"matchLabels": {RELEASE_LABEL[0]: RELEASE_LABEL[1]}}
    return pol


def training_priority_class(objs: list[dict]) -> list[dict]:
    """The kueue role's objects with ``preemptionPolicy: Never`` on the highest PriorityClass (training)."""
    pcs = [o for o in objs if o["kind"] == "PriorityClass"]
    top = max(pcs, key=lambda o: o["value"]) if pcs else None
    if top is not None:
        top["preemptionPolicy"] = "Never"
    return objs


def jobset(name: str, namespace: str, queue: str, nodes: int, gpus_per_node: int, duration: float | None,
           priority_class: str, workload_priority_class: str | None) -> dict:
    """A JobSet of ``nodes`` pods, each asking for a whole node's GPUs, in the training template's shape.

    As ``templates/training/jobset.yaml.j2``: one replicated Job, Indexed,
    ``parallelism`` = ``completions`` = ``nodes``. The shape matters at
    scale: a thousand one-pod Jobs cost the Job and JobSet controllers a
    thousand objects to create and keep the status of, where one indexed
    Job creates its pods in batches.

    ``duration``: seconds each pod runs (kwok), or None to run until
    :func:`finish_training` ends them all at once.
    """
    labels = {KUEUE_QUEUE_LABEL: queue}
    if workload_priority_class:
        labels[KUEUE_PRIORITY_LABEL] = workload_priority_class
    annotations = {SIMULATED_DURATION_ANNOTATION: f"{duration:g}"} if duration is not None else {}
    pod = {
        "metadata": {"annotations": annotations, "labels": {WORKLOAD_LABEL: WORKLOAD_TRAINING}},
        "spec": {
            "restartPolicy": "Never",
            "priorityClassName": priority_class,
            # As the training templates: Kueue's topology-aware node controller judges taints by the
            # Workload's pod template, so the GPU taint and the flip-out's reservation are tolerated here.
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
                            {"key": RESERVED_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "trainer", "image": "registry.invalid/gpufleet/trainer:sim",
                            "resources": {"requests": {GPU_RESOURCE: str(gpus_per_node), "cpu": "8", "memory": "64Gi"},
                                          "limits": {GPU_RESOURCE: str(gpus_per_node)}}}],
        },
    }
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {
                "spec": {"completionMode": "Indexed", "parallelism": nodes, "completions": nodes, "backoffLimit": 0,
                         "template": pod}}}]}}


def training_pod_times(pods: list[dict], submitted: float,
                       inference_nodes: frozenset[str] | set[str] = frozenset()) -> dict[str, float | None]:
    """How the training's wait splits, from its pods (``[Pod]``) and the submission (``submitted``, Unix seconds).

    ``seconds_training_pods_created``: the submission to the last pod's
    creation (Kueue's admission, JobSet's Jobs and the Job controller's
    pace: not the flip's). ``seconds_training_pod_waited_max``: the longest
    any pod waited from its creation to its binding (its ``PodScheduled``
    condition True): what the flip cost a pod once it existed, with the
    scheduler's own pace. ``seconds_training_bound_on_free_nodes``: the
    submission to the last binding of a pod on a node not in
    ``inference_nodes`` (the nodes inference held at the submission): the
    gang's own pace, admission to placement, that no flip changes (a pod's
    ``kubernetes.io/hostname`` selector does not narrow kube-scheduler's
    NodeAffinity PreFilter, which narrows on ``metadata.name`` fields only,
    so each pod's filtering visits every node). The API's times have a
    resolution of one second. None for a figure no pod gives.
    """
    created, waited, free_bound = [], [], []
    for p in pods:
        born = parse_time(p["metadata"].get("creationTimestamp"))
        if born is None:
            continue
        created.append(born)
        bound = next((parse_time(c.get("lastTransitionTime")) for c in (p.get("status") or {}).get("conditions") or []
                      if c.get("type") == "PodScheduled" and c.get("status") == "True"), None)
        if bound is not None:
            waited.append(max(0.0, bound - born))
            if (p.get("spec") or {}).get("nodeName") not in inference_nodes:
                free_bound.append(bound)
    return {"seconds_training_pods_created": round(max(created) - submitted, 1) if created else None,
            "seconds_training_pod_waited_max": round(max(waited), 1) if waited else None,
            "seconds_training_bound_on_free_nodes": round(max(free_bound) - submitted, 1) if free_bound else None}


def finish_training(kube: Kube, namespace: str, name: str = JOBSET_NAME) -> int:
    """End every running pod of JobSet ``name`` now (duration annotation 0: kwok makes them Succeed); returns how many."""
    from concurrent.futures import ThreadPoolExecutor

    items = kube.list("v1", "pods", namespace, labelSelector=f"{JOBSET_NAME_LABEL}={name}")["items"]
    running = [p["metadata"]["name"] for p in items if (p.get("status") or {}).get("phase") == "Running"]

    def end(pod: str) -> None:
        kube.patch("v1", "pods", pod, {"metadata": {"annotations": {SIMULATED_DURATION_ANNOTATION: "0"}}}, namespace)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(end, running))
    return len(running)


# ------------------------------------------------------------------------------- recording


@dataclass
class Sample:
    """One second of the flip (GPUs, pods; ``t`` in seconds since the start)."""

    t: float
    training_gpus: int
    training_pods_running: int
    training_pods_started: int
    training_pods_finished: int
    inference_ready: int
    inference_ready_in_cluster: int
    inference_ready_outside: dict[str, int]
    inference_gpus_in_cluster: int
    inference_gpus_outside: dict[str, int]
    tainted: dict[str, bool]
    reserved_nodes: int
    pending_pods: int
    free_gpus: float | None


@dataclass
class Recorder:
    """Samples the node and pod caches (those the taint controller reads) once per ``interval`` seconds in a thread."""

    caches: ApiServerSignal
    inference_ns: str
    training_ns: str
    virtual_nodes: list[str]
    interval: float = 1.0
    t0: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    started: set[str] = field(default_factory=set)
    #: ``(virtual node, seconds)`` of each inference pod seen bound outside and not Ready, then Ready.
    starts_outside: list[tuple[str, float]] = field(default_factory=list)
    #: Seconds from each inference pod's creation to its binding to a virtual node, for pods seen unbound first.
    binds_outside: list[float] = field(default_factory=list)
    _bound_outside: dict[str, tuple[str, float] | None] = field(default_factory=dict)
    _unbound: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> Sample:
        """Take one sample now from the watch caches."""
        caches = self.caches
        nodes = {n["name"]: n for n in caches.nodes.items()}
        pods = caches.pods.items()
        virtual = {n for n, v in nodes.items() if v["virtual"]}
        tr_gpus = tr_run = 0
        ready_in = gpus_in = 0
        ready_out: dict[str, int] = {n: 0 for n in self.virtual_nodes}
        gpus_out: dict[str, int] = {n: 0 for n in self.virtual_nodes}
        pending = 0
        now = round(time.monotonic() - self.t0, 2)
        wall = time.time()
        for p in pods:
            ns = p["metadata"]["namespace"]
            if not p["node"]:
                pending += 1
                if ns == self.inference_ns:
                    self._unbound.add(p["metadata"]["uid"])
                continue
            if ns == self.training_ns and p["phase"] == "Running":
                tr_gpus += p["gpus"]
                tr_run += 1
                self.started.add(p["metadata"]["uid"])
            elif ns == self.inference_ns and not p["metadata"].get("deletionTimestamp"):
                outside = p["node"] in virtual
                if outside:
                    gpus_out[p["node"]] = gpus_out.get(p["node"], 0) + p["gpus"]
                    self._start_outside(p, now)
                self._bound(p, wall, outside)
                if not outside:
                    gpus_in += p["gpus"]
                if p["ready"]:
                    if outside:
                        ready_out[p["node"]] = ready_out.get(p["node"], 0) + 1
                    else:
                        ready_in += 1
        tainted = {n: any(t.get("key") == FREE_GPUS_TAINT for t in nodes[n]["taints"]) for n in self.virtual_nodes
                   if n in nodes}
        reserved = sum(bool(reservation_leads(n)) for n in nodes.values())
        # A training pod seen Running that left the cache of non-terminal pods has finished.
        present = {p["metadata"]["uid"] for p in pods}
        finished = len(self.started - present)
        return Sample(round(time.monotonic() - self.t0, 2), tr_gpus, tr_run, len(self.started), finished, ready_in + sum(ready_out.values()), ready_in,
                      ready_out, gpus_in, gpus_out, tainted, reserved, pending, caches.value())

    def _start_outside(self, p: dict, now: float) -> None:
        """Time the provider's start of inference pod ``p`` (bound outside) from when a sample first saw it
        bound and not Ready to when one first saw it Ready (1 s resolution); a pod first seen Ready is not timed."""
        uid = p["metadata"]["uid"]
        if uid not in self._bound_outside:
            self._bound_outside[uid] = None if p["ready"] else (p["node"], now)
        elif p["ready"] and self._bound_outside[uid] is not None:
            node, since = self._bound_outside[uid]
            self.starts_outside.append((node, round(now - since, 2)))
            self._bound_outside[uid] = None

    def _bound(self, p: dict, wall: float, outside: bool) -> None:
        """Inference pod ``p`` is bound, first seen so at ``wall`` (Unix seconds; 1 s sampling): ``outside``, time
        how long it waited from its creation (its creationTimestamp, 1 s resolution) to its binding; once, and
        only for a pod a sample saw unbound (one already bound when sampling began is not timed). Either way
        it is no longer followed."""
        uid = p["metadata"]["uid"]
        if uid in self._unbound:
            self._unbound.discard(uid)
            if outside and p["created"]:
                self.binds_outside.append(round(max(0.0, wall - p["created"]), 2))

    def run(self) -> None:
        """Sample until :meth:`stop`."""
        while not self._stop.is_set():
            began = time.monotonic()
            self.samples.append(self.sample())
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def start(self) -> "Recorder":
        """Run in a daemon thread; returns self."""
        threading.Thread(target=self.run, daemon=True, name="sim-recorder").start()
        return self

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()

    def last(self) -> Sample:
        """The latest sample (taking one if there is none)."""
        return self.samples[-1] if self.samples else self.sample()


def summarize(samples: list[Sample], *, submitted: float, replicas: int, pdb_min_available: int,
              training_pods: int, flip_mode: str = "", prices: dict[str, float] | None = None,
              ) -> tuple[dict[str, Any], dict[str, float | None]]:
    """The summary (:data:`SUMMARY_KEYS`) and the phase times from the samples (seconds since the start).

    ``serving_capacity_min_ratio``: fewest Ready inference pods (a surge
    replacement counts: it serves) over the desired replicas, from the
    training's submission to the end. ``seconds_training_waited_for_flip``:
    submission to every training pod started (Kueue admits at once here, so
    this is admission to running as the samples see it).
    ``external_gpu_seconds_during_flip``: GPUs of inference pods outside,
    integrated from the submission until inference is back in-cluster.
    ``external_gpu_cost_during_flip``: the same integral per virtual node
    times its pool's price, ``sum over pools of GPU-seconds / 3600 x
    price_per_gpu_hour`` (USD, rounded to 4 decimals), with
    ``external_gpu_cost_during_flip_by_pool`` (``{pool: cost}``, every pool
    of ``prices``).

    Args:
        prices: ``{pool: USD per GPU-hour}`` (inventory ``virtual_kubelet_pools``); the samples name
            virtual nodes, :func:`gpufleet.virtual_kubelet.node.node_name_for` of each pool. A virtual node of no pool
            here (another stack's) is left out of the cost, with a warning.

    Returns:
        ``(summary, phases)``; phases: ``submitted``, ``served_outside``,
        ``training_running`` (every pod started), ``training_end`` (every pod finished),
        ``back_in_cluster`` (None if never reached).
    """
    after = [s for s in samples if s.t >= submitted]
    served = next((s.t for s in after if sum(s.inference_ready_outside.values()) >= replicas), None)
    running = next((s.t for s in after if s.training_pods_started >= training_pods), None)
    end = next((s.t for s in after if s.training_pods_finished >= training_pods), None)
    back = None
    if end is not None:
        back = next((s.t for s in after if s.t >= end and s.inference_ready_in_cluster >= replicas
                     and sum(s.inference_ready_outside.values()) == 0 and sum(s.inference_gpus_outside.values()) == 0),
                    None)
    ext = _gpu_seconds_outside([s for s in after if s.t >= end]) if end is not None else 0.0
    flip = [s for s in after if back is None or s.t <= back]
    during = _gpu_seconds_outside(flip)
    by_pool = _cost_outside(flip, prices or {})
    summary = {
        "seconds_to_served_outside": None if served is None else round(served - submitted, 1),
        "seconds_to_back_in_cluster": None if back is None or end is None else round(back - end, 1),
        "min_ready_replicas": min((s.inference_ready for s in after), default=0),
        "pdb_min_available": pdb_min_available,
        "external_gpu_seconds_after_training": round(ext, 1),
        "flip_mode": flip_mode,
        "serving_capacity_min_ratio": round(min((s.inference_ready for s in after), default=0) / replicas, 3),
        "seconds_training_waited_for_flip": None if running is None else round(running - submitted, 1),
        "external_gpu_seconds_during_flip": round(during, 1),
        "external_gpu_cost_during_flip": round(sum(by_pool.values()), 4),
        "external_gpu_cost_during_flip_by_pool": {p: round(c, 4) for p, c in sorted(by_pool.items())},
    }
    phases = {"submitted": submitted, "served_outside": served, "training_running": running, "training_end": end,
              "back_in_cluster": back}
    return summary, phases


def provider_start_times(starts: list[tuple[str, float]], pools: list[str]) -> dict[str, Any]:
    """The providers' start latency as the cluster saw it, from :attr:`Recorder.starts_outside`.

    ``seconds_provider_start_p50_by_pool`` and ``..._max_by_pool``
    (``{pool: seconds}``, None for a pool that started no pod): from an
    inference pod first seen bound to the pool's virtual node to first seen
    Ready (the provider's start and the virtual kubelet's status update; 1 s
    sampling). ``seconds_slowest_provider_start_p50``: the largest of the
    pools' medians (the goal for the training's wait names the slowest
    provider's start latency). ``pools``: the pool names of this run.
    """
    pool_of = {node_name_for(p): p for p in pools}
    by_pool: dict[str, list[float]] = {p: [] for p in pools}
    for node, seconds in starts:
        if node in pool_of:
            by_pool[pool_of[node]].append(seconds)
    p50 = {p: round(statistics.median(v), 1) if v else None for p, v in by_pool.items()}
    return {"seconds_provider_start_p50_by_pool": p50,
            "seconds_provider_start_max_by_pool": {p: round(max(v), 1) if v else None for p, v in by_pool.items()},
            "seconds_slowest_provider_start_p50": max((v for v in p50.values() if v is not None), default=None)}


def outside_bind_times(binds: list[float]) -> dict[str, float | None]:
    """``seconds_outside_pod_bind_p50`` and ``seconds_outside_pod_bind_max`` from :attr:`Recorder.binds_outside`
    (seconds from an inference pod's creation to its binding to a virtual node); None when no pod was timed."""
    return {"seconds_outside_pod_bind_p50": round(statistics.median(binds), 1) if binds else None,
            "seconds_outside_pod_bind_max": round(max(binds), 1) if binds else None}


def _gpu_seconds_outside(samples: list[Sample]) -> float:
    """GPU-seconds of inference outside over consecutive ``samples`` (left Riemann sum)."""
    return sum(sum(a.inference_gpus_outside.values()) * (b.t - a.t) for a, b in zip(samples, samples[1:]))


def _cost_outside(samples: list[Sample], prices: dict[str, float]) -> dict[str, float]:
    """``{pool: cost}`` of inference outside over consecutive ``samples``: each virtual node's GPU-seconds (left
    Riemann sum, as :func:`_gpu_seconds_outside`) x its pool's price per GPU-hour / 3600 (:func:`gpufleet.virtual_kubelet.ledger.cost_of`).
    GPUs on a virtual node of no pool of ``prices`` are left out (logged once per node)."""
    from gpufleet.virtual_kubelet.ledger import cost_of

    pool_of = {node_name_for(p): p for p in prices}
    out = dict.fromkeys(prices, 0.0)
    unpriced: set[str] = set()
    for a, b in zip(samples, samples[1:]):
        for node, gpus in a.inference_gpus_outside.items():
            if not gpus:
                continue
            if node not in pool_of:
                if node not in unpriced:
                    unpriced.add(node)
                    log.warning("virtual node %s held %d GPUs but is no pool of this run (%s): left out of the cost",
                                node, gpus, ", ".join(sorted(prices)) or "none")
                continue
            out[pool_of[node]] += cost_of(gpus * (b.t - a.t), prices[pool_of[node]])
    return out


def plot(samples: list[Sample], phases: dict[str, float | None], path: Path, title: str, *,
         requests_per_second: dict[str, list[float]] | None = None) -> Path:
    """A PNG of GPU allocation by kind over time (training, inference in-cluster, inference per virtual node),
    with the taint flips and the phases marked; below, Ready replicas, and requests per second served in-cluster,
    outside and failed (``requests_per_second`` as :func:`gpufleet_workshop.sim.serving.per_second` gives it) on the same
    time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    vnodes = sorted({n for s in samples for n in s.inference_gpus_outside})
    series = [[s.training_gpus for s in samples], [s.inference_gpus_in_cluster for s in samples]]
    labels = ["training", "inference in-cluster"] + [f"inference on {n}" for n in vnodes]
    series += [[s.inference_gpus_outside.get(n, 0) for s in samples] for n in vnodes]
    if requests_per_second:
        fig, (ax, ax2, ax3) = plt.subplots(3, 1, figsize=(13, 8.5), sharex=True, gridspec_kw={"height_ratios": [3, 1, 1.5]})
    else:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(13, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.stackplot(t, *series, labels=labels, alpha=0.85)
    ax.set_ylabel("GPUs")
    ax.set_title(title)
    prev = None
    for s in samples:
        state = all(s.tainted.values()) if s.tainted else None
        if prev is not None and state != prev:
            ax.axvline(s.t, color="black", linestyle="--", linewidth=1)
            ax.text(s.t, ax.get_ylim()[1] * 0.97, " taint on" if state else " taint off", fontsize=8, va="top")
        prev = state
    for name, at in phases.items():
        if at is not None:
            ax2.axvline(at, color="grey", linestyle=":", linewidth=1)
            ax2.text(at, 0.2, f" {name.replace('_', ' ')}", fontsize=7, rotation=90, va="bottom")
    ax2.plot(t, [s.inference_ready for s in samples], label="inference Ready", color="tab:green")
    ax2.plot(t, [s.inference_ready_in_cluster for s in samples], label="Ready in-cluster", color="tab:orange")
    ax2.set_ylabel("replicas")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax2.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    last = ax2
    if requests_per_second:
        rps = requests_per_second
        ax3.stackplot(rps["t"], rps["in_cluster"], rps["outside"], labels=["served in-cluster", "served outside"],
                      colors=["tab:orange", "tab:purple"], alpha=0.8, step="post")
        ax3.plot(rps["t"], rps["failed"], color="red", label="failed", drawstyle="steps-post")
        ax3.set_ylabel("requests/s")
        ax3.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        last = ax3
    last.set_xlabel("seconds")
    fig.subplots_adjust(left=0.06, right=0.8, top=0.93, bottom=0.09, hspace=0.08)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------- the run


@dataclass
class Options:
    """Inputs of :func:`run` (units: nodes, replicas, seconds).

    Attributes:
        env: inventory environment; nodes: GPU nodes (None: the inventory's).
        replicas: inference replicas (None: the inventory's).
        duration: seconds the training runs once its last pod started.
        cluster: local cluster name; pools: pools to run (None: all of the inventory).
        out: output folder.
        timeout: seconds each phase may take.
        keep: leave the inference, the JobSet and the virtual nodes behind.
        mode: the flip-out mode (``make_before_break`` or ``evict_first``; None: the inventory's
            ``taint_controller_flip_mode``).
        rate: requests per second sent through the inference Service for the whole run (0: none; then
            inference runs on kwok's nodes and only Ready pods are counted).
        latency_ms: milliseconds the inference stand-in takes per request (None: 20, or
            :data:`~gpufleet_workshop.sim.loadstep.LATENCY_MS` with a load step).
        pdb_max_unavailable: the PodDisruptionBudget's maxUnavailable (pods or ``"10%"``) instead of the
            inventory's budget (None: the inventory's).
        pool_gpus: every pool's ``capacity_gpus`` instead of the inventory's (None: the inventory's): outside
            capacity for as many replicas as a fleet-size run moves.
        migration_pods_per_minute: ``descheduler_migration_pods_per_minute`` instead of the inventory's (the
            way back's pace; None: the inventory's).
        load_step: requests per second through the Service during each load step (:mod:`gpufleet_workshop.sim.loadstep`,
            above ``rate``; 0: no step); the HPA's scale-down window is then
            :data:`~gpufleet_workshop.sim.loadstep.STABILIZATION_SECONDS` unless the inventory sets one.
    """

    env: str = "local"
    nodes: int | None = None
    replicas: int | None = None
    duration: float = 30.0
    cluster: str = "gpufleet"
    pools: tuple[str, ...] | None = None
    out: Path = Path("out/sim-flip")
    timeout: float = 300.0
    keep: bool = False
    other_clusters: dict[str, str] = field(default_factory=dict)
    mode: str | None = None
    rate: float = 20.0
    latency_ms: float | None = None
    pdb_max_unavailable: int | str | None = None
    pool_gpus: int | None = None
    migration_pods_per_minute: float | None = None
    load_step: float = 0.0

    def overrides(self, base) -> dict[str, Any]:
        """Inventory overrides of these options (``load(env, overrides=...)``), from ``base``, the inventory
        without them."""
        out: dict[str, Any] = {}
        if self.pool_gpus is not None:
            out["virtual_kubelet_pools"] = [
                {**p.model_dump(mode="json", exclude_unset=True), "capacity_gpus": self.pool_gpus}
                for p in base.role("virtual_kubelet").virtual_kubelet_pools]
        if self.migration_pods_per_minute is not None:
            out["descheduler_migration_pods_per_minute"] = self.migration_pods_per_minute
        return out


#: The inference stand-in's milliseconds per request without a load step.
DEFAULT_LATENCY_MS = 20.0


def _wait(what: str, check: Callable[[], bool], timeout: float, rec: Recorder | None = None) -> None:
    try:
        poll_until(check, what=what, timeout=timeout, interval=0.5)
    except PollTimeout:
        state = json.dumps(rec.last().__dict__) if rec else ""
        raise SimError(f"timed out after {timeout:.0f}s waiting for {what}; last sample: {state}") from None


def use_descheduler_policy(cluster, policy: dict, timeout: float = 60.0) -> None:
    """Run the local cluster's descheduler with ``policy`` (it reads its policy file only at start).

    Writes the policy file and restarts the descheduler process (a second or
    two; cheaper than another ``local.up``, which does not restart a
    component whose command line is unchanged).

    Raises:
        gpufleet_workshop.local.processes.ComponentFailed: the descheduler did not come back healthy.
    """
    import yaml

    from gpufleet_workshop.local import processes

    path = cluster.layout.config / "descheduler-policy.yaml"
    spec = cluster.specs()["descheduler"]
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    processes.stop(spec.pidfile)
    processes.start(spec)
    processes.wait_healthy(spec, timeout)


def _up(name: str, specs: list, say, **kwargs):
    """The local cluster ``name`` with ``specs`` nodes, through ``local.up`` (idempotent: a cluster already up is
    completed, and its real node gets gpufleet's image anew when the image is out of date)."""
    from gpufleet_workshop.local import cluster as local

    # A stopped cluster restarts from empty state: kwok restarted on an old etcd can leave newly bound
    # pods Pending for minutes, and the simulation needs nothing from an earlier run.
    fresh = not local.main_pids(name)
    return local.up(name, specs=specs, log=lambda m: say(f"  {m}"), fresh=fresh, **kwargs)


def _apply_objects(kube: Kube, inv, pod_template: Callable[[dict], dict] | None = None) -> None:
    """The kueue role's queues and priorities (training's PriorityClass included) and the inference role's objects
    (Deployments' pod templates through ``pod_template`` when given)."""
    from roles.inference.manifests import objects as inference_objects
    from roles.kueue.manifests import objects as kueue_objects

    for obj in training_priority_class(kueue_objects(inv)):
        # Queues and priorities only: the kueue role's quota-sync controller objects belong to
        # the stack (`invoke up`), and applying them here would take their fields from it.
        if obj["kind"] not in QUEUE_KINDS:
            continue
        incluster.apply(kube, obj)
    for obj in inference_objects(inv):
        if pod_template is not None and obj["kind"] == "Deployment":
            obj["spec"]["template"] = pod_template(obj["spec"]["template"])
        incluster.apply(kube, keep_live_selector(kube, obj))


def keep_live_selector(kube: Kube, obj: dict) -> dict:
    """``obj`` with the selector of the live object of that name, where its kind's selector is immutable
    (:data:`gpufleet.kube.validation.IMMUTABLE_SELECTOR_KINDS`) and one exists: a Deployment an earlier
    release created keeps its selector, as the stack keeps it (``gpufleet_admin.stack.role.declare``),
    instead of the apply being refused."""
    if (obj["apiVersion"], obj["kind"]) not in IMMUTABLE_SELECTOR_KINDS:
        return obj
    try:
        live = kube.request("GET", kube.path_of(obj))
    except NotFound:
        return obj
    selector = (live.get("spec") or {}).get("selector")
    if not selector or selector == obj["spec"].get("selector"):
        return obj
    log.warning("%s %s/%s keeps its live selector %s (immutable), not this release's %s; to take it, delete the "
                "%s (every pod goes at once)", obj["kind"], obj["metadata"].get("namespace", ""),
                obj["metadata"]["name"], json.dumps(selector, sort_keys=True),
                json.dumps(obj["spec"].get("selector"), sort_keys=True), obj["kind"])
    return {**obj, "spec": {**obj["spec"], "selector": selector}}


def _start_controllers(kube: Kube, cluster, opts: Options, pools: list, say):
    """The roles' taint-controller and virtual-kubelet Deployments on the real node, Available, and the
    recorder's caches (started).

    A stack's Deployments are used as they are; missing ones are applied
    here (and removed after the run). Returns ``(objects, created, caches)``.
    """
    from roles.registry import load

    overrides = incluster.overrides(incluster.stack_config(cluster))
    overrides.update(opts.overrides(load(opts.env)))
    if opts.mode:
        overrides["taint_controller_flip_mode"] = opts.mode
    objs = incluster.controller_objects(load(opts.env, overrides=overrides), [p.name for p in pools])
    _check_mode(kube, objs)
    created = incluster.deploy(kube, objs)
    say(f"controllers in-cluster: {', '.join(n for _, n in incluster.deployments(objs))}"
        f" ({'deployed' if created else 'already there'}); waiting until Available")
    try:
        incluster.wait_available(kube, incluster.deployments(objs), opts.timeout)
    except BaseException:
        if not opts.keep:
            incluster.remove(kube, created)  # else a later run would take them for a stack's
        raise
    caches = ApiServerSignal(Kube(kube.config, user_agent="gpufleet-sim-recorder"))
    caches.start()
    return objs, created, caches

def run(opts: Options, *, console=None) -> dict[str, Any]:
    """Run the flip (module docstring); returns the summary dict.

    Raises:
        SimError: a phase timed out (timeline and plot are written anyway).
        gpufleet_admin.inventory.InventoryError: bad inventory; ValueError: bad options.
    """
    from rich.console import Console

    from roles.registry import load

    console = console or Console(stderr=True, highlight=False)
    say = console.print
    inv = load(opts.env, nodes=opts.nodes) if opts.nodes else load(opts.env)
    extra = opts.overrides(inv)
    if extra:
        inv = load(opts.env, nodes=opts.nodes, overrides=extra)
    nodes = len(inv.hosts)
    gpus_per_node = max(h.vars.gpu_count for h in inv.hosts.values())
    vk_vars = inv.role("virtual_kubelet")
    pools = [p for p in vk_vars.virtual_kubelet_pools if opts.pools is None or p.name in opts.pools]
    if opts.pools and {p.name for p in pools} != set(opts.pools):
        raise ValueError(f"--pools {','.join(opts.pools)}: known pools are "
                         f"{', '.join(p.name for p in vk_vars.virtual_kubelet_pools)}")
    if opts.rate > 0:
        # Requests need endpoints that answer: a kubernetes pool's pods run on its cluster's real node, a
        # simulated rental's instances are local processes only with instances: local_process.
        unreachable = [p.name for p in pools if p.provider != "kubernetes" and p.instances != "local_process"]
        if opts.pools and unreachable:
            raise ValueError(f"--pools {','.join(opts.pools)}: pool(s) {', '.join(unreachable)} (provider simulated, "
                             "instances none) have no endpoints requests can reach; with --rate use kubernetes pools "
                             "or simulated ones with instances: local_process, or --rate 0")
        pools = [p for p in pools if p.name not in unreachable]
        if not pools:
            raise ValueError(f"--rate {opts.rate:g}: the inventory {opts.env!r} has no pool whose pods can serve "
                             "requests outside; use --rate 0")
    inf = inv.role("inference")
    dep = inf.inference_deployments[0]
    replicas = opts.replicas or dep.replicas
    if replicas < 1:
        raise ValueError(f"--replicas {replicas}: expected at least 1")
    if opts.pdb_max_unavailable is not None:
        dep = dep.model_copy(update={"pdb_min_available": None, "pdb_max_unavailable": opts.pdb_max_unavailable})
    if dep.pdb_min_available is not None:
        dep = dep.model_copy(update={"pdb_min_available": min(dep.pdb_min_available, max(replicas - 1, 0))})
    if opts.load_step and opts.rate <= 0:
        raise ValueError(f"--load-step {opts.load_step:g}: a load step needs requests to step from; expected --rate "
                         "above 0, or leave --load-step out")
    if opts.load_step and opts.load_step <= opts.rate:
        raise ValueError(f"--load-step {opts.load_step:g}: expected requests per second above --rate {opts.rate:g} "
                         "(the step adds to the run's own stream), or 0 for no step")
    dep = dep.model_copy(update={"replicas": replicas, "min_replicas": replicas,
                                 "max_replicas": max(replicas, dep.max_replicas)})
    if opts.load_step and dep.scale_down_stabilization_seconds is None:
        dep = dep.model_copy(update={"scale_down_stabilization_seconds": loadstep.STABILIZATION_SECONDS})
    latency_ms = opts.latency_ms if opts.latency_ms is not None else (
        loadstep.LATENCY_MS if opts.load_step else DEFAULT_LATENCY_MS)
    if opts.load_step and dep.scale_on == "requests_in_flight":
        dep = dep.model_copy(update={"target_requests_in_flight": loadstep.target_in_flight(
            opts.rate, opts.load_step, latency_ms, replicas)})
    pdb = dep.pdb_floor(replicas)
    budget = (f"minAvailable {pdb}" if dep.pdb_min_available is not None
              else f"maxUnavailable {dep.pdb_max_unavailable}: {pdb} Ready at least")
    # With real serving every in-cluster replica runs on the real node: it stands in for as many GPU hosts as
    # the replicas' GPUs fill, so training needs all of it and the flip moves every replica. No spare: the way
    # back's replacement takes its pod's place (gpufleet.taint_controller.surge), one pod's GPUs at a time.
    real_gpus = gpus_per_node * math.ceil(replicas * dep.gpus_per_pod / gpus_per_node)
    if opts.rate > 0 and real_gpus // gpus_per_node >= nodes:
        raise ValueError(f"--replicas {replicas}: {replicas * dep.gpus_per_pod} GPUs of inference need "
                         f"{real_gpus // gpus_per_node} of the {nodes} GPU nodes; expected more --nodes")
    inv.roles["inference"] = inf.model_copy(update={"inference_deployments": [dep]})
    kq = inv.role("kueue")
    training_cq = max(kq.kueue_cluster_queues, key=lambda q: q.share).name
    lq = next(q for q in kq.kueue_local_queues if q.cluster_queue == training_cq)
    training_pc = max(kq.kueue_priority_classes, key=lambda p: p.value).name
    wpc = max(kq.kueue_workload_priority_classes, key=lambda p: p.value).name if kq.kueue_workload_priority_classes else None
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)

    # 1. clusters
    policy = gated_policy(inv)
    say(f"[bold]sim.flip[/]: {nodes} nodes x {gpus_per_node} GPUs, {replicas} inference replicas "
        f"(PDB {budget}), pools {', '.join(p.name for p in pools)}")
    c = _up(opts.cluster, inv.node_specs(), say, env=opts.env, descheduler_policy=policy)
    use_descheduler_policy(c, policy)
    # KEDA queries the cluster's Prometheus from the real node's bridge, as the stack configures it.
    inv.roles["inference"] = inv.role("inference").model_copy(update={"inference_prometheus_url": c.in_cluster_prometheus})
    kube = Kube.from_kubeconfig(c.kubeconfig, user_agent="gpufleet-sim", field_manager=FIELD_MANAGER_SIM)
    pool_clusters = incluster.pool_clusters(kube, inv, pools, names=opts.other_clusters, say=say)

    # 2. objects (serving for real: stand-ins required on the real node or a virtual one)
    _cleanup(kube, lq.namespace, inf.inference_namespace, dep.name, incluster.orphan_virtual_nodes(kube, inv), fresh=True)
    _apply_objects(kube, inv, None if opts.rate <= 0 else lambda t: serving.standin_pod(
        t, image=workshop_image.reference(), real_node=real_node_name(c.name), latency_ms=latency_ms,
        cluster=opts.cluster))

    # 3. controllers: the roles' Deployments on the real node (a stack's when there, else applied here);
    # then the real nodes enlisted as GPU hosts (after: the GPU taint keeps new gpufleet pods off) and the data plane
    began = time.time()  # transitions logged before this belong to an earlier run
    objs, created, caches = _start_controllers(kube, c, opts, pools, say)
    setup = None
    if opts.rate > 0:
        say(f"real serving: real nodes offer GPUs, kube-proxy in {dataplane_name(opts.cluster)}, "
            f"{opts.rate:g} requests/s through Service {inf.inference_namespace}/{dep.name}")
        try:
            setup = serving.prepare(c, kube, inv, pool_clusters, pools, real_gpus // gpus_per_node, gpus_per_node)
        except BaseException:
            caches.stop()
            if not opts.keep:
                # Left behind, the next run would take this run's controllers for a stack's and keep them.
                incluster.remove(kube, created)
            raise
    vnodes = [node_name_for(p.name) for p in pools]
    meter = ControllerMeter(kube, incluster.deployments(objs)).start()
    rec = Recorder(caches, inf.inference_namespace, lq.namespace, vnodes).start()
    wall_t0 = time.time() - (time.monotonic() - rec.t0)
    transitions: list[Transition] = []
    submitted = None
    steps: dict[str, loadstep.Step] = {}
    step_requests: list = []

    def load_step(where: str) -> None:
        """One load step (module :mod:`~gpufleet_workshop.sim.loadstep`); its requests join the run's."""
        def start():
            return serving.start_stream(setup.dataplane, setup.url, opts.load_step - opts.rate,
                                        out / f"requests-load-step-{where}.jsonl")

        steps[where] = loadstep.run_step(
            kube, inf.inference_namespace, dep.name, replicas, where=where, start=start,
            stop=lambda stream: step_requests.extend(stream.stop()), timeout=opts.timeout,
            now=lambda: time.monotonic() - rec.t0, say=say, prometheus=f"http://127.0.0.1:{c.ports.prometheus}")
    pod_times: dict[str, float | None] | None = None
    try:
        say("waiting for inference Ready in-cluster and the virtual nodes tainted")
        _wait("inference Ready in-cluster with the virtual nodes tainted",
              lambda: (s := rec.last()).inference_ready_in_cluster >= replicas and s.tainted and all(s.tainted.values()),
              opts.timeout, rec)
        if setup is not None:
            svc = kube.get("v1", "services", dep.name, inf.inference_namespace)
            setup.url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/"
            serving.wait_serving(setup.dataplane, setup.url, opts.timeout)
            setup.stream = serving.start_stream(setup.dataplane, setup.url, opts.rate, out / "requests.jsonl")
            time.sleep(min(30.0, max(5.0, 200 / opts.rate)))  # a steady state to compare the flip with (~200 requests)
            if opts.load_step:
                load_step("in_cluster")
                # The training then finds the cluster as a run without a step does: the step's extra replicas
                # gone, not only terminating (a terminating pod still holds its GPUs while it drains).
                _wait("the step's extra replicas gone", lambda: rec.last().inference_ready_in_cluster == replicas
                      and sum(p["metadata"]["namespace"] == inf.inference_namespace
                              for p in caches.pods.items()) == replicas, opts.timeout, rec)
        # 4. training
        submitted = rec.last().t
        inference_nodes = {p["node"] for p in caches.pods.items()
                           if p["metadata"]["namespace"] == inf.inference_namespace and p["node"]}
        say(f"t={submitted:.0f}s submitting JobSet {lq.namespace}/{JOBSET_NAME}: {nodes} x {gpus_per_node} GPUs for "
            f"{opts.duration:g}s via LocalQueue {lq.name}")
        js = jobset(JOBSET_NAME, lq.namespace, lq.name, nodes, gpus_per_node, None, training_pc, wpc)
        if setup is not None:
            pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            container, volume = serving.trainer_container(pod["spec"]["containers"][0], setup.image, opts.cluster)
            pod["spec"]["containers"] = [container]
            pod["spec"]["volumes"] = [volume]
        incluster.apply(kube, js)
        _wait("every training pod started", lambda: rec.last().training_pods_started >= nodes, opts.timeout, rec)
        try:
            pod_times = training_pod_times(kube.list("v1", "pods", lq.namespace, labelSelector=JOBSET_SELECTOR)["items"],
                                           wall_t0 + submitted, inference_nodes)
        except KubeError as exc:  # a figure lost, not the run
            log.warning("training pods' times: %s", exc)
        say(f"t={rec.last().t:.0f}s every training pod started; training holds {rec.last().training_gpus} GPUs; "
            f"inference Ready outside: {rec.last().inference_ready_outside}")
        training_began = time.monotonic()
        if opts.load_step and setup is not None:
            # Every replica outside, none left in-cluster: Ready replacements outside are there before the pods
            # they replace have gone, and the HPA counts those pods until they do.
            _wait("every inference replica Ready outside and none in-cluster",
                  lambda: sum((s := rec.last()).inference_ready_outside.values()) >= replicas
                  and s.inference_ready_in_cluster == 0 and s.inference_gpus_in_cluster == 0, opts.timeout, rec)
            load_step("outside")
        time.sleep(max(0.0, opts.duration - (time.monotonic() - training_began)))
        if setup is not None:
            serving.write_end_file(opts.cluster)
        say(f"t={rec.last().t:.0f}s ending the training ({finish_training(kube, lq.namespace)} pods)")
        _wait("the training to finish", lambda: rec.last().training_pods_finished >= nodes, opts.timeout, rec)
        say(f"t={rec.last().t:.0f}s training finished; waiting for inference to come back in-cluster")
        _wait("inference back in-cluster", lambda: (s := rec.last()).inference_ready_in_cluster >= replicas
              and sum(s.inference_ready_outside.values()) == 0 and sum(s.inference_gpus_outside.values()) == 0,
              opts.timeout, rec)
        time.sleep(2)
    finally:
        reqs = sorted(serving.finish(setup) + step_requests, key=lambda r: r.t) if setup is not None else None
        rec.stop()
        meter.stop()
        caches.stop()
        logs = save_logs(kube, incluster.deployments(objs), out / "logs")
        transitions = incluster.transitions(list(logs.get("taint-controller", {}).values()), wall_t0, since=began)
        mode = _flip_mode(_config_map(objs))
        summary, phases = _write_results(out, opts, rec.samples, transitions, submitted, nodes=nodes,
                                         gpus_per_node=gpus_per_node, replicas=replicas, pdb=pdb, pools=pools,
                                         mode=mode, requests=reqs, wall_t0=wall_t0, controllers=meter.figures(),
                                         pod_times=pod_times, steps=steps, starts=rec.starts_outside,
                                         binds=rec.binds_outside,
                                         in_cluster_nodes=setup.in_cluster_nodes if setup else set())
        if not opts.keep:
            # What this run deployed goes (its virtual kubelets first, then their nodes); a stack's controllers stay.
            incluster.remove(kube, created)
            _cleanup(kube, lq.namespace, inf.inference_namespace, dep.name,
                     [node_name_for(n.removeprefix("vk-")) for _, n in created if n.startswith("vk-")])
        # The clusters (this one and the pools' second ones) stay up: `invoke local.down [--name]` stops them.
    _print_summary(console, summary, phases, transitions)
    return summary


#: The taint controller's ConfigMap (its configuration file, roles/taint_controller): where its flip mode is.
TC_CONFIG = "taint-controller-config"


def _flip_mode(config_map: dict | None) -> str:
    """The ``flip_mode`` of a taint controller's configuration, from its ConfigMap ("" without one)."""
    if config_map is None:
        return ""
    from gpufleet.componentconfig import parse
    from gpufleet.taint_controller.config import KIND, Configuration
    from gpufleet_admin.manifests import CONFIG_FILE

    return parse(config_map["data"][CONFIG_FILE], Configuration, KIND, TC_CONFIG).flip_mode


def _config_map(objs: list[dict]) -> dict | None:
    """The taint controller's ConfigMap among ``objs`` (None when the role declares none)."""
    return next((o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == TC_CONFIG), None)


def _check_mode(kube: Kube, objs: list[dict]) -> None:
    """Refuse a run whose flip mode differs from that of a taint controller a stack already runs.

    Raises:
        ValueError: names the mode asked for, the one running, and what to do.
    """
    want = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "taint-controller")
    ns = want["metadata"]["namespace"]
    live = kube.get_or_none("apps/v1", "deployments", "taint-controller", ns)
    if live is None or live["metadata"].get("deletionTimestamp"):
        return
    running, asked = _flip_mode(kube.get_or_none("v1", "configmaps", TC_CONFIG, ns)), _flip_mode(_config_map(objs))
    if running != asked:
        raise ValueError(f"--mode {asked}: the taint controller deployed in {ns} runs flip_mode {running or '(none)'}; "
                         f"run `invoke up` with taint_controller_flip_mode={asked} or leave --mode out")


def check_both(opts: Options, kube: Kube | None = None) -> None:
    """Refuse ``--mode both`` before its first run when a taint controller a stack deployed runs one flip mode:
    the other run would stop at :func:`_check_mode` after the first one took its minutes.

    Args:
        kube: the cluster's client (default: local cluster ``opts.cluster``'s when it runs; none running,
            nothing is deployed there and both runs can go).

    Raises:
        ValueError: names the mode the deployed controller runs and what to do.
    """
    from roles.registry import load

    if kube is None:
        from gpufleet_workshop.local import cluster as local

        if not local.main_pids(opts.cluster):
            return
        kube = Kube.from_kubeconfig(local.get(opts.cluster).kubeconfig, user_agent="gpufleet-sim")
    for mode in FLIP_MODES:
        objs = incluster.controller_objects(load(opts.env, overrides={"taint_controller_flip_mode": mode}), [])
        try:
            _check_mode(kube, objs)
        except ValueError as exc:
            raise ValueError(f"--mode both: {exc}") from None


def _write_results(out: Path, opts: Options, samples: list, transitions: list, submitted: float | None, *, nodes: int,
                   gpus_per_node: int, replicas: int, pdb: int, pools: list, mode: str = "",
                   requests: list | None = None, wall_t0: float = 0.0,
                   in_cluster_nodes: set[str] = frozenset(),
                   controllers: dict[str, dict[str, Any]] | None = None,
                   pod_times: dict[str, float | None] | None = None,
                   steps: dict[str, loadstep.Step] | None = None,
                   starts: list[tuple[str, float]] | None = None,
                   binds: list[float] | None = None) -> tuple[dict[str, Any], dict[str, float | None]]:
    """Summarise the samples (and the ``requests`` sent, :mod:`gpufleet_workshop.sim.traffic`; None when none were;
    the load ``steps`` run, :mod:`gpufleet_workshop.sim.loadstep`); write ``timeline.json``, ``flip.png`` (when
    sampled) and ``summary.json`` in ``out``.

    Returns ``(summary, phases)`` as :func:`summarize` does.
    """
    summary, phases = summarize(samples, submitted=submitted if submitted is not None else 0.0, replicas=replicas,
                                pdb_min_available=pdb, training_pods=nodes, flip_mode=mode,
                                prices={p.name: p.price_per_gpu_hour for p in pools})
    rps = None
    if requests is not None:
        flip_to = phases["back_in_cluster"] or (samples[-1].t if samples else None)
        figures = serving.summarize(requests, wall_t0=wall_t0, flip_from=submitted, flip_to=flip_to,
                                    in_cluster_nodes=in_cluster_nodes)
        summary.update({k: figures[k] for k in REQUEST_KEYS})
        rps = serving.per_second(requests, wall_t0=wall_t0, in_cluster_nodes=in_cluster_nodes)
    else:
        summary.update(dict.fromkeys(REQUEST_KEYS))
    summary.update(controller_keys(controllers or {}))
    summary.update(pod_times or training_pod_times([], 0.0))
    summary.update(loadstep.summary_keys(steps or {}))
    summary.update(provider_start_times(starts or [], [p.name for p in pools]))
    summary.update(outside_bind_times(binds or []))
    summary = {k: summary[k] for k in SUMMARY_KEYS}
    phases.update({f"load_step_{w}": st.started_at for w, st in (steps or {}).items()})
    timeline = {"nodes": nodes, "gpus_per_node": gpus_per_node, "replicas": replicas, "pdb_min_available": pdb,
                "pools": [p.name for p in pools], "duration_seconds": opts.duration, "phases": phases,
                "request_rate": opts.rate if requests is not None else 0, "requests_per_second": rps,
                "transitions": [t.__dict__ for t in transitions],
                "load_steps": {w: st.__dict__ for w, st in (steps or {}).items()},
                "samples": [s.__dict__ for s in samples]}
    (out / "timeline.json").write_text(json.dumps(timeline, indent=1))
    if samples:
        plot(samples, phases, out / "flip.png", f"gpufleet flip ({mode or 'mode unknown'}): {nodes} nodes, "
             f"{replicas} inference replicas", requests_per_second=rps)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary, phases


def save_logs(kube: Kube, deployments: list[tuple[str, str]], folder: Path) -> dict[str, dict[str, str]]:
    """Write the log of each pod of ``deployments`` (``(namespace, name)``, the controllers) to
    ``folder/<pod>.log`` before the run removes them; returns Deployment name -> pod -> log."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for ns, name in deployments:
        out[name] = incluster.logs(kube, ns, name)
        for pod, text in out[name].items():
            (folder / f"{pod}.log").write_text(text)
    return out


def controller_keys(controllers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The summary's controller keys (module docstring) from :meth:`ControllerMeter.figures` (Deployment -> figures)."""
    tc = controllers.get("taint-controller") or {}
    vks = [f["rss_max_mib"] for n, f in controllers.items() if n.startswith("vk-") and f.get("rss_max_mib") is not None]
    return {"taint_controller_tick_cpu_ms_p99": tc.get("tick_cpu_ms_p99"),
            "taint_controller_tick_process_cpu_ms_p99": tc.get("tick_process_cpu_ms_p99"),
            "taint_controller_rss_max_mib": tc.get("rss_max_mib"),
            "virtual_kubelet_rss_max_mib": max(vks) if vks else None, "controllers": controllers}


def _cleanup(kube: Kube, training_ns: str, inference_ns: str, deployment: str, vnodes: list[str], *,
             fresh: bool = False) -> None:
    """Delete the JobSet, the inference Deployment/ScaledObject/HPA/PDB and the virtual nodes (best effort).

    With ``fresh`` (before a run), also delete what is left of their pods at
    once (grace 0: a previous run's pods may sit on virtual nodes no
    virtual kubelet serves) and wait up to 60 s for them to be gone, so
    every run starts from the same state.
    """
    steps = [("jobset.x-k8s.io/v1alpha2", "jobsets", JOBSET_NAME, training_ns)]
    # The ScaledObject before its HPA: KEDA would make the HPA again.
    steps += [(api, plural, deployment, inference_ns) for api, plural in (
        ("keda.sh/v1alpha1", "scaledobjects"), ("apps/v1", "deployments"), ("autoscaling/v2", "horizontalpodautoscalers"),
        ("policy/v1", "poddisruptionbudgets"))]
    steps += [("v1", "nodes", n, None) for n in vnodes]
    for api, plural, name, ns in steps:
        try:
            kube.delete(api, plural, name, ns, propagation="Background")
        except KubeError:
            pass
    if not fresh:
        return
    selectors = [(training_ns, f"jobset.sigs.k8s.io/jobset-name={JOBSET_NAME}"),
                 (inference_ns, f"app.kubernetes.io/name={deployment}")]
    def none_left() -> bool:
        left = []
        for ns, sel in selectors:
            try:
                left += kube.list("v1", "pods", ns, labelSelector=sel)["items"]
            except KubeError:
                pass
        for p in left:
            try:
                kube.delete("v1", "pods", p["metadata"]["name"], p["metadata"]["namespace"], grace_seconds=0)
            except KubeError:
                pass
        # KEDA removes its finalizer from the ScaledObject: applied before it is gone, the new one would go with it.
        try:
            scaled = kube.get_or_none("keda.sh/v1alpha1", "scaledobjects", deployment, inference_ns)
        except KubeError:  # no KEDA in this cluster
            scaled = None
        return not left and scaled is None

    with contextlib.suppress(PollTimeout):  # best effort, as before
        poll_until(none_left, what="the flip's pods gone", timeout=60, interval=0.5)


def _print_summary(console, summary: dict, phases: dict, transitions: list[Transition]) -> None:
    from rich.table import Table

    table = Table(title="sim.flip summary")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k in TABLE_KEYS:
        table.add_row(k, "-" if summary[k] is None else str(summary[k]))
    console.print(table)
    for name, figures in (summary.get("controllers") or {}).items():
        console.print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    phase_line = ", ".join(f"{k} {v:.0f}s" for k, v in phases.items() if v is not None)
    console.print(f"phases: {phase_line}")
    for t in transitions:
        console.print(f"  taint {'on ' if t.tainted else 'off'} after {t.reaction_seconds:.1f}s "
                      f"(apply {t.latency_seconds * 1000:.0f} ms): {t.reason}")
