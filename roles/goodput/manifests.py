"""What the goodput role declares: the ``gpufleet goodput`` accountant in every team namespace.

Least privilege: a namespaced Role that only reads Kueue Workloads, pods
and Events of its own namespace; the team's checkpoint volume mounted
read-only where training pods mount it (``parallel_fs_mount_path``), so
the ``CHECKPOINT_DIR`` a job's pods were given is the path it reads. One
replica: it reads only, and keeps its history in memory. Its settings go in
one file, ConfigMap ``gpufleet-goodput-config`` of the namespace (mounted
read-only at ``/etc/gpufleet/config``, passed as ``--config``): the
configuration ``roles/goodput/config.py`` builds from the inventory.
"""

from __future__ import annotations

from gpufleet.goodput.config import dump
from gpufleet_admin.inventory import Inventory
from gpufleet.names import KUEUE_GROUP
from gpufleet_admin.manifests import (Obj, api_server_env, config_file, duration, meta, rule, service_account,
                                     system_placement)

from ..parallel_fs.manifests import team_namespaces, volume
from .config import configuration

NAME = "gpufleet-goodput"
#: Component label (``app.kubernetes.io/name``) of the accountant's pods and Service.
COMPONENT = "goodput"


def rules() -> list[Obj]:
    """What the accountant reads in its namespace, and nothing else."""
    return [rule([KUEUE_GROUP], ["workloads"], ["get", "list", "watch"]),
            rule([""], ["pods"], ["get", "list", "watch"]),
            rule([""], ["events"], ["get", "list", "watch"])]


def accountant(inv: Inventory, ns: str) -> list[Obj]:
    """ServiceAccount, Role, RoleBinding, Deployment and metrics Service of one namespace's accountant."""
    v, pfs = inv.role("goodput"), inv.role("parallel_fs")
    labels = {"app.kubernetes.io/name": COMPONENT}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(NAME, ns, COMPONENT),
            "rules": rules()}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(NAME, ns, COMPONENT),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
               "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": ns}]}
    cf = config_file(NAME, ns, dump(configuration(inv)), COMPONENT)
    container = {
        "name": "goodput", "image": inv.fleet.gpufleet_image,
        "args": ["goodput", "--namespace", ns, *cf.args, "--metrics-port", str(v.goodput_port)],
        "env": api_server_env(inv.fleet.gpufleet_api_server),
        "ports": [{"name": "metrics", "containerPort": v.goodput_port}],
        "resources": {"requests": {"cpu": v.goodput_cpu, "memory": v.goodput_memory},
                      "limits": {"memory": v.goodput_memory}},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": v.goodput_port}, "periodSeconds": 10,
                          "failureThreshold": 3},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True},
        "volumeMounts": [{"name": "checkpoints", "mountPath": pfs.parallel_fs_mount_path, "readOnly": True}, cf.mount],
    }
    vol = volume(inv)
    if "persistentVolumeClaim" in vol:
        vol = {**vol, "persistentVolumeClaim": {**vol["persistentVolumeClaim"], "readOnly": True}}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(NAME, ns, COMPONENT),
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": dict(labels), "annotations": dict(cf.annotations)},
                              "spec": {"serviceAccountName": NAME, "containers": [container], "volumes": [vol, cf.volume],
                                       **system_placement(inv.fleet)}}},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta(NAME, ns, COMPONENT),
               "spec": {"clusterIP": "None", "selector": dict(labels),
                        "ports": [{"name": "metrics", "port": v.goodput_port, "targetPort": "metrics"}]}}
    out = [service_account(NAME, ns), role, binding, cf.config_map, deployment, service]
    if inv.role("gpu_metrics").gpu_metrics_prometheus_operator:
        interval = duration(inv.role("gpu_metrics").gpu_metrics_scrape_interval_seconds)
        out.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": meta(NAME, ns, COMPONENT),
                    "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": COMPONENT}},
                             "endpoints": [{"port": "metrics", "interval": interval}]}})
    return out


def objects(inv: Inventory) -> list[Obj]:
    """One accountant per team namespace (namespaces with a LocalQueue)."""
    if not inv.role("goodput").goodput_enabled or not inv.role("parallel_fs").parallel_fs_enabled:
        return []
    return [o for ns in team_namespaces(inv) for o in accountant(inv, ns)]
