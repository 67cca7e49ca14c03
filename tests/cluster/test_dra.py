"""GPUs allocated through DRA on a local cluster of the ``local-dra`` environment, and one GPU removed, not the node.

The module starts its own cluster (``<session cluster>-dra``, env
``local-dra``: 8 kwok nodes whose GPUs are devices of ResourceSlices of
``gpu.nvidia.com``, and the real node with its DRA kubelet plugin) and
stops it at the end. It checks:

* the slices are what NVIDIA's driver publishes, and the DeviceClass;
* the real node's kubelet prepares a claim through the plugin and
  unprepares it when the pod goes;
* a training job of the DRA flavor gets its GPUs through claims and Kueue
  counts them as ``nvidia.com/gpu`` quota;
* the issue's goal, end to end: a GPU at 90 C on one node (a simulated
  exporter scraped by a real Prometheus) is tainted by node health, the
  node's other seven GPUs take a 7-GPU pod, a 1-GPU training pod finds no
  GPU there, an inference pod tolerating the degraded taint gets the hot
  GPU; quota sync lowers quota by the partial-node policy; once the GPU
  cools and its checks pass, the taint goes after the hold and quota comes
  back. The latencies are printed (``pytest -s``); ``bench/gpu_removal.py``
  measures them against the targets.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest

from gpufleet import names
from gpufleet.kube import Kube, NotFound
from gpufleet.node_health.config import Configuration
from gpufleet.node_health.devices import GpuRemediator
from gpufleet.node_health.faults import Rules
from gpufleet.node_health.remediate import Remediator
from gpufleet.ops import gpus as gpuops
from gpufleet.ops.reads import list_gpus
from gpufleet.prom.client import PromClient
from gpufleet_workshop.local import cluster as local
from gpufleet_workshop.local import node as realnode
from roles.kueue.config import configuration as quota_configuration
from roles.registry import load

from .helpers import ensure_kueue_objects, hostname_selector, step_until, wait

pytestmark = pytest.mark.cluster

ENV = "local-dra"
NS = "team-pretrain"
#: Latencies measured by the last run (seconds), for the report and bench/.
DRA_FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def dra(tmp_path_factory):
    """``(cluster, kube)``: a running local cluster of env local-dra with its real node; stopped at module end."""
    name = f"{os.environ.get('GPUFLEET_TEST_CLUSTER', 'gpufleet-test')}-dra"
    was_up = bool(local.main_pids(name))
    c = local.up(name, env=ENV, fresh=not was_up, timeout=300)
    kube = Kube.from_kubeconfig(c.kubeconfig, user_agent="gpufleet-tests")
    ensure_kueue_objects(kube, load(ENV))
    try:
        yield c, kube
    finally:
        kube.close()
        if not was_up and os.environ.get("GPUFLEET_KEEP_CLUSTER") != "1":
            local.down(name)


def claim_template(name: str, count: int, tolerations: list[dict] | None = None) -> dict:
    exactly = {"deviceClassName": names.GPU_DEVICE_CLASS, "allocationMode": "ExactCount", "count": count}
    if tolerations:
        exactly["tolerations"] = tolerations
    return {"apiVersion": names.RESOURCE_API, "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}}


def gpu_pod(name: str, template: str, node: str, *, image: str = "registry.invalid/none:1", system: bool = False,
            command: list[str] | None = None) -> dict:
    """A pod on ``node`` (by node selector: the scheduler allocates its claim) with one claim from ``template``."""
    tolerations = [{"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    if system:
        key, value, effect = names.SYSTEM_NODE_TAINT
        tolerations.append({"key": key, "value": value, "effect": effect})
    container = {"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                 "resources": {"claims": [{"name": "gpus"}]}}
    if command:
        container["command"] = command
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": tolerations,
                     "terminationGracePeriodSeconds": 0, "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                     "containers": [container]}}


def phase(kube: Kube, name: str, ns: str) -> str:
    return (kube.get("v1", "pods", name, ns).get("status") or {}).get("phase", "")


def allocated(kube: Kube, pod: str, ns: str) -> list[str]:
    """The devices allocated to the pod's claim (its ResourceClaim's status)."""
    p = kube.get("v1", "pods", pod, ns)
    for st in (p.get("status") or {}).get("resourceClaimStatuses") or []:
        if st.get("resourceClaimName"):
            claim = kube.get(names.RESOURCE_API, "resourceclaims", st["resourceClaimName"], ns)
            return sorted(r["device"] for r in (((claim.get("status") or {}).get("allocation") or {})
                                                .get("devices") or {}).get("results") or [])
    return []


@pytest.fixture
def scratch(dra):
    """A namespace for a test's pods and claim templates, deleted afterwards."""
    _, kube = dra
    ns = f"dra-{uuid.uuid4().hex[:6]}"
    kube.create("v1", "namespaces", {"metadata": {"name": ns}})
    yield ns
    kube.delete("v1", "namespaces", ns)
    wait(f"namespace {ns} gone", lambda: kube.get_or_none("v1", "namespaces", ns) is None, timeout=120)


def test_the_fleet_publishes_gpus_as_nvidias_driver_does(dra):
    c, kube = dra
    gpus = list_gpus(kube)
    kwok_nodes = sorted(n for n in gpus if n.startswith("gpu-"))
    assert len(kwok_nodes) == 8 and all(len(gpus[n]) == 8 for n in kwok_nodes)
    g = gpus[kwok_nodes[0]][5]
    assert (g.driver, g.pool, g.device, g.index) == ("gpu.nvidia.com", kwok_nodes[0], "gpu-5", 5)
    assert g.uuid.startswith("GPU-") and g.pci_bus_id == "0000:ab:00.0"
    sl = kube.get(names.RESOURCE_API, "resourceslices", f"{kwok_nodes[0]}-gpu.nvidia.com")
    attrs = sl["spec"]["devices"][5]["attributes"]
    assert {"type", "uuid", "productName", "brand", "architecture", "cudaComputeCapability", "driverVersion",
            "cudaDriverVersion", "index", "minor", "resource.kubernetes.io/pciBusID"} <= set(attrs)
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert sl["metadata"]["ownerReferences"][0]["kind"] == "Node"  # goes with its node
    node = kube.get("v1", "nodes", kwok_nodes[0])
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]  # DRA, not the device plugin
    assert node["metadata"]["labels"][names.GPU_ALLOCATION_LABEL] == "dra"
    assert kube.get(names.RESOURCE_API, "deviceclasses", names.GPU_DEVICE_CLASS)
    real = realnode.node_name(c.name)
    assert len(gpus[real]) == 8  # published by the real node's kubelet plugin


def test_the_real_nodes_kubelet_prepares_and_unprepares_a_claim_through_the_plugin(dra, scratch):
    from gpufleet_admin.build import image as images

    c, kube = dra
    real = realnode.node_name(c.name)
    kube.create(names.RESOURCE_API, "resourceclaimtemplates", claim_template("two", 2), scratch)
    image = images.built()["reference"]
    kube.create("v1", "pods", gpu_pod("prepared", "two", real, image=image, system=True,
                                      command=["python3", "-c", "import time; time.sleep(3600)"]), scratch)
    wait("the pod Running on the real node", lambda: phase(kube, "prepared", scratch) == "Running", timeout=180)
    devices = allocated(kube, "prepared", scratch)
    assert len(devices) == 2
    checkpoint = realnode.NodePaths.of(c.layout).kubelet_root / "plugins" / "gpu.nvidia.com" / "checkpoint.json"
    prepared = json.loads(checkpoint.read_text())
    assert [v["devices"] for v in prepared.values() if v["namespace"] == scratch] == [devices]
    log = c.layout.log(local.DRA_DRIVER).read_text()
    assert "Prepared claim" in log
    kube.delete("v1", "pods", "prepared", scratch, grace_seconds=0)
    wait("the claim unprepared", lambda: not [v for v in json.loads(checkpoint.read_text()).values()
                                              if v["namespace"] == scratch], timeout=120)
    assert "Unprepared claim" in c.layout.log(local.DRA_DRIVER).read_text()


def test_a_training_job_gets_its_gpus_through_claims_and_kueue_counts_them(dra):
    from gpufleet_admin.training.render import render
    from gpufleet_admin.training.submit import create_objects, find_workload
    import yaml

    _, kube = dra
    name = f"dra-{uuid.uuid4().hex[:5]}"
    objs = [o for o in yaml.safe_load_all(render(ENV, "job", name, 2, sets=["simulated_duration_seconds=600"])) if o]
    assert [o["kind"] for o in objs] == ["ResourceClaimTemplate", "Service", "Job"]
    job = create_objects(kube, objs)
    try:
        wl = wait("the Workload admitted", lambda: (w := find_workload(kube, NS, job["metadata"]["uid"])) and any(
            cond["type"] == "Admitted" and cond["status"] == "True"
            for cond in (w.get("status") or {}).get("conditions") or []) and w, timeout=120)
        usage = wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
        assert usage["nvidia.com/gpu"] == "16"  # two claims of 8 devices, counted by Kueue's DRA mapping
        pods = wait("both pods Running", lambda: (ps := kube.list("v1", "pods", NS, labelSelector=f"gpufleet.io/job={name}")[
            "items"]) and len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps) and ps, timeout=120)
        assert all(len(allocated(kube, p["metadata"]["name"], NS)) == 8 for p in pods)
        tpl = kube.get(names.RESOURCE_API, "resourceclaimtemplates", f"{name}-gpus", NS)
        assert tpl["metadata"]["ownerReferences"][0]["kind"] == "Job"  # goes with the job
    finally:
        kube.delete("batch/v1", "jobs", name, NS, propagation="Background")
        kube.delete("v1", "services", name, NS)
        wait("the job's pods gone", lambda: not kube.list("v1", "pods", NS, labelSelector=f"gpufleet.io/job={name}")["items"],
             timeout=120)


def nominal(kube: Kube, queue: str = "training") -> int:
    cq = kube.get("kueue.x-k8s.io/v1beta2", "clusterqueues", queue)
    for group in cq["spec"]["resourceGroups"]:
        for f in group["flavors"]:
            for r in f["resources"]:
                if r["name"] == "nvidia.com/gpu":
                    return int(r["nominalQuota"])
    raise AssertionError("no GPU quota")


def test_one_hot_gpu_is_removed_not_the_node_and_returns_after_the_hold(dra, scratch, tmp_path_factory):
    from gpufleet.prom.server import PrometheusNotFound, running_prometheus
    from gpufleet.quota_sync.controller import QuotaSync
    from gpufleet_workshop.sim.fleet import scrape_config, start_node

    _, kube = dra
    inv = load(ENV)
    node = sorted(n for n in list_gpus(kube) if n.startswith("gpu-"))[0]
    sim = start_node(node, workdir=tmp_path_factory.mktemp(node))
    try:
        with running_prometheus([scrape_config([sim])]) as prom:
            prom.wait_for_targets_up(1)
            _scenario(kube, inv, node, sim, PromClient(prom.url), scratch)
    except PrometheusNotFound as exc:
        pytest.skip(str(exc))
    finally:
        sim.stop()


def _scenario(kube: Kube, inv, node: str, sim, prom: PromClient, ns: str) -> None:
    from gpufleet.quota_sync.controller import QuotaSync

    rules = Rules(hot_samples=3, gpu_temp_celsius=78, memory_temp_celsius=85, scrape_interval_seconds=1)
    settings = Configuration(rules=rules, max_nodes_out=2, namespace="gpufleet-system",
                             telemetry_node_selector=hostname_selector([node]), gpu_hold_seconds=3)
    passed: list[str] = []
    gpu_rem = GpuRemediator(kube, settings, checks=lambda g: passed.append(g.device) or [])
    rem = Remediator(kube, prom, settings, gpus=gpu_rem)
    qs = QuotaSync(kube, quota_configuration(inv).model_copy(update={"debounce_seconds": 0.2}))
    stop = threading.Event()
    runner = threading.Thread(target=qs.run, args=(stop,), daemon=True)
    runner.start()
    rule = gpuops.rule_name(node, "gpu-3")
    try:
        wait("quota sync's first resync", lambda: qs.history and qs.history[-1].error is None, timeout=60)
        queues = [q.name for q in inv.role("kueue").kueue_cluster_queues]
        total = lambda: sum(nominal(kube, q) for q in queues)  # noqa: E731
        before, total_before = nominal(kube), total()
        # 90 C on GPU 3 of the node: three hot samples (1 s scrapes), then node health's step confirms
        sim.set_temperature(3, 90)
        report = step_until(rem, "GPU 3 tainted", lambda r: r.gpu and any(
            d.action == "remove" and d.gpu.device == "gpu-3" for d in r.gpu.decisions), interval=0.25)
        tainted_at = time.time()
        DRA_FIGURES["fault_to_taint_seconds"] = report.gpu.latencies[(node, "gpu-3")]  # bench/gpu_removal.py times it
        taint = kube.get(names.RESOURCE_API, "devicetaintrules", rule)["spec"]["taint"]
        assert taint == {"key": names.GPU_DEGRADED_TAINT, "value": "gpu_temp", "effect": "NoSchedule"} | (
            {"timeAdded": taint["timeAdded"]} if "timeAdded" in taint else {})
        assert node not in report.faults  # the node itself has no fault: not cordoned, not tainted
        n = kube.get("v1", "nodes", node)
        assert not n["spec"].get("unschedulable") and not [t for t in n["spec"].get("taints") or []
                                                             if t["key"].startswith("gpufleet.io/")]
        # quota falls by what the partial-node policy says: the whole node (8) by default, else the one GPU
        lost = 1 if inv.role("kueue").kueue_partial_gpu_nodes_count else 8
        wait("quota lowered", lambda: total() == total_before - lost, timeout=30, interval=0.05)
        DRA_FIGURES["taint_to_quota_seconds"] = time.time() - tainted_at
        # the other seven GPUs take a 7-GPU pod
        kube.create(names.RESOURCE_API, "resourceclaimtemplates", claim_template("seven", 7), ns)
        kube.create(names.RESOURCE_API, "resourceclaimtemplates", claim_template("one", 1), ns)
        kube.create(names.RESOURCE_API, "resourceclaimtemplates", claim_template(
            "one-degraded-ok", 1, [{"key": names.GPU_DEGRADED_TAINT, "operator": "Exists", "effect": "NoSchedule"}]), ns)
        kube.create("v1", "pods", gpu_pod("seven", "seven", node), ns)
        wait("the 7-GPU pod Running on the node", lambda: phase(kube, "seven", ns) == "Running", timeout=90)
        assert "gpu-3" not in allocated(kube, "seven", ns) and len(allocated(kube, "seven", ns)) == 7
        # a training-like 1-GPU claim finds no GPU there; inference's claim tolerating the degraded taint does
        kube.create("v1", "pods", gpu_pod("training-one", "one", node), ns)
        kube.create("v1", "pods", gpu_pod("inference-one", "one-degraded-ok", node), ns)
        wait("the inference pod Running on the hot GPU", lambda: phase(kube, "inference-one", ns) == "Running", timeout=90)
        assert allocated(kube, "inference-one", ns) == ["gpu-3"]
        time.sleep(3)
        assert phase(kube, "training-one", ns) == "Pending"
        # cool down: after the hold (3 s) and the GPU's checks, the taint goes and quota comes back
        sim.set_temperature(3, 41)
        step_until(rem, "GPU 3 returned", lambda r: r.gpu and any(
            d.action == "return" and d.gpu.device == "gpu-3" for d in r.gpu.decisions), timeout=60, interval=0.25)
        returned_at = time.time()
        assert kube.get_or_none(names.RESOURCE_API, "devicetaintrules", rule) is None and passed == ["gpu-3"]
        kube.delete("v1", "pods", "inference-one", ns, grace_seconds=0)
        kube.delete("v1", "pods", "training-one", ns, grace_seconds=0)
        wait("quota back", lambda: total() == total_before and nominal(kube) == before, timeout=30, interval=0.05)
        DRA_FIGURES["recovery_to_quota_seconds"] = time.time() - returned_at
        hist = gpuops.history(kube.get("v1", "nodes", node))["gpu-3"]
        assert [e["action"] for e in hist][-2:] == ["remove", "return"]
        print(f"\nDRA figures: {json.dumps(DRA_FIGURES)}")
    finally:
        stop.set()
        runner.join(timeout=10)
        try:
            kube.delete(names.RESOURCE_API, "devicetaintrules", rule)
        except NotFound:
            pass
        rem.close()


def test_a_person_removes_and_returns_one_gpu_and_status_shows_it(dra, invoke_cli):
    from rich.console import Console

    from gpufleet_workshop.tasks.gpu import gpu as collection
    from gpufleet_workshop.tasks.status import show_status

    c, kube = dra
    cli = invoke_cli(collection)
    node = sorted(n for n in list_gpus(kube) if n.startswith("gpu-"))[1]
    kc = ("--kubeconfig", str(c.kubeconfig))
    code, out, err = cli("gpu.remove", node, "5", "--reason", "fan noise, RMA 4711", "--dry-run", *kc)
    assert code == 0 and "dry run" in out and kube.get_or_none(names.RESOURCE_API, "devicetaintrules",
                                                               gpuops.rule_name(node, "gpu-5")) is None
    code, out, err = cli("gpu.remove", node, "5", "--reason", "fan noise, RMA 4711", *kc)
    assert code == 0, err
    rule = kube.get(names.RESOURCE_API, "devicetaintrules", gpuops.rule_name(node, "gpu-5"))
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-5"}
    assert rule["spec"]["taint"]["key"] == names.GPU_UNHEALTHY_TAINT and rule["spec"]["taint"]["effect"] == "NoExecute"
    assert rule["metadata"]["annotations"][names.ANN_GPU_REMOVED_BY] == "person"
    code, out, _ = cli("gpu.remove", node, "gpu-5", "--reason", "again", *kc)
    assert code == 0 and "already out" in out  # idempotent
    code, _, err = cli("gpu.remove", node, "9", "--reason", "x", *kc)
    assert code == 2 and f"node {node}: no GPU '9'" in err
    code, _, err = cli("gpu.remove", "gpu-nowhere", "1", "--reason", "x", *kc)
    assert code == 2 and "not found" in err
    # invoke status lists the GPU out, with its node and who took it out
    console = Console(record=True, width=250)
    fleet = show_status(ENV, kubeconfig=str(c.kubeconfig), console=console)
    assert [(r.node, r.device, r.by) for r in fleet.gpus_out] == [(node, "gpu-5", "person")]
    assert "GPUs out (1 on 1 nodes" in console.export_text()
    # a return without checks is refused unless asked for
    code, _, err = cli("gpu.return", node, "5", *kc)
    assert code == 2 and "--env is needed" in err
    code, out, err = cli("gpu.return", node, "5", "--skip-checks", *kc)
    assert code == 0 and "back in service" in out, err
    assert kube.get_or_none(names.RESOURCE_API, "devicetaintrules", gpuops.rule_name(node, "gpu-5")) is None
    code, out, _ = cli("gpu.return", node, "5", "--skip-checks", *kc)
    assert code == 0 and "not out" in out  # idempotent
