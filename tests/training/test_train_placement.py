"""Placement of a training gang: Kueue's topology request, and Kubernetes' own gang in the shape the cluster serves."""

from __future__ import annotations

import pytest
import yaml

from gpufleet_admin.schemas import validate
from gpufleet_admin.training import gang
from gpufleet_admin.training import render as r
from gpufleet_admin.training.render import TrainingInputError, build_context

REQUIRED = "kueue.x-k8s.io/podset-required-topology"
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
GROUP = "kueue.x-k8s.io/podset-group-name"


def render(inventory, env="local", template="jobset", nodes=4, **kw):
    text = r.render(env, template, "run1", nodes, inventory=inventory(env), **kw)
    return [d for d in yaml.safe_load_all(text) if d]


def pods_of(obj) -> list[dict]:
    if obj["kind"] == "JobSet":
        return [j["template"]["spec"]["template"] for j in obj["spec"]["replicatedJobs"]]
    if obj["kind"] == "PyTorchJob":
        return [s["template"] for s in obj["spec"]["pytorchReplicaSpecs"].values()]
    return [obj["spec"]["template"]]


def job_of(objs):
    return next(o for o in objs if o["kind"] in ("JobSet", "PyTorchJob", "Job"))


@pytest.mark.parametrize("template", list(r.TEMPLATES))
@pytest.mark.parametrize(("topology", "mode", "key", "label"), [
    ("rack", "required", REQUIRED, "gpufleet.io/rack"),
    ("rack", "preferred", PREFERRED, "gpufleet.io/rack"),
    ("block", "required", REQUIRED, "gpufleet.io/block"),
])
def test_kueue_topology_request_on_every_pod_template(inventory, template, topology, mode, key, label):
    objs = render(inventory, "prod", template, nodes=8, topology=topology, topology_mode=mode)
    job = job_of(objs)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "pretrain"
    for pod in pods_of(job):
        ann = pod["metadata"]["annotations"]
        assert ann[key] == label
        assert {REQUIRED, PREFERRED} - {key} - set(ann) == {REQUIRED, PREFERRED} - {key}  # one request only
        assert "affinity" not in pod["spec"]  # Kueue places the gang; no scheduler-level rule besides
        # The flip-out's reservation must not look like a failed node to Kueue.
        assert {"key": "gpufleet.io/reserved-for", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    for obj in objs:
        assert validate(obj) == [], obj["kind"]


def test_pytorchjob_master_and_workers_are_one_placement_unit(inventory):
    (pj,) = render(inventory, "local", "pytorchjob", nodes=4, topology="rack", topology_mode="required")
    assert [p["metadata"]["annotations"][GROUP] for p in pods_of(pj)] == ["trainer", "trainer"]
    (single,) = render(inventory, "local", "pytorchjob", nodes=1, topology="rack")
    assert GROUP not in pods_of(single)[0]["metadata"]["annotations"]  # Kueue's groups are of exactly 2 PodSets


def test_topology_none_keeps_a_preferred_same_rack_affinity(inventory):
    job = job_of(render(inventory, topology="none"))
    (pod,) = pods_of(job)
    assert not {REQUIRED, PREFERRED} & set(pod["metadata"].get("annotations") or {})
    term = pod["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "gpufleet.io/rack"


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"topology": "spine"}, "--topology 'spine': expected one of block, rack, none"),
    ({"topology_mode": "strict"}, "--topology-mode 'strict': expected one of required, preferred"),
    ({"nodes": 5, "topology": "rack", "topology_mode": "required"},
     "--nodes 5 --topology rack --topology-mode required: expected at most 4 nodes (the largest rack of flavor "
     "h100-sxm-80gb, rack-d, has 4); use --topology-mode preferred or a coarser --topology"),
    ({"nodes": 9, "topology": "block", "topology_mode": "required"},
     "--nodes 9 --topology block --topology-mode required: expected at most 8 nodes"),
    ({"gang": "volcano"}, "--gang 'volcano': expected one of kueue, native, both"),
    ({"gang": "native"}, "--gang native: the cluster's scheduling.k8s.io version is unknown: expected a cluster to "
                         "discover it from, or --scheduling-api v1alpha1|v1alpha2|v1alpha3|v1beta1"),
    # JobSet v0.11's CRD declares 1.35's spec.workloadRef, not spec.schedulingGroup (1.36 on).
    ({"gang": "native", "gang_api": gang.SHAPES["v1beta1"]},
     "--gang native --template jobset: the pinned JobSet CRD has no pod spec.schedulingGroup, and the API server "
     "would drop it"),
    ({"template": "pytorchjob", "gang": "both", "gang_api": gang.SHAPES["v1alpha2"]},
     "--gang both --template pytorchjob: the pinned PyTorchJob CRD has no pod spec.schedulingGroup"),
])
def test_bad_placement_input(inventory, kwargs, expected):
    args = {"template": "jobset", "name": "run1", "nodes": 4} | kwargs
    with pytest.raises(TrainingInputError) as err:
        build_context(inventory("local"), args.pop("template"), args.pop("name"), args.pop("nodes"), **args)
    assert any(p.startswith(expected) for p in err.value.problems), err.value.problems


def test_a_required_gang_the_size_of_a_rack_renders(inventory):
    job = job_of(render(inventory, nodes=4, topology="rack", topology_mode="required"))
    assert pods_of(job)[0]["metadata"]["annotations"][REQUIRED] == "gpufleet.io/rack"


def test_topology_needs_kueues_topology(inventory):
    from roles.registry import load

    inv = load("local", overrides={"kueue_topology_enabled": False, "training_topology": "none"})
    with pytest.raises(TrainingInputError) as err:
        build_context(inv, "job", "run1", 2, topology="rack")
    assert err.value.problems == ["--topology rack: expected none: kueue_topology_enabled is false in "
                                  "inventories/local, so Kueue has no Topology to place the gang in"]


def test_native_gang_on_kubernetes_1_35(inventory):
    objs = render(inventory, template="job", nodes=3, gang="native", gang_api=gang.SHAPES["v1alpha1"],
                  topology="rack", topology_mode="required")
    assert [o["kind"] for o in objs] == ["Service", "Job", "Workload"]
    job, wl = objs[1], objs[2]
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    assert job["spec"]["suspend"] is False  # no Kueue to unsuspend it
    pod = job["spec"]["template"]
    assert pod["spec"]["workloadRef"] == {"name": "run1", "podGroup": "workers"}
    # No Kueue to place the gang: the scheduler gets the rack as a pod affinity, as asked (required).
    term = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term == {"topologyKey": "gpufleet.io/rack", "labelSelector": {"matchLabels": {"gpufleet.io/job": "run1"}}}
    assert not {REQUIRED, PREFERRED} & set(pod["metadata"].get("annotations") or {})
    assert wl == {"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload",
                  "metadata": {"name": "run1", "namespace": "team-pretrain", "labels": {"gpufleet.io/job": "run1"}},
                  "spec": {"controllerRef": {"apiGroup": "batch", "kind": "Job", "name": "run1"},
                           "podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 3}}}]}}
    for obj in objs:  # Kubernetes 1.35 serves exactly this shape
        assert validate(obj, kubernetes="v1.35.4") == [], obj["kind"]


#: PodGroup spec.<ref> naming its Workload's template: 1.36's shape, and 1.37's (kubernetes/kubernetes#140080).
TEMPLATE_REF_1_36 = {"podGroupTemplateRef": {"workload": {"workloadName": "run1", "podGroupTemplateName": "workers"}}}
TEMPLATE_REF_1_37 = {"workloadRef": {"workloadName": "run1", "templateName": "workers"}}


@pytest.mark.parametrize("version,release,ref", [
    ("v1alpha2", "v1.36.3", TEMPLATE_REF_1_36),
    ("v1alpha3", "v1.37.2", TEMPLATE_REF_1_37),
    ("v1beta1", "v1.37.2", TEMPLATE_REF_1_37),
])
def test_native_gang_on_kubernetes_1_36_and_1_37(inventory, version, release, ref):
    objs = render(inventory, template="job", nodes=3, gang="native", gang_api=gang.SHAPES[version])
    assert [o["kind"] for o in objs] == ["Service", "Job", "Workload", "PodGroup"]
    job, wl, pg = objs[1:]
    assert job["spec"]["template"]["spec"]["schedulingGroup"] == {"podGroupName": "run1-workers"}
    assert "workloadRef" not in job["spec"]["template"]["spec"]
    assert wl["apiVersion"] == pg["apiVersion"] == f"scheduling.k8s.io/{version}"
    # The group's priority is the pods' (the 1.37 scheduler refuses a pod whose priority differs from its group's).
    prio = {"priorityClassName": "gpufleet-training"}
    assert job["spec"]["template"]["spec"]["priorityClassName"] == prio["priorityClassName"]
    assert wl["spec"] == {"controllerRef": {"apiGroup": "batch", "kind": "Job", "name": "run1"},
                          "podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"gang": {"minCount": 3}},
                                                 **prio}]}
    assert pg["metadata"]["name"] == "run1-workers"
    assert pg["spec"] == {**ref, "schedulingPolicy": {"gang": {"minCount": 3}}, **prio}
    for obj in objs:  # checked against the OpenAPI documents of the release that serves the shape
        assert validate(obj, kubernetes=release) == [], (obj["kind"], validate(obj, kubernetes=release))


def test_each_release_serves_only_its_own_shapes():
    """The OpenAPI documents of each release know exactly the gang versions the table says it serves."""
    from gpufleet_admin.schemas import UnknownKind

    for release, served in {"v1.35.4": {"v1alpha1"}, "v1.36.3": {"v1alpha2"}, "v1.37.2": {"v1alpha3", "v1beta1"}}.items():
        for version in gang.SHAPES:
            wl = {"apiVersion": f"scheduling.k8s.io/{version}", "kind": "Workload", "metadata": {"name": "w"}}
            if version in served:
                validate(wl, kubernetes=release)
            else:
                with pytest.raises(UnknownKind):
                    validate(wl, kubernetes=release)
        assert gang.for_release(release).version in served


def test_the_flags_that_serve_each_release():
    assert gang.for_release("v1.35.4").feature_gates == {
        "kube-apiserver": "GenericWorkload=true", "kube-scheduler": "GenericWorkload=true,GangScheduling=true"}
    beta = gang.for_release("v1.37.2")
    # 1.37 removed GangScheduling (kubernetes/kubernetes#139520): GenericWorkload alone, on all three.
    assert beta.version == "v1beta1" and set(beta.feature_gates.values()) == {"GenericWorkload=true"}
    assert set(beta.feature_gates) == {"kube-apiserver", "kube-controller-manager", "kube-scheduler"}
    assert beta.runtime_config == "scheduling.k8s.io/v1beta1=true"
    with pytest.raises(KeyError, match="Kubernetes '1.34': no known scheduling.k8s.io gang shape"):
        gang.for_release("1.34")


def test_both_gangs_queue_through_kueue_and_name_the_native_gang(inventory):
    objs = render(inventory, template="job", nodes=4, gang="both", gang_api=gang.SHAPES["v1alpha1"], topology="rack")
    job = objs[1]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "pretrain"
    assert job["spec"]["suspend"] is True
    pod = job["spec"]["template"]
    assert pod["metadata"]["annotations"][PREFERRED] == "gpufleet.io/rack"
    assert pod["spec"]["workloadRef"] == {"name": "run1", "podGroup": "workers"}
    assert objs[2]["kind"] == "Workload"


def test_choose_picks_the_newest_served_shape():
    assert gang.choose({"v1": {"priorityclasses"}, "v1alpha1": {"workloads"}}).version == "v1alpha1"
    assert gang.choose({"v1alpha2": {"workloads", "podgroups"}}).kubernetes == "1.36"
    assert gang.choose({"v1alpha2": {"workloads", "podgroups"}, "v1beta1": {"workloads", "podgroups"}}).version == "v1beta1"
    # 1.37 with its alpha runtime config too serves both; the beta wins.
    assert gang.choose({"v1alpha3": {"workloads", "podgroups", "compositepodgroups"},
                        "v1beta1": {"workloads", "podgroups"}}).version == "v1beta1"


def test_choose_ignores_versions_without_the_workload_api():
    # scheduling.k8s.io/v1beta1 once served only PriorityClass (removed in 1.22); v1alpha2 needs its PodGroups.
    with pytest.raises(gang.NativeGangUnavailable) as err:
        gang.choose({"v1": {"priorityclasses"}, "v1beta1": {"priorityclasses"}, "v1alpha2": {"workloads"}})
    msg = str(err.value)
    assert msg.startswith("--gang native: the cluster serves no Workload API of scheduling.k8s.io (versions served: "
                          "v1 (priorityclasses), v1alpha2 (workloads), v1beta1 (priorityclasses))")
    assert "Kubernetes 1.35 (v1alpha1): kube-apiserver --feature-gates=GenericWorkload=true " \
           "--runtime-config=scheduling.k8s.io/v1alpha1=true" in msg
    assert "or use --gang kueue" in msg
    with pytest.raises(gang.NativeGangUnavailable, match=r"versions served: none"):
        gang.choose({})


def test_by_version_names_the_known_versions():
    with pytest.raises(KeyError, match="'v2': expected one of v1alpha1, v1alpha2, v1alpha3, v1beta1"):
        gang.by_version("v2")


def crd(pod_props: dict) -> dict:
    pod = {"type": "object", "properties": {"containers": {"type": "array"}, **pod_props}}
    return {"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {
        "type": "object", "properties": {"spec": {"type": "object", "properties": {
            "template": {"type": "object", "properties": {"spec": pod}}}}}}}}]}}


def test_crd_check_finds_pruned_pod_fields():
    assert gang.crd_pod_spec_has(crd({"workloadRef": {"type": "object"}}), "v1", "workloadRef") is True
    assert gang.crd_pod_spec_has(crd({}), "v1", "workloadRef") is False
    assert gang.crd_pod_spec_has(crd({}), "v2", "workloadRef") is None
    kept = crd({})
    kept["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["template"][
        "properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] = True
    assert gang.crd_pod_spec_has(kept, "v1", "workloadRef") is True


def test_render_task_takes_the_placement_flags(cli, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    code, out, err = cli("train.render", "--env", "local", "--template", "job", "--name", "demo", "--nodes", "2",
                         "--topology", "block", "--topology-mode", "required", "--gang", "both",
                         "--scheduling-api", "v1alpha1")
    assert code == 0, err
    kinds = [d["kind"] for d in yaml.safe_load_all(out)]
    assert kinds == ["Service", "Job", "Workload"]
    assert "kueue.x-k8s.io/podset-required-topology: \"gpufleet.io/block\"" in out


def test_render_task_refuses_an_unknown_scheduling_api(cli):
    code, _, err = cli("train.render", "--env", "local", "--name", "demo", "--nodes", "2", "--template", "job",
                       "--gang", "native", "--scheduling-api", "v2")
    assert code == 2 and "--scheduling-api 'v2': expected one of v1alpha1, v1alpha2, v1alpha3, v1beta1 or auto" in err


def test_render_task_without_a_cluster_to_discover(cli, tmp_path):
    code, _, err = cli("train.render", "--env", "local", "--name", "demo", "--nodes", "2", "--template", "job",
                       "--gang", "native", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 2
    assert "--gang native: cannot discover the cluster's scheduling.k8s.io version" in err
    assert "give --scheduling-api v1alpha1|v1alpha2|v1alpha3|v1beta1" in err


def test_kueue_gangs_need_no_discovery(cli, tmp_path):
    code, _, err = cli("train.render", "--env", "local", "--name", "demo", "--nodes", "2", "--gang", "kueue",
                       "--kubeconfig", str(tmp_path / "missing"))
    assert code == 0, err


def test_a_dra_flavor_asks_for_its_gpus_through_a_claim_template():
    from roles.registry import load

    inv = load("local-dra")
    objs = [o for o in yaml.safe_load_all(r.render("local-dra", "job", "run1", 2, inventory=inv)) if o]
    assert [o["kind"] for o in objs] == ["ResourceClaimTemplate", "Service", "Job"]
    tpl, job = objs[0], objs[2]
    assert tpl["metadata"]["name"] == "run1-gpus" and tpl["metadata"]["namespace"] == job["metadata"]["namespace"]
    request = tpl["spec"]["spec"]["devices"]["requests"][0]
    # the whole node's GPUs, no device toleration: a GPU node health took out never goes to training
    assert request == {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                                                   "count": 8}}
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "run1-gpus"}]
    res = pod["containers"][0]["resources"]
    assert res["claims"] == [{"name": "gpus"}] and "nvidia.com/gpu" not in res["requests"] | res["limits"]
    for obj in objs:
        assert validate(obj) == [], obj["kind"]
    with pytest.raises(TrainingInputError) as err:
        build_context(load("local-dra", overrides={"kueue_topology_enabled": True}), "job", "run1", 2, topology="rack")
    assert any("allocates its GPUs through DRA" in p for p in err.value.problems)
