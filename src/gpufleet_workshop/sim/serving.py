"""Real serving for ``invoke sim.flip``: inference pods that answer HTTP, on real nodes, behind a real data plane.

kwok's nodes run no process, so a request sent to one of their pods would
fail. For the flip to be judged by requests served (not by Ready pods), the
simulation makes the inference it moves real:

- **The real node offers GPUs** (:func:`enlist`): the main cluster's real
  node takes a GPU host's labels (flavor, topology, product) and taint
  instead of the system node's taint, and an extended resource
  ``nvidia.com/gpu`` on its status (Kubernetes' documented way to advertise
  a resource no device plugin manages; the kubelet keeps it). Training then
  needs it like any GPU node, and the flip moves inference off it. The
  second cluster of each ``kubernetes`` pool does the same with its own real
  node, and its kwok nodes are cordoned for the run, so remote pods run as
  real containers too. :func:`restore` undoes both.
- **Inference pods are stand-ins** (:func:`standin_pod`): gpufleet's workshop
  image (:mod:`gpufleet_workshop.local.workshop_image`) running
  ``gpufleet-standin`` (:mod:`gpufleet_workshop.inference_standin`)
  with small CPU and memory requests (the real node is small), required
  to run on the real node or a virtual node (the only nodes where a pod
  really runs here).
- **Training pods on the real node run too** (:func:`trainer_container`):
  the same image, ending when the simulation writes the end file into a
  hostPath folder (kwok ignores both and ends its pods on the annotation).
- **A real Service data plane** (:mod:`gpufleet_workshop.local.dataplane`) and a
  steady stream of requests through the inference Service's ClusterIP
  (:mod:`gpufleet_workshop.sim.traffic`), in the data plane's namespace.
"""

from __future__ import annotations

import copy
import logging
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.kube import Kube, KubeError
from gpufleet.names import GPU_RESOURCE, HOSTNAME_LABEL, SYSTEM_NODE_TAINT, VIRTUAL_NODE_LABEL
from gpufleet_workshop.inference_standin import COMMAND as STANDIN_COMMAND
from gpufleet_workshop.sim import traffic
from gpufleet.wait import poll_until

log = logging.getLogger(__name__)

#: The GPU host's taint the real node carries while enlisted (as kwok's GPU nodes do).
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
#: What a stand-in asks for: the real node has two cores for everything it runs. A stand-in uses about 1.15m
#: of CPU per request/s (5.75m at 5/s, read through the resource metrics API), so with 15m the inference
#: role's CPU HPA (70% by default) holds the demo's 5 requests/s per replica and scales above about 9.
STANDIN_REQUESTS = {"cpu": "15m", "memory": "48Mi"}
TRAINER_REQUESTS = {"cpu": "5m", "memory": "32Mi"}
#: Where a training pod on the real node waits for the end file (hostPath; one folder per cluster).
END_ROOT = Path("/run/gpufleet-sim-flip")
END_FILE = "training-ended"


# ------------------------------------------------------------------------------- nodes


@dataclass
class Enlisted:
    """What :func:`enlist` changed on one cluster, to undo: the node, its labels and taints before, nodes cordoned."""

    kube: Kube
    node: str
    labels_before: dict[str, str | None]
    taints_before: list[dict]
    cordoned: list[str] = field(default_factory=list)


def enlist(kube: Kube, node: str, *, gpus: int, labels: dict[str, str], cordon_others: bool = False) -> Enlisted:
    """Make real node ``node`` a GPU host with ``gpus`` GPUs and ``labels``; cordon every other non-virtual
    node when ``cordon_others`` (a second cluster whose pods must all be real).

    Raises:
        KubeError: a read or patch was refused (what was already changed is undone first).
    """
    live = kube.get("v1", "nodes", node)
    before_labels = {k: (live["metadata"].get("labels") or {}).get(k) for k in labels}
    taints = list(live["spec"].get("taints") or [])
    key, value, effect = SYSTEM_NODE_TAINT
    new_taints = [t for t in taints if t.get("key") != key] + ([] if any(t.get("key") == GPU_RESOURCE for t in taints)
                                                                else [GPU_TAINT])
    out = Enlisted(kube, node, before_labels, taints)
    try:
        kube.patch("v1", "nodes", node, {"metadata": {"labels": labels}, "spec": {"taints": new_taints}})
        kube.patch("v1", "nodes", node, {"status": {"capacity": {GPU_RESOURCE: str(gpus)},
                                                    "allocatable": {GPU_RESOURCE: str(gpus)}}}, subresource="status")
        if cordon_others:
            for n in kube.list("v1", "nodes")["items"]:
                name, lab = n["metadata"]["name"], n["metadata"].get("labels") or {}
                if (name == node or lab.get(VIRTUAL_NODE_LABEL[0]) == VIRTUAL_NODE_LABEL[1]
                        or n["spec"].get("unschedulable")):
                    continue
                kube.patch("v1", "nodes", name, {"spec": {"unschedulable": True}})
                out.cordoned.append(name)
    except KubeError:
        # Nothing half-applied: the caller never sees this Enlisted, so it could not restore it.
        restore(out)
        raise
    return out


def restore(e: Enlisted) -> None:
    """Undo :func:`enlist` (best effort: a node gone meanwhile, or a change never made, is skipped)."""
    for name in e.cordoned:
        try:
            e.kube.patch("v1", "nodes", name, {"spec": {"unschedulable": None}})
        except KubeError:
            pass
    try:
        e.kube.patch("v1", "nodes", e.node, {"metadata": {"labels": e.labels_before}, "spec": {"taints": e.taints_before}})
    except KubeError:
        pass
    # Apart from the labels: a JSON patch removing a resource the node never got is refused.
    try:
        e.kube.patch("v1", "nodes", e.node, [{"op": "remove", "path": f"/status/capacity/{GPU_RESOURCE.replace('/', '~1')}"},
                                             {"op": "remove", "path": f"/status/allocatable/{GPU_RESOURCE.replace('/', '~1')}"}],
                     subresource="status", patch="json")
    except KubeError:
        pass


# ------------------------------------------------------------------------------- pods


def standin_pod(pod: dict[str, Any], *, image: str, real_node: str, latency_ms: float, cluster: str) -> dict[str, Any]:
    """The inference pod template ``pod`` (metadata + spec) serving for real: stand-in container (``image``: gpufleet's
    workshop image), small requests, required to run on ``real_node`` or a virtual node (module docstring). Returns
    a copy."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    c = spec["containers"][0]
    c["image"] = image
    c["imagePullPolicy"] = "IfNotPresent"
    c["command"] = [STANDIN_COMMAND]
    c["args"] = ["--port", str(c["ports"][0]["containerPort"]), "--latency-ms", f"{latency_ms:g}", "--cluster", cluster]
    c["env"] = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    gpus = c["resources"]["requests"].get(GPU_RESOURCE)
    c["resources"] = {"requests": dict(STANDIN_REQUESTS), "limits": {"memory": STANDIN_REQUESTS["memory"]}}
    if gpus:
        c["resources"]["requests"][GPU_RESOURCE] = c["resources"]["limits"][GPU_RESOURCE] = gpus
    c["readinessProbe"] = {"httpGet": {"path": "/health", "port": c["ports"][0]["containerPort"]}, "periodSeconds": 1,
                           "failureThreshold": 1}
    # The drain (the stand-in's --drain-seconds) ends well within the grace period.
    spec["terminationGracePeriodSeconds"] = 15
    node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [real_node]}]},
        {"matchExpressions": [{"key": VIRTUAL_NODE_LABEL[0], "operator": "In", "values": [VIRTUAL_NODE_LABEL[1]]}]}]}
    return pod


def end_dir(cluster: str) -> Path:
    """The host folder where cluster ``cluster``'s simulated training pods look for the end file."""
    return END_ROOT / cluster


def trainer_container(container: dict[str, Any], image: str, cluster: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(container, volume)``: a training container that runs until the end file appears in its hostPath folder."""
    folder = end_dir(cluster)
    c = copy.deepcopy(container)
    c["image"] = image
    c["imagePullPolicy"] = "IfNotPresent"
    c["command"] = ["python3", "-c", f"import os, time\nwhile not os.path.exists('{folder}/{END_FILE}'): time.sleep(0.5)"]
    req = c["resources"]["requests"]
    c["resources"] = {"requests": {**TRAINER_REQUESTS, GPU_RESOURCE: req[GPU_RESOURCE]},
                      "limits": {GPU_RESOURCE: req[GPU_RESOURCE]}}
    c["volumeMounts"] = [{"name": "sim-end", "mountPath": str(folder), "readOnly": True}]
    return c, {"name": "sim-end", "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"}}


def reset_end_file(cluster: str) -> None:
    """Remove cluster ``cluster``'s end file (before a run); creates its folder."""
    end_dir(cluster).mkdir(parents=True, exist_ok=True)
    (end_dir(cluster) / END_FILE).unlink(missing_ok=True)


def write_end_file(cluster: str) -> None:
    """End the training pods on cluster ``cluster``'s real node."""
    end_dir(cluster).mkdir(parents=True, exist_ok=True)
    (end_dir(cluster) / END_FILE).write_text("")


# ------------------------------------------------------------------------------- traffic


@dataclass
class Stream:
    """A running request stream (:mod:`gpufleet_workshop.sim.traffic` in the data plane's namespace)."""

    proc: subprocess.Popen
    out: Path
    #: What the stream wrote on stderr (its error when it stopped early); set by :meth:`stop`.
    stderr: str = ""

    def stop(self, timeout: float = 10.0) -> list[traffic.Request]:
        """Stop sending (requests in flight finish, SIGKILL after ``timeout`` seconds) and return every request
        recorded. The process is reaped and its stderr read into :attr:`stderr`, logged when it failed."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self.stderr = (err or b"").decode(errors="replace").strip()
        if self.proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
            log.warning("request stream exited %s: %s", self.proc.returncode, self.stderr[-500:])
        return traffic.read(self.out)


def start_stream(dataplane, url: str, rate: float, out: Path) -> Stream:
    """Start :mod:`gpufleet_workshop.sim.traffic` sending ``rate`` requests per second to ``url`` inside ``dataplane``."""
    out.unlink(missing_ok=True)
    out.touch()
    argv = dataplane.exec_argv([sys.executable, "-m", "gpufleet_workshop.sim.traffic", "--url", url, "--rate", f"{rate:g}",
                                "--out", str(out)])
    return Stream(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out)


def wait_serving(dataplane, url: str, timeout: float) -> None:
    """Wait until ``url`` answers 200 from inside ``dataplane`` (the data plane has the Service's endpoints).

    Raises:
        TimeoutError: no 200 within ``timeout`` seconds (the last error).
    """
    probe = ("import sys, urllib.request\n"
             "try:\n  urllib.request.urlopen(sys.argv[1], timeout=2).read()\nexcept Exception as e:\n"
             "  print(e); sys.exit(1)")
    last = [""]

    def served() -> bool:
        proc = subprocess.run(dataplane.exec_argv([sys.executable, "-c", probe, url]), capture_output=True, text=True)
        last[0] = (proc.stdout + proc.stderr).strip()[-300:]
        return proc.returncode == 0

    poll_until(served, what=f"{url} served through the data plane", timeout=timeout, interval=0.5,
               detail=lambda: f"last error: {last[0]}")


def summarize(reqs: list[traffic.Request], *, wall_t0: float, flip_from: float | None, flip_to: float | None,
              in_cluster_nodes: set[str]) -> dict[str, Any]:
    """The request figures of ``sim.flip``: ``requests_total``, ``requests_failed``, ``latency_p99_ms_steady``
    (requests sent before ``flip_from``), ``latency_p99_ms_flip`` (from ``flip_from`` to ``flip_to``, or the end);
    times are seconds since ``wall_t0`` (Unix seconds); latencies of successful requests, in ms."""
    def rel(r: traffic.Request) -> float:
        return r.t - wall_t0

    steady = [r.ms for r in reqs if r.ok and (flip_from is None or rel(r) < flip_from)]
    flip = [r.ms for r in reqs if r.ok and flip_from is not None and rel(r) >= flip_from
            and (flip_to is None or rel(r) <= flip_to)]
    p_steady, p_flip = traffic.p99(steady), traffic.p99(flip)
    return {"requests_total": len(reqs), "requests_failed": sum(not r.ok for r in reqs),
            "latency_p99_ms_steady": None if p_steady is None else round(p_steady, 1),
            "latency_p99_ms_flip": None if p_flip is None else round(p_flip, 1),
            "requests_served_in_cluster": sum(r.ok and r.node in in_cluster_nodes for r in reqs),
            "requests_served_outside": sum(r.ok and r.node not in in_cluster_nodes for r in reqs)}


def per_second(reqs: list[traffic.Request], *, wall_t0: float, in_cluster_nodes: set[str]) -> dict[str, list[float]]:
    """Requests per second by outcome over the run: ``t`` (bucket start, seconds since ``wall_t0``),
    ``in_cluster``, ``outside``, ``failed``."""
    if not reqs:
        return {"t": [], "in_cluster": [], "outside": [], "failed": []}
    first, last = int(reqs[0].t - wall_t0), int(reqs[-1].t - wall_t0)
    n = last - first + 1
    out = {"t": [float(first + i) for i in range(n)], "in_cluster": [0.0] * n, "outside": [0.0] * n, "failed": [0.0] * n}
    for r in reqs:
        i = int(r.t - wall_t0) - first
        key = "failed" if not r.ok else "in_cluster" if r.node in in_cluster_nodes else "outside"
        out[key][i] += 1
    return out


# ------------------------------------------------------------------------------- the run's setup


@dataclass
class Setup:
    """What :func:`prepare` made ready: nodes enlisted (to restore), the data plane, the nodes that count as
    in-cluster for requests, the image stand-ins run from, and the request stream once started."""

    cluster: str
    enlisted: list[Enlisted]
    dataplane: Any
    in_cluster_nodes: set[str]
    image: str
    url: str = ""
    stream: Stream | None = None


def prepare(c, kube: Kube, inv, pool_clusters: dict[str, Any], pools: list, hosts: int, gpus_per_node: int) -> Setup:
    """Enlist the real nodes (module docstring) and start the data plane; returns the :class:`Setup`.

    The main cluster's real node stands in for ``hosts`` GPU hosts of
    ``gpus_per_node`` GPUs (as many as its inference replicas fill): it
    takes the labels of the inventory's last GPU host and the last ``hosts``
    kwok nodes are cordoned for the run, so the fleet keeps its GPUs and its
    quota. ``c``: the main :class:`~gpufleet_workshop.local.cluster.Cluster`;
    ``pool_clusters``: pool name -> second cluster.

    Raises:
        KubeError: a node patch was refused; gpufleet_workshop.local.dataplane.DataPlaneError,
        gpufleet_workshop.local.processes.ComponentFailed: the data plane did not start.
    """
    from gpufleet_workshop.local import dataplane
    from gpufleet_workshop.local.node import node_name

    borrowed = inv.node_specs()[-hosts:]
    labels = {k: v for k, v in borrowed[-1].labels.items() if k != HOSTNAME_LABEL}
    real = node_name(c.name)
    enlisted = []
    try:
        main = enlist(kube, real, gpus=hosts * gpus_per_node, labels=labels)
        enlisted.append(main)
        for spec in borrowed:
            if kube.get_or_none("v1", "nodes", spec.name) is not None:
                kube.patch("v1", "nodes", spec.name, {"spec": {"unschedulable": True}})
                main.cordoned.append(spec.name)
        for p in pools:
            rc = pool_clusters.get(p.name)
            if rc is not None:
                enlisted.append(enlist(rc.kube(), node_name(rc.name), gpus=p.capacity_gpus, labels={}, cordon_others=True))
        dp = dataplane.up(c, list(pool_clusters.values()))
    except Exception:
        for e in enlisted:
            restore(e)
        raise
    reset_end_file(c.name)
    return Setup(c.name, enlisted, dp, {real}, inv.fleet.gpufleet_image)


def finish(setup: Setup) -> list[traffic.Request]:
    """Stop the stream (if any) and restore every enlisted node; the requests recorded."""
    reqs = setup.stream.stop() if setup.stream is not None else []
    for e in setup.enlisted:
        restore(e)
    return reqs
