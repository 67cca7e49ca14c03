"""Least privilege, asked of the API server: each gpufleet ServiceAccount can do what its controller does, and no more.

The RBAC objects are the ones the roles declare for the ``local``
environment (rendered through the real stack program), applied to the local
cluster; every question is a SubjectAccessReview for the ServiceAccount's
user and groups, answered by the API server's RBAC authorizer.

``NEEDED`` is what each controller's code calls (read from the code, not from
the roles): a missing verb would break production. ``NEVER`` is what none
of them may do: read Secrets cluster-wide, delete Nodes or Namespaces,
create Pods, change Services, bind or escalate RBAC, impersonate.
"""

from __future__ import annotations

import pytest
from gpufleet.kube import Kube
from gpufleet_workshop.local.apply import apply_changed
from gpufleet_admin.stack.render import render
from gpufleet.wait import poll_until
from roles.registry import load

pytestmark = pytest.mark.cluster

RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
SYSTEM = "gpufleet-system"

# (verb, group, resource, namespace, name): namespace "" = cluster-wide, OWN = the ServiceAccount's own; name "" = any.
Ask = tuple[str, str, str, str, str]
OWN = "<own namespace>"


def _ask(verb: str, resource: str, namespace: str = "", name: str = "", group: str = "") -> Ask:
    return (verb, group, resource, namespace, name)


LEASES = [_ask(v, "leases", SYSTEM, group="coordination.k8s.io") for v in ("get", "create", "update")]
EVENTS = [_ask("create", "events", SYSTEM), _ask("create", "events", "team-pretrain")]
NEEDED: dict[str, list[Ask]] = {
    # flip/controller.py, flipout.py, flipback.py: taints by update, tolerations by patch, evictions, deletes.
    "taint-controller": [*(_ask(v, "nodes") for v in ("get", "list", "watch", "patch", "update")),
                         *(_ask(v, "pods") for v in ("list", "watch", "get")),
                         _ask("patch", "pods", "team-pretrain"), _ask("delete", "pods", "inference"),
                         _ask("create", "pods/eviction", "inference"), *LEASES, *EVENTS,
                         # flip/surge.py: make-before-break replacements, only where inference runs.
                         *(_ask(v, "replicasets", "inference", group="apps") for v in ("get", "create", "delete")),
                         # flip/surge.py Deployments: a watch cache per inference namespace.
                         *(_ask(v, "deployments", "inference", group="apps") for v in ("get", "list", "watch")),
                         # vk/orphans.py: gpufleet's EndpointSlices and the node Leases watched, a silent
                         # publisher's slices marked not ready, a deleted node's removed.
                         *(_ask(v, "endpointslices", group="discovery.k8s.io") for v in ("list", "watch")),
                         *(_ask(v, "endpointslices", "inference", group="discovery.k8s.io") for v in ("patch", "delete")),
                         *(_ask(v, "leases", "kube-node-lease", group="coordination.k8s.io") for v in ("list", "watch")),
                         # flip/published.py: Services watched to know a replacement is published.
                         *(_ask(v, "services") for v in ("list", "watch"))],
    # quota/controller.py, resync.py: capacity from nodes and pods, nominalQuota patched.
    "quota-sync": [_ask("list", "nodes"), _ask("watch", "nodes"), _ask("list", "pods"),
                   *(_ask(v, "clusterqueues", group="kueue.x-k8s.io") for v in ("get", "list", "watch", "patch")),
                   _ask("list", "resourceflavors", group="kueue.x-k8s.io"),
                   _ask("list", "workloads", "team-pretrain", group="kueue.x-k8s.io"), *LEASES, *EVENTS],
    # health/remediate.py, ops/swap.py, ops/drain.py: cordon/taint, drain through evictions, swap-request ConfigMaps.
    "node-health": [*(_ask(v, "nodes") for v in ("get", "list", "watch", "patch", "update")),
                    _ask("list", "pods"), _ask("create", "pods/eviction", "inference"),
                    _ask("list", "poddisruptionbudgets", "inference", group="policy"),
                    *(_ask(v, "configmaps", SYSTEM) for v in ("get", "list", "create", "update", "patch")),
                    *LEASES, *EVENTS],
    # vk/node.py, lease.py, pods.py: its Node and node Lease, the pods bound to it and their status.
    "vk-rental": [*(_ask(v, "nodes") for v in ("get", "create", "update", "patch")),
                  _ask("update", "nodes/status"), _ask("patch", "nodes/status"),
                  *(_ask(v, "pods") for v in ("get", "list", "watch", "update", "patch", "delete")),
                  _ask("update", "pods/status", "inference"), _ask("patch", "pods/status", "inference"),
                  *(_ask(v, "leases", "kube-node-lease", group="coordination.k8s.io") for v in ("get", "create", "update")),
                  # vk/endpoints.py: Services watched; its EndpointSlices watched, applied (create/patch), deleted.
                  _ask("list", "services"), _ask("watch", "services"),
                  *(_ask(v, "endpointslices", group="discovery.k8s.io") for v in ("list", "watch")),
                  *(_ask(v, "endpointslices", "inference", group="discovery.k8s.io") for v in ("create", "patch", "delete")),
                  # vk/reflect.py: the ConfigMaps and Secrets pods outside reference, where inference runs.
                  *(_ask(v, r, "inference") for r in ("configmaps", "secrets") for v in ("get", "list", "watch")),
                  *EVENTS],
    "vk-other": [_ask("get", "nodes"), _ask("create", "nodes"), _ask("update", "nodes/status"),
                 _ask("list", "pods"), _ask("update", "pods/status", "inference"), _ask("watch", "services"),
                 _ask("patch", "endpointslices", "inference", group="discovery.k8s.io"),
                 _ask("get", "secrets", SYSTEM, "other-cluster-kubeconfig"),
                 _ask("get", "secrets", "inference"), _ask("watch", "configmaps", "inference")],
    # goodput/: one accountant per team namespace reads that namespace's Workloads, pods and Events.
    "gpufleet-goodput": [*(_ask(v, "workloads", OWN, group="kueue.x-k8s.io") for v in ("get", "list", "watch")),
                         *(_ask(v, r, OWN) for r in ("pods", "events") for v in ("get", "list", "watch"))],
    # exporter/: reads sysfs and NVML, serves /metrics; asks the API server nothing.
    "gpufleet-fabric-exporter": [],
}
NEVER: list[Ask] = [
    _ask("list", "secrets"), _ask("get", "secrets", "kube-system"), _ask("watch", "secrets", "team-pretrain"),
    _ask("get", "secrets", SYSTEM, "some-other-secret"),
    _ask("delete", "nodes"), _ask("delete", "namespaces"), _ask("delete", "namespaces", name="team-pretrain"),
    _ask("create", "pods", "default"), _ask("create", "pods", "kube-system"), _ask("create", "pods", SYSTEM),
    _ask("patch", "services", "inference"), _ask("delete", "services", "inference"),
    _ask("create", "replicasets", "kube-system", group="apps"), _ask("create", "replicasets", "team-pretrain", group="apps"),
    _ask("create", "clusterrolebindings", group="rbac.authorization.k8s.io"),
    _ask("create", "rolebindings", SYSTEM, group="rbac.authorization.k8s.io"),
    _ask("bind", "clusterroles", group="rbac.authorization.k8s.io"),
    _ask("escalate", "clusterroles", group="rbac.authorization.k8s.io"),
    _ask("update", "clusterroles", group="rbac.authorization.k8s.io"),
    _ask("impersonate", "users"), _ask("impersonate", "groups"), _ask("impersonate", "serviceaccounts", SYSTEM),
    _ask("create", "serviceaccounts/token", SYSTEM),
]


@pytest.fixture(scope="module")
def accounts(local_cluster) -> dict[str, str]:
    """The roles' ServiceAccounts and RBAC applied to the cluster; ``{name: namespace}`` of each ServiceAccount."""
    objs = [o for o in render(load("local")).objects if o["kind"] in RBAC_KINDS]
    with local_cluster.cluster.kube() as k:
        apply_changed(k, sorted(objs, key=lambda o: o["kind"] != "Namespace"))
    accounts = {o["metadata"]["name"]: o["metadata"]["namespace"] for o in objs if o["kind"] == "ServiceAccount"}
    # The RBAC authorizer decides from its own informers: a Role or binding just written may not be seen for a
    # moment. Wait until every account's first needed verb is allowed, so the tests read settled RBAC.
    poll_until(lambda: all(_allowed(local_cluster.kube, sa, ns, NEEDED[sa][0]) for sa, ns in accounts.items()
                           if NEEDED.get(sa)),
               what="the applied RBAC seen by the authorizer", timeout=30, interval=0.5)
    return accounts


def _allowed(k: Kube, sa: str, namespace: str, ask: Ask) -> bool:
    verb, group, resource, ns, name = ask
    ns = namespace if ns == OWN else ns
    resource, _, sub = resource.partition("/")
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": sub or None,
                  "namespace": ns or None, "name": name or None}
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": f"system:serviceaccount:{namespace}:{sa}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
        "resourceAttributes": {key: v for key, v in attributes.items() if v is not None}}}
    return bool(k.create("authorization.k8s.io/v1", "subjectaccessreviews", review)["status"].get("allowed"))


def test_every_service_account_is_covered(accounts):
    assert set(accounts) == set(NEEDED)


@pytest.mark.parametrize("sa", sorted(NEEDED))
def test_needed_verbs_are_allowed(local_cluster, accounts, sa):
    denied = [ask for ask in NEEDED[sa] if not _allowed(local_cluster.kube, sa, accounts[sa], ask)]
    assert denied == [], f"{sa} lacks what its controller does"


@pytest.mark.parametrize("sa", sorted(NEEDED))
def test_dangerous_verbs_are_denied(local_cluster, accounts, sa):
    allowed = [ask for ask in NEVER if _allowed(local_cluster.kube, sa, accounts[sa], ask)]
    assert allowed == [], f"{sa} may do what no gpufleet controller may"


# gpufleet's own client in the pod: gpufleet.kube.config decides (service account, GPUFLEET_API_SERVER).
IN_CLUSTER = """
from gpufleet.kube import Forbidden, Kube
k = Kube()
print("source", k.config.source)
print("server", k.server)
print("nodes", len(k.list("v1", "nodes")["items"]))
try:
    k.list("v1", "secrets")
    print("secrets allowed")
except Forbidden:
    print("secrets 403")
"""


def test_a_controller_pod_reaches_the_api_server_in_cluster_with_its_token(local_cluster, accounts):
    """From gpufleet's image on the real node: ServiceAccount token and CA, the endpoint from gpufleet_api_server
    (``GPUFLEET_API_SERVER``: the ``kubernetes`` Service the kubelet names has no kube-proxy behind it)."""
    from gpufleet_admin.build import image as images
    from gpufleet_workshop.local import node as realnode
    from gpufleet_admin.manifests import api_server_env, system_toleration

    k = local_cluster.kube
    name, sa = "in-cluster-probe", "taint-controller"
    endpoint = realnode.in_cluster_api(local_cluster.cluster.ports)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": accounts[sa]},
           "spec": {"serviceAccountName": sa, "restartPolicy": "Never",
                    "nodeName": realnode.node_name(local_cluster.name), "tolerations": [system_toleration()],
                    "containers": [{"name": "main", "image": images.built()["reference"],
                                    "command": ["python3", "-c", IN_CLUSTER], "env": api_server_env(endpoint),
                                    "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True}}]}}
    k.create("v1", "pods", pod, accounts[sa])
    try:
        phase = poll_until(lambda: (ph := k.get("v1", "pods", name, accounts[sa]).get("status", {}).get("phase"))
                           in ("Succeeded", "Failed") and ph, what=f"pod {name} finished", timeout=120, interval=0.5)
        logs = k.pod_log(accounts[sa], name)
        assert phase == "Succeeded", logs
        assert "source in-cluster service account (API server from $GPUFLEET_API_SERVER)" in logs, logs
        assert f"server {endpoint}" in logs, logs
        assert f"nodes {len(k.list('v1', 'nodes')['items'])}" in logs, logs
        assert "secrets 403" in logs, logs
    finally:
        k.delete("v1", "pods", name, accounts[sa], grace_seconds=0)
