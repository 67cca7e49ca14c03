"""Pure builders of Kubernetes objects shared by several roles.

Each returns a plain manifest dict (what ``kubectl apply`` would take), so
roles compose them and tests check them without a Pulumi engine.
"""

from __future__ import annotations

from typing import Any


Obj = dict[str, Any]

#: Labels on every object gpufleet declares (Kubernetes recommended labels).
def labels(component: str, part_of: str = "gpufleet") -> dict[str, str]:
    """Recommended labels (``app.kubernetes.io/*``) for one component."""
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": part_of,
            "app.kubernetes.io/managed-by": "pulumi"}


def meta(name: str, namespace: str | None = None, component: str | None = None, **extra: Any) -> Obj:
    """ObjectMeta with gpufleet's labels; ``extra`` adds e.g. annotations."""
    out: Obj = {"name": name, "labels": labels(component or name)}
    if namespace:
        out["namespace"] = namespace
    out.update(extra)
    return out


def namespace(name: str) -> Obj:
    """A Namespace."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(name)}


def config_map(name: str, namespace: str, data: dict[str, str], component: str | None = None,
               extra_labels: dict[str, str] | None = None) -> Obj:
    """A ConfigMap of text files."""
    m = meta(name, namespace, component)
    m["labels"].update(extra_labels or {})
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": m, "data": data}


def service_account(name: str, namespace: str) -> Obj:
    """A ServiceAccount."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name, namespace)}


def cluster_rbac(name: str, namespace: str, rules: list[Obj]) -> list[Obj]:
    """ClusterRole with ``rules`` bound to ServiceAccount ``namespace/name`` (least privilege)."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": meta(f"gpufleet:{name}", component=name), "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": meta(f"gpufleet:{name}", component=name),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"gpufleet:{name}"},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}
    return [role, binding]


def rule(groups: list[str], resources: list[str], verbs: list[str]) -> Obj:
    """One RBAC PolicyRule."""
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


#: Leader election through coordination.k8s.io Leases (one active instance).
LEASE_RULE = rule(["coordination.k8s.io"], ["leases"], ["get", "list", "watch", "create", "update", "patch"])
EVENT_RULE = rule(["", "events.k8s.io"], ["events"], ["create", "patch"])


def controller(name: str, namespace: str, args: list[str], rules: list[Obj], *, image: str, port: int = 8080,
               cpu: str = "100m", memory: str = "256Mi", env: dict[str, str] | None = None,
               volumes: list[Obj] | None = None, mounts: list[Obj] | None = None) -> list[Obj]:
    """A gpufleet controller: ServiceAccount, least-privilege RBAC and a Deployment.

    The container runs ``gpufleet <args>`` from ``image`` (the inventory's ``gpufleet_image``), with
    resource requests, a liveness probe on ``/healthz`` and metrics on ``port``.
    Two replicas: one is active at a time through a Lease (leader election).
    """
    pod_labels = {"app.kubernetes.io/name": name}
    container: Obj = {
        "name": name,
        "image": image,
        "args": args,
        "ports": [{"name": "metrics", "containerPort": port}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        + [{"name": k, "value": v} for k, v in sorted((env or {}).items())],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10, "failureThreshold": 3},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True},
    }
    if mounts:
        container["volumeMounts"] = mounts
    spec: Obj = {"serviceAccountName": name, "containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, namespace),
        "spec": {"replicas": 2, "selector": {"matchLabels": pod_labels},
                 "template": {"metadata": {"labels": pod_labels}, "spec": spec}},
    }
    return [service_account(name, namespace), *cluster_rbac(name, namespace, rules), deployment]
