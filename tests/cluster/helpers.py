"""Helpers shared by the cluster tests (not a test module)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import pytest

from gpufleet.kube import Kube, NotFound
from gpufleet.wait import poll_until

#: The namespace of the local inventory's pretraining team (LocalQueue ``pretrain``), where tests submit jobs.
TEAM_NAMESPACE = "team-pretrain"
#: Kinds of the kueue role that tests need present (not its quota-sync controller).
KUEUE_KINDS = ("Namespace", "PriorityClass", "WorkloadPriorityClass", "Topology", "ResourceFlavor", "ClusterQueue",
               "LocalQueue")


def wait(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25):
    """Poll ``check`` until truthy and return its value; fail naming ``what`` after ``timeout`` seconds."""
    return poll_until(check, what=what, timeout=timeout, interval=interval)


def step_until(rem, what: str, check: Callable[[Any], Any], timeout: float = 30.0, interval: float = 0.5):
    """Run node health steps (``rem``: a :class:`gpufleet.node_health.remediate.Remediator`) every ``interval`` s
    until ``check(report)`` is truthy; returns that report. A step with errors fails at once; a timeout names
    ``what`` and the last step's decisions (the node path's and the per-GPU path's)."""
    last: list = []

    def stepped():
        report = rem.step()
        assert not report.errors, report.errors
        last[:] = [report]
        return report if check(report) else None

    def detail() -> str:
        r = last[0] if last else None
        return (f"last decisions: {r.decisions if r else None}"
                + (f"; GPUs: {r.gpu.decisions}" if r is not None and r.gpu else ""))

    return poll_until(stepped, what=what, timeout=timeout, interval=interval, detail=detail)


def ensure_kueue_objects(kube: Kube, inventory) -> None:
    """Create the kueue role's objects of ``inventory`` that are absent, and wait until its ClusterQueues are Active.

    Existing objects are left as they are (another test or ``pulumi up``
    may own them). A namespace still terminating from an earlier test is
    waited for (up to 90 s) and then created again.
    """
    from roles.kueue.manifests import objects

    def state(obj: dict) -> str:
        try:
            got = kube.request("GET", kube.path_of(obj))
        except NotFound:
            return "absent"
        return "terminating" if obj["kind"] == "Namespace" and got["status"].get("phase") == "Terminating" else "present"

    wanted = [o for o in objects(inventory) if o["kind"] in KUEUE_KINDS]
    for obj in wanted:
        name = obj["metadata"]["name"]
        now = wait(f"{obj['kind']} {name} not terminating",
                   lambda: (st := state(obj)) != "terminating" and st, timeout=90)
        if now == "absent":
            kube.create_object(obj)
    for name in (o["metadata"]["name"] for o in wanted if o["kind"] == "ClusterQueue"):
        wait(f"ClusterQueue {name} Active", lambda: any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (kube.get("kueue.x-k8s.io/v1beta2", "clusterqueues", name).get("status") or {}).get("conditions") or []))


def config_file(path, command: str, env: str = "local", instance: str = "", **changes: Any):
    """Write ``gpufleet <command>``'s configuration file for ``env`` to ``path``, as its role renders it (with
    ``changes`` to top-level fields over it); returns ``path`` (what a process started by hand reads with ``--config``)."""
    from roles.registry import component, load

    comp = component(command)
    inv = load(env)
    config = comp.build(inv, instance or comp.instances(inv)[0])
    path.write_text(comp.dump(config.model_copy(update=changes) if changes else config))
    return path


def gpu_nodes_by(kube: Kube, label: str) -> dict[str, list[str]]:
    """Simulated GPU node names by the value of node label ``label`` (e.g. ``gpufleet.io/rack``), names sorted."""
    out: dict[str, list[str]] = {}
    for n in kube.list("v1", "nodes", labelSelector="gpufleet.io/simulated=true")["items"]:
        out.setdefault((n["metadata"].get("labels") or {}).get(label, ""), []).append(n["metadata"]["name"])
    return {k: sorted(v) for k, v in sorted(out.items())}


def busy_nodes(kube: Kube) -> set[str]:
    """Simulated GPU nodes where a bound, unfinished pod holds GPUs (virtual nodes are not counted)."""
    gpu_nodes = {n["metadata"]["name"] for n in kube.list("v1", "nodes", labelSelector="gpufleet.io/simulated=true")["items"]}
    busy = set()
    for p in kube.list("v1", "pods", fieldSelector="status.phase!=Succeeded,status.phase!=Failed")["items"]:
        spec = p.get("spec") or {}
        if spec.get("nodeName") in gpu_nodes and any(((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu")
                                                     for c in spec.get("containers") or []):
            busy.add(spec["nodeName"])
    return busy


def fill(kube: Kube, namespace: str, nodes, name: str = "filler") -> list[str]:
    """Bind one pod holding all 8 GPUs to each of ``nodes`` (not through Kueue; Kueue counts it as used). Returns pod names."""
    names = []
    for node in nodes:
        pod = f"{name}-{node}"
        kube.create("v1", "pods", {"metadata": {"name": pod, "labels": {"gpufleet.io/filler": name}}, "spec": {
            "nodeName": node, "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.invalid/filler:1",
                            "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}]}},
            namespace)
        names.append(pod)
    wait(f"{len(names)} filler pods Running", lambda: all(
        (kube.get("v1", "pods", p, namespace).get("status") or {}).get("phase") == "Running" for p in names), timeout=60)
    return names


def delete_job(kube: Kube, namespace: str, name: str) -> None:
    """Delete a batch Job (and its Service) rendered by the training templates, and wait until its pods are gone."""
    for api_version, plural, propagation in (("batch/v1", "jobs", "Background"), ("v1", "services", None)):
        try:
            kube.delete(api_version, plural, name, namespace, propagation=propagation)
        except NotFound:
            pass
    wait(f"pods of {name} gone", lambda: not kube.list(
        "v1", "pods", namespace, labelSelector=f"gpufleet.io/job={name}")["items"], timeout=90)


def hostname_selector(names: list[str]) -> dict:
    """A LabelSelector of exactly the nodes ``names`` (``kubernetes.io/hostname In names``)."""
    return {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(names)}]}


@contextmanager
def exporter_fleet(kube: Kube, tmp_path_factory, nodes: slice, selector: str = "gpufleet.io/simulated=true"):
    """Simulated GPU exporters (:mod:`gpufleet_workshop.sim.fleet`) on a slice of the cluster's nodes, scraped by a real Prometheus.

    Args:
        kube: the cluster.
        tmp_path_factory: pytest's, for each exporter's work folder.
        nodes: which of the nodes matching ``selector``, sorted by name (``slice(8, 14)``, ``slice(-3, None)``):
            modules running beside each other take slices no other module uses.
        selector: the label selector of the nodes to slice.

    Yields:
        ``(names, exporters by node name, Prometheus)``, every target up. Skips the test without a Prometheus.
    """
    from gpufleet.ops.reads import list_nodes
    from gpufleet.prom.server import PrometheusNotFound, running_prometheus
    from gpufleet_workshop.sim.fleet import scrape_config, start_node

    names = sorted(n["metadata"]["name"] for n in list_nodes(kube, selector))[nodes]
    sims = {n: start_node(n, workdir=tmp_path_factory.mktemp(n)) for n in names}
    try:
        with running_prometheus([scrape_config(list(sims.values()))]) as prom:
            prom.wait_for_targets_up(len(sims))
            yield names, sims, prom
    except PrometheusNotFound as exc:
        pytest.skip(str(exc))
    finally:
        for s in sims.values():
            s.stop()


def return_to_service(kube: Kube, names: list[str]) -> None:
    """Nodes ``names`` back in service without node health's marks: swap and degraded taints, the cordon, the
    lemon and replacement labels and every ``gpufleet.io/`` annotation removed (the tests' own nodes only)."""
    from gpufleet.kube.retry import update_with_retry
    from gpufleet.names import DEGRADED_TAINT, LEMON_LABEL, REPLACEMENT_LABEL, SWAP_TAINT

    def change(obj):
        meta = obj["metadata"]
        return {"spec": {"taints": [t for t in obj["spec"].get("taints") or []
                                    if t["key"] not in (SWAP_TAINT, DEGRADED_TAINT)] or None, "unschedulable": None},
                "metadata": {"labels": {k: None for k in meta.get("labels", {}) if k in (LEMON_LABEL, REPLACEMENT_LABEL)},
                             "annotations": {k: None for k in meta.get("annotations", {}) if k.startswith("gpufleet.io/")}}}

    for name in names:
        update_with_retry(kube, f"/api/v1/nodes/{name}", change)
