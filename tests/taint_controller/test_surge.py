"""The make-before-break surge ReplicaSet built from a victim's ReplicaSet (pure), the hand-over's writes, and the
mode's settings."""

from __future__ import annotations

import pytest

from gpufleet.taint_controller.budget import MigrationBudget
from gpufleet.taint_controller.flipback import FlipBack
from gpufleet import cli
from gpufleet.taint_controller import main
from gpufleet.kube.informer import Informer
from gpufleet.taint_controller.signal import POD_INDEXES
from gpufleet.kube import Forbidden
from gpufleet.wait import poll_until
from gpufleet.taint_controller.surge import Deployments, Surge, Surges, adoption, surge_name, surge_replicaset
from gpufleet_workshop.testing import FakeKube
from gpufleet.names import (
    FREE_GPUS_EFFECT, FREE_GPUS_TAINT, POD_DELETION_COST_ANNOTATION, SURGE_FOR_LABEL, VIRTUAL_NODE_TAINT,
)

VICTIM = {"name": "srv-7d9f-abcde", "namespace": "inference", "uid": "0a1b2c3d-0000-0000-0000-000000000000"}


def owner_rs(**spec) -> dict:
    return {"metadata": {"name": "srv-7d9f", "namespace": "inference",
                         "ownerReferences": [{"kind": "Deployment", "name": "srv", "uid": "dep-uid", "controller": True}]},
            "spec": {"template": {"metadata": {"labels": {"app": "srv", "pod-template-hash": "7d9f"},
                                               "annotations": {"prometheus.io/scrape": "true"}},
                                  "spec": {"containers": [{"name": "c", "image": "x"}], **spec}}}}


def test_the_surge_keeps_the_workload_labels_but_never_the_replicasets():
    rs = surge_replicaset(VICTIM, owner_rs(nodeSelector={"gpufleet.io/flavor": "H100"}))
    labels = rs["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app": "srv", SURGE_FOR_LABEL: VICTIM["uid"], "gpufleet.io/surge-direction": "out"}  # a Service on app=srv selects it
    assert rs["spec"]["selector"] == {"matchLabels": {SURGE_FOR_LABEL: VICTIM["uid"]}}
    assert rs["spec"]["replicas"] == 1
    spec = rs["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpufleet.io/flavor": "H100", "type": "virtual-kubelet"}
    assert [t["key"] for t in spec["tolerations"]] == [VIRTUAL_NODE_TAINT]
    owner = rs["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner.get("controller")) == ("Deployment", "srv", None)
    assert rs["spec"]["template"]["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}


def test_the_surge_outside_takes_the_priority_class_given_and_the_way_back_keeps_the_workloads():
    rs = surge_replicaset(VICTIM, owner_rs(priorityClassName="inference", priority=1000,
                                           preemptionPolicy="PreemptLowerPriority"), "out", "gpufleet-flip-surge")
    spec = rs["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "gpufleet-flip-surge", spec
    assert "priority" not in spec and "preemptionPolicy" not in spec, "admission sets both from the class"
    back = surge_replicaset(VICTIM, owner_rs(priorityClassName="inference"), "back", "gpufleet-flip-surge")
    assert back["spec"]["template"]["spec"]["priorityClassName"] == "inference", "in-cluster, training stays above it"
    kept = surge_replicaset(VICTIM, owner_rs(priorityClassName="inference"), "out", None)
    assert kept["spec"]["template"]["spec"]["priorityClassName"] == "inference"


def test_an_existing_virtual_toleration_is_not_repeated():
    tol = [{"key": VIRTUAL_NODE_TAINT, "operator": "Equal", "value": "rental", "effect": "NoSchedule"}]
    assert surge_replicaset(VICTIM, owner_rs(tolerations=tol))["spec"]["template"]["spec"]["tolerations"] == tol


def test_a_replicaset_without_a_deployment_gets_no_surge():
    rs = owner_rs()
    rs["metadata"]["ownerReferences"] = []
    with pytest.raises(ValueError, match="inference/srv-7d9f: expected a pod template and a Deployment owner"):
        surge_replicaset(VICTIM, rs)


def test_surge_names_are_label_values():
    name = surge_name("a" * 80, VICTIM["uid"])
    assert len(name) == 63 and name.endswith("-surge-0a1b2")


def test_the_mode_is_checked_and_comes_from_the_inventory():
    from gpufleet.taint_controller.config import Configuration
    from roles.registry import load
    from roles.taint_controller.config import configuration

    with pytest.raises(ValueError, match="flip_mode"):
        Configuration(flip_mode="later")
    assert configuration(load("local")).flip_mode == "make_before_break"
    assert configuration(load("local", overrides={"taint_controller_flip_mode": "evict_first"})).flip_mode == "evict_first"
    args = cli.build_parser("taint-controller").parse_args(["taint-controller", "--flip-mode", "evict_first"])
    assert main.configuration(args).flip_mode == "evict_first"
    with pytest.raises(SystemExit):
        cli.build_parser("taint-controller").parse_args(["taint-controller", "--flip-mode", "x"])


def test_a_surge_back_stays_off_virtual_nodes_in_every_required_term():
    terms = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, {"matchFields": []}]
    rs = surge_replicaset(VICTIM, owner_rs(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}), "back")
    spec = rs["spec"]["template"]["spec"]
    got = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    notin = {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}
    assert all(notin in t["matchExpressions"] for t in got) and len(got) == 2
    assert terms[0]["matchExpressions"] == [{"key": "zone", "operator": "In", "values": ["a"]}]  # input untouched
    assert "nodeSelector" not in spec and "tolerations" not in spec
    assert rs["metadata"]["labels"]["gpufleet.io/surge-direction"] == "back"
    with pytest.raises(ValueError, match="surge direction 'up'"):
        surge_replicaset(VICTIM, owner_rs(), "up")


def cluster(*views: dict) -> FakeKube:
    """The in-memory API server holding the victim's ReplicaSet and the pods of ``views`` (what the hand-over
    writes to)."""
    rs = owner_rs()
    rs["metadata"]["uid"] = "srv-7d9f-uid"  # as the views' ownerReferences name it
    kube = FakeKube({**rs, "apiVersion": "apps/v1", "kind": "ReplicaSet"})
    for v in views:
        kube.add({"apiVersion": "v1", "kind": "Pod", "metadata": dict(v["metadata"]), "spec": {"nodeName": v["node"]}})
    return kube


def calls(kube: FakeKube) -> list[tuple]:
    """The writes sent, in order: ``(verb, plural, name[, body or propagationPolicy])``."""
    out: list[tuple] = []
    for a in kube.writes():
        if a.verb == "create":
            out.append(("create", a.resource, a.body["metadata"]["name"]))
        elif a.verb == "patch":
            out.append(("patch", a.resource, a.name, a.body))
        elif a.verb == "delete":
            out.append(("delete", a.resource, a.name, (a.body or {}).get("propagationPolicy")))
    return out


class Nodes:
    def __init__(self, *nodes):
        self.nodes = list(nodes)

    def items(self):
        return list(self.nodes)


def cache(*views) -> Informer:
    """An informer of pod views holding ``views`` as if listed (its thread is never started)."""
    pods = Informer(FakeKube(), "/api/v1/pods", name="pods", indexers=POD_INDEXES)
    for v in views:
        pods.apply("ADDED", v)
    return pods


def view(name: str, uid: str, labels: dict, owner: str, *, ready=True, published=True, node="vk-rental") -> dict:
    return {"metadata": {"name": name, "namespace": "inference", "uid": uid, "labels": labels,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                              "uid": f"{owner}-uid", "controller": True}]},
            "node": node, "ready": ready, "published": published, "ip": "", "phase": "Running", "gpus": 1}


#: The surge pod's patch at the hand-over: relabelled, and controlled by the victim's ReplicaSet.
ADOPTED = {"metadata": {"labels": {SURGE_FOR_LABEL: None, "gpufleet.io/surge-direction": None, "pod-template-hash": "7d9f"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "srv-7d9f",
                                             "uid": "srv-7d9f-uid", "controller": True}]}}


def test_adoption_needs_the_victims_template_hash_and_replicaset():
    victim = view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f")
    assert adoption(victim["metadata"]) == ADOPTED
    victim["metadata"]["ownerReferences"] = []
    with pytest.raises(ValueError, match="pod inference/srv-7d9f-abcde: expected a pod-template-hash label and a "
                                         "controller ReplicaSet"):
        adoption(victim["metadata"])


def test_a_ready_published_surge_pod_takes_its_victims_place_in_its_replicaset():
    victim = view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
    surge_rs = surge_name(VICTIM["name"], VICTIM["uid"])
    surge_pod = view("srv-surge-x1", "surge-uid", {"app": "srv", SURGE_FOR_LABEL: VICTIM["uid"],
                                                  "gpufleet.io/surge-direction": "out"}, surge_rs, published=False)
    kube = cluster(victim, surge_pod)
    surges = Surges(kube, cache(victim, surge_pod), direction="out")
    assert not surges.ready(victim) and calls(kube) == [("create", "replicasets", surge_rs)]
    assert not surges.ready(victim), "Ready but not yet published: not a replacement yet"
    assert surges.hand_over(victim) is False
    surge_pod["published"] = True
    assert surges.ready(victim)
    kube.actions.clear()
    assert surges.hand_over(victim) is True
    assert calls(kube) == [
        ("patch", "pods", VICTIM["name"], {"metadata": {"annotations": {POD_DELETION_COST_ANNOTATION: "-2147483648"}}}),
        ("delete", "replicasets", surge_rs, "Orphan"),
        ("patch", "pods", "srv-surge-x1", ADOPTED)]
    kube.actions.clear()
    assert surges.ready(victim) and surges.hand_over(victim) is True and calls(kube) == [], "handed over once"
    surges.give_up([victim])
    assert calls(kube) == [] and VICTIM["uid"] not in surges.unsurgeable, "a handed-over victim is never given up"


def test_the_way_back_needs_a_test_of_in_cluster_publication():
    with pytest.raises(ValueError, match="surge direction 'back': expected a test of in-cluster publication"):
        Surges(FakeKube(), cache(), direction="back")


def test_on_the_way_back_a_replaced_pod_is_neither_released_nor_chosen_again():
    """The in-cluster replacement took the pod's place: no release label, no eviction; the pod counts in flight
    (its ReplicaSet deletes it) so no second replacement starts for it."""
    class Endpoints:
        def published(self, pod):
            return pod["metadata"]["name"] == "srv-surge-x1"

    node = {"name": "vk-rental", "virtual": True, "taints": [{"key": FREE_GPUS_TAINT, "effect": FREE_GPUS_EFFECT}]}
    outside = {**view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f"),
               "phase": "Running", "tolerations": [], "priority": 0, "created": 1.0}
    surge = view("srv-surge-x1", "surge-uid", {"app": "srv", SURGE_FOR_LABEL: VICTIM["uid"],
                                              "gpufleet.io/surge-direction": "back"},
                 surge_name(VICTIM["name"], VICTIM["uid"]), node="n1")
    kube, now = cluster(outside, surge), [0.0]
    back = FlipBack(kube, Nodes(node), cache(outside), MigrationBudget(600), mode="release", make_before_break=True,
                    endpoints=Endpoints(), clock=lambda: now[0])
    assert back.tick() == [] and [c[0] for c in calls(kube)] == ["create"]  # the replacement starts; the pod stays
    back.pods.apply("ADDED", surge)
    now[0] = 1.0
    kube.actions.clear()
    assert [c.name for c in back.tick()] == [VICTIM["name"]]
    assert [(c[0], c[1]) for c in calls(kube)] == [("patch", "pods"), ("delete", "replicasets"), ("patch", "pods")]
    assert not any("gpufleet.io/flip-back" in str(c) for c in calls(kube)), "released as well"
    now[0] = 30.0
    kube.actions.clear()
    assert back.tick() == [] and calls(kube) == [], "chosen again while its ReplicaSet removes it"
    with pytest.raises(ValueError, match="make_before_break: expected the Service and EndpointSlice caches"):
        FlipBack(kube, Nodes(), cache(), MigrationBudget(600), make_before_break=True)


@pytest.mark.parametrize("max_in_flight, started", [(2, ["a", "b"]), (1, ["a"])])
def test_on_the_way_back_replacements_start_at_the_budgets_pace_up_to_max_in_flight(max_in_flight, started):
    """A move spends its token when its replacement starts and stays in flight until its pod is gone: a
    replacement still starting never holds the next one back by taking the token again each tick."""
    class Endpoints:
        def published(self, pod):
            return False  # no replacement becomes Ready and published here

    node = {"name": "vk-rental", "virtual": True, "taints": [{"key": FREE_GPUS_TAINT, "effect": FREE_GPUS_EFFECT}]}
    outside = [{**view(f"srv-7d9f-{n}", f"uid-{n}", {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f"),
                "phase": "Running", "tolerations": [], "priority": 0, "created": float(i)}
               for i, n in enumerate("abc")]
    kube, now = cluster(*outside), [0.0]
    back = FlipBack(kube, Nodes(node), cache(*outside), MigrationBudget(10, max_in_flight=max_in_flight),
                    mode="release", make_before_break=True, endpoints=Endpoints(), clock=lambda: now[0])
    created = []
    for t in (0.0, 1.0, 6.0, 12.0, 18.0):  # ticks; a token every 6 s (10 a minute)
        now[0] = t
        kube.actions.clear()
        assert back.tick() == []  # nothing released or replaced: every replacement is still starting
        created += [c[2] for c in calls(kube) if c[0] == "create"]
    # One replacement per token, the oldest pod first, never more than max_in_flight starting at once.
    assert [name.split("-surge")[0].removeprefix("srv-7d9f-") for name in created] == started
    assert not any("gpufleet.io/flip-back" in str(a.body) for a in kube.writes()), "nothing released meanwhile"


def test_a_surge_whose_victim_left_reads_its_deployment_from_a_watch_cache_not_a_get_per_tick():
    """The surge waits for its Deployment to be available again; the Deployment comes from a watch cache of
    its namespace (one list, then events), so a thousand ticks are not a thousand GETs. Available is the
    status and the Deployment's own Ready pods by its selector (matchExpressions too), the surge not counted."""
    kube = FakeKube(bookmark_seconds=0.02)
    own = view("srv-7d9f-new", "new-uid", {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", ready=False,
               node="n1")
    surge_pod = view("srv-surge-gone-x", "surge-uid", {"app": "srv", SURGE_FOR_LABEL: "gone-uid"}, "srv-surge-gone")
    pods = cache(own, surge_pod)
    try:
        kube.add({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "srv", "namespace": "inference"},
                  "spec": {"replicas": 1, "selector": {
                      "matchLabels": {"app": "srv"},
                      "matchExpressions": [{"key": SURGE_FOR_LABEL, "operator": "DoesNotExist"}]}},
                  "status": {"availableReplicas": 0}})
        kube.add({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                  "metadata": {"name": "srv-surge-gone", "namespace": "inference"}, "spec": {"replicas": 1}})
        surges = Surges(kube, pods, direction="out")
        surges.live["gone-uid"] = Surge("gone-uid", "inference", "srv-surge-gone", "srv", 0.0)
        surges.reconcile([])  # starts the namespace's cache (a GET while it lists)
        deployments = surges.deployments.caches["inference"]
        assert deployments.wait_synced(5)
        kube.actions.clear()
        for _ in range(5):
            surges.reconcile([])
        assert "gone-uid" in surges.live, "not available yet: the surge stays"
        assert not [a for a in kube.actions if a.resource == "deployments" and a.verb != "watch"]
        kube.modify("deployments", "srv", "inference", lambda d: d["status"].update(availableReplicas=1))
        kube.sync(deployments)
        surges.reconcile([])
        assert "gone-uid" in surges.live, "the status counts a pod the selector does not show Ready: it lags"
        pods.apply("MODIFIED", {**own, "ready": True})
        surges.reconcile([])
        assert "gone-uid" not in surges.live
        assert [(a.verb, a.name) for a in kube.writes()] == [("delete", "srv-surge-gone")]
    finally:
        surges.deployments.stop()
        kube.close()


def test_a_namespace_whose_deployment_list_is_forbidden_stays_on_gets_after_one_warning(caplog):
    """An older surge Role grants ``get`` alone: the cache is stopped after its first Forbidden list, the
    namespace is read with GETs (no list retried every few seconds), and a watch is tried again later."""
    kube = FakeKube(bookmark_seconds=0.02)
    now = [0.0]
    deployments = Deployments(kube, forbidden_retry_seconds=300, clock=lambda: now[0])
    try:
        kube.add({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "srv", "namespace": "inference"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "srv"}}}, "status": {"availableReplicas": 1}})
        forbidden = kube.fail("list", "deployments", Forbidden(403, "Forbidden", "deployments is forbidden"), times=None)
        assert deployments.get("inference", "srv")["metadata"]["name"] == "srv"  # a GET while the cache lists
        cache = deployments.caches["inference"]
        poll_until(lambda: isinstance(cache.last_error, Forbidden), what="the list forbidden", timeout=5, interval=0.01)
        with caplog.at_level("WARNING", logger="gpufleet.taint_controller.surge"):
            for _ in range(3):
                assert deployments.get("inference", "srv")["spec"]["replicas"] == 1
        assert "inference" not in deployments.caches
        assert len([r for r in caplog.records if r.name == "gpufleet.taint_controller.surge"]) == 1
        kube.actions.clear()
        assert deployments.get("inference", "missing") is None
        assert [a.verb for a in kube.actions if a.resource == "deployments"] == ["get"]

        kube.remove_reactor(forbidden)  # `pulumi up` brought the Role that grants list and watch
        now[0] = 301.0
        deployments.get("inference", "srv")
        assert deployments.caches["inference"].wait_synced(5)
        kube.actions.clear()
        assert deployments.get("inference", "srv")["status"]["availableReplicas"] == 1
        assert not [a for a in kube.actions if a.resource == "deployments" and a.verb != "watch"]
    finally:
        deployments.stop()
        kube.close()


def test_a_surge_pod_orphaned_by_an_interrupted_hand_over_is_adopted_or_removed_on_recovery():
    """An instance stopped between the surge ReplicaSet's Orphan delete and the relabel: the next one
    relabels the pod into its victim's ReplicaSet, or, the victim gone, deletes the pod left over."""
    victim = view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
    orphan = view("srv-surge-x1", "surge-uid", {"app": "srv", SURGE_FOR_LABEL: VICTIM["uid"],
                                               "gpufleet.io/surge-direction": "out"}, "unused")
    orphan["metadata"].pop("ownerReferences")
    kube = cluster(victim, orphan)
    surges = Surges(kube, cache(victim, orphan), direction="out")
    surges.recover()
    assert calls(kube) == [("patch", "pods", "srv-surge-x1", ADOPTED)]
    assert surges.ready(victim), "handed over: the victim goes with its ReplicaSet, no second surge"
    assert [c[0] for c in calls(kube)] == ["patch"]

    gone = view("srv-surge-x2", "surge-uid-2", {"app": "srv", SURGE_FOR_LABEL: "victim-gone",
                                               "gpufleet.io/surge-direction": "out"}, "unused")
    gone["metadata"].pop("ownerReferences")
    back = view("srv-surge-x3", "surge-uid-3", {"app": "srv", SURGE_FOR_LABEL: "other",
                                               "gpufleet.io/surge-direction": "back"}, "unused")
    back["metadata"].pop("ownerReferences")
    kube = cluster(gone, back)
    Surges(kube, cache(gone, back), direction="out").recover()
    assert calls(kube) == [("delete", "pods", "srv-surge-x2", None)], "the way back's orphan is the other's"
    assert kube.object("pods", "srv-surge-x2", "inference")["metadata"]["deletionTimestamp"], "graceful: it drains"


def test_a_hand_over_cut_after_its_orphan_delete_leaves_no_pod_behind_when_the_surge_is_removed():
    """The relabel fails after the surge ReplicaSet was deleted with Orphan; the victim then needs no move
    any more: removing the surge finds its ReplicaSet gone and deletes the pod it left."""
    from gpufleet.kube import ServerError

    victim = view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
    surge_rs = surge_name(VICTIM["name"], VICTIM["uid"])
    surge_pod = view("srv-surge-x1", "surge-uid", {"app": "srv", SURGE_FOR_LABEL: VICTIM["uid"],
                                                  "gpufleet.io/surge-direction": "out"}, surge_rs)
    kube = cluster(victim, surge_pod)
    surges = Surges(kube, cache(victim, surge_pod), direction="out")
    assert not surges.ready(victim) and surges.ready(victim)
    kube.fail("patch", "pods", ServerError(500, "InternalError", "etcd leader changed"), name="srv-surge-x1")
    assert surges.hand_over(victim) is None, "the relabel failed: tried again next tick"
    kube.actions.clear()
    surges.reconcile([])  # the preemptor went: the victim stays, the surge goes
    assert calls(kube) == [("delete", "replicasets", surge_rs, "Background"), ("delete", "pods", "srv-surge-x1", None)]
    assert VICTIM["uid"] not in surges.live


def test_the_victims_of_one_replicaset_read_its_template_once():
    """A flip-out moves hundreds of one workload's pods: one read of their ReplicaSet serves every surge for
    OWNER_TEMPLATE_SECONDS, then it is read again."""
    from gpufleet.taint_controller.surge import OWNER_TEMPLATE_SECONDS

    victims = [view(f"srv-7d9f-{i}", f"uid-{i}", {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
               for i in range(3)]
    kube = cluster(*victims)
    now = [0.0]
    surges = Surges(kube, cache(*victims), direction="out", clock=lambda: now[0])

    def reads() -> int:
        return sum(1 for a in kube.actions if a.verb == "get" and a.resource == "replicasets")

    for v in victims[:2]:
        assert not surges.ready(v)
    assert reads() == 1 and [c[0] for c in calls(kube)] == ["create", "create"]
    now[0] = OWNER_TEMPLATE_SECONDS + 1
    assert not surges.ready(victims[2])
    assert reads() == 2, "read again once the template may have changed"
    # A ReplicaSet recreated under the same name is another one: read for its own pods, never served from the cache.
    other = view("srv-7d9f-x", "uid-x", {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
    other["metadata"]["ownerReferences"][0]["uid"] = "recreated"
    surges.ready(other)
    surges.ready({**other, "metadata": {**other["metadata"], "uid": "uid-y", "name": "srv-7d9f-y"}})
    assert reads() == 4


def test_a_surge_its_replicaset_cannot_create_a_pod_for_lets_the_victim_go_at_once():
    """A ResourceQuota (a LimitRange, a webhook) refuses the surge pod: its ReplicaSet reports ReplicaFailure, and the
    victim goes without a replacement once the surge is removed, instead of after surge_max_wait_seconds. The status
    is read only while the surge has no pod, REFUSAL_CHECK_SECONDS after its creation and between reads, and a
    failure counts once a second read REFUSAL_CONFIRM_SECONDS later finds it too."""
    from gpufleet.kube import ServerError
    from gpufleet.taint_controller.surge import REFUSAL_CHECK_SECONDS, REFUSAL_CONFIRM_SECONDS

    victim = view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
    kube = cluster(victim)
    now = [0.0]
    surges = Surges(kube, cache(victim), direction="out", clock=lambda: now[0])
    surge_rs = surge_name(VICTIM["name"], VICTIM["uid"])

    def reads() -> int:
        return sum(1 for a in kube.actions if a.verb == "get" and a.resource == "replicasets" and a.name == surge_rs)

    assert not surges.ready(victim)
    now[0] = REFUSAL_CHECK_SECONDS - 1
    assert not surges.ready(victim) and reads() == 0, "a ReplicaSet is given time to create its pod"
    now[0] = REFUSAL_CHECK_SECONDS
    assert not surges.ready(victim) and reads() == 1, "no condition yet: still waiting"

    def refuse(rs: dict) -> None:
        rs["status"] = {"replicas": 0, "conditions": [{"type": "ReplicaFailure", "status": "True",
                                                       "reason": "FailedCreate",
                                                       "message": 'pods "x" is forbidden: exceeded quota: gpus'}]}

    kube.modify("replicasets", surge_rs, "inference", refuse)
    now[0] += 1
    assert not surges.ready(victim) and reads() == 1, "at most one read per REFUSAL_CHECK_SECONDS"
    now[0] += REFUSAL_CHECK_SECONDS
    assert not surges.ready(victim) and reads() == 2, "found once: it may be a creation whose status is not written yet"
    now[0] += REFUSAL_CONFIRM_SECONDS
    kube.actions.clear()
    kube.fail("delete", "replicasets", ServerError(503, "ServiceUnavailable", "etcd"))
    assert not surges.ready(victim), "confirmed, but the surge is still there: not yet"
    assert VICTIM["uid"] not in surges.unsurgeable
    assert surges.ready(victim), "removed on the next call: the victim may go"
    assert [c for c in calls(kube) if c[0] == "delete"] == [("delete", "replicasets", surge_rs, "Background")] * 2
    assert reads() == 1, "the refusal is not read again for the retry"
    assert VICTIM["uid"] in surges.unsurgeable and surges.hand_over(victim) is False, "evicted as in evict_first"
    surges.reconcile(set())
    assert VICTIM["uid"] not in surges.unsurgeable, "wanted again later, it may have a surge then"


def test_a_surge_whose_replicaset_was_deleted_by_someone_else_is_created_again():
    from gpufleet.taint_controller.surge import REFUSAL_CHECK_SECONDS

    victim = view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
    kube = cluster(victim)
    now = [0.0]
    surges = Surges(kube, cache(victim), direction="out", clock=lambda: now[0])
    surge_rs = surge_name(VICTIM["name"], VICTIM["uid"])
    assert not surges.ready(victim)
    kube.remove("replicasets", surge_rs, "inference")
    now[0] = REFUSAL_CHECK_SECONDS
    assert not surges.ready(victim) and VICTIM["uid"] not in surges.live
    assert not surges.ready(victim) and kube.object("replicasets", surge_rs, "inference") is not None


def test_a_surge_with_a_pod_is_never_read_for_refusals():
    victim = view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
    surge_rs = surge_name(VICTIM["name"], VICTIM["uid"])
    pending = view("srv-surge-x1", "surge-uid", {"app": "srv", SURGE_FOR_LABEL: VICTIM["uid"],
                                                "gpufleet.io/surge-direction": "out"}, surge_rs, ready=False, node="")
    kube = cluster(victim)
    now = [0.0]
    surges = Surges(kube, cache(victim, pending), direction="out", clock=lambda: now[0])
    assert not surges.ready(victim)
    now[0] = 60.0
    assert not surges.ready(victim)
    assert not [a for a in kube.actions if a.verb == "get" and a.name == surge_rs], "its pod exists: it waits"


def test_a_second_pod_the_surge_replicaset_started_during_the_hand_over_is_removed_by_the_sweep():
    """The ReplicaSet controller saw the surge pod leave (the relabel) before its ReplicaSet's deletion and started
    one more; the garbage collector orphaned it. Within ORPHAN_SWEEP_SECONDS the running instance deletes it: its
    victim was handed over already, so it is one pod too many. A cache scan, not on every tick."""
    from gpufleet.taint_controller.surge import ORPHAN_SWEEP_SECONDS

    victim = view(VICTIM["name"], VICTIM["uid"], {"app": "srv", "pod-template-hash": "7d9f"}, "srv-7d9f", node="n1")
    surge_rs = surge_name(VICTIM["name"], VICTIM["uid"])
    surge_pod = view("srv-surge-x1", "surge-uid", {"app": "srv", SURGE_FOR_LABEL: VICTIM["uid"],
                                                  "gpufleet.io/surge-direction": "out"}, surge_rs)
    pods = cache(victim, surge_pod)
    kube = cluster(victim, surge_pod)
    now = [0.0]
    surges = Surges(kube, pods, direction="out", clock=lambda: now[0])
    assert not surges.ready(victim) and surges.ready(victim) and surges.hand_over(victim) is True
    extra = view("srv-surge-x2", "extra-uid", {"app": "srv", SURGE_FOR_LABEL: VICTIM["uid"],
                                              "gpufleet.io/surge-direction": "out"}, surge_rs, ready=False, node="")
    extra["metadata"].pop("ownerReferences")
    kube.add({"apiVersion": "v1", "kind": "Pod", "metadata": dict(extra["metadata"]), "spec": {}})
    pods.apply("ADDED", extra)
    # The cache still holds the handed-over pod as the garbage collector left it for a moment: its surge label on,
    # no owner. The API server has the relabel: that pod is serving and stays.
    stale = {**surge_pod, "metadata": {k: v for k, v in surge_pod["metadata"].items() if k != "ownerReferences"}}
    pods.apply("MODIFIED", stale)
    kube.actions.clear()
    surges.reconcile({VICTIM["uid"]})
    assert calls(kube) == [], "not swept on every tick"
    now[0] = ORPHAN_SWEEP_SECONDS
    surges.reconcile({VICTIM["uid"]})
    assert calls(kube) == [("delete", "pods", "srv-surge-x2", None)], "the handed-over pod is read again, and kept"
