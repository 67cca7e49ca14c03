"""Simulated GPU nodes: kwok's command line, its Stages, and Node manifests from the inventory.

kwok manages only Nodes annotated ``kwok.x-k8s.io/node: fake`` (so a
virtual kubelet's Node in the same cluster is left alone) and the pods bound
to them. Stages are objects of kwok's Stage API (``kwok.x-k8s.io/v1alpha1``)
stored in the cluster (``--enable-crds=Stage``), so tests may add their own
(a node going NotReady, a pod failing) while the cluster runs.

Stages installed (upstream ones read from the pinned kwok module):

* ``node-initialize`` (``kustomize/stage/node/fast``): a new Node becomes
  Ready, keeping the capacity/allocatable it was created with.
* ``node-heartbeat-with-lease``: slow status refresh; liveness comes from
  the node Leases kwok renews.
* ``pod-ready`` (``kustomize/stage/pod/fast``): a pod bound to a kwok node
  becomes Running and Ready with a pod IP from ``--cidr``.
* ``gpufleet-pod-complete``: a Running pod with annotation
  :data:`SIMULATED_DURATION_ANNOTATION` (seconds, or a Go duration such as ``5m``)
  Succeeds that long after it started running.
* ``gpufleet-pod-terminate``: a pod being deleted that still has a
  finalizer (a Job's ``batch.kubernetes.io/job-tracking``) ends as a
  kubelet ends it: its containers terminated (exit code 143, SIGTERM),
  phase ``Failed``. The finalizer's owner then sees the pod finished (the Job
  controller counts it, or ignores it under its podFailurePolicy, and
  creates the replacement) and removes the finalizer.
* ``pod-delete``: a pod being deleted without finalizers is removed at once
  (upstream's stage, plus that condition: deleting a pod that waits on a
  finalizer would leave it "Running" for ever).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet_workshop.local import manifests
from gpufleet_workshop.local.components import component
from gpufleet_admin.build.gobuild import module_dir
from gpufleet_workshop.local.webhooks import load_crds
from gpufleet.names import LOCAL_CLUSTER_LABEL, SIMULATED_DURATION_ANNOTATION, SIMULATED_LABEL

#: Annotation giving a simulated pod's run time.
#: Annotation selecting the nodes kwok manages.
MANAGED_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
#: Label on every Node the local cluster created from the inventory.
#: Pod IP range (kept clear of the 10.96.0.0/16 service range).
POD_CIDR = "10.128.0.0/12"
#: Node lease duration (s); kwok renews at a quarter of it (100 s). Lease
#: renewals are the largest steady load at scale (4096 nodes renewing every
#: 10 s, kubelet's default, would be 400 writes/s), so they are spaced out.
LEASE_SECONDS = 400
#: kube-controller-manager's ``--node-monitor-grace-period``: longer than the
#: renewal interval, so a node whose kwok stops goes NotReady after ~3 minutes.
#: Tests that need NotReady sooner set the condition with a kwok Stage.
NODE_MONITOR_GRACE = "200s"

_UPSTREAM_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
)


def kwok_source() -> Path:
    """Folder of the pinned kwok module in the Go module cache."""
    c = component("kwok")
    return module_dir(c.module, c.version)


def stage_crds() -> list[dict]:
    """kwok's Stage CRD (the only kwok CRD the local cluster enables)."""
    return [c for c in load_crds(kwok_source() / "kustomize" / "crd" / "bases") if c["spec"]["names"]["kind"] == "Stage"]


def _complete_stage(src: Path) -> dict:
    """Our pod-complete Stage, reusing upstream's status template."""
    upstream = manifests.load_one(src / "kustomize/stage/pod/fast/pod-complete.yaml")
    value = f'.metadata.annotations["{SIMULATED_DURATION_ANNOTATION}"]'
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": "gpufleet-pod-complete"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                    {"key": value, "operator": "Exists"},
                ]
            },
            "delay": {
                "durationMilliseconds": 0,
                # "30" -> "30s"; "5m" stays a Go duration.
                "durationFrom": {
                    "expressionFrom": f'({value} | tostring) as $v | if ($v | test("^[0-9.]+$")) then $v + "s" else $v end'
                },
            },
            "next": {"statusTemplate": upstream["spec"]["next"]["statusTemplate"]},
        },
    }


def _terminate_stage(src: Path) -> dict:
    """Our pod-terminate Stage: a deleted pod held by a finalizer becomes Failed, containers exited 143."""
    upstream = manifests.load_one(src / "kustomize/stage/pod/fast/pod-complete.yaml")
    template = (upstream["spec"]["next"]["statusTemplate"]
                .replace("exitCode: 0", "exitCode: 143").replace("reason: Completed", "reason: Error")
                .replace("phase: Succeeded", "phase: Failed"))
    # Upstream reads the old container statuses into $origin (unused); a pod deleted while still Pending has none.
    template = "\n".join(line for line in template.splitlines() if "$origin" not in line) + "\n"
    assert "exitCode: 143" in template and "phase: Failed" in template, "upstream pod-complete template changed"
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": "gpufleet-pod-terminate"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {"matchExpressions": [
                {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                {"key": ".metadata.finalizers", "operator": "Exists"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending", "Running"]},
            ]},
            "next": {"statusTemplate": template},
        },
    }


def _delete_stage(src: Path) -> dict:
    """Upstream's pod-delete Stage, for pods no finalizer holds (see the module docstring)."""
    stage = manifests.load_one(src / "kustomize/stage/pod/fast/pod-delete.yaml")
    stage["spec"]["selector"]["matchExpressions"].append({"key": ".metadata.finalizers", "operator": "DoesNotExist"})
    return stage


def stages() -> list[dict]:
    """Every Stage object the local cluster installs (see the module docstring)."""
    src = kwok_source()
    out = [manifests.load_one(src / p) for p in _UPSTREAM_STAGES[:3]]
    return [*out, _complete_stage(src), _terminate_stage(src), _delete_stage(src)]


def node_manifest(spec, cluster: str) -> dict:
    """A kwok-managed Node from an inventory ``NodeSpec``.

    Args:
        spec: object with ``name``, ``labels``, ``taints`` (dicts with key,
            value, effect) and ``capacity`` (resource -> quantity string).
        cluster: local cluster name, recorded in label ``gpufleet.io/local-cluster``.

    Returns:
        A Node manifest with status capacity = allocatable = ``spec.capacity``
        (set on create; kwok keeps it).
    """
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        SIMULATED_LABEL: "true",
        LOCAL_CLUSTER_LABEL: cluster,
        **dict(spec.labels),
    }
    taints = [{k: t[k] for k in ("key", "value", "effect") if t.get(k) is not None} for t in spec.taints]
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {MANAGED_ANNOTATION[0]: MANAGED_ANNOTATION[1]},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": dict(spec.capacity), "allocatable": dict(spec.capacity)},
    }
    return node


def kwok_configuration(parallelism: int = 16) -> dict:
    """kwok's ``config.kwok.x-k8s.io/v1alpha1`` KwokConfiguration: more workers than the default 4.

    Args:
        parallelism: node stages, node leases and pod stages processed in
            parallel (thousands of nodes become Ready faster).
    """
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "nodePlayStageParallelism": parallelism,
            "nodeLeaseParallelism": parallelism,
            "podPlayStageParallelism": parallelism,
        },
    }


def kwok_argv(kubeconfig: Path, port: int, config_file: Path) -> list[str]:
    """Command line of kwok for the local cluster (health/metrics server on ``127.0.0.1:port``).

    Args:
        config_file: a :func:`kwok_configuration` file (stages are not read
            from it but from the cluster).
    """
    return [
        str(component("kwok").binary()),
        f"--config={config_file}",
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION[0]}={MANAGED_ANNOTATION[1]}",
        "--enable-crds=Stage",
        f"--server-address=127.0.0.1:{port}",
        f"--cidr={POD_CIDR}",
        "--node-ip=10.127.0.1",
        f"--node-lease-duration-seconds={LEASE_SECONDS}",
        # INFO logs a line per lease renewal: thousands a minute at scale.
        "--v=WARN",
    ]
