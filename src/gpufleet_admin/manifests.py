"""Pure builders of Kubernetes objects shared by several roles.

Each returns a plain manifest dict (what ``kubectl apply`` would take), so
roles compose them and tests check them without a Pulumi engine. This module
sits below the roles and the stack program that declares what they build
(``gpufleet_admin.stack -> roles -> gpufleet_admin.manifests``): it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.componentconfig import checksum
from gpufleet.kube.config import API_SERVER_ENV
from gpufleet.names import CONFIG_CHECKSUM_ANNOTATION, SYSTEM_NODE_TAINT


Obj = dict[str, Any]


@dataclass(frozen=True)
class HelmRelease:
    """A pinned Helm chart install: ``chart`` from ``repo`` (or an ``oci://`` chart) at ``version``.

    Declared by :class:`gpufleet_admin.stack.role.RoleComponent`; defined here because
    the roles' manifests, which gpufleet's controllers load, must not need Pulumi.
    """

    name: str
    namespace: str
    chart: str
    version: str
    values: dict[str, Any] = field(default_factory=dict)
    repo: str | None = None


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


def namespaced_rbac(name: str, namespace: str, rules: list[Obj], *, account_namespace: str | None = None) -> list[Obj]:
    """Role with ``rules`` in ``namespace`` bound to ServiceAccount ``<account_namespace or namespace>/name``:
    rights that stop at one namespace."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": meta(f"gpufleet:{name}", namespace, component=name), "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": meta(f"gpufleet:{name}", namespace, component=name),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"gpufleet:{name}"},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": account_namespace or namespace}]}
    return [role, binding]


def rule(groups: list[str], resources: list[str], verbs: list[str], names: list[str] | None = None) -> Obj:
    """One RBAC PolicyRule; ``names`` restricts it to those objects (``resourceNames``)."""
    out: Obj = {"apiGroups": groups, "resources": resources, "verbs": verbs}
    if names:
        out["resourceNames"] = names
    return out


def duration(seconds: float) -> str:
    """A duration as Prometheus and Kubernetes write one: ``15s``; a fraction of a second in ``ms`` (``1500ms``)."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


#: Leader election through coordination.k8s.io Leases (one active instance).
LEASE_RULE = rule(["coordination.k8s.io"], ["leases"], ["get", "list", "watch", "create", "update", "patch"])
EVENT_RULE = rule(["", "events.k8s.io"], ["events"], ["create", "patch"])


def api_server_env(endpoint: str | None) -> list[Obj]:
    """:data:`gpufleet.kube.config.API_SERVER_ENV` set to ``https://HOST:PORT`` (none when None): the API
    server gpufleet's in-cluster client uses instead of the ``kubernetes`` Service's address (one decision,
    in :func:`gpufleet.kube.config.load_config`)."""
    return [{"name": API_SERVER_ENV, "value": endpoint}] if endpoint else []


def system_toleration() -> Obj:
    """The toleration of the system-node taint (:data:`gpufleet.names.SYSTEM_NODE_TAINT`)."""
    key, value, effect = SYSTEM_NODE_TAINT
    return {"key": key, "operator": "Equal", "value": value, "effect": effect}


def system_placement(fleet: Any) -> Obj:
    """Pod spec fields placing a gpufleet pod on ``fleet.gpufleet_node_selector`` (empty without one).

    Placed on system nodes on purpose, the pod tolerates their taint there
    (and only then): ``{"nodeSelector": {...}, "tolerations": [...]}``.
    """
    if not fleet.gpufleet_node_selector:
        return {}
    return {"nodeSelector": dict(fleet.gpufleet_node_selector), "tolerations": [system_toleration()]}


#: Where a gpufleet pod finds its configuration file (``--config``): the component's ConfigMap, mounted read-only.
CONFIG_DIR = "/etc/gpufleet/config"
CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class ConfigFile:
    """A component's configuration file as a pod gets it: ConfigMap, volume, mount, flag and checksum.

    The pod template carries :data:`gpufleet.names.CONFIG_CHECKSUM_ANNOTATION` (the file's SHA-256),
    so a changed file changes the template and the Deployment rolls its pods.
    """

    config_map: Obj
    volume: Obj
    mount: Obj
    args: tuple[str, ...]
    annotations: dict[str, str]


def config_file(name: str, namespace: str, text: str, component: str | None = None) -> ConfigFile:
    """ConfigMap ``<name>-config`` in ``namespace`` holding ``text`` as ``config.yaml``, and how a pod mounts it."""
    cm = config_map(f"{name}-config", namespace, {CONFIG_FILE: text}, component=component or name)
    return ConfigFile(
        config_map=cm,
        volume={"name": "config", "configMap": {"name": f"{name}-config"}},
        mount={"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        args=("--config", f"{CONFIG_DIR}/{CONFIG_FILE}"),
        annotations={CONFIG_CHECKSUM_ANNOTATION: checksum(text)},
    )


def controller(name: str, namespace: str, args: list[str], rules: list[Obj], *, fleet: Any, port: int = 8080,
               cpu: str = "100m", memory: str = "256Mi", env: dict[str, str] | None = None,
               volumes: list[Obj] | None = None, mounts: list[Obj] | None = None,
               namespaced_rules: list[Obj] | None = None, config: str | None = None,
               image: str | None = None) -> list[Obj]:
    """A gpufleet controller: ServiceAccount, least-privilege RBAC and a Deployment.

    ``fleet`` (the inventory's :class:`~gpufleet_admin.inventory.models.FleetVars`)
    gives the image (``gpufleet_image``, unless ``image`` names another), the API endpoint where there is no
    service network (``gpufleet_api_server``) and the nodes to run on
    (``gpufleet_node_selector``; with one, the system-node taint is tolerated).
    The container runs ``gpufleet <args>`` from that image, with
    resource requests, a liveness probe on ``/healthz`` and metrics on ``port``,
    on a read-only root filesystem with a small writable ``/tmp``.
    Two replicas: one is active at a time through a Lease (leader election).
    ``rules`` hold cluster-wide (a ClusterRole); ``namespaced_rules`` only in
    ``namespace`` (a Role): whatever can stop at the controller's own
    namespace does. With ``config`` (the text of the component's
    configuration file, which the role built from the inventory), the file
    goes along in ConfigMap ``<name>-config``, mounted read-only at
    :data:`CONFIG_DIR`, passed as ``--config``, its checksum on the pod
    template (:func:`config_file`).
    """
    extra: list[Obj] = []
    template_meta: Obj = {}
    if config is not None:
        cf = config_file(name, namespace, config)
        extra.append(cf.config_map)
        volumes, mounts = [*(volumes or []), cf.volume], [*(mounts or []), cf.mount]
        args = [*args, *cf.args]
        template_meta["annotations"] = dict(cf.annotations)
    pod_labels = {"app.kubernetes.io/name": name}
    container: Obj = {
        "name": name,
        "image": image or fleet.gpufleet_image,
        "args": args,
        "ports": [{"name": "metrics", "containerPort": port}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        + api_server_env(fleet.gpufleet_api_server)
        + [{"name": k, "value": v} for k, v in sorted((env or {}).items())],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        # /healthz fails on a stale heartbeat (a stuck loop); a slow answer on a busy node is not one: the
        # kubelet's 1 s default timeout restarted controllers that were working, under load.
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10, "timeoutSeconds": 5,
                          "failureThreshold": 3},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True},
    }
    # The root filesystem is read-only; the Kubernetes client writes a kubeconfig's embedded
    # certificates (a kubernetes pool's) to temporary files.
    container["volumeMounts"] = [*(mounts or []), {"name": "tmp", "mountPath": "/tmp"}]
    volumes = [*(volumes or []), {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}]
    spec: Obj = {"serviceAccountName": name, "containers": [container], **system_placement(fleet), "volumes": volumes}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, namespace),
        "spec": {"replicas": 2, "selector": {"matchLabels": pod_labels},
                 "template": {"metadata": {"labels": pod_labels, **template_meta}, "spec": spec}},
    }
    rbac = cluster_rbac(name, namespace, rules) + (namespaced_rbac(name, namespace, namespaced_rules)
                                                   if namespaced_rules else [])
    return [service_account(name, namespace), *rbac, *extra, deployment]
