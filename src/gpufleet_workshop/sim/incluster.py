"""gpufleet's components in the local cluster, as production runs them: Pods on the real node.

The local inventory places gpufleet's pods on the real node
(``gpufleet_node_selector``). What they reach from there depends on the
cluster, so :func:`stack_config` gives it as stack config (what ``invoke up
--env local`` and the demo pass to the engine): the apiserver and Prometheus
through the node's forwards (no service network, no cluster DNS), the
fixture GPU node the exporter reads (the node has no GPUs), and, for every
``kubernetes`` pool, its cluster: a second local cluster named after the
pool, whose kubeconfig (server: that cluster's own forward, which the pod
networks route to) goes into the pool's Secret.

:func:`deploy` applies the taint controller's and virtual kubelets'
objects of the roles (``invoke sim.flip`` without a stack), :func:`wait_available`
waits for Deployments, :func:`logs` reads their pods' logs through the
kubelet.
"""

from __future__ import annotations

import contextlib
import base64
import datetime as dt
import math
import re
from collections.abc import Callable
from typing import Any

from gpufleet.taint_controller.controller import Transition
from gpufleet.kube import Kube, KubeError
from gpufleet.kube.validation import PRIORITY_CLASS_IMMUTABLE
from gpufleet.names import FIELD_MANAGER_SIM
from gpufleet.wait import PollTimeout, poll_until

def fixture_node(cluster) -> str:
    """The folder of the fixture GPU node the real node's exporter reads (written once: ``node.json``, ``sys/``)."""
    from gpufleet_workshop.local.node import NodePaths
    from gpufleet_workshop.fixtures.node import healthy_node, write_node

    fixture = NodePaths.of(cluster.layout).fixture
    if not (fixture / "node.json").is_file():
        write_node(healthy_node(cluster.name), fixture)
    return str(fixture)


def stack_config(cluster) -> dict[str, str]:
    """Stack config (``gpufleet:<variable>`` -> value) placing gpufleet's pods on ``cluster``'s real node.

    ``cluster``: a :class:`gpufleet_workshop.local.cluster.Cluster`.
    """
    fixture = fixture_node(cluster)
    return {"gpufleet:gpufleet_api_server": cluster.in_cluster_api,
            "gpufleet:node_health_prometheus_url": cluster.in_cluster_prometheus,
            "gpufleet:taint_controller_prometheus_url": cluster.in_cluster_prometheus,
            # KEDA's scalers query it from the real node's bridge (gpufleet_workshop.local.keda).
            "gpufleet:inference_prometheus_url": cluster.in_cluster_prometheus,
            "gpufleet:gpu_metrics_exporter_fixture_node": fixture,
            # The "parallel FS mounted on every node" (backend hostpath) is the fixture node's checkpoint folder.
            "gpufleet:parallel_fs_mount_path": f"{fixture}/mnt/checkpoints"}


def overrides(config: dict[str, str]) -> dict[str, Any]:
    """:func:`stack_config`'s values as inventory overrides (``load(env, overrides=...)``)."""
    return {k.split(":", 1)[1]: v for k, v in config.items()}


def pool_node_specs(inv, pool) -> list:
    """The nodes of a ``kubernetes`` pool's local cluster: enough GPU nodes of ``inv`` for the pool's capacity."""
    from roles.registry import node_specs

    gpus_per_node = max(h.vars.gpu_count for h in inv.hosts.values())
    return node_specs(inv.env, max(1, math.ceil(pool.capacity_gpus / gpus_per_node)))


def pool_clusters(kube: Kube, inv, pools, *, names: dict[str, str] | None = None,
                  say: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the local cluster of each ``kubernetes`` pool and store its kubeconfig in the pool's Secret.

    The cluster is named after the pool (``names`` maps a pool to another
    name), with enough GPU nodes for the pool's capacity, and its own real
    node (its forward is the server of the kubeconfig the virtual kubelet's
    pod reads). Returns pool -> :class:`~gpufleet_workshop.local.cluster.Cluster`.
    """
    from gpufleet_workshop.local import cluster as local

    ns = inv.role("virtual_kubelet").virtual_kubelet_namespace
    out = {}
    for p in pools:
        if p.provider != "kubernetes":
            continue
        name = (names or {}).get(p.name, p.name)
        specs = pool_node_specs(inv, p)
        try:
            st = local.status(name)
            ready = st.up and st.nodes == (len(specs) + 1, len(specs) + 1)
        except LookupError:
            ready = False
        if ready:
            rc = local.get(name)
        else:
            say(f"second cluster {name} for pool {p.name}")
            rc = local.up(name, specs=specs, env=inv.env, fresh=not local.main_pids(name), log=lambda m: say(f"  {m}"))
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, field_manager=FIELD_MANAGER_SIM)
        kube.apply({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": p.kubeconfig_secret or f"{p.name}-kubeconfig", "namespace": ns},
                    "data": {"kubeconfig": base64.b64encode(rc.pod_kubeconfig().encode()).decode()}},
                   field_manager=FIELD_MANAGER_SIM)
        out[p.name] = rc
    return out


def controller_objects(inv, pools: list[str]) -> list[dict]:
    """The taint controller's and the ``pools``' virtual kubelets' objects, as the roles declare them for ``inv``."""
    from roles.taint_controller.manifests import objects as taint_controller
    from roles.virtual_kubelet.manifests import objects as virtual_kubelet

    vk = inv.role("virtual_kubelet")
    inv.roles["virtual_kubelet"] = vk.model_copy(update={
        "virtual_kubelet_pools": [p for p in vk.virtual_kubelet_pools if p.name in pools]})
    try:
        return taint_controller(inv) + virtual_kubelet(inv)
    finally:
        inv.roles["virtual_kubelet"] = vk


def orphan_virtual_nodes(kube: Kube, inv) -> list[str]:
    """Delete the virtual Nodes of ``inv``'s pools that no virtual kubelet Deployment serves (left by an earlier
    run or a destroyed stack: pods bound there would stay Pending); returns their names."""
    from gpufleet.virtual_kubelet.node import node_name_for

    vk = inv.role("virtual_kubelet")
    gone = []
    for p in vk.virtual_kubelet_pools:
        node = node_name_for(p.name)
        if (kube.get_or_none("apps/v1", "deployments", f"vk-{p.name}", vk.virtual_kubelet_namespace) is None
                and kube.get_or_none("v1", "nodes", node) is not None):
            try:
                kube.delete("v1", "nodes", node)
                gone.append(node)
            except KubeError:
                pass
    return gone


def deployments(objs: list[dict]) -> list[tuple[str, str]]:
    """``(namespace, name)`` of the Deployments among ``objs``."""
    return [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs if o["kind"] == "Deployment"]


def apply(kube: Kube, obj: dict) -> dict:
    """Server-side apply ``obj`` (field manager ``gpufleet-sim``, conflicts forced).

    A PriorityClass the API server refuses (422) whose ``value`` or
    ``preemptionPolicy`` (:data:`gpufleet.kube.validation.PRIORITY_CLASS_IMMUTABLE`)
    differs from the one there (an earlier run or a test may have left it
    with others) is deleted, by that UID, and created again; pods keep the
    priority their admission gave them.

    Raises:
        KubeError: refused for another cause (the immutable fields as wanted, or another kind), or the kind is
            not served.
    """
    try:
        return kube.apply(obj, field_manager=FIELD_MANAGER_SIM)
    except KubeError as exc:
        if obj["kind"] != "PriorityClass" or exc.status != 422:
            raise
        there = kube.get_or_none("scheduling.k8s.io/v1", "priorityclasses", obj["metadata"]["name"])
        defaults = {"preemptionPolicy": "PreemptLowerPriority"}  # what the API server stores when left out
        if there is None or all(there.get(f, defaults.get(f)) == obj.get(f, defaults.get(f))
                                for f in PRIORITY_CLASS_IMMUTABLE):
            raise
        kube.delete_object(obj, uid=there["metadata"]["uid"])
        return kube.apply(obj, field_manager=FIELD_MANAGER_SIM)


def deploy(kube: Kube, objs: list[dict]) -> list[tuple[str, str]]:
    """Apply ``objs`` (server-side, field manager ``gpufleet-sim``) whose Deployments do not exist yet.

    Returns the Deployments this created (``(namespace, name)``); those
    already there (a stack's) are left as they are, and so are their objects.
    """
    created = [d for d in deployments(objs) if kube.get_or_none("apps/v1", "deployments", d[1], d[0]) is None]
    if not created:
        return []
    # Only the created controllers' objects (a controller's carry its name as app.kubernetes.io/name): a stack's
    # configuration file, ServiceAccount and RBAC stay as the stack declared them.
    mine = {name for _, name in created}
    order = {"Namespace": 0, "Deployment": 2}
    for obj in sorted(objs, key=lambda o: order.get(o["kind"], 1)):
        if obj["kind"] == "Namespace" or (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/name") in mine:
            apply(kube, obj)
    return created


def available(kube: Kube, namespace: str, name: str) -> bool:
    """Deployment ``namespace/name`` has its condition Available True and every replica updated and ready."""
    d = kube.get_or_none("apps/v1", "deployments", name, namespace) or {}
    st = d.get("status") or {}
    want = (d.get("spec") or {}).get("replicas", 1)
    return (any(c["type"] == "Available" and c["status"] == "True" for c in st.get("conditions") or [])
            and st.get("readyReplicas", 0) >= want and st.get("updatedReplicas", 0) >= want)


def wait_available(kube: Kube, deps: list[tuple[str, str]], timeout: float) -> None:
    """Wait until every Deployment of ``deps`` is :func:`available`.

    Raises:
        TimeoutError: names those that are not, with their pods' phases and reasons.
    """
    poll_until(lambda: all(available(kube, *d) for d in deps), what="Deployments Available", timeout=timeout,
               interval=1, detail=lambda: "; ".join(f"{ns}/{n} ({pod_states(kube, ns, n)})" for ns, n in deps
                                                    if not available(kube, ns, n)))


def pods(kube: Kube, namespace: str, name: str) -> list[dict]:
    """The pods of Deployment ``namespace/name`` (its selector's ``matchLabels``; none when it does not exist)."""
    d = kube.get_or_none("apps/v1", "deployments", name, namespace)
    if d is None:
        return []
    selector = ",".join(f"{k}={v}" for k, v in sorted(d["spec"]["selector"]["matchLabels"].items()))
    return kube.list("v1", "pods", namespace, labelSelector=selector)["items"]


def pod_states(kube: Kube, namespace: str, name: str) -> str:
    """``pod: phase reason`` of each pod of a Deployment, for error messages."""
    out = []
    for p in pods(kube, namespace, name):
        st = p.get("status") or {}
        waiting = [c["state"]["waiting"].get("reason", "") for c in st.get("containerStatuses") or []
                   if "waiting" in (c.get("state") or {})]
        out.append(f"{p['metadata']['name']}: {st.get('phase')} {' '.join(waiting)}".strip())
    return ", ".join(out) or "no pods"


def remove(kube: Kube, deps: list[tuple[str, str]], timeout: float = 60.0) -> None:
    """Delete Deployments ``deps`` and their configuration files (ConfigMap ``<name>-config``: a later ``pulumi up``
    must not meet fields this run's field manager owns), and wait until they and their pods are gone (best effort)."""
    for ns, name in deps:
        try:
            kube.delete("apps/v1", "deployments", name, ns, propagation="Foreground")
        except KubeError:
            pass
        try:
            kube.delete("v1", "configmaps", f"{name}-config", ns)
        except KubeError:
            pass
    # Foreground deletion: the Deployment object stays until its ReplicaSets and pods are gone.
    with contextlib.suppress(PollTimeout):  # best effort
        poll_until(lambda: not any(pods(kube, ns, name) or kube.get_or_none("apps/v1", "deployments", name, ns)
                                   for ns, name in deps), what="Deployments and their pods gone", timeout=timeout,
                   interval=0.5)


def logs(kube: Kube, namespace: str, name: str) -> dict[str, str]:
    """Pod name -> log of each pod of Deployment ``namespace/name`` (through the kubelet; "" when it has none yet).

    A container that restarted (a leader that lost its Lease exits 1 and comes back as a follower) has its
    previous instance's log first: what it did while it led is part of the run.
    """
    out = {}
    for p in pods(kube, namespace, name):
        pod = p["metadata"]["name"]
        restarted = any(s.get("restartCount") for s in (p.get("status") or {}).get("containerStatuses") or [])
        text = ""
        for previous in ((True, False) if restarted else (False,)):
            try:
                text += kube.pod_log(namespace, pod, previous=previous)
            except KubeError:
                pass
        out[pod] = text
    return out


#: The taint controller's line for each transition (:meth:`gpufleet.taint_controller.controller.TaintController.tick`).
_TRANSITION = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: taint controller: "
                         r"(?P<to>tainted|untainted) virtual nodes after (?P<reaction>[\d.]+)s "
                         r"\(apply (?P<ms>\d+) ms\): (?P<reason>.*)$")


def transitions(texts: list[str], wall_t0: float, since: float = 0.0) -> list[Transition]:
    """The taint controller's transitions from its pods' logs, in time order, from wall-clock ``since`` on.

    ``at`` is in seconds since ``wall_t0`` (wall-clock seconds; the pods log
    in UTC), the other fields as the controller measured them.
    """
    out = []
    for text in texts:
        for line in text.splitlines():
            if m := _TRANSITION.match(line.strip()):
                when = dt.datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.timezone.utc)
                if when.timestamp() < since:
                    continue
                out.append(Transition(round(when.timestamp() - wall_t0, 2), m["to"] == "tainted",
                                      float(m["reaction"]), int(m["ms"]) / 1000, m["reason"]))
    return sorted(out, key=lambda t: t.at)
