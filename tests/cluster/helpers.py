"""Helpers shared by the cluster tests (not a test module)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException

#: Kinds of the kueue role that tests need present (not its quota-sync controller).
KUEUE_KINDS = ("Namespace", "PriorityClass", "WorkloadPriorityClass", "Topology", "ResourceFlavor", "ClusterQueue",
               "LocalQueue")


def wait(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25):
    """Poll ``check`` until truthy and return its value; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def ensure_kueue_objects(api_client, inventory) -> None:
    """Create the kueue role's objects of ``inventory`` that are absent, and wait until its ClusterQueues are Active.

    Existing objects are left as they are (another test or ``pulumi up``
    may own them). A namespace still terminating from an earlier test is
    waited for (up to 90 s) and then created again.
    """
    from roles.kueue.manifests import objects

    dyn = dynamic.DynamicClient(api_client)

    def state(res, name: str, ns: str | None) -> str:
        try:
            got = res.get(name=name, namespace=ns)
        except ApiException as exc:
            if exc.status == 404:
                return "absent"
            raise
        return "terminating" if res.kind == "Namespace" and got.status.phase == "Terminating" else "present"

    wanted = [o for o in objects(inventory) if o["kind"] in KUEUE_KINDS]
    for obj in wanted:
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        name, ns = obj["metadata"]["name"], obj["metadata"].get("namespace")
        now = wait(f"{obj['kind']} {name} not terminating",
                   lambda: (st := state(res, name, ns)) != "terminating" and st, timeout=90)
        if now == "absent":
            res.create(body=obj, namespace=ns)
    cqs = dyn.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue")
    for name in (o["metadata"]["name"] for o in wanted if o["kind"] == "ClusterQueue"):
        wait(f"ClusterQueue {name} Active", lambda: any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (cqs.get(name=name).to_dict().get("status") or {}).get("conditions") or []))


def gpu_nodes_by(api_client, label: str) -> dict[str, list[str]]:
    """Simulated GPU node names by the value of node label ``label`` (e.g. ``gpufleet.io/rack``), names sorted."""
    from kubernetes import client

    out: dict[str, list[str]] = {}
    for n in client.CoreV1Api(api_client).list_node(label_selector="gpufleet.io/simulated=true").items:
        out.setdefault((n.metadata.labels or {}).get(label, ""), []).append(n.metadata.name)
    return {k: sorted(v) for k, v in sorted(out.items())}


def busy_nodes(api_client) -> set[str]:
    """Simulated GPU nodes where a bound, unfinished pod holds GPUs (virtual nodes are not counted)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    gpu_nodes = {n.metadata.name for n in core.list_node(label_selector="gpufleet.io/simulated=true").items}
    busy = set()
    for p in core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items:
        if p.spec.node_name in gpu_nodes and any((c.resources.requests or {}).get("nvidia.com/gpu")
                                                 for c in p.spec.containers):
            busy.add(p.spec.node_name)
    return busy


def fill(api_client, namespace: str, nodes, name: str = "filler") -> list[str]:
    """Bind one pod holding all 8 GPUs to each of ``nodes`` (not through Kueue; Kueue counts it as used). Returns pod names."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    names = []
    for node in nodes:
        pod = f"{name}-{node}"
        core.create_namespaced_pod(namespace, {"metadata": {"name": pod, "labels": {"gpufleet.io/filler": name}}, "spec": {
            "nodeName": node, "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.invalid/filler:1",
                            "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}]}})
        names.append(pod)
    wait(f"{len(names)} filler pods Running", lambda: all(
        core.read_namespaced_pod(p, namespace).status.phase == "Running" for p in names), timeout=60)
    return names


def train_cli(kubeconfig, capsys):
    """``run(task, *argv) -> (exit code, stdout, stderr)``: ``invoke train.<task> ... --kubeconfig`` in-process."""
    from invoke import Collection, Program

    from gpufleet.tasks.train import train as collection

    ns = Collection()
    ns.add_collection(collection)
    program = Program(namespace=ns, version="test")

    def run(task: str, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            program.run(["invoke", f"train.{task}", *argv, "--kubeconfig", str(kubeconfig)])
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def delete_job(api_client, namespace: str, name: str) -> None:
    """Delete a batch Job (and its Service) rendered by the training templates, and wait until its pods are gone."""
    from kubernetes import client

    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    for call in (lambda: batch.delete_namespaced_job(name, namespace, propagation_policy="Background"),
                 lambda: core.delete_namespaced_service(name, namespace)):
        try:
            call()
        except ApiException as e:
            if e.status != 404:
                raise
    wait(f"pods of {name} gone", lambda: not core.list_namespaced_pod(
        namespace, label_selector=f"gpufleet.io/job={name}").items, timeout=90)
