"""Submit a rendered training job to its Kueue LocalQueue and follow it until its pods run.

The job is created suspended with ``kueue.x-k8s.io/queue-name``; Kueue makes a
Workload for it, reserves quota for the whole gang (``QuotaReserved``), admits
it (``Admitted``) and unsuspends it; then the pods start. :func:`submit`
follows those steps with a rich progress display and returns when every pod
runs on a node, or raises :class:`SubmitError` with the reason Kueue (or the
scheduler) gives when that has not happened within the timeout. A job that
times out is left queued: Kueue may still admit it when quota frees up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from gpufleet.kube import Kube, KubeError, NotFound, api_path
from gpufleet.names import JOB_LABEL, KUEUE_API, KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL

from gpufleet_admin.inventory.inventory import TOPOLOGY_LEVELS

from .render import TEMPLATES



class SubmitError(RuntimeError):
    """The job could not be submitted, admitted or started; the message says why.

    ``workload`` is the Kueue Workload's name when one exists; ``created``
    whether the job objects were created (and are still queued).
    """

    def __init__(self, message: str, *, workload: str | None = None, created: bool = False):
        super().__init__(message)
        self.workload = workload
        self.created = created


@dataclass
class SubmitResult:
    """Where a submitted job stands: its Workload, admission, and pods running on which nodes."""

    kind: str
    namespace: str
    name: str
    workload: str | None = None
    quota_reserved: bool = False
    admitted: bool = False
    pods_running: int = 0
    nodes: list[str] = field(default_factory=list)
    reason: str = ""
    #: Pods per topology domain, by level (``{"rack": {"rack-a": 3, "rack-b": 1}}``), from the nodes' labels.
    domains: dict[str, dict[str, int]] = field(default_factory=dict)


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def _is_true(conds: dict[str, dict[str, Any]], kind: str) -> bool:
    return conds.get(kind, {}).get("status") == "True"


def workload_reason(workload: dict[str, Any] | None, kind: str = "job") -> str:
    """Why a Workload is not (yet) admitted, from its conditions, in one line.

    Order: ``Finished``, ``Evicted``, ``QuotaReserved`` false (e.g. "couldn't
    assign flavors to pod set workers: insufficient quota for nvidia.com/gpu
    ..."), ``Admitted`` false (admission checks), ``PodsReady`` false.
    """
    if workload is None:
        return (f"Kueue created no Workload for the {kind}: is Kueue running and does its configuration "
                f"manage {kind}s (integrations.frameworks)?")
    conds = _conditions(workload)
    for ctype, bad in (("Finished", "True"), ("Evicted", "True"), ("QuotaReserved", "False"),
                       ("Admitted", "False"), ("PodsReady", "False")):
        c = conds.get(ctype)
        if c and c.get("status") == bad:
            return f"Workload {workload['metadata']['name']}: {ctype}={bad} ({c.get('reason', '')}): {c.get('message', '')}"
    if not conds:
        return f"Workload {workload['metadata']['name']}: no conditions yet: Kueue has not considered it"
    return f"Workload {workload['metadata']['name']}: " + "; ".join(
        f"{t}={c.get('status')} ({c.get('reason', '')})" for t, c in conds.items())


def _phase(pod: dict[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def pods_reason(pods: Sequence[dict[str, Any]]) -> str:
    """Why pods are not running: the first pending pod's scheduling message, or the phases."""
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return f"pod {pod['metadata']['name']}: {cond.get('reason')}: {cond.get('message')}"
    phases: dict[str, int] = {}
    for pod in pods:
        phases[_phase(pod)] = phases.get(_phase(pod), 0) + 1
    return "pods: " + (", ".join(f"{n} {p}" for p, n in sorted(phases.items())) or "none created yet")


def _main_object(objects: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The job object: the one Kueue admits (queue label), else (``--gang native``) the labelled job of a template."""
    for obj in objects:
        if KUEUE_QUEUE_LABEL in (obj.get("metadata", {}).get("labels") or {}):
            return obj
    kinds = {t.kind for t in TEMPLATES.values()}
    for obj in objects:
        if obj.get("kind") in kinds and JOB_LABEL in (obj.get("metadata", {}).get("labels") or {}):
            return obj
    raise SubmitError(f"none of the objects has the label {KUEUE_QUEUE_LABEL} or is a {'/'.join(sorted(kinds))} "
                      f"labelled {JOB_LABEL}: nothing to follow")


def preflight(kube: Kube, namespace: str, queue: str, priority_class: str | None) -> None:
    """Check the namespace, the LocalQueue and the WorkloadPriorityClass exist on the cluster.

    Raises:
        SubmitError: naming the flag (``--queue``, ``--set priority_class``) and what is missing.
    """
    try:
        kube.get("v1", "namespaces", namespace)
    except NotFound:
        raise SubmitError(f"--queue {namespace}/{queue}: namespace {namespace} does not exist on the cluster") from None
    try:
        kube.get(KUEUE_API, "localqueues", queue, namespace)
    except NotFound:
        raise SubmitError(f"--queue {namespace}/{queue}: no LocalQueue {queue} in namespace {namespace} "
                          "on the cluster (or Kueue is not installed)") from None
    if priority_class:
        try:
            kube.get(KUEUE_API, "workloadpriorityclasses", priority_class)
        except NotFound:
            raise SubmitError(f"--set priority_class={priority_class}: no WorkloadPriorityClass "
                              f"{priority_class} on the cluster") from None


def create_objects(kube: Kube, objects: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Create ``objects`` in order (any kind, CRDs included); returns the created job object.

    Objects after the job object (a native gang's Workload and PodGroup) are
    owned by it (``ownerReferences``), so they go when the job is deleted; so
    is a GPU ResourceClaimTemplate, created before the job (its pods need it
    from the start) and given the job as owner once the job exists.
    All or nothing: when one object fails, those created before it are deleted again.

    Raises:
        SubmitError: an object exists already, its kind is not served by the
            cluster, or the API server refused it (with its message).
    """
    main = _main_object(objects)
    created_main: dict[str, Any] = {}
    done: list[dict[str, Any]] = []
    try:
        for obj in objects:
            meta = obj["metadata"]
            ident = f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}"
            try:
                kube.resource(obj["apiVersion"], obj["kind"])
            except NotFound:
                raise SubmitError(f"{ident}: the cluster does not serve {obj['apiVersion']} {obj['kind']} "
                                  "(are its controller and CRD installed?)") from None
            if created_main and not meta.get("ownerReferences"):
                owner = created_main["metadata"]
                obj = {**obj, "metadata": {**meta, "ownerReferences": [{
                    "apiVersion": main["apiVersion"], "kind": main["kind"], "name": owner["name"], "uid": owner["uid"]}]}}
            try:
                out = kube.create_object(obj)
            except KubeError as e:
                if e.status == 409:
                    raise SubmitError(f"{ident} already exists: delete it or choose another --name") from None
                raise SubmitError(f"{ident}: the API server refused it: {e.status} {e.reason}: {e.message}") from None
            done.append(obj)
            if obj is main:
                created_main = out
                created_main.setdefault("apiVersion", main["apiVersion"])
                owner = {"apiVersion": main["apiVersion"], "kind": main["kind"], "name": out["metadata"]["name"],
                         "uid": out["metadata"]["uid"]}
                for earlier in done[:-1]:
                    if earlier["kind"] == "ResourceClaimTemplate":
                        kube.request("PATCH", kube.path_of(earlier), body={"metadata": {"ownerReferences": [owner]}},
                                     patch="merge")
    except SubmitError:
        for obj in reversed(done):
            try:
                kube.delete_object(obj)
            except KubeError:
                pass  # best effort; the error below says what failed
        raise
    return created_main


def find_workload(kube: Kube, namespace: str, owner_uid: str) -> dict[str, Any] | None:
    """The Kueue Workload owned by the object with ``owner_uid``, or None."""
    for wl in kube.list_all(api_path(KUEUE_API, "workloads", namespace))[0]:
        if any(ref.get("uid") == owner_uid for ref in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def follow(
    kube: Kube,
    main: dict[str, Any],
    pods_expected: int,
    *,
    timeout: float,
    console: Console | None = None,
    poll_seconds: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    kueue: bool = True,
) -> SubmitResult:
    """Follow the Workload of ``main`` (a created object) until ``pods_expected`` pods run.

    ``kueue=False`` (a native gang, no LocalQueue): only the pods are followed.

    Raises:
        SubmitError: not admitted, or pods not running, within ``timeout``
            seconds (the message has the Workload's or the scheduler's reason),
            or the Workload finished first.
    """
    meta = main["metadata"]
    ns, name, uid, kind = meta["namespace"], meta["name"], meta["uid"], main["kind"]
    result = SubmitResult(kind=kind, namespace=ns, name=name)
    deadline = clock() + timeout
    console = console or Console(stderr=True)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        admission = progress.add_task(f"{kind} {ns}/{name}: waiting for its Kueue Workload", total=2,
                                      visible=kueue)
        running = progress.add_task("pods running", total=pods_expected)
        workload = None
        pods: list[dict[str, Any]] = []
        result.admitted = not kueue
        while True:
            workload = find_workload(kube, ns, uid) if kueue else None
            if workload is not None:
                result.workload = workload["metadata"]["name"]
                conds = _conditions(workload)
                result.quota_reserved = _is_true(conds, "QuotaReserved")
                result.admitted = _is_true(conds, "Admitted")
                if _is_true(conds, "Finished"):
                    result.reason = workload_reason(workload, kind)
                    raise SubmitError(f"{kind} {ns}/{name} finished before all pods ran: {result.reason}",
                                      workload=result.workload, created=True)
                state = "admitted" if result.admitted else "quota reserved" if result.quota_reserved else "pending"
                progress.update(admission, completed=int(result.quota_reserved) + int(result.admitted),
                                description=f"Workload {result.workload}: {state}")
            pods = kube.list_all(api_path("v1", "pods", ns), label_selector=f"{JOB_LABEL}={name}")[0]
            up = [p for p in pods if _phase(p) in ("Running", "Succeeded") and (p.get("spec") or {}).get("nodeName")]
            result.pods_running = len(up)
            result.nodes = sorted({p["spec"]["nodeName"] for p in up})
            progress.update(running, completed=min(len(up), pods_expected))
            if result.admitted and len(up) >= pods_expected:
                result.domains = _domains(kube, up)
                return result
            if clock() >= deadline:
                break
            time.sleep(poll_seconds)
    if not result.admitted:
        result.reason = workload_reason(workload, kind)
        what = "was not admitted by Kueue"
    else:
        result.reason = pods_reason([p for p in pods if _phase(p) != "Running"] or pods)
        what = (f"was admitted but only {result.pods_running}/{pods_expected} pods run" if kueue else
                f"has {result.pods_running}/{pods_expected} pods running (native gang: the scheduler binds all or none)")
    raise SubmitError(f"{kind} {ns}/{name} {what} within {timeout:g} s: {result.reason}\n"
                      f"It is still queued; delete it with: kubectl -n {ns} delete {kind.lower()} {name}",
                      workload=result.workload, created=True)


def submit(
    kube: Kube,
    objects: Sequence[dict[str, Any]],
    pods_expected: int,
    *,
    timeout: float,
    console: Console | None = None,
    poll_seconds: float = 1.0,
) -> SubmitResult:
    """Check the queue, create ``objects`` and follow Kueue admission and pod start.

    Args:
        kube: client for the target cluster.
        objects: rendered objects in apply order; exactly one carries the
            ``kueue.x-k8s.io/queue-name`` label.
        pods_expected: pods that must run (the job's nodes).
        timeout: seconds to wait for admission and running pods.
        console: where progress goes (default stderr).
        poll_seconds: seconds between polls of the Workload and pods.

    Returns:
        :class:`SubmitResult` once the Workload is admitted and all pods run.

    Raises:
        SubmitError: missing queue or priority class, an object that exists,
            or no admission / running pods within ``timeout`` (with the reason).
    """
    main = _main_object(objects)
    labels = main["metadata"].get("labels") or {}
    kueue = KUEUE_QUEUE_LABEL in labels
    if kueue:
        preflight(kube, main["metadata"]["namespace"], labels[KUEUE_QUEUE_LABEL], labels.get(KUEUE_PRIORITY_LABEL))
    created = create_objects(kube, objects)
    created.setdefault("kind", main["kind"])
    return follow(kube, created, pods_expected, timeout=timeout, console=console, poll_seconds=poll_seconds,
                  kueue=kueue)


def _domains(kube: Kube, pods: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Pods per topology domain (block, rack) of the nodes they run on; levels the nodes lack are left out."""
    nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in kube.list_all(api_path("v1", "nodes"))[0]}
    out: dict[str, dict[str, int]] = {}
    for level in TOPOLOGY_LEVELS:
        if level.name == "hostname":
            continue
        counts: dict[str, int] = {}
        for p in pods:
            value = nodes.get(p["spec"]["nodeName"], {}).get(level.label)
            if value is not None:
                counts[value] = counts.get(value, 0) + 1
        if counts:
            out[level.name] = counts
    return out
