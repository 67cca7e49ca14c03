"""The names every part of gpufleet shares: labels, taints, annotations, resources, field manager.

Everything that marks a node as out of service, degraded or up for
replacement is spelled here once, so the quota sync (which excludes such
nodes), the swap steps (which set them), the remediation controller and
``invoke status`` (which report them) cannot disagree. Which taints keep
whose pods off a node is decided by tolerations, in one place:
:mod:`gpufleet.fleet.classify`.
"""

from __future__ import annotations

#: Label of the local cluster's real node, which runs system pods (gpufleet's own), never GPU work:
#: ``gpufleet.io/node-role=system``.
SYSTEM_NODE_LABEL = ("gpufleet.io/node-role", "system")
#: Taint of that node: ``gpufleet.io/system=true:NoSchedule``; only gpufleet's and other system pods tolerate it.
SYSTEM_NODE_TAINT = ("gpufleet.io/system", "true", "NoSchedule")
#: Taint of a node out for swap: ``gpufleet.io/swap=<reason>:NoSchedule``.
SWAP_TAINT = "gpufleet.io/swap"
#: Taint of a degraded node (fit for inference, not training): ``gpufleet.io/degraded=<fault>:NoSchedule``.
DEGRADED_TAINT = "gpufleet.io/degraded"
#: Taint the taint controller keeps on virtual nodes while the cluster has free GPUs.
FREE_GPUS_TAINT = "gpufleet.io/cluster-has-free-gpus"
#: Its effect: NoSchedule only, never NoExecute (pods outside keep serving until moved one budget at a time).
FREE_GPUS_EFFECT = "NoSchedule"
#: Taint put on an in-cluster node the flip-out reserves for one pending high-priority pod
#: (value: that pod's UID); the pod gets the matching toleration.
RESERVED_TAINT = "gpufleet.io/reserved-for"
#: Label the flip-back puts on a pod outside it releases for eviction (the descheduler's
#: DefaultEvictor ``labelSelector`` selects it).
RELEASE_LABEL = ("gpufleet.io/flip-back", "released")
#: Label on a make-before-break replacement (its ReplicaSet and pod): the UID of the pod it replaces.
SURGE_FOR_LABEL = "gpufleet.io/surge-for"
#: Label on a surge: ``out`` (a replacement on virtual nodes, flip-out) or ``back`` (in-cluster, flip-back).
SURGE_DIRECTION_LABEL = "gpufleet.io/surge-direction"
#: PriorityClass of the flip-out's replacements outside (the taint_controller role declares it): above training's,
#: ``preemptionPolicy: Never``, so kube-scheduler places them before the gang they make room for.
SURGE_PRIORITY_CLASS = "gpufleet-flip-surge"
#: Pod condition the virtual kubelet keeps on each pod it runs outside: True once the pod is a ready, serving
#: endpoint, at the address its provider reports, of every Service that selects it (gpufleet.virtual_kubelet.endpoints);
#: a make-before-break replacement takes a pod's place only then (gpufleet.taint_controller.surge). Not a readiness gate
#: (the endpoint is ready only once the pod is): a condition of its own, under gpufleet's domain.
PUBLISHED_CONDITION = "endpoints.gpufleet.io/Published"
#: kube-controller-manager's annotation ranking a ReplicaSet's pods when it has one too many (int32; the lowest
#: goes first, after pods not yet scheduled, running or Ready): ``controller.kubernetes.io/pod-deletion-cost``.
POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: Flip-out modes: a replacement outside is Ready before the pod is evicted, or today's evict first.
FLIP_MODES = ("make_before_break", "evict_first")
#: Taint of virtual nodes (the virtual-kubelet convention); pods that may run outside tolerate it.
VIRTUAL_NODE_TAINT = "virtual-kubelet.io/provider"

#: Label on a node whose replacement was requested (a provider integration selects on it).
REPLACEMENT_LABEL = "gpufleet.io/replacement-requested"
#: Label on a lemon node: repeated attributable failures; stays out until a person returns it.
LEMON_LABEL = "gpufleet.io/lemon"
#: Label of virtual nodes (the virtual-kubelet convention).
VIRTUAL_NODE_LABEL = ("type", "virtual-kubelet")
#: Annotations on a pod the virtual kubelet runs at a provider: the source pod's UID, namespace and name.
SOURCE_UID = "gpufleet.io/source-uid"
SOURCE_NAMESPACE = "gpufleet.io/source-namespace"
SOURCE_NAME = "gpufleet.io/source-name"
#: Label on such a remote pod: the virtual node it runs for (not a node label: see VIRTUAL_NODE_LABEL).
REMOTE_NODE_LABEL = "gpufleet.io/virtual-node"
#: Label on remote pods of a kubernetes pool reached through a load balancer: their workload's remote Service.
REMOTE_SERVICE_LABEL = "gpufleet.io/remote-service"
#: Label on a ConfigMap or Secret the virtual kubelet reflects to a provider (a copy of one its pods
#: reference): the virtual node it is reflected for.
REFLECTED_LABEL = "gpufleet.io/reflected-for"
#: Label on what the kubernetes provider creates in a remote cluster (namespaces, Services, reflected
#: ConfigMaps and Secrets): ``gpufleet.io/managed-by=virtual-kubelet``.
MANAGED_BY_LABEL = ("gpufleet.io/managed-by", "virtual-kubelet")
#: Prefix of a reflected copy's name in a remote namespace: ``gf-<pool>.<source name>`` (one copy per pool,
#: so pools sharing a remote namespace, and the remote cluster's own objects, never share a name).
REFLECTED_NAME_PREFIX = "gf-"
#: Event reason (and failed pod reason) when a reflected copy's name is taken by an object gpufleet does not own.
FOREIGN_OBJECT_REASON = "ForeignObjectInTheWay"
#: NVIDIA's node label naming the GPU model (GPU feature discovery).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
#: Label naming a virtual node's external capacity pool.
POOL_LABEL = "gpufleet.io/pool"
#: Label naming a virtual node's provider kind (``simulated``, ``kubernetes``).
PROVIDER_LABEL = "gpufleet.io/provider"
#: Annotation on a virtual node: its pool's price per GPU-hour (the provider's ``price_per_gpu_hour``).
PRICE_ANNOTATION = "gpufleet.io/price-per-gpu-hour"
#: Annotation on a make-before-break replacement's ReplicaSet: ``namespace/name`` of the pod it replaces.
SURGE_OF_ANNOTATION = "gpufleet.io/surge-of"
#: Label selecting ResourceFlavors (set on every GPU node from the inventory).
FLAVOR_LABEL = "gpufleet.io/flavor"
GPU_RESOURCE = "nvidia.com/gpu"
#: GPU feature discovery's label of a node's GPU count (the inventory sets it on the nodes it declares).
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
#: Label on every pod of a training job rendered from templates/training: the job's name.
JOB_LABEL = "gpufleet.io/job"
#: File a trainer writes last into ``$CHECKPOINT_DIR/step-<N>/`` when the checkpoint is complete
#: (the training templates' ``CHECKPOINT_MARKER``; read by gpufleet.goodput.checkpoints).
CHECKPOINT_MARKER = "COMPLETE"
#: Folder under ``$CHECKPOINT_DIR`` where each training pod of templates/training records its start
#: (one file per container start; read by gpufleet.goodput.checkpoints to tell the job's checkpoints
#: from others and to measure the checkpoint filesystem's clock).
CHECKPOINT_STARTS_DIR = ".gpufleet/starts"

#: Node annotations written by the swap steps (times are RFC 3339 UTC).
ANN_SWAP_REASON = "gpufleet.io/swap-reason"
ANN_SWAP_SOURCE = "gpufleet.io/swap-source"
ANN_SWAPPED_AT = "gpufleet.io/swapped-at"
#: "true" when the swap step cordoned the node (return uncordons only then).
ANN_CORDONED_BY_SWAP = "gpufleet.io/cordoned-by-swap"
ANN_RETURNED_AT = "gpufleet.io/returned-at"
ANN_DEGRADED_AT = "gpufleet.io/degraded-at"
#: JSON list of ``{"time", "fault", "action", "detail"}``: the node's attributable failures.
ANN_HEALTH_HISTORY = "gpufleet.io/health-history"
ANN_LEMON_REASON = "gpufleet.io/lemon-reason"

#: Swap-request ConfigMaps (see gpufleet.ops.swap): label selecting them, and their state label.
SWAP_REQUEST_LABEL = "gpufleet.io/swap-request"
SWAP_STATE_LABEL = "gpufleet.io/swap-state"
SWAP_NODE_LABEL = "gpufleet.io/node"
#: ConfigMap, in node_health_namespace, of node health's circuit breaker: its state, and a person's resume
#: (gpufleet.node_health.breaker; written by node health and ``invoke health.breaker-resume``, read by ``invoke status``).
BREAKER_CONFIGMAP = "gpufleet-node-health-breaker"
#: Default namespace of gpufleet's own objects (node_health_namespace, kueue_quota_sync_namespace).
SYSTEM_NAMESPACE = "gpufleet-system"

#: Kueue (kueue.x-k8s.io/v1beta2, the storage version of the pinned v0.19).
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
#: Kueue's apiVersion: ``kueue.x-k8s.io/v1beta2``.
KUEUE_API = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PODSET_LABEL = "kueue.x-k8s.io/podset"
#: Label Kueue's pod integration puts on the plain pods it manages: ``kueue.x-k8s.io/managed=true``.
KUEUE_MANAGED_LABEL = ("kueue.x-k8s.io/managed", "true")
#: Label naming a job's WorkloadPriorityClass (Kueue's queue order).
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"

#: The local cluster's names (gpufleet_workshop.local, gpufleet_workshop.sim): its simulated (kwok) nodes' label
#: (``gpufleet.io/simulated=true``), the label of the cluster they belong to, the annotation of what
#: ``local.up`` applied (the manifest's digest), and the goodput replay's node label (value: the run id).
SIMULATED_LABEL = "gpufleet.io/simulated"
LOCAL_CLUSTER_LABEL = "gpufleet.io/local-cluster"
APPLIED_ANNOTATION = "gpufleet.io/applied-sha256"
GOODPUT_REPLAY_LABEL = "gpufleet.io/goodput-replay"

#: ``apiVersion`` of gpufleet's component configuration files (gpufleet.componentconfig; each ``kind`` is
#: the component's: ``TaintControllerConfiguration``...).
CONFIG_API_VERSION = "config.gpufleet.io/v1alpha1"
#: Pod template annotation: the SHA-256 of the component's configuration file, so a changed file rolls the pods.
CONFIG_CHECKSUM_ANNOTATION = "gpufleet.io/config-sha256"

#: Field manager of gpufleet's writes and server-side applies (``metadata.managedFields``).
FIELD_MANAGER = "gpufleet"
#: Field manager of the local cluster's bootstrap (CRDs, webhooks, kwok nodes), apart from the stack's.
FIELD_MANAGER_LOCAL = "gpufleet-local"
#: Field manager of the flip simulation's objects, so it never takes fields from the stack.
FIELD_MANAGER_SIM = "gpufleet-sim"

#: Labels every GPU node carries from the inventory (gpufleet_admin.inventory.Inventory.node_spec).
#: The fabric's place of the node, coarse to fine: block (leaf group of racks) and rack;
#: Kueue's Topology levels are these, then the hostname.
BLOCK_LABEL = "gpufleet.io/block"
RACK_LABEL = "gpufleet.io/rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"

#: Kueue Topology-Aware Scheduling: the PodSet annotations on a pod template (kueue.x-k8s.io/v1beta2).
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_UNCONSTRAINED_TOPOLOGY = "kueue.x-k8s.io/podset-unconstrained-topology"
#: Two PodSets (a leader of one pod and its workers) placed as one in the topology.
KUEUE_PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"
#: Scheduling gate Kueue puts on TAS pods until it assigns them nodes.
KUEUE_TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
#: Pod annotation naming the pod's Kueue Workload.
KUEUE_WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"

#: EndpointSlices (discovery.k8s.io/v1): the label naming a slice's Service, the label naming who manages
#: a slice, and gpufleet's value of it (the virtual kubelets publish pods that run outside through slices
#: of their own; kube-controller-manager's are ``endpointslice-controller.k8s.io``).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
ENDPOINTSLICE_MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
ENDPOINTSLICE_MANAGED_BY = "endpointslice.gpufleet.io"

#: Pod annotation of simulated work: seconds (or a Go duration) a pod runs once Running, then Succeeds
#: (kwok's stage, the simulated rental); "0" ends it now.
SIMULATED_DURATION_ANNOTATION = "gpufleet.io/simulated-duration-seconds"
#: Label on pods saying which kind of work they are (values: WORKLOAD_TRAINING, WORKLOAD_INFERENCE).
WORKLOAD_LABEL = "gpufleet.io/workload"
WORKLOAD_TRAINING = "training"
WORKLOAD_INFERENCE = "inference"

#: Dynamic Resource Allocation (resource.k8s.io/v1, GA in Kubernetes 1.34; device taints GA in 1.37).
RESOURCE_API = "resource.k8s.io/v1"
#: NVIDIA's DRA driver for full GPUs: its driver name, and the DeviceClass its chart installs (same name).
GPU_DRIVER = "gpu.nvidia.com"
GPU_DEVICE_CLASS = "gpu.nvidia.com"
#: Device attributes NVIDIA's driver sets on each GPU (``<driver>`` domain unless qualified): the GPU's
#: UUID (NVML), its PCI bus id (the standard ``resource.kubernetes.io/pciBusID``), its index and minor.
GPU_ATTR_UUID = "uuid"
GPU_ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
GPU_ATTR_INDEX = "index"
#: How a node group's GPUs are allocated (inventory ``gpu_allocation``): the device plugin's extended resource
#: (``nvidia.com/gpu`` in the Node's allocatable) or DRA (ResourceSlices of GPU_DRIVER).
GPU_ALLOCATIONS = ("device_plugin", "dra")
#: Node label saying which (value: one of GPU_ALLOCATIONS), set from the inventory.
GPU_ALLOCATION_LABEL = "gpufleet.io/gpu-allocation"
#: Device taint keys node health puts on one GPU through a DeviceTaintRule (value: the fault):
#: unhealthy (NoExecute: the fault kills what runs there) and degraded (NoSchedule: running pods stay,
#: inference claims that tolerate it may still get the GPU, training claims do not).
GPU_UNHEALTHY_TAINT = "gpufleet.io/gpu-unhealthy"
GPU_DEGRADED_TAINT = "gpufleet.io/gpu-degraded"
#: Label on the DeviceTaintRules gpufleet owns (value: the node), and the annotation with the GPU's
#: health history (JSON, as ANN_HEALTH_HISTORY) and the lemon mark (a person returns a lemon GPU).
DEVICE_TAINT_RULE_LABEL = "gpufleet.io/gpu-node"
ANN_GPU_HEALTH_HISTORY = "gpufleet.io/gpu-health-history"
ANN_GPU_LEMON = "gpufleet.io/gpu-lemon"
#: Annotations on gpufleet's DeviceTaintRules (gpufleet.ops.gpus): the fault's detail, who removed the GPU
#: (``node-health`` or ``person``), when, and since when node health has seen it healthy (the hold's start).
ANN_GPU_FAULT = "gpufleet.io/gpu-fault"
ANN_GPU_REMOVED_BY = "gpufleet.io/gpu-removed-by"
ANN_GPU_REMOVED_AT = "gpufleet.io/gpu-removed-at"
ANN_GPU_HEALTHY_SINCE = "gpufleet.io/gpu-healthy-since"
#: The Prometheus community's scrape annotations on a Service (its Helm chart's ``kubernetes-service-endpoints``
#: job): scrape its endpoints (``"true"``), at this port and path. The inference role annotates its Services with
#: them; the local environment's Prometheus scrapes the Services that carry them through their EndpointSlices,
#: so a pod outside, published by a virtual kubelet, is scraped like a pod inside.
PROMETHEUS_SCRAPE_ANNOTATION = "prometheus.io/scrape"
PROMETHEUS_PORT_ANNOTATION = "prometheus.io/port"
PROMETHEUS_PATH_ANNOTATION = "prometheus.io/path"
