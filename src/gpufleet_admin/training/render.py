"""Render the training job templates (``templates/training/``) from an inventory.

``build_context`` turns the user's flags and the environment's inventory into
the template variables, checking every input first; ``render`` fills one
template (Jinja2, ``StrictUndefined``: an undefined variable is an error, not
an empty string). Nothing here talks to a cluster.

Every bad input is reported at once, as ``--flag value: expected ...``, in a
:class:`TrainingInputError`, before anything is submitted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jinja2
import yaml

from gpufleet import paths
from gpufleet_admin.inventory import Host, Inventory
from gpufleet_admin.inventory.inventory import GPU_RESOURCE, LABEL_FLAVOR, LABEL_RACK
from gpufleet_admin.inventory.models import Hca
from gpufleet.kube.quantity import parse_quantity
from gpufleet.names import (CHECKPOINT_MARKER, CHECKPOINT_STARTS_DIR, GPU_DEVICE_CLASS, JOB_LABEL,
                            KUEUE_PODSET_GROUP, KUEUE_PREFERRED_TOPOLOGY, KUEUE_REQUIRED_TOPOLOGY, RESERVED_TAINT,
                            RESOURCE_API, SIMULATED_DURATION_ANNOTATION)
from roles.registry import load

from . import gang as native
from .checkpoint import default_interval_seconds

#: Where the training templates live (``<checkout>/templates/training``).
TEMPLATE_DIR: Path = paths.TEMPLATES / "training"
#: ``--topology`` values: a level of the inventory's fabric, or none.
TOPOLOGIES = ("block", "rack", "none")
#: ``--topology-mode`` values: Kueue's podset-required-topology or podset-preferred-topology.
TOPOLOGY_MODES = ("required", "preferred")
#: ``--gang`` values (templates/training/README.md).
GANG_MODES = ("kueue", "native", "both")
#: Kueue PodSet group of a PyTorchJob's Master and Workers: one unit of topology placement.
PODSET_GROUP = "trainer"
#: Kubernetes PriorityClass of training pods (declared by the kueue role); preempts inference.
POD_PRIORITY_CLASS = "gpufleet-training"
#: The checkpoint PersistentVolumeClaim the parallel_fs role declares in every team namespace.
CHECKPOINT_CLAIM = "gpufleet-checkpoints"
#: Default container image (NGC PyTorch; torchrun and NCCL included).
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:24.12-py3"
#: Share of a node's CPU and memory a training pod requests by default (the
#: rest is left to the kubelet's reservations and the node's DaemonSets).
NODE_SHARE = 0.9

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class TrainingInputError(ValueError):
    """Bad inputs for a training job; ``problems`` has one line per bad flag or value.

    Each line reads ``--flag value: expected ...``. Raised before anything
    is rendered or submitted.
    """

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid training job:\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class Template:
    """One training template: file under ``templates/training/``, the object it makes, its longest hostname.

    ``hostname(name, nodes)`` is the longest pod hostname the workload
    controller derives from the job name; it must fit in a 63-character DNS label.
    ``job_uid_label`` is the pod label in which the workload controller puts
    the job object's uid (None: it puts none), for the pods' start records.
    """

    name: str
    file: str
    kind: str
    api_version: str
    hostname: Callable[[str, int], str]
    description: str
    job_uid_label: str | None = None

    @property
    def group(self) -> str:
        """API group of the job object (``""`` for the core group)."""
        return self.api_version.rpartition("/")[0]


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("jobset", "jobset.yaml.j2", "JobSet", "jobset.x-k8s.io/v1alpha2",
                 lambda n, k: f"{n}-workers-0-{k - 1}",
                 "JobSet: one indexed Job of N pods; failurePolicy restarts the whole gang",
                 job_uid_label="jobset.sigs.k8s.io/jobset-uid"),
        Template("pytorchjob", "pytorchjob.yaml.j2", "PyTorchJob", "kubeflow.org/v1",
                 lambda n, k: f"{n}-master-0" if k < 2 else max(f"{n}-master-0", f"{n}-worker-{k - 2}", key=len),
                 "Kubeflow PyTorchJob: 1 Master + N-1 Workers (training-operator)"),
        Template("job", "job.yaml.j2", "Job", "batch/v1",
                 lambda n, k: f"{n}-{k - 1}",
                 "indexed batch Job of N pods plus its headless Service",
                 job_uid_label="batch.kubernetes.io/controller-uid"),
    )
}


@dataclass(frozen=True)
class Setting:
    """One ``--set key=value``: how the value is parsed and what it means."""

    parse: Callable[[str, Inventory], Any]
    expected: str
    help: str


def _int(lo: int, hi: int | None = None) -> Callable[[str, Inventory], int]:
    def parse(value: str, _inv: Inventory) -> int:
        n = int(value.strip(), 10)
        if n < lo or (hi is not None and n > hi):
            raise ValueError
        return n
    return parse


def _text(pattern: str | None = None) -> Callable[[str, Inventory], str]:
    def parse(value: str, _inv: Inventory) -> str:
        if not value.strip() or (pattern and not re.fullmatch(pattern, value)):
            raise ValueError
        return value
    return parse


def _quantity(value: str, _inv: Inventory) -> str:
    if parse_quantity(value) <= 0:
        raise ValueError
    return value


def _priority(value: str, inv: Inventory) -> str:
    if value not in {p.name for p in inv.role("kueue").kueue_workload_priority_classes}:
        raise ValueError
    return value


SETTINGS: dict[str, Setting] = {
    "image": Setting(_text(r"\S+"), "a container image reference", f"container image (default {DEFAULT_IMAGE})"),
    "script": Setting(_text(), "a non-empty path", "training script torchrun runs (default /workspace/train.py)"),
    "args": Setting(lambda v, _i: v, "any text", "arguments after the script (default none)"),
    "priority_class": Setting(_priority, "a WorkloadPriorityClass of the inventory (kueue_workload_priority_classes)",
                              "Kueue WorkloadPriorityClass (default: the lowest in the inventory)"),
    "checkpoint_interval_seconds": Setting(_int(1), "an integer > 0",
                                           "seconds of training between checkpoints (default: the advisor's)"),
    "max_restarts": Setting(_int(0), "an integer >= 0", "gang restarts before the job fails (default training_max_restarts)"),
    "simulated_duration_seconds": Setting(_int(0), "an integer >= 0",
                                          "local kwok cluster: pods finish after this many seconds (default: unset)"),
    "cpu": Setting(_quantity, "a Kubernetes quantity > 0 such as 200 or 500m", "CPU request per pod (default 90% of a node)"),
    "memory": Setting(_quantity, "a Kubernetes quantity > 0 such as 1800Gi", "memory per pod (default 90% of a node)"),
    "socket_ifname": Setting(_text(r"\S+"), "an interface name or NCCL list such as eth0 or ^lo,docker",
                             "NCCL_SOCKET_IFNAME: bootstrap/socket interface (default eth0, the pod network)"),
    "master_port": Setting(_int(1, 65535), "a port number 1..65535", "rendezvous port of rank 0 (default 29500)"),
}


def parse_sets(pairs: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Split ``["key=value", ...]`` into a dict; later keys win. Returns ``(values, problems)``.

    Keys must be in :data:`SETTINGS`; values are parsed later (they may need the inventory).
    """
    values: dict[str, str] = {}
    problems: list[str] = []
    known = ", ".join(sorted(SETTINGS))
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"--set {pair!r}: expected key=value (keys: {known})")
        elif key not in SETTINGS:
            problems.append(f"--set {pair!r}: unknown key {key!r}: expected one of {known}")
        else:
            values[key] = value
    return values, problems


def parse_queue(queue: str) -> tuple[str, str]:
    """``"namespace/name"`` -> ``(namespace, name)``. Raises ValueError if not of that form."""
    ns, sep, name = queue.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ValueError(queue)
    return ns, name


def _flavor_hosts(inv: Inventory, flavor: str) -> list[Host]:
    return [h for h in inv.hosts.values() if h.vars.gpu_count and h.gpu.flavor == flavor]


def _common_hcas(hosts: Sequence[Host]) -> list[Hca]:
    """HCAs every host of the job's flavor has (same name and port), in the first host's order."""
    if not hosts:
        return []
    common = {(h.name, h.port) for h in hosts[0].vars.node_hcas}
    for host in hosts[1:]:
        common &= {(h.name, h.port) for h in host.vars.node_hcas}
    return [h for h in hosts[0].vars.node_hcas if (h.name, h.port) in common]


def nccl_env(hcas: Sequence[Hca], socket_ifname: str, extra: Mapping[str, str]) -> dict[str, str]:
    """NCCL environment for the job's pods, derived from the nodes' HCAs.

    * ``NCCL_IB_HCA``: ``=mlx5_0:1,mlx5_1:1,...`` — every HCA port of the
      flavor's nodes; the leading ``=`` makes NCCL match names exactly (without
      it ``mlx5_1`` would also select ``mlx5_10``).
    * ``NCCL_IB_DISABLE``: ``0`` with HCAs, ``1`` (TCP sockets) without.
    * ``NCCL_IB_GID_INDEX=3`` when an HCA is Ethernet (RoCE v2 needs the IPv4-mapped GID).
    * ``NCCL_SOCKET_IFNAME``: the interface for bootstrap and socket traffic.
    * then ``extra`` (the inventory's ``training_nccl_env``), which wins.
    """
    env: dict[str, str] = {}
    if hcas:
        env["NCCL_IB_HCA"] = "=" + ",".join(f"{h.name}:{h.port}" for h in hcas)
        env["NCCL_IB_DISABLE"] = "0"
        if any(h.link_layer == "Ethernet" for h in hcas):
            env["NCCL_IB_GID_INDEX"] = "3"
    else:
        env["NCCL_IB_DISABLE"] = "1"
    env["NCCL_SOCKET_IFNAME"] = socket_ifname
    env.update(extra)
    return env


def _default_flavor(inv: Inventory) -> str | None:
    flavors = inv.flavors()
    if not flavors:
        return None
    return min(flavors.values(), key=lambda f: (-f.gpus, f.name)).name


def build_context(
    inv: Inventory,
    template: str,
    name: str,
    nodes: int,
    *,
    queue: str | None = None,
    flavor: str | None = None,
    gpus_per_node: int | None = None,
    sets: Sequence[str] = (),
    topology: str | None = None,
    topology_mode: str | None = None,
    gang: str | None = None,
    gang_api: native.GangApi | None = None,
) -> dict[str, Any]:
    """Check the inputs against the inventory and build the template variables.

    Args:
        inv: the environment (``gpufleet_admin.inventory.load(env)``).
        template: one of :data:`TEMPLATES` (``jobset``, ``pytorchjob``, ``job``).
        name: job name; a DNS-1035 label short enough for the pods' hostnames.
        nodes: nodes the job spans (each with all its GPUs), 1..nodes of the flavor.
        queue: LocalQueue ``namespace/name``; default the inventory's first.
        flavor: ResourceFlavor (GPU model); default the one with most GPUs.
        gpus_per_node: must equal the flavor's GPUs per node; default that.
        sets: ``key=value`` strings, keys from :data:`SETTINGS`.
        topology: fabric level the gang is placed in (:data:`TOPOLOGIES`);
            default ``training_topology``.
        topology_mode: ``required`` or ``preferred``; default ``training_topology_mode``.
        gang: who schedules the gang all-or-nothing (:data:`GANG_MODES`);
            default ``training_gang``.
        gang_api: the native gang API the target cluster serves (:func:`gang.choose`);
            needed for ``native`` and ``both``.

    Returns:
        The variables every template uses (see ``templates/training/README.md``).

    Raises:
        TrainingInputError: listing every bad input (``--flag value: expected ...``).
    """
    problems: list[str] = []
    values, set_problems = parse_sets(sets)
    problems += set_problems
    tpl = TEMPLATES.get(template)
    if tpl is None or not (TEMPLATE_DIR / tpl.file).exists():
        problems.append(f"--template {template!r}: expected one of {', '.join(TEMPLATES)}")
    lq = _check_queue(inv, queue, problems)
    flavor_name, hosts, gpn = _check_flavor(inv, flavor, gpus_per_node, problems)
    _check_nodes_and_name(inv, tpl, name, nodes, flavor_name, hosts, problems)
    training = inv.role("training")
    topo = topology if topology is not None else training.training_topology
    mode = topology_mode if topology_mode is not None else training.training_topology_mode
    gang_mode = gang if gang is not None else training.training_gang
    _check_placement(inv, nodes, flavor_name, hosts, gpn, topo, mode, gang_mode, problems)
    _check_gang(tpl, gang_mode, gang_api, problems)
    _check_claims(inv, tpl, flavor_name, problems)
    parsed = _parse_settings(inv, values, problems)
    _check_roles(inv, problems)
    if problems:
        raise TrainingInputError(problems)
    assert tpl is not None and lq is not None and flavor_name is not None
    return {
        **_variables(inv, tpl, name, nodes, lq, flavor_name, hosts, gpn, parsed),
        **_placement(inv, tpl, name, lq.namespace, nodes, topo, mode, gang_mode, gang_api),
    }


def _check_queue(inv: Inventory, queue: str | None, problems: list[str]) -> Any:
    """The LocalQueue ``queue`` names (default: the inventory's first); None, with a problem added, when there is none."""
    local_queues = list(inv.role("kueue").kueue_local_queues)
    known_queues = ", ".join(f"{q.namespace}/{q.name}" for q in local_queues) or "(none)"
    lq = None
    if queue is None:
        if local_queues:
            lq = local_queues[0]
        else:
            problems.append(f"--queue: inventories/{inv.env} declares no LocalQueue (kueue_local_queues)")
    else:
        try:
            ns, qname = parse_queue(queue)
        except ValueError:
            problems.append(f"--queue {queue!r}: expected namespace/name, one of {known_queues}")
        else:
            lq = next((q for q in local_queues if (q.namespace, q.name) == (ns, qname)), None)
            if lq is None:
                problems.append(f"--queue {queue!r}: expected a LocalQueue of inventories/{inv.env}: {known_queues}")
    return lq


def _check_flavor(inv: Inventory, flavor: str | None, gpus_per_node: int | None,
                  problems: list[str]) -> tuple[str | None, list[Host], int]:
    """``(flavor, its hosts with gpus_per_node GPUs, GPUs per node)``; problems added for an unknown flavor or size.

    The flavor defaults to the one with most GPUs, GPUs per node to the flavor's largest count.
    """
    flavors = inv.flavors()
    flavor_name = flavor if flavor is not None else _default_flavor(inv)
    hosts: list[Host] = []
    gpn = 0
    if flavor_name is None:
        problems.append(f"--flavor: inventories/{inv.env} has no GPU nodes")
    elif flavor_name not in flavors:
        problems.append(f"--flavor {flavor_name!r}: expected one of {', '.join(flavors)}")
    else:
        all_hosts = _flavor_hosts(inv, flavor_name)
        counts = sorted({h.vars.gpu_count for h in all_hosts})
        gpn = gpus_per_node if gpus_per_node else counts[-1]
        if gpn not in counts:
            shown = " or ".join(str(c) for c in counts)
            problems.append(f"--gpus-per-node {gpus_per_node}: expected {shown} (GPUs per node of flavor "
                            f"{flavor_name}): training jobs take whole nodes")
        hosts = [h for h in all_hosts if h.vars.gpu_count == gpn] or all_hosts
    return flavor_name, hosts, gpn


def _check_nodes_and_name(inv: Inventory, tpl: Template | None, name: str, nodes: int, flavor_name: str | None,
                          hosts: Sequence[Host], problems: list[str]) -> None:
    """Add problems for a node count outside 1..len(hosts) and a job name that is no DNS label or too long.

    The name must leave room for the template's pod hostnames (63 characters, RFC 1035).
    """
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        shown = "0 (or not given)" if nodes == 0 and not isinstance(nodes, bool) else repr(nodes)
        problems.append(f"--nodes {shown}: expected an integer >= 1")
    elif hosts and nodes > len(hosts):
        problems.append(f"--nodes {nodes}: expected at most {len(hosts)} (nodes of flavor {flavor_name} "
                        f"in inventories/{inv.env})")

    size = nodes if isinstance(nodes, int) and nodes >= 1 else 1
    limit = 63 - (len(tpl.hostname(name, size)) - len(name) if tpl is not None else 0)
    if not name:
        problems.append("--name: required: a DNS label such as llama-8b-run1")
    elif len(name) > limit or not _DNS1035.match(name):
        why = f" (pod hostnames such as {tpl.hostname('<name>', size)!r} must fit in 63)" if tpl is not None else ""
        problems.append(f"--name {name!r}: expected a DNS label (RFC 1035): lower-case letters, digits and '-', "
                        f"starting with a letter, at most {limit} characters{why}")


def _check_placement(inv: Inventory, nodes: int, flavor_name: str | None, hosts: Sequence[Host], gpn: int,
                     topo: str, mode: str, gang_mode: str, problems: list[str]) -> None:
    """Add problems for a topology level the hosts do not carry or Kueue cannot place in, a bad mode,
    or a ``required`` gang larger than the largest domain of that level."""
    kueue = inv.role("kueue")
    levels = [lv.name for lv in inv.topology_levels() if lv.name != "hostname"]
    if topo not in TOPOLOGIES:
        problems.append(f"--topology {topo!r}: expected one of {', '.join(TOPOLOGIES)}")
    elif topo != "none" and topo not in levels:
        problems.append(f"--topology {topo}: expected {' or '.join(levels + ['none'])} (the hosts of "
                        f"inventories/{inv.env} carry no node_{topo})")
    elif topo != "none" and gang_mode != "native" and flavor_name in inv.flavors() and inv.flavors()[flavor_name].dra:
        problems.append(f"--topology {topo}: expected none: flavor {flavor_name} allocates its GPUs through DRA, "
                        "and Kueue's topology-aware scheduling does not place pods that ask for DRA devices "
                        "(Kueue v0.19)")
    elif topo != "none" and gang_mode != "native" and not kueue.kueue_topology_enabled:
        problems.append(f"--topology {topo}: expected none: kueue_topology_enabled is false in inventories/{inv.env}, "
                        "so Kueue has no Topology to place the gang in")
    if mode not in TOPOLOGY_MODES:
        problems.append(f"--topology-mode {mode!r}: expected one of {', '.join(TOPOLOGY_MODES)}")
    elif (mode == "required" and topo in levels and hosts and isinstance(nodes, int) and not isinstance(nodes, bool)
          and nodes >= 1):
        sizes = {d: len([h for h in hs if h.vars.gpu_count == gpn])
                 for d, hs in inv.domains(topo, flavor_name).items()}
        biggest = max(sizes, key=lambda d: (sizes[d], d)) if sizes else None
        if biggest is not None and nodes > sizes[biggest]:
            problems.append(f"--nodes {nodes} --topology {topo} --topology-mode required: expected at most "
                            f"{sizes[biggest]} nodes (the largest {topo} of flavor {flavor_name}, {biggest}, has "
                            f"{sizes[biggest]}); use --topology-mode preferred or a coarser --topology")


def _check_gang(tpl: Template | None, gang_mode: str, gang_api: native.GangApi | None, problems: list[str]) -> None:
    """Add problems for an unknown gang mode, a native gang without a known API version, or a template whose
    pinned CRD would drop the pods' gang field."""
    if gang_mode not in GANG_MODES:
        problems.append(f"--gang {gang_mode!r}: expected one of {', '.join(GANG_MODES)}")
    elif gang_mode != "kueue":
        if gang_api is None:
            problems.append(f"--gang {gang_mode}: the cluster's {native.GROUP} version is unknown: expected a "
                            f"cluster to discover it from, or --scheduling-api {'|'.join(native.SHAPES)}")
        elif tpl is not None and tpl.group not in ("", "batch"):
            kept = _pinned_crd_keeps(tpl, gang_api.pod_field)
            if kept is False:
                problems.append(f"--gang {gang_mode} --template {tpl.name}: the pinned {tpl.kind} CRD has no pod "
                                f"spec.{gang_api.pod_field}, and the API server would drop it (pods outside the "
                                f"gang): expected --template job, or a {tpl.kind} release whose CRD has it")


def _check_claims(inv: Inventory, tpl: Template | None, flavor_name: str | None, problems: list[str]) -> None:
    """Add a problem when a DRA flavor's pods would lose their GPU claim: the template's pinned CRD has no
    pod ``spec.resourceClaims`` (its API server would prune it, and the pods would get no GPU)."""
    flavors = inv.flavors()
    if tpl is None or flavor_name not in flavors or not flavors[flavor_name].dra or tpl.group in ("", "batch"):
        return
    if _pinned_crd_keeps(tpl, "resourceClaims") is False:
        problems.append(f"--template {tpl.name} --flavor {flavor_name}: the pinned {tpl.kind} CRD has no pod "
                        f"spec.resourceClaims, and flavor {flavor_name} allocates its GPUs through DRA: expected "
                        "--template job or jobset")


def _parse_settings(inv: Inventory, values: Mapping[str, str], problems: list[str]) -> dict[str, Any]:
    """Each ``--set key=value`` parsed by its :data:`SETTINGS` entry; a problem added for each bad value."""
    parsed: dict[str, Any] = {}
    for key, raw in values.items():
        setting = SETTINGS[key]
        try:
            parsed[key] = setting.parse(raw, inv)
        except ValueError:
            problems.append(f"--set {key}={raw}: expected {setting.expected}")
    return parsed


def _check_roles(inv: Inventory, problems: list[str]) -> None:
    """Add problems for what the inventory's roles must give training: its PriorityClass, a parallel filesystem."""
    kueue = inv.role("kueue")
    if POD_PRIORITY_CLASS not in {p.name for p in kueue.kueue_priority_classes}:
        problems.append(f"kueue_priority_classes (inventories/{inv.env}): expected a PriorityClass "
                        f"{POD_PRIORITY_CLASS} for training pods")
    pfs = inv.role("parallel_fs")
    if not pfs.parallel_fs_enabled:
        problems.append(f"parallel_fs_enabled (inventories/{inv.env}): false: expected true, training jobs "
                        "checkpoint to the parallel filesystem")


def _variables(inv: Inventory, tpl: Template, name: str, nodes: int, lq: Any, flavor_name: str, hosts: Sequence[Host],
               gpn: int, parsed: Mapping[str, Any]) -> dict[str, Any]:
    """The template variables of checked inputs, placement apart: job, queue, sizes (GPUs, CPU, bytes),
    image, checkpointing, NCCL environment; ``--set`` values win over the inventory's defaults."""
    kueue, training, pfs = inv.role("kueue"), inv.role("training"), inv.role("parallel_fs")
    gpus = nodes * gpn
    wpcs = sorted(kueue.kueue_workload_priority_classes, key=lambda p: (p.value, p.name))
    node_cpu = min(h.vars.node_cpu for h in hosts)
    node_mem = min(int(parse_quantity(h.vars.node_memory)) for h in hosts)
    hcas = _common_hcas(hosts)
    job_dir = f"{pfs.parallel_fs_mount_path.rstrip('/')}/{lq.namespace}/{name}"
    return {
        "template": tpl.name,
        "kind": tpl.kind,
        "api_version": tpl.api_version,
        "env_name": inv.env,
        "name": name,
        "namespace": lq.namespace,
        "queue": lq.name,
        "priority_class": parsed.get("priority_class", wpcs[0].name if wpcs else None),
        "pod_priority_class": POD_PRIORITY_CLASS,
        "nodes": nodes,
        "gpus_per_node": gpn,
        "gpus": gpus,
        "flavor": flavor_name,
        "flavor_label": LABEL_FLAVOR,
        "gpu_product": inv.flavors()[flavor_name].gpu_model.product,
        "gpu_resource": GPU_RESOURCE,
        "rack_label": LABEL_RACK,
        "job_label": JOB_LABEL,
        "cpu": parsed.get("cpu", str(max(1, int(node_cpu * NODE_SHARE)))),
        "memory": parsed.get("memory", f"{max(1, int(node_mem * NODE_SHARE) >> 30)}Gi"),
        "image": parsed.get("image", DEFAULT_IMAGE),
        "script": parsed.get("script", "/workspace/train.py"),
        "args": parsed.get("args", ""),
        "master_port": parsed.get("master_port", 29500),
        "max_restarts": parsed.get("max_restarts", training.training_max_restarts),
        # The advisor models hardware failures only; the inventory's interval caps it so a
        # crash of a small job still costs minutes, not hours.
        "checkpoint_interval_seconds": parsed.get(
            "checkpoint_interval_seconds",
            min(default_interval_seconds(gpus, training.training_checkpoint_seconds),
                training.training_checkpoint_interval_minutes * 60)),
        "checkpoint_seconds": training.training_checkpoint_seconds,
        "job_dir": job_dir,
        "checkpoint_dir": f"{job_dir}/{training.training_checkpoint_subdir.strip('/')}",
        "checkpoint_marker": CHECKPOINT_MARKER,
        "start_record": start_record_command(name),
        "job_uid_label": tpl.job_uid_label,
        "checkpoint_backend": pfs.parallel_fs_backend,
        "checkpoint_claim": CHECKPOINT_CLAIM,
        "checkpoint_subpath": f"{lq.namespace}/{name}",
        "rdma": bool(hcas),
        "nccl_env": nccl_env(hcas, parsed.get("socket_ifname", "eth0"), training.training_nccl_env),
        "simulated_duration_seconds": parsed.get("simulated_duration_seconds"),
        "annotation_simulated_duration": SIMULATED_DURATION_ANNOTATION,
        **gpu_claims(inv, flavor_name, name, lq.namespace, gpn),
    }


#: Name of the GPU claim in a DRA training pod (``spec.resourceClaims[].name``, ``resources.claims[].name``).
GPU_CLAIM = "gpus"


def gpu_claims(inv: Inventory, flavor: str, name: str, namespace: str, gpus_per_node: int) -> dict[str, Any]:
    """Template variables of how pods get their GPUs: ``gpu_claim`` and ``claim_objects``.

    Device plugin flavors: ``gpu_claim`` is None and pods request ``nvidia.com/gpu``.
    DRA flavors: one ResourceClaimTemplate ``<job>-gpus`` asking for exactly
    ``gpus_per_node`` devices of NVIDIA's DeviceClass (each pod gets a claim of
    its own from it: the whole node's GPUs); ``gpu_claim`` is
    ``{"name": "gpus", "template": "<job>-gpus"}``. The claim tolerates no
    device taint: a GPU node health took out (``gpufleet.io/gpu-unhealthy``)
    or degraded (``gpufleet.io/gpu-degraded``) never goes to training. Kueue
    counts the claims' devices as ``nvidia.com/gpu`` quota (the kueue role's
    ``deviceClassMappings``).
    """
    if not inv.flavors()[flavor].dra:
        return {"gpu_claim": None, "claim_objects": []}
    template = f"{name}-{GPU_CLAIM}"
    obj = {"apiVersion": RESOURCE_API, "kind": "ResourceClaimTemplate",
           "metadata": {"name": template, "namespace": namespace, "labels": {JOB_LABEL: name}},
           "spec": {"spec": {"devices": {"requests": [{"name": GPU_CLAIM, "exactly": {
               "deviceClassName": GPU_DEVICE_CLASS, "allocationMode": "ExactCount", "count": gpus_per_node}}]}}}}
    return {"gpu_claim": {"name": GPU_CLAIM, "template": template}, "claim_objects": [obj]}


def start_record_command(job: str) -> str:
    """The shell every training pod runs before its trainer: one start record in
    ``$CHECKPOINT_DIR/.gpufleet/starts/`` (:data:`gpufleet.names.CHECKPOINT_STARTS_DIR`).

    The record is ``{"pod", "pod_uid", "job", "job_uid", "time"}`` (``time``:
    bash's ``EPOCHREALTIME``, the pod's clock as it writes the file), in a file
    named after the pod's uid and that time, which the goodput accountant
    reads (:func:`gpufleet.goodput.checkpoints.read_start`) to tell the job's
    checkpoints from others' and to measure the checkpoint filesystem's clock.
    It needs ``POD_NAME``, ``POD_UID`` and (optional) ``JOB_UID`` in the
    environment; a failure to write it never stops the trainer.
    """
    return ('d="$CHECKPOINT_DIR/' + CHECKPOINT_STARTS_DIR + '"; t="${EPOCHREALTIME:-$(date +%s)}"; '
            "{ mkdir -p \"$d\" && printf '{\"pod\": \"%s\", \"pod_uid\": \"%s\", \"job\": \"%s\", "
            "\"job_uid\": \"%s\", \"time\": %s}\\n' "
            f'"$POD_NAME" "$POD_UID" "{job}" "${{JOB_UID:-}}" "$t" > "$d/$POD_UID.${{t/./}}"; }} 2>/dev/null || true; ')


def _pinned_crd_keeps(tpl: Template, field: str) -> bool | None:
    """Whether the pinned CRD of ``tpl``'s kind keeps pod spec ``field`` (None: not known here)."""
    from gpufleet_admin.build.gobuild import GoError
    from gpufleet_admin.schemas import crd

    try:
        doc = crd(tpl.group, tpl.kind)
    except (LookupError, OSError, GoError):  # no pin, or no Go module cache: the submit checks the cluster's CRD
        return None
    return native.crd_pod_spec_has(doc, tpl.api_version.rpartition("/")[2], field)


def _placement(inv: Inventory, tpl: Template, name: str, namespace: str, nodes: int, topo: str, mode: str,
               gang_mode: str, gang_api: native.GangApi | None) -> dict[str, Any]:
    """Template variables of placement: Kueue, the topology request, pod affinity, the native gang.

    * ``kueue``: the job goes through a LocalQueue (queue label, created suspended).
    * ``topology_annotations``: Kueue's podset-required/preferred-topology with
      the level's node label, on every pod template (``kueue`` and ``both``).
    * ``podset_group``: Kueue PodSet group name joining a PyTorchJob's Master
      and Workers into one placement unit (a leader of one pod and its workers).
    * ``pod_affinity``: the scheduler's own preference (or rule) for one domain:
      the rack, preferred, when no topology is asked; the level, as asked, for
      ``native`` (no Kueue to place the gang).
    * ``gang_field``/``gang_ref``: the pod spec field naming the native gang,
      and ``gang_objects``: its Workload (and PodGroup), rendered after the job.
    """
    kueue = gang_mode != "native"
    label = next((lv.label for lv in inv.topology_levels() if lv.name == topo), None)
    annotations: dict[str, str] = {}
    affinity: dict[str, str] | None = None
    if topo == "none":
        affinity = {"mode": "preferred", "label": LABEL_RACK}
    elif kueue:
        annotations[KUEUE_REQUIRED_TOPOLOGY if mode == "required" else KUEUE_PREFERRED_TOPOLOGY] = label
    else:
        affinity = {"mode": mode, "label": label}
    group = PODSET_GROUP if annotations and tpl.name == "pytorchjob" and nodes > 1 else None
    out: dict[str, Any] = {
        "kueue": kueue, "gang": gang_mode, "topology": topo, "topology_mode": mode,
        "topology_annotations": annotations, "podset_group": group, "podset_group_annotation": KUEUE_PODSET_GROUP,
        "pod_affinity": affinity, "reserved_taint": RESERVED_TAINT,
        "gang_field": None, "gang_ref": None, "gang_objects": [],
    }
    if gang_mode != "kueue" and gang_api is not None:
        out["gang_field"], out["gang_ref"] = native.pod_reference(gang_api, name)
        out["gang_objects"] = native.objects(gang_api, name, namespace, nodes, (tpl.group, tpl.kind),
                                             {JOB_LABEL: name}, POD_PRIORITY_CLASS)
    return out


def _quote(value: Any) -> str:
    """YAML-safe scalar: JSON (a subset of YAML) for strings, numbers and booleans.

    An undefined value raises ``jinja2.UndefinedError`` (StrictUndefined), as elsewhere.
    """
    if isinstance(value, jinja2.Undefined):
        value = str(value)  # StrictUndefined raises here
    return json.dumps(value, ensure_ascii=False)


def environment() -> jinja2.Environment:
    """The Jinja2 environment of ``templates/training``: StrictUndefined, a ``q`` (quote) filter."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = _quote
    env.filters["yaml"] = lambda obj: yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)
    return env


def render_context(context: Mapping[str, Any]) -> str:
    """Fill the template ``context["template"]`` names with ``context``; returns YAML text.

    Raises:
        jinja2.UndefinedError: the template used a variable ``context`` lacks.
    """
    return environment().get_template(TEMPLATES[context["template"]].file).render(**context)


def render(
    env: str,
    template: str,
    name: str,
    nodes: int,
    *,
    queue: str | None = None,
    flavor: str | None = None,
    gpus_per_node: int | None = None,
    sets: Sequence[str] = (),
    inventory: Inventory | None = None,
    fleet_nodes: int | None = None,
    topology: str | None = None,
    topology_mode: str | None = None,
    gang: str | None = None,
    gang_api: native.GangApi | None = None,
) -> str:
    """Render one training job for environment ``env`` as YAML (one or more documents).

    Arguments as for :func:`build_context`; ``inventory`` skips loading ``env``
    again; ``fleet_nodes`` sizes a simulated fleet (``load(env, nodes=...)``).

    Raises:
        TrainingInputError: a bad input (see :func:`build_context`).
        gpufleet_admin.inventory.InventoryError: the environment's inventory is invalid or unknown.
    """
    inv = inventory or load(env, nodes=fleet_nodes)
    ctx = build_context(inv, template, name, nodes, queue=queue, flavor=flavor, gpus_per_node=gpus_per_node,
                        sets=sets, topology=topology, topology_mode=topology_mode, gang=gang, gang_api=gang_api)
    return render_context(ctx)
