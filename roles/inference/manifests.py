"""What the inference role declares: Deployments with a Service, an autoscaler and a PodDisruptionBudget.

Each Deployment has a ClusterIP Service of its own name: the Deployment's
pod labels as selector, one port per container port of the pod template
(same name and number, ``targetPort`` by name). In-cluster pods reach it
through kube-controller-manager's EndpointSlices; pods that run outside
through the virtual kubelets' (:mod:`gpufleet.virtual_kubelet.endpoints`), so requests
follow the pods wherever they run.

Pods get the low PriorityClass (training preempts them), prefer in-cluster
nodes (soft node affinity against ``type=virtual-kubelet``), tolerate the
degraded-node taint (GPUs fit for inference) and the GPU taint, and do NOT
tolerate ``gpufleet.io/cluster-has-free-gpus``: the taint controller
decides when they may run outside.

With Kueue's topology-aware scheduling (kueue role), Kueue counts the GPUs
of every pod it did not admit as used, and would admit no training gang onto
nodes inference holds; the flip-out, which makes room for training, acts
only on training pods that exist, so neither would move. Training always
wins those GPUs, so inference pods carry Kueue's
``podset-unconstrained-topology`` annotation, which makes Kueue leave them
out of that count (sigs.k8s.io/kueue v0.17
``pkg/controller/tas/non_tas_usage_controller.go``: ``filterPod`` skips
TAS pods): Kueue places the gang, pins its pods to nodes, and the flip-out
evicts inference from exactly those nodes.

The Deployment's selector (its ``matchLabels`` and ``surge-for
DoesNotExist``) leaves out the taint controller's make-before-break
surge pods, which carry the workload's labels (the Service and the
PodDisruptionBudget select them: they serve and count as healthy while
their victim leaves) and the ``gpufleet.io/surge-for`` label: the
HorizontalPodAutoscaler lists the pods it averages over by the scale
subresource's selector, which is the Deployment's, so a surge pod is never
counted as a replica of its own. A Deployment's selector is immutable; one
created by an earlier release keeps its selector (the stack ignores the
field after creation, ``gpufleet_admin.stack.role.declare``) until it is
replaced on purpose (roles/inference/README.md).

Autoscaling follows requests in flight per pod by default (``scale_on:
requests_in_flight``): a model server's latency follows the requests it
batches, wherever its pods run, where CPU says little about a GPU server.
The role declares a KEDA ScaledObject; KEDA makes the HPA, named after the
Deployment as the CPU one is (``kubectl get hpa <name>`` and what reads the
HPA by that name keep working), with one External metric:
``sum(<metric>{namespace="<ns>",service="<name>"})``, Prometheus' total over
the targets the Service's EndpointSlices list (in-cluster pods, and those
outside through the virtual kubelets' slices), at ``AverageValue``
``target_requests_in_flight``. The HPA divides that sum by the Deployment's
current replicas (its scale subresource's ``status.replicas``), which never
counts surge pods (above), while surges that serve are in the sum: the total
load is the demand, the Deployment's replicas the supply.
``ignoreNullValues: "false"``: an empty result (Prometheus lost every
target) is an error, and the HPA holds its replica count, where KEDA's
default would read 0 and scale down to the minimum. Every Service carries
the ``prometheus.io/*`` scrape annotations (vLLM and the stand-in serve
``/metrics`` on their HTTP port). The ScaledObject carries KEDA's
``transfer-hpa-ownership``: KEDA's admission webhook refuses a ScaledObject
for a workload another HPA scales, and a Deployment moving from CPU still has
its CPU HPA of the same name until the stack deletes it, after creating the
ScaledObject (KEDA adopts it, then makes it again once deleted).
``scale_on: cpu`` declares the HorizontalPodAutoscaler on CPU utilization
instead.

Where every GPU node of the inventory allocates its GPUs through DRA
(``gpu_allocation: dra``), a pod gets its GPUs from a ResourceClaim of the
Deployment's ResourceClaimTemplate (``<name>-gpus``, NVIDIA's DeviceClass)
instead of ``nvidia.com/gpu``. The claim tolerates the degraded-GPU device
taint (``gpufleet.io/gpu-degraded``, NoSchedule): a GPU node health took out
of training for a fault that leaves it fit to serve still goes to inference,
as the degraded node tier does for whole nodes; the unhealthy taint
(NoExecute) is not tolerated. Such pods run in the cluster only: the virtual
kubelets translate no ResourceClaims.
"""

from __future__ import annotations

from gpufleet.fleet.classify import INFERENCE_TOLERATIONS
from gpufleet_admin.inventory import Inventory
from gpufleet_admin.inventory.inventory import GPU_RESOURCE
from gpufleet.names import (
    GPU_DEGRADED_TAINT,
    GPU_DEVICE_CLASS,
    KUEUE_UNCONSTRAINED_TOPOLOGY,
    PROMETHEUS_PATH_ANNOTATION,
    PROMETHEUS_SCRAPE_ANNOTATION,
    RESOURCE_API,
    SURGE_FOR_LABEL,
    WORKLOAD_INFERENCE,
    WORKLOAD_LABEL,
)
from gpufleet_admin.manifests import Obj, meta

VIRTUAL_NODE_LABEL = ("type", "virtual-kubelet")


#: The selector requirement that leaves make-before-break surge pods out of a Deployment (module doc).
NOT_A_SURGE = {"key": SURGE_FOR_LABEL, "operator": "DoesNotExist"}

#: The container port a model server serves requests and ``/metrics`` on (vLLM and the stand-in alike).
HTTP_PORT_NAME = "http"
#: Path of the model server's Prometheus metrics (on :data:`HTTP_PORT_NAME`).
METRICS_PATH = "/metrics"
#: KEDA's ScaledObject API and the name of its one trigger.
KEDA_API = "keda.sh/v1alpha1"
TRIGGER_NAME = "requests-in-flight"
#: Lets a new ScaledObject adopt the Deployment's CPU HPA of the same name (module doc; KEDA v2.21
#: ``apis/keda/v1alpha1/scaledobject_types.go``, ``ScaledObjectTransferHpaOwnershipAnnotation``).
KEDA_TRANSFER_HPA_ANNOTATION = "scaledobject.keda.sh/transfer-hpa-ownership"

#: Name of the GPU claim of a DRA inference pod.
GPU_CLAIM = "gpus"
#: The device toleration of an inference claim: GPUs node health degraded still serve (module doc).
DEGRADED_DEVICE_TOLERATION = {"key": GPU_DEGRADED_TAINT, "operator": "Exists", "effect": "NoSchedule"}


def uses_dra(inv: Inventory) -> bool:
    """Inference asks for GPUs through ResourceClaims: every GPU flavor of the inventory is a DRA one."""
    flavors = inv.flavors().values()
    return bool(flavors) and all(f.dra for f in flavors)


def claim_template(name: str, namespace: str, gpus: int) -> Obj:
    """The ResourceClaimTemplate of an inference Deployment: ``gpus`` devices of NVIDIA's DeviceClass,
    tolerating the degraded-GPU taint (module doc)."""
    return {"apiVersion": RESOURCE_API, "kind": "ResourceClaimTemplate",
            "metadata": meta(f"{name}-{GPU_CLAIM}", namespace, component="inference"),
            "spec": {"spec": {"devices": {"requests": [{"name": GPU_CLAIM, "exactly": {
                "deviceClassName": GPU_DEVICE_CLASS, "allocationMode": "ExactCount", "count": gpus,
                "tolerations": [dict(DEGRADED_DEVICE_TOLERATION)]}}]}}}}


def pod_spec(inv: Inventory, d) -> Obj:
    """The inference pod: low priority, GPU request (or claim), affinity and tolerations (see module doc)."""
    priority = min(inv.role("kueue").kueue_priority_classes, key=lambda p: p.value).name
    resources = {"cpu": d.cpu, "memory": d.memory}
    claim = bool(d.gpus_per_pod) and uses_dra(inv)
    if d.gpus_per_pod and not claim:
        resources[GPU_RESOURCE] = str(d.gpus_per_pod)
    container_resources: Obj = {"requests": resources, "limits": {k: v for k, v in resources.items() if k != "cpu"}}
    extra: Obj = {}
    if claim:
        container_resources["claims"] = [{"name": GPU_CLAIM}]
        extra["resourceClaims"] = [{"name": GPU_CLAIM, "resourceClaimTemplateName": f"{d.name}-{GPU_CLAIM}"}]
    return {
        **extra,
        "priorityClassName": priority,
        "terminationGracePeriodSeconds": 30,
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "preference": {"matchExpressions": [{"key": VIRTUAL_NODE_LABEL[0], "operator": "NotIn",
                                                 "values": [VIRTUAL_NODE_LABEL[1]]}]}}]}},
        # The classifier counts inference capacity with these very tolerations (gpufleet.fleet.classify):
        # the GPU taint, the degraded tier, and virtual nodes once the free-GPU taint is gone.
        "tolerations": [dict(t) for t in INFERENCE_TOLERATIONS],
        "containers": [{
            "name": "server", "image": d.image,
            "ports": [{"name": HTTP_PORT_NAME, "containerPort": 8000}],
            "resources": container_resources,
            "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
        }],
    }


def pod_metadata(inv: Inventory, selector: dict[str, str]) -> Obj:
    """Labels of an inference pod, and the annotation that keeps its GPUs out of Kueue's topology usage (module doc)."""
    out: Obj = {"labels": {**selector, WORKLOAD_LABEL: WORKLOAD_INFERENCE}}
    if inv.role("kueue").kueue_topology_enabled:
        out["annotations"] = {KUEUE_UNCONSTRAINED_TOPOLOGY: "true"}
    return out


def service(name: str, namespace: str, selector: dict[str, str], pod: Obj) -> Obj:
    """The Service of one inference Deployment: ``selector`` (its pod labels), a port per container port of ``pod``,
    and the ``prometheus.io/*`` annotations that have Prometheus scrape ``/metrics`` on the ``http`` port (module doc).

    Raises:
        ValueError: a container port has no name (a Service port needs one when there are several), or no
            container port is named ``http`` (where the metrics are served).
    """
    ports = []
    for c in pod.get("containers") or []:
        for p in c.get("ports") or []:
            if not p.get("name"):
                raise ValueError(f"inference Deployment {name}: container {c.get('name')!r} port {p.get('containerPort')} "
                                 "has no name (the Service names its ports after them)")
            ports.append({"name": p["name"], "protocol": p.get("protocol", "TCP"), "port": p["containerPort"],
                          "targetPort": p["name"]})
    if not any(p["name"] == HTTP_PORT_NAME for p in ports):
        raise ValueError(f"inference Deployment {name}: no container port named {HTTP_PORT_NAME!r} (have "
                         f"{[p['name'] for p in ports]}); Prometheus scrapes {METRICS_PATH} on it")
    # No prometheus.io/port: each endpoint is scraped at the port its EndpointSlice gives, which a virtual
    # kubelet's slices may map to another (a rental instance's own port): the annotation would override it.
    scrape = {PROMETHEUS_SCRAPE_ANNOTATION: "true", PROMETHEUS_PATH_ANNOTATION: METRICS_PATH}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": meta(name, namespace, component="inference", annotations=scrape),
            "spec": {"type": "ClusterIP", "selector": dict(selector), "ports": ports}}


def requests_in_flight_query(metric: str, namespace: str, service_name: str) -> str:
    """PromQL of the requests in flight of one Service's pods, all of them: ``sum(metric{namespace,service})``.

    The labels are the Service's, which the scrape gives every target its EndpointSlices list (module doc).
    """
    return f'sum({metric}{{namespace="{namespace}",service="{service_name}"}})'


def keda_number(value: float) -> str:
    """A number as KEDA's trigger metadata takes it (a string): ``8.0`` -> ``"8"``, ``2.5`` -> ``"2.5"``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def cpu_hpa(d, namespace: str) -> Obj:
    """The HorizontalPodAutoscaler of a ``scale_on: cpu`` deployment: CPU utilization at ``target_cpu_utilization``."""
    hpa: Obj = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": d.name},
                "minReplicas": d.min_replicas, "maxReplicas": d.max_replicas,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                    "type": "Utilization", "averageUtilization": d.target_cpu_utilization}}}]}
    if d.scale_down_stabilization_seconds is not None:
        hpa["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": d.scale_down_stabilization_seconds}}
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": meta(d.name, namespace, component="inference"), "spec": hpa}


def scaled_object(d, namespace: str, prometheus_url: str, metric: str) -> Obj:
    """The KEDA ScaledObject of a ``scale_on: requests_in_flight`` deployment (module doc): its HPA named after the
    Deployment, one Prometheus trigger at ``target_requests_in_flight`` per replica, an empty result an error."""
    hpa_config: Obj = {"name": d.name}
    if d.scale_down_stabilization_seconds is not None:
        hpa_config["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": d.scale_down_stabilization_seconds}}
    return {"apiVersion": KEDA_API, "kind": "ScaledObject",
            "metadata": meta(d.name, namespace, component="inference",
                             annotations={KEDA_TRANSFER_HPA_ANNOTATION: "true"}),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": d.name},
                     "minReplicaCount": d.min_replicas, "maxReplicaCount": d.max_replicas,
                     "advanced": {"horizontalPodAutoscalerConfig": hpa_config},
                     "triggers": [{"type": "prometheus", "name": TRIGGER_NAME, "metricType": "AverageValue",
                                   "metadata": {"serverAddress": prometheus_url,
                                                "query": requests_in_flight_query(metric, namespace, d.name),
                                                "threshold": keda_number(d.target_requests_in_flight),
                                                "ignoreNullValues": "false"}}]}}


#: Seconds between scrapes of the model servers' metrics where the Prometheus operator scrapes them: short,
#: because the autoscaler follows what is scraped (the local environment's Prometheus scrapes them as often).
SCRAPE_INTERVAL = "5s"


def service_monitor(namespace: str) -> Obj:
    """The Prometheus operator's ServiceMonitor of every inference Service in ``namespace`` (the role's Services
    carry ``app.kubernetes.io/name: inference``): ``/metrics`` on the ``http`` port every :data:`SCRAPE_INTERVAL`.
    The operator's targets carry ``namespace`` and ``service``, the labels the ScaledObject's query sums by; it
    reads endpoints (EndpointSlices where the Prometheus resource says so), so pods outside are scraped too."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": meta("inference", namespace, component="inference"),
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "inference"}},
                     "endpoints": [{"port": HTTP_PORT_NAME, "path": METRICS_PATH, "interval": SCRAPE_INTERVAL}]}}


def objects(inv: Inventory) -> list[Obj]:
    """Namespace, and per deployment: its ResourceClaimTemplate (DRA only), Deployment, Service, autoscaler (a KEDA
    ScaledObject on requests in flight, or with ``scale_on: cpu`` a HorizontalPodAutoscaler), PodDisruptionBudget;
    where the Prometheus operator scrapes (``gpu_metrics_prometheus_operator``) and a deployment scales on requests
    in flight, one ServiceMonitor of the inference Services (:func:`service_monitor`)."""
    from gpufleet_admin.manifests import namespace

    v = inv.role("inference")
    if not v.inference_enabled:
        return []
    ns = v.inference_namespace
    out: list[Obj] = [namespace(ns)]
    for d in v.inference_deployments:
        sel = {"app.kubernetes.io/name": d.name}
        spec = pod_spec(inv, d)
        if spec.get("resourceClaims"):
            out.append(claim_template(d.name, ns, d.gpus_per_pod))
        out.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(d.name, ns, component="inference"),
                    "spec": {"replicas": d.replicas,
                             "selector": {"matchLabels": sel, "matchExpressions": [dict(NOT_A_SURGE)]},
                             "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
                             "template": {"metadata": pod_metadata(inv, sel), "spec": spec}}})
        out.append(service(d.name, ns, sel, spec))
        if d.scale_on == "cpu":
            out.append(cpu_hpa(d, ns))
        else:
            out.append(scaled_object(d, ns, v.inference_prometheus_url, v.inference_requests_in_flight_metric))
        out.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(d.name, ns, component="inference"),
                    "spec": {**d.pdb_spec(), "selector": {"matchLabels": sel}}})
    if inv.role("gpu_metrics").gpu_metrics_prometheus_operator and any(
            d.scale_on == "requests_in_flight" for d in v.inference_deployments):
        # Where the Prometheus operator scrapes (gpu_metrics), it ignores the prometheus.io annotations.
        out.append(service_monitor(ns))
    return out
