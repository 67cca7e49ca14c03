"""One road from the inventory to every component: each variable a component uses, set through Pulumi stack config,
reaches that component's configuration file as the component reads it; defaults written once; checks done once.

The table of variables is complete by construction: every field of every component's configuration model
(:data:`roles.registry.COMPONENTS`) must have a row in its role's declaration (``roles/<role>/config.py``
``VARIABLES``: a variable, or None where no variable feeds it), and every variable there must have a test
value below, or the test fails naming what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import componentconfig as cc
from gpufleet.virtual_kubelet.config import Pool
from gpufleet_admin.inventory import InventoryError
from gpufleet_admin.manifests import CONFIG_DIR
from gpufleet_admin.stack.program import file_config
from roles.registry import COMPONENTS, ROLES, Component, load

ENV = "local"
NEW_POOL = {"name": "burst", "provider": "simulated", "gpu_model": "A100-SXM-80GB", "capacity_gpus": 4,
            "price_per_gpu_hour": 1.5, "start_latency_seconds": 3}
TOP = {"name": "top", "value": 5000, "description": "training", "preemption_policy": "Never"}

#: variable -> (``pulumi config set gpufleet:<variable> <text>``'s text, {field: the value the component must read}
#: where it is not the decoded text itself, other stack config the value needs to make a valid inventory).
VALUES: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "taint_controller_high_water_gpus": ("100", {}, {}),
    "taint_controller_low_water_gpus": ("3", {}, {}),
    "taint_controller_hold_seconds": ("30", {}, {}),
    "taint_controller_add_hold_seconds": ("3", {}, {}),
    "taint_controller_remove_hold_seconds": ("90", {}, {}),
    "taint_controller_signal": ("prometheus", {}, {}),
    "taint_controller_promql": ("sum(up)", {}, {}),
    "taint_controller_prometheus_url": ("http://prom.example:9090", {}, {}),
    "taint_controller_flip_mode": ("evict_first", {"surge_priority_class": None}, {}),
    "taint_controller_surge_max_wait_seconds": ("240", {}, {}),
    "taint_controller_flip_back_max_in_flight": ("4", {}, {}),
    "taint_controller_enabled": ("false", {"register_with_taints": ()}, {}),
    "virtual_kubelet_pools": (json.dumps([NEW_POOL]), {"pools": ("burst",), "pool": Pool(**NEW_POOL).model_dump()}, {}),
    "virtual_kubelet_namespace": ("vk-ns", {}, {}),
    "virtual_kubelet_endpoint_health_interval_seconds": ("5", {}, {}),
    "virtual_kubelet_endpoint_health_timeout_seconds": ("0.5", {}, {}),
    "virtual_kubelet_endpoint_health_unhealthy_threshold": ("4", {}, {}),
    "virtual_kubelet_kubelet_port": ("10251", {}, {}),
    "kueue_priority_classes": (json.dumps([TOP, {"name": "low", "value": 10}]),
                               {"flip_out_priority_classes": ("top",), "reclaim_below_priority": 5000}, {}),
    "descheduler_migration_pods_per_minute": ("5", {}, {}),
    "kueue_cluster_queues": (json.dumps([{"name": "only", "share": 2, "nominal_gpus": {"h100-sxm-80gb": 16}}]),
                             {"cluster_queues": ({"name": "only", "share": 2, "nominal_gpus": {"h100-sxm-80gb": 16}},)},
                             {"kueue_local_queues": json.dumps([{"namespace": "team-x", "name": "x",
                                                                 "cluster_queue": "only"}])}),
    "kueue_reserve_gpus": ("8", {}, {}),
    "kueue_quota_sync_namespace": ("quota-ns", {}, {}),
    "kueue_partial_gpu_nodes_count": ("true", {}, {}),
    "kueue_quota_subtract_unmanaged_gpus": ("false", {}, {}),
    "node_health_hot_samples": ("5", {}, {}),
    "gpu_metrics_gpu_temp_threshold_celsius": ("72.5", {}, {}),
    "gpu_metrics_memory_temp_threshold_celsius": ("90", {}, {}),
    "node_health_fatal_xids": ("[48, 79]", {"rules.fatal_xids": frozenset({48, 79})}, {}),
    "gpu_metrics_scrape_interval_seconds": ("30", {}, {}),
    "node_health_event_window_seconds": ("900", {}, {}),
    "node_health_error_window_seconds": ("120", {}, {}),
    "node_health_nvlink_error_threshold": ("2", {}, {}),
    "node_health_ib_error_threshold": ("3", {}, {}),
    "node_health_roce_error_threshold": ("4", {}, {}),
    "gpu_metrics_telemetry_stale_seconds": ("120", {}, {}),
    "node_health_max_nodes_out": ("2", {}, {}),
    "node_health_dry_run": ("true", {}, {}),
    "node_health_degraded_faults": ('["xid"]', {"degraded_faults": frozenset({"xid"})}, {}),
    "node_health_lemon_failures": ("5", {}, {}),
    "node_health_lemon_window_hours": ("24", {}, {}),
    "node_health_namespace": ("nh-ns", {}, {}),
    "node_health_prometheus_url": ("http://prom.example:9090", {}, {}),
    "node_health_drain_timeout_seconds": ("900", {}, {}),
    "node_health_degraded_clear_seconds": ("1200", {}, {}),
    "node_health_interval_seconds": ("10", {}, {}),
    "node_health_max_unhealthy_share": ("0.25", {}, {}),
    "node_health_telemetry_node_selector": ('{"matchLabels": {"gpufleet.io/pool": "a"}}', {"telemetry_node_selector": {
        "matchLabels": {"gpufleet.io/pool": "a"}, "matchExpressions": []}}, {}),
    "node_health_gpu_noexecute_faults": ('["xid", "nvlink_errors"]',
                                         {"gpu_noexecute_faults": frozenset({"xid", "nvlink_errors"})}, {}),
    "node_health_gpu_hold_seconds": ("90", {}, {}),
    "goodput_interval_seconds": ("30", {}, {}),
}
#: Variables no stack config may set (node variables): each with how its field is tested instead.
HOST_VARIABLES = {"gpu_model": "staging"}


def _rows() -> list[tuple[Component, str, str]]:
    """(component, field, variable) for every field a variable feeds; fails naming a field without a row."""
    rows, missing = [], []
    for comp in COMPONENTS:
        for field in cc.leaf_fields(comp.model):
            row = next((k for k in sorted(comp.variables, key=len, reverse=True)
                        if field == k or field.startswith(k + ".")), None)
            if row is None:
                missing.append(f"{comp.command}: {field}")
            elif comp.variables[row] and (comp, row, comp.variables[row]) not in rows:
                rows.append((comp, row, comp.variables[row]))
    assert not missing, f"configuration fields without a row in their role's VARIABLES: {missing}"
    return rows


ROWS = _rows()


def test_every_variable_of_every_component_has_a_test_value():
    variables = {v for _, _, v in ROWS}
    assert variables - set(VALUES) - set(HOST_VARIABLES) == set(), "variables without a test value in VALUES"
    assert set(VALUES) - variables == set(), "test values for variables no component uses"


def stack_config(tmp_path: Path, **values: str) -> dict[str, Any]:
    """``Pulumi.<env>.yaml`` with ``gpufleet:<variable>: <text>`` as ``pulumi config set`` writes it, read back
    as the stack program reads stack config (values JSON-decoded: gpufleet_admin.stack.program)."""
    path = tmp_path / f"Pulumi.{ENV}.yaml"
    path.write_text(yaml.safe_dump({"config": {f"gpufleet:{k}": v for k, v in values.items()}}))
    overrides, secrets = file_config(path)
    assert not secrets
    return overrides


def effective(comp: Component, inv, tmp_path: Path, instance: str) -> Any:
    """The component's configuration as it reads it: the ConfigMap its role declares, mounted where ``--config``
    points, parsed by the component's own ``load``."""
    role = next(r for r in ROLES if r.name == comp.role)
    objs = role.objects(inv)
    dep = next(o for o in objs if o["kind"] == "Deployment"
               and o["spec"]["template"]["spec"]["containers"][0]["args"][0] == comp.command
               and (not instance or instance in o["spec"]["template"]["spec"]["containers"][0]["args"]))
    pod = dep["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    path = Path(args[args.index("--config") + 1])
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == str(path.parent))
    name = next(v for v in pod["volumes"] if v["name"] == mount["name"])["configMap"]["name"]
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name
              and o["metadata"]["namespace"] == dep["metadata"]["namespace"])
    assert str(path.parent) == CONFIG_DIR
    local = tmp_path / f"{comp.command}-{instance or 'config'}.yaml"
    local.write_text(cm["data"][path.name])
    return comp.load(str(local))


def _field(config: Any, key: str) -> Any:
    """A field's value, models as their dumps (what a test row spells)."""
    value = cc.field_value(config, key)
    if isinstance(value, tuple) and value and hasattr(value[0], "model_dump"):
        return tuple(v.model_dump() for v in value)
    return value.model_dump() if hasattr(value, "model_dump") else value


@pytest.mark.parametrize("comp, field, variable", [r for r in ROWS if r[2] not in HOST_VARIABLES],
                         ids=lambda x: x if isinstance(x, str) else x.command)
def test_a_variable_set_in_stack_config_reaches_the_component(comp, field, variable, tmp_path):
    text, expected, extra = VALUES[variable]
    overrides = stack_config(tmp_path, **{variable: text}, **extra)
    inv = load(ENV, overrides=overrides, overrides_file=f"Pulumi.{ENV}.yaml")
    instance = comp.instances(inv)[0]
    got = _field(effective(comp, inv, tmp_path, instance), field)
    want = expected.get(field, overrides[variable])
    assert got == want, f"{variable} = {text}: {comp.command} reads {field} = {got!r}"
    before = load(ENV)
    if instance in comp.instances(before):  # (a new pool has no "before")
        assert _field(comp.build(before, instance), field) != got, f"{variable}: the test value is the inventory's"


def test_host_variables_reach_the_component_from_the_hosts_and_never_from_stack_config(tmp_path):
    comp = next(c for c in COMPONENTS if c.command == "quota-sync")
    inv = load("staging")
    assert effective(comp, inv, tmp_path, "").flavors == tuple(inv.flavors()) == ("a100-sxm-80gb", "h100-sxm-80gb")
    with pytest.raises(InventoryError, match="gpu_model: 'A100-SXM-80GB': expected a cluster-wide variable"):
        load(ENV, overrides=stack_config(tmp_path, gpu_model="A100-SXM-80GB"))


# ------------------------------------------------------------------------------------- one place for each default


def defaults_only(tmp_path: Path) -> Any:
    """The local inventory's hosts with nothing set in group_vars/all: every role variable at its documented default."""
    root = tmp_path / "inventories" / "bare"
    (root / "group_vars").mkdir(parents=True)
    src = Path(load(ENV).root)
    (root / "hosts.yml").write_text((src / "hosts.yml").read_text())
    for f in (src / "group_vars").glob("*.yml"):
        (root / "group_vars" / f.name).write_text(f.read_text())
    (root / "group_vars" / "all.yml").write_text(yaml.safe_dump({"fleet_simulated_nodes": 16}))
    return load("bare", root=root)


def test_the_documented_defaults_are_the_components_defaults(tmp_path):
    """defaults.yaml documents each variable with its default (Ansible's convention); the component's model holds
    it. Built from the roles' defaults alone, every configuration is the model's defaults, field by field."""
    inv = defaults_only(tmp_path)
    with_pool = load("bare", root=inv.root, overrides={"virtual_kubelet_pools": [NEW_POOL]})  # none by default
    differ = []
    for comp, field, variable in ROWS:
        if variable in HOST_VARIABLES or (comp.command == "virtual-kubelet" and field == "pool"):
            continue  # from the hosts; a pool has no default
        built = comp.build(with_pool, "burst") if comp.command == "virtual-kubelet" else comp.build(inv, "")
        default = cc.field_value(_defaults(comp), field)
        if cc.field_value(built, field) != default:
            differ.append(f"{variable} -> {comp.command} {field}: {cc.field_value(built, field)!r} != {default!r}")
    assert not differ, "documented defaults that are not the component's:\n" + "\n".join(differ)


def _defaults(comp: Component) -> Any:
    """The model's own defaults (a virtual kubelet needs a pool to exist: the one given)."""
    if comp.command == "virtual-kubelet":
        return comp.model(pool=Pool(**NEW_POOL))
    return comp.model()


def test_a_variable_and_the_field_it_feeds_are_checked_by_one_rule():
    """A variable that is a field's value as it is has that field's kind: the same check, written once."""
    models = {r.name: r.vars for r in ROLES}
    differ = []
    for comp, field, variable in ROWS:
        if variable in HOST_VARIABLES or field in _derived(comp):
            continue
        role = next(name for name in models if variable.startswith(name + "_"))
        var_ann = cc.field_annotation(models[role], variable)
        field_ann = cc.field_annotation(comp.model, field)
        if var_ann != field_ann:
            differ.append(f"{variable} ({var_ann}) -> {comp.command} {field} ({field_ann})")
    assert not differ, "\n".join(differ)


def _derived(comp: Component) -> set[str]:
    import importlib

    module = importlib.import_module(f"roles.{comp.role}.config")
    derived = getattr(module, "DERIVED", None)
    if derived is None and hasattr(module, "derived"):
        derived = module.derived("")
    return set(derived or {})


# ------------------------------------------------------------------------------------------ checks done once


@pytest.mark.parametrize("overrides, fragments", [
    ({"taint_controller_low_water_gpus": 20},
     ["Pulumi.local.yaml (stack config): taint_controller_low_water_gpus: 20: expected taint_controller_low_water_gpus "
      "below taint_controller_high_water_gpus (hysteresis)",
      "taint_controller_high_water_gpus is 8 from inventories/local/group_vars/all/taint_controller.yml"]),
    ({"virtual_kubelet_endpoint_health_timeout_seconds": 9},
     ["virtual_kubelet_endpoint_health_timeout_seconds: 9.0: expected virtual_kubelet_endpoint_health_timeout_seconds "
      "at most virtual_kubelet_endpoint_health_interval_seconds",
      "virtual_kubelet_endpoint_health_interval_seconds is 2.0 from roles/virtual_kubelet/defaults.yaml"]),
    ({"virtual_kubelet_pools": [], "virtual_kubelet_endpoint_health_timeout_seconds": 9},
     ["virtual_kubelet_endpoint_health_timeout_seconds: 9.0"]),  # checked with no pool too
    ({"kueue_cluster_queues": [{"name": "training"}, {"name": "research"}, {"name": "training"}]},
     ["kueue_cluster_queues:", "expected kueue_cluster_queues with unique names (training more than once)"]),
    ({"kueue_cluster_queues": [{"name": "training", "nominal_gpus": {"b200": 8}}, {"name": "research"}]},
     ["kueue_cluster_queues:", "expected kueue_cluster_queues pinning (nominal_gpus) ResourceFlavors of flavors "
                               "(h100-sxm-80gb): training pins b200"]),
    ({"virtual_kubelet_pools": [{**NEW_POOL, "address_mode": "pod_ip"}]},
     ["virtual_kubelet_pools[0]: ", "address_mode 'pod_ip' applies to provider kubernetes only"]),
])
def test_a_check_across_variables_names_the_variable_its_file_and_the_others(overrides, fragments):
    with pytest.raises(InventoryError) as info:
        load(ENV, overrides=overrides, overrides_file="Pulumi.local.yaml (stack config)")
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in:\n{info.value}"
