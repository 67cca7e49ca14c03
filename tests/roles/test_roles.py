"""Each role's objects and their key fields, declared through the real stack program under Pulumi mocks."""

from __future__ import annotations

from functools import cache

import pytest
import yaml

from gpufleet_admin.inventory.errors import InventoryError
from gpufleet_admin.versions import pin

from gpufleet_admin.stack.render import Rendered, render
from roles.registry import load


@cache
def stack(env: str, **overrides) -> Rendered:
    return render(load(env, overrides=overrides or None))


def find(r: Rendered, kind: str, name: str, namespace: str | None = None) -> dict:
    for o in r.objects:
        md = o["metadata"]
        if o["kind"] == kind and md["name"] == name and md.get("namespace") == namespace:
            return o
    raise AssertionError(f"{kind} {namespace}/{name} not declared; have {sorted((o['kind'], o['metadata']['name']) for o in r.objects)}")


def test_every_role_is_a_component_with_a_gpufleet_token() -> None:
    tokens = dict((name, typ) for typ, name in stack("prod").components)
    assert tokens["kueue"] == "gpufleet:scheduling:Kueue"
    assert tokens["virtual-kubelet"] == "gpufleet:flip:VirtualKubelet"
    assert set(tokens) == {"namespaces", "kueue", "gpu-metrics", "parallel-fs", "training", "virtual-kubelet",
                           "taint-controller", "descheduler", "node-health", "inference", "goodput"}


def test_kueue_flavors_queues_in_one_cohort_and_quota_from_inventory() -> None:
    r = stack("prod")
    flavor = find(r, "ResourceFlavor", "h100-sxm-80gb")
    assert flavor["spec"]["nodeLabels"] == {"gpufleet.io/flavor": "h100-sxm-80gb"}
    pre, res = find(r, "ClusterQueue", "pretraining"), find(r, "ClusterQueue", "research")
    assert pre["spec"]["cohortName"] == res["spec"]["cohortName"] == "gpufleet"
    gpu = lambda cq: next(x["nominalQuota"] for x in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]  # noqa: E731
                          if x["name"] == "nvidia.com/gpu")
    # 1,024 GPUs - 16 reserved = 1,008, split 3:1 with nothing lost to rounding.
    assert (gpu(pre), gpu(res)) == ("756", "252")
    assert find(r, "LocalQueue", "pretrain", "team-pretrain")["spec"]["clusterQueue"] == "pretraining"


def test_staging_has_a_flavor_per_gpu_model_in_each_queue() -> None:
    cq = find(stack("staging"), "ClusterQueue", "staging")
    assert [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]] == ["a100-sxm-80gb", "h100-sxm-80gb"]


def test_training_outranks_inference_without_scheduler_preemption() -> None:
    """Training wins through the taint controller's flip-out (PDB-respecting evictions), not the scheduler."""
    r = stack("prod")
    training, inference = find(r, "PriorityClass", "gpufleet-training"), find(r, "PriorityClass", "gpufleet-inference")
    assert training["value"] > inference["value"]
    assert training["preemptionPolicy"] == inference["preemptionPolicy"] == "Never"
    assert find(r, "WorkloadPriorityClass", "training-production")["value"] == 1000


def test_kueue_helm_release_carries_wait_for_pods_ready() -> None:
    (release,) = [x for x in stack("prod").releases if x["name"] == "kueue"]
    assert release["version"] == pin("kueue", "helm_chart_version") == pin("kueue").removeprefix("v")
    config = yaml.safe_load(release["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["waitForPodsReady"]["timeout"] == "600s" and config["waitForPodsReady"]["blockAdmission"] is True
    assert "jobset.x-k8s.io/jobset" in config["integrations"]["frameworks"]
    assert "resources" not in config and "featureGates" not in config  # no DRA flavor in prod


def test_kueue_counts_dra_claims_as_gpu_quota_where_a_flavor_is_dra() -> None:
    """A DRA flavor's claims count as nvidia.com/gpu quota, and its ResourceFlavor has no TAS Topology."""
    from roles.kueue.manifests import configuration, resource_flavor
    from roles.registry import load

    inv = load("local-dra")
    config = configuration(inv)
    assert config["resources"]["deviceClassMappings"] == [{"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]}]
    assert config["featureGates"] == {"KueueDRAIntegration": True, "KueueDRARejectWorkloadsWhenDRADisabled": True}
    dra = load("local-dra", overrides={"kueue_topology_enabled": True})
    assert "topologyName" not in resource_flavor(dra, "h100-sxm-80gb")["spec"]
    assert resource_flavor(load("local"), "h100-sxm-80gb")["spec"]["topologyName"] == "gpu-fabric"


def test_local_switches_installs_off_but_keeps_configuration() -> None:
    r = stack("local")
    assert r.releases == []
    find(r, "ClusterQueue", "training")
    find(r, "ConfigMap", "gpufleet-descheduler-policy", "kube-system")


def test_descheduler_only_acts_on_the_virtual_node_taint() -> None:
    cm = find(stack("prod"), "ConfigMap", "gpufleet-descheduler-policy", "kube-system")
    policy = yaml.safe_load(cm["data"]["policy.yaml"])
    assert policy["apiVersion"] == "descheduler/v1alpha2"
    args = {p["name"]: p.get("args") for p in policy["profiles"][0]["pluginConfig"]}
    assert args["RemovePodsViolatingNodeTaints"] == {"includedTaints": ["gpufleet.io/cluster-has-free-gpus"]}
    assert args["DefaultEvictor"]["labelSelector"] == {"matchLabels": {"gpufleet.io/flip-back": "released"}}
    assert policy["maxNoOfPodsToEvictTotal"] == 5
    (release,) = [x for x in stack("prod").releases if x["name"] == "descheduler"]
    assert release["values"]["deschedulerPolicy"] == policy


def test_inference_is_low_priority_prefers_in_cluster_and_has_a_pdb() -> None:
    r = stack("prod")
    spec = find(r, "Deployment", "chat", "inference")["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "gpufleet-inference"
    pref = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
    assert pref["matchExpressions"][0] == {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}
    tolerated = {t["key"] for t in spec["tolerations"]}
    assert "gpufleet.io/cluster-has-free-gpus" not in tolerated and "gpufleet.io/degraded" in tolerated
    assert find(r, "PodDisruptionBudget", "chat", "inference")["spec"]["minAvailable"] == 12
    assert find(r, "ScaledObject", "chat", "inference")["spec"]["maxReplicaCount"] == 64


def test_the_hpa_scale_down_window_is_kubernetes_default_unless_the_inventory_sets_one() -> None:
    hpa_config = find(stack("prod"), "ScaledObject", "chat", "inference")["spec"]["advanced"]["horizontalPodAutoscalerConfig"]
    assert "behavior" not in hpa_config
    chat = load("prod").role("inference").inference_deployments[0].model_dump(mode="json", exclude_unset=True)
    r = render(load("prod", overrides={"inference_deployments": [{**chat, "scale_down_stabilization_seconds": 30}]}))
    spec = find(r, "ScaledObject", "chat", "inference")["spec"]["advanced"]["horizontalPodAutoscalerConfig"]
    assert spec["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 30}}
    cpu = render(load("prod", overrides={"inference_deployments": [
        {**chat, "scale_on": "cpu", "scale_down_stabilization_seconds": 30}]}))
    spec = find(cpu, "HorizontalPodAutoscaler", "chat", "inference")["spec"]
    assert spec["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 30}}
    with pytest.raises(InventoryError, match=r"scale_down_stabilization_seconds: 3601: expected less than or equal to 3600"):
        load("prod", overrides={"inference_deployments": [{**chat, "scale_down_stabilization_seconds": 3601}]})


@pytest.mark.parametrize("name", ["taint-controller", "node-health", "quota-sync", "vk-burst-cluster", "vk-gpu-rental"])
def test_controllers_have_least_privilege_rbac_requests_and_probes(name: str) -> None:
    r = stack("prod")
    dep = find(r, "Deployment", name, "gpufleet-system")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["requests"]["cpu"] and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["livenessProbe"]["timeoutSeconds"] >= 5, "a busy node answers slowly; only a stale heartbeat is a hang"
    role = find(r, "ClusterRole", f"gpufleet:{name}")
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and not any("*" in rule["resources"] for rule in role["rules"])
    binding = find(r, "ClusterRoleBinding", f"gpufleet:{name}")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "gpufleet-system"}]


def test_virtual_kubelet_runs_one_replica_per_pool_with_its_kubeconfig() -> None:
    dep = find(stack("prod"), "Deployment", "vk-gpu-rental", "gpufleet-system")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] == "gpu-rental-kubeconfig"
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][:3] == ["virtual-kubelet", "--pool", "gpu-rental"]
    config = find(stack("prod"), "ConfigMap", "vk-gpu-rental-config", "gpufleet-system")["data"]["config.yaml"]
    assert load_vk_config_text(config).pool.name == "gpu-rental"


def test_a_virtual_kubelet_running_its_rentals_as_local_processes_reserves_their_memory() -> None:
    r = stack("local")

    def memory(name: str) -> str:
        return find(r, "Deployment", name, "gpufleet-system")["spec"]["template"]["spec"]["containers"][0][
            "resources"]["limits"]["memory"]

    # rental: 64 GPUs of local-process instances, 32 MiB each, on top of the virtual kubelet's 512 MiB.
    assert memory("vk-rental") == f"{512 + 64 * 32}Mi" and memory("vk-other") == "512Mi"


def test_each_pool_runs_the_image_its_provider_ships_in() -> None:
    from gpufleet_admin.versions import pin

    def image(r: Rendered, name: str) -> str:
        return find(r, "Deployment", name, "gpufleet-system")["spec"]["template"]["spec"]["containers"][0]["image"]

    local = stack("local")
    # The simulated rental is a plugin of gpufleet's workshop: only its image carries it.
    assert image(local, "vk-rental") == pin("gpufleet", "workshop_image") != pin("gpufleet", "image")
    assert image(local, "vk-other") == load("local").fleet.gpufleet_image == image(local, "taint-controller")
    pools = [dict(p.model_dump(exclude_none=True), image="registry.example/rental-vk:2") if p.name == "rental"
             else p.model_dump(exclude_none=True) for p in load("local").role("virtual_kubelet").virtual_kubelet_pools]
    assert image(render(load("local", overrides={"virtual_kubelet_pools": pools})), "vk-rental") == \
        "registry.example/rental-vk:2"


def test_virtual_kubelet_reads_config_maps_and_secrets_of_the_inference_namespace_only() -> None:
    r = stack("prod")
    role = find(r, "Role", "gpufleet:vk-gpu-rental", "inference")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list", "watch"]}]
    binding = find(r, "RoleBinding", "gpufleet:vk-gpu-rental", "inference")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vk-gpu-rental", "namespace": "gpufleet-system"}]
    cluster = find(r, "ClusterRole", "gpufleet:vk-gpu-rental")
    assert not [x for x in cluster["rules"] if {"configmaps", "secrets"} & set(x["resources"])]


def test_checkpoint_volume_per_team_on_weka() -> None:
    r = stack("prod")
    assert find(r, "StorageClass", "gpufleet-checkpoints")["provisioner"] == "csi.weka.io"
    pvc = find(r, "PersistentVolumeClaim", "gpufleet-checkpoints", "team-research")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["resources"]["requests"]["storage"] == "500Ti"


def test_virtual_nodes_register_closed_where_a_taint_controller_opens_them() -> None:
    def taints(r: Rendered) -> list[dict]:
        text = find(r, "ConfigMap", "vk-other-config", "gpufleet-system")["data"]["config.yaml"]
        return [t.api() for t in load_vk_config_text(text).register_with_taints]

    assert taints(stack("local")) == [{"key": "gpufleet.io/cluster-has-free-gpus", "effect": "NoSchedule"}]
    assert taints(stack("local", taint_controller_enabled=False)) == []


def load_vk_config_text(text: str):
    """A virtual kubelet's configuration from its ConfigMap's text, read as the virtual kubelet reads it."""
    from gpufleet.componentconfig import parse
    from gpufleet.virtual_kubelet.config import KIND, Configuration

    return parse(text, Configuration, KIND, "config.yaml")


def test_disabled_role_declares_nothing() -> None:
    r = stack("staging", inference_enabled=False)
    assert not [o for o in r.objects if o["metadata"].get("namespace") == "inference"]
    assert "inference" not in dict((n, t) for t, n in r.components)


def test_gpu_metrics_counters_exporter_and_rules() -> None:
    r = stack("prod")
    counters = find(r, "ConfigMap", "dcgm-counters", "gpu-metrics")["data"]["counters.csv"]
    for field in ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
                  "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_POWER_USAGE",
                  "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"):
        assert field in counters
    ds = find(r, "DaemonSet", "gpufleet-fabric-exporter", "gpu-metrics")
    assert ds["spec"]["template"]["spec"]["containers"][0]["args"][:3] == ["exporter", "--sysfs-root", "/host/sys"]
    rules = find(r, "PrometheusRule", "gpufleet", "gpu-metrics")["spec"]
    assert any("78" in str(rule.get("expr")) for g in rules["groups"] for rule in g["rules"])
    assert [x for x in r.releases if x["name"] == "dcgm-exporter"][0]["values"]["arguments"] == ["-f", "/etc/gpufleet/counters.csv"]


def test_the_taint_controller_may_mark_and_remove_endpointslices_but_never_create_them() -> None:
    """gpufleet.virtual_kubelet.orphans: a gone virtual kubelet's endpoints marked not ready, a deleted node's removed."""
    role = find(stack("prod"), "ClusterRole", "gpufleet:taint-controller")
    verbs = {v for rule in role["rules"] if "endpointslices" in rule["resources"] for v in rule["verbs"]}
    assert verbs == {"list", "watch", "patch", "delete"}
    leases = {v for rule in role["rules"] if "leases" in rule["resources"] for v in rule["verbs"]}
    assert {"list", "watch"} <= leases


def test_surges_get_a_priority_class_above_trainings_that_never_preempts_where_the_flip_starts_them() -> None:
    """roles.taint_controller.manifests.surge_priority_class, declared with the controller that names it."""
    r = stack("prod")
    surge = find(r, "PriorityClass", "gpufleet-flip-surge")
    training = max((o for o in r.objects if o["kind"] == "PriorityClass" and o["metadata"]["name"] != "gpufleet-flip-surge"),
                   key=lambda o: o["value"])
    assert (surge["value"], surge["preemptionPolicy"], surge["globalDefault"]) == (training["value"] + 1, "Never", False)
    text = find(r, "ConfigMap", "taint-controller-config", "gpufleet-system")["data"]["config.yaml"]
    assert yaml.safe_load(text)["surge_priority_class"] == "gpufleet-flip-surge"
    for overrides in ({"taint_controller_flip_mode": "evict_first"}, {"inference_enabled": False}):
        r = stack("prod", **overrides)
        assert not [o for o in r.objects if o["metadata"]["name"] == "gpufleet-flip-surge"], overrides
        text = find(r, "ConfigMap", "taint-controller-config", "gpufleet-system")["data"]["config.yaml"]
        assert yaml.safe_load(text).get("surge_priority_class") is None, overrides


def test_a_training_class_at_the_apis_ceiling_leaves_no_room_for_the_surge_class() -> None:
    """A PriorityClass may be at most 1,000,000,000: with training's there, the surges' class cannot be above it,
    so make before break refuses it by name; evict_first, which starts no surges, takes it."""
    from roles.registry import load

    classes = [{"name": "gpufleet-training", "value": 1_000_000_000, "preemption_policy": "Never"},
               {"name": "gpufleet-inference", "value": 1000, "preemption_policy": "Never"}]
    with pytest.raises(InventoryError, match=r"kueue_priority_classes\[0\]\.value: 1000000000: expected at most "
                                             r"999999999 with taint_controller_flip_mode make_before_break"):
        load("prod", overrides={"kueue_priority_classes": classes, "taint_controller_flip_mode": "make_before_break"})
    load("prod", overrides={"kueue_priority_classes": classes, "taint_controller_flip_mode": "evict_first"})
