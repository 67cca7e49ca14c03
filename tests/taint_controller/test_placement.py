"""The flip-out places its own surge pods outside: the fit on one virtual node (pure) and the bindings it sends."""

from __future__ import annotations

from decimal import Decimal

from gpufleet.kube import Forbidden
from gpufleet.kube.informer import Informer
from gpufleet.names import SURGE_DIRECTION_LABEL, SURGE_FOR_LABEL, VIRTUAL_NODE_TAINT
from gpufleet.taint_controller.placement import free_resources, place
from gpufleet.taint_controller.signal import POD_INDEXES, node_view, pod_view
from gpufleet.taint_controller.surge import Surges
from gpufleet_workshop.testing import FakeKube

VIRTUAL_TAINT = {"key": VIRTUAL_NODE_TAINT, "value": "rental", "effect": "NoSchedule"}
TOLERATE_VIRTUAL = {"key": VIRTUAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}


def vnode(name: str, gpus=8, *, cpu="64", pods="110", ready=True, unschedulable=False, taints=(VIRTUAL_TAINT,),
          labels=None) -> dict:
    obj = {"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "labels": {"type": "virtual-kubelet", **(labels or {})}},
           "spec": {"unschedulable": unschedulable, "taints": list(taints)},
           "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": cpu, "memory": "512Gi", "pods": pods},
                      "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    return obj


def surge_pod(name: str, *, gpus=1, cpu="4", node="", phase="Pending", created="2026-01-01T00:00:00Z", **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "uid": f"uid-{name}", "creationTimestamp": created,
                         "labels": {"app": "srv", SURGE_FOR_LABEL: f"victim-of-{name}", SURGE_DIRECTION_LABEL: "out"}},
            "spec": {"nodeName": node, "priority": 100, "schedulerName": "default-scheduler",
                     "nodeSelector": {"type": "virtual-kubelet"}, "tolerations": [TOLERATE_VIRTUAL],
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": cpu}}}],
                     **spec},
            "status": {"phase": phase}}


def bound_to(pods: list[dict]):
    return lambda node: [p for p in pods if p["node"] == node]


def test_free_resources_are_allocatable_less_what_unfinished_pods_request():
    n = node_view(vnode("vk-a", gpus=8, cpu="64", pods="3"))
    held = [pod_view(surge_pod("p1", gpus=3, cpu="500m", node="vk-a", phase="Running")),
            pod_view(surge_pod("p2", gpus=2, node="vk-a", phase="Succeeded"))]
    free = free_resources(n, held)
    assert free["nvidia.com/gpu"] == 5 and free["cpu"] == Decimal("63.5") and free["pods"] == 2


def test_each_pod_goes_where_it_fits_most_gpus_free_first_and_counts_against_the_next():
    nodes = [node_view(vnode("vk-a", gpus=4)), node_view(vnode("vk-b", gpus=6)), node_view(vnode("n1", gpus=8,
                                                                                                   taints=()))]
    nodes[2]["virtual"] = False  # a real node: never a surge's
    pods = [pod_view(surge_pod(f"s{i}", gpus=2, created=f"2026-01-01T00:00:0{i}Z")) for i in range(6)]
    placed = place(pods, nodes, bound_to([]))
    # b (6 free) > a (4): b; then 4 = 4: a (name); then b (4 > 2)...; 5 pods fit in 10 GPUs, the youngest not.
    assert [(p["metadata"]["name"], n) for p, n in placed] == [
        ("s0", "vk-b"), ("s1", "vk-a"), ("s2", "vk-b"), ("s3", "vk-a"), ("s4", "vk-b")]


def test_a_node_that_does_not_admit_the_pod_is_never_chosen():
    wants_h100 = pod_view(surge_pod("p", nodeSelector={"type": "virtual-kubelet", "gpufleet.io/flavor": "h100"}))
    plain = pod_view(surge_pod("q"))
    assert place([wants_h100], [node_view(vnode("vk-a"))], bound_to([])) == [], "labels"
    assert place([plain], [node_view(vnode("vk-a", ready=False))], bound_to([])) == [], "not Ready"
    assert place([plain], [node_view(vnode("vk-a", unschedulable=True))], bound_to([])) == [], "cordoned"
    other_taint = {"key": "gpufleet.io/swap", "value": "hot", "effect": "NoExecute"}
    assert place([plain], [node_view(vnode("vk-a", taints=(VIRTUAL_TAINT, other_taint)))], bound_to([])) == []
    prefer = {"key": "x", "effect": "PreferNoSchedule"}
    assert len(place([plain], [node_view(vnode("vk-a", taints=(VIRTUAL_TAINT, prefer)))], bound_to([]))) == 1
    assert place([pod_view(surge_pod("big", cpu="65"))], [node_view(vnode("vk-a"))], bound_to([])) == [], "cpu"
    full = node_view(vnode("vk-a", pods="1"))
    assert place([plain], [full], bound_to([pod_view(surge_pod("x", gpus=0, node="vk-a", phase="Running"))])) == []
    odd = pod_view(surge_pod("odd", containers=[{"name": "c", "resources": {"requests": {"example.com/fpga": "1"}}}]))
    assert place([odd], [node_view(vnode("vk-a"))], bound_to([])) == [], "a resource the node does not have"


def test_a_pod_whose_fit_depends_on_more_than_one_node_is_left_to_the_scheduler():
    nodes = [node_view(vnode("vk-a"))]
    spread = {"maxSkew": 1, "topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "srv"}}}
    for spec in ({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                     {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "srv"}}}]}}},
                 {"topologySpreadConstraints": [{**spread, "whenUnsatisfiable": "DoNotSchedule"}]},
                 {"schedulingGates": [{"name": "example.com/wait"}]},
                 {"schedulerName": "my-scheduler"},
                 {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}):
        assert place([pod_view(surge_pod("p", **spec))], nodes, bound_to([])) == [], spec


def test_preferences_weigh_scores_not_the_fit_and_a_required_node_affinity_is_matched():
    """The inference role's pods prefer in-cluster nodes (a preferred node affinity): that does not keep
    their surge from being placed outside. A required node affinity is evaluated as the scheduler does."""
    nodes = [node_view(vnode("vk-a", labels={"gpufleet.io/gpu-product": "H100"})),
             node_view(vnode("vk-b", gpus=16, labels={"gpufleet.io/gpu-product": "A100"}))]
    prefer_in_cluster = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
                         "preference": {"matchExpressions": [{"key": "type", "operator": "NotIn",
                                                              "values": ["virtual-kubelet"]}]}}]},
                         "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1,
                             "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                 "labelSelector": {"matchLabels": {"app": "srv"}}}}]}}
    soft = pod_view(surge_pod("soft", affinity=prefer_in_cluster, topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]))
    assert [n for _, n in place([soft], nodes, bound_to([]))] == ["vk-b"], "most GPUs free"
    h100 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpufleet.io/gpu-product", "operator": "In", "values": ["H100", "H200"]}]}]}}}
    assert [n for _, n in place([pod_view(surge_pod("h", affinity=h100))], nodes, bound_to([]))] == ["vk-a"]
    by_name = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["vk-b"]}]}]}}}
    assert [n for _, n in place([pod_view(surge_pod("f", affinity=by_name))], nodes, bound_to([]))] == ["vk-a"]


def cache(*objs) -> Informer:
    pods = Informer(FakeKube(), "/api/v1/pods", name="pods", indexers=POD_INDEXES)
    for o in objs:
        pods.apply("ADDED", pod_view(o))
    return pods


def test_the_flip_out_binds_its_pending_surge_pods_and_leaves_the_rest_to_the_scheduler():
    """One Binding per surge pod with room (the pod's UID as precondition); a pod the scheduler bound first
    (409) is passed over; the way back's surges, bound pods and other pods are not touched."""
    objs = [surge_pod("s1", gpus=4), surge_pod("s2", gpus=4, created="2026-01-01T00:00:01Z"),
            surge_pod("s3", gpus=4, created="2026-01-01T00:00:02Z"),
            surge_pod("running", gpus=4, node="vk-b", phase="Running")]
    back = surge_pod("back")
    back["metadata"]["labels"][SURGE_DIRECTION_LABEL] = "back"
    plain = surge_pod("plain")
    plain["metadata"]["labels"] = {"app": "srv"}
    kube = FakeKube(*objs, back, plain)
    kube.modify("pods", "s2", "inference", lambda p: p["spec"].update(nodeName="vk-a"))  # the scheduler was first
    surges = Surges(kube, cache(*objs, back, plain), direction="out")
    nodes = [node_view(vnode("vk-a", gpus=8)), node_view(vnode("vk-b", gpus=8))]
    assert surges.place(nodes) == 2
    bindings = [(a.name, a.body["target"]["name"], a.body["metadata"]["uid"]) for a in kube.writes()]
    assert bindings == [("s1", "vk-a", "uid-s1"), ("s2", "vk-a", "uid-s2"), ("s3", "vk-b", "uid-s3")]
    assert all(a.subresource == "binding" for a in kube.writes())
    assert kube.object("pods", "s1", "inference")["spec"]["nodeName"] == "vk-a"
    assert kube.object("pods", "s2", "inference")["spec"]["nodeName"] == "vk-a", "the scheduler's binding stands"
    assert kube.object("pods", "back", "inference")["spec"].get("nodeName") == ""
    assert Surges(kube, cache(back), direction="back", published=lambda p: True).place(nodes) == 0


def test_a_forbidden_binding_is_said_once_and_placing_waits(caplog):
    """A surge Role from before ``pods/binding`` was granted: one warning, kube-scheduler places the surges,
    and the flip-out tries again after a while."""
    kube = FakeKube(surge_pod("s1"), surge_pod("s2"))
    kube.fail("create", "pods", Forbidden(403, "Forbidden", "pods \"s1\" is forbidden: binding"), times=None,
              subresource="binding")
    now = [0.0]
    surges = Surges(kube, cache(surge_pod("s1"), surge_pod("s2")), direction="out", clock=lambda: now[0])
    nodes = [node_view(vnode("vk-a"))]
    with caplog.at_level("WARNING", logger="gpufleet.taint_controller.surge"):
        assert surges.place(nodes) == 0
        assert surges.place(nodes) == 0
    assert len([r for r in caplog.records if "pods/binding" in r.getMessage()]) == 1
    assert len([a for a in kube.actions if a.subresource == "binding"]) == 1
    now[0] = 301.0
    surges.place(nodes)
    assert len([a for a in kube.actions if a.subresource == "binding"]) == 2

