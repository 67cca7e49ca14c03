"""Kubernetes' own gang scheduling: which ``scheduling.k8s.io`` shape a cluster serves, and its objects.

Kubernetes schedules a group of pods all-or-nothing when the pods name a
gang the scheduler knows (KEP-4671, workload-aware scheduling). The API
changed in every release so far; which shape to emit is chosen by API
discovery, never by guessing from the server version:

============  =====================  ==============================================  ==========================
Kubernetes    API version            objects                                         pod field
============  =====================  ==============================================  ==========================
1.35 (alpha)  ``v1alpha1``           Workload (``spec.podGroups[].policy.gang``)     ``spec.workloadRef``
1.36 (alpha)  ``v1alpha2``           Workload (``spec.podGroupTemplates[]``) and a   ``spec.schedulingGroup``
                                     PodGroup per gang (``spec.podGroupTemplateRef``)
1.37 (alpha)  ``v1alpha3``           as 1.36, the PodGroup names its template by     ``spec.schedulingGroup``
                                     ``spec.workloadRef: {workloadName, templateName}``
1.37 (beta)   ``v1beta1``            as ``v1alpha3`` (the storage version)           ``spec.schedulingGroup``
============  =====================  ==============================================  ==========================

Sources, all from the ``k8s.io/api`` module source: ``scheduling/v1alpha1``
and ``core/v1`` of v0.35.4; ``scheduling/v1alpha2`` and ``core/v1`` of
v0.36.3; ``scheduling/v1alpha3``, ``scheduling/v1beta1`` and ``core/v1`` of
v0.37.2 (``PodGroupSpec.WorkloadRef``, kubernetes/kubernetes#140080; the
promotion to ``v1beta1``, #140184). The enabling flags come from
``pkg/features/kube_features.go`` and ``pkg/controlplane/instance.go`` of
``k8s.io/kubernetes`` at each release: 1.37 removed the ``GangScheduling``
gate (#139520; ``GenericWorkload``, beta and off by default, now turns on
the scheduler's gang plugin and the controller manager's PodGroup
protection) and serves ``v1beta1`` only with its runtime config (a beta
group version added after 1.24 is off by default).

Alpha objects are never converted: 1.36 stops serving ``v1alpha1`` and
1.37 ``v1alpha2`` (the 1.37 release notes: "remove all v1alpha2 objects from
the kube-apiserver before upgrading"), so every Workload and PodGroup of
the old version must be deleted before the control plane is upgraded, and
pods that name them recreated (``templates/training/README.md``).

An old group version can linger in discovery (``scheduling.k8s.io/v1beta1``
served PriorityClass until 1.22), so a shape counts as served only when its
version lists the ``workloads`` resource (and ``podgroups`` where it has them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

from gpufleet.kube import Kube, NotFound, api_path

GROUP = "scheduling.k8s.io"
#: The gang's one pod group (a training job is one gang: every pod or none).
POD_GROUP = "workers"


@dataclass(frozen=True)
class GangApi:
    """One served shape of the native gang API.

    Attributes:
        version: ``scheduling.k8s.io`` version (``v1alpha1``, ``v1alpha2``, ``v1alpha3``, ``v1beta1``).
        kubernetes: the first Kubernetes minor release serving it (``"1.37"``).
        pod_group_object: a separate PodGroup object (1.36 on) rather than groups inside the Workload.
        pod_field: the pod spec field naming the gang (``workloadRef`` or ``schedulingGroup``).
        template_ref: how a PodGroup names its Workload's template: ``podGroupTemplateRef``
            (1.36) or ``workloadRef`` (1.37); ``""`` without PodGroup objects.
        feature_gates: component (``kube-apiserver``, ``kube-controller-manager``,
            ``kube-scheduler``) -> the ``--feature-gates`` value that serves this shape there.
        runtime_config: the kube-apiserver ``--runtime-config`` value that serves it.
    """

    version: str
    kubernetes: str
    pod_group_object: bool
    pod_field: str
    template_ref: str
    feature_gates: Mapping[str, str] = field(default_factory=dict, hash=False)
    runtime_config: str = ""

    @property
    def api_version(self) -> str:
        """``scheduling.k8s.io/<version>``."""
        return f"{GROUP}/{self.version}"

    @property
    def enable(self) -> str:
        """The flags that serve this shape, as one line for messages (``kube-apiserver --feature-gates=...; ...``)."""
        parts = []
        for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            flags = []
            if self.feature_gates.get(component):
                flags.append(f"--feature-gates={self.feature_gates[component]}")
            if component == "kube-apiserver":
                flags.append(f"--runtime-config={self.runtime_config}")
            if flags:
                parts.append(f"{component} {' '.join(flags)}")
        return "; ".join(parts)


def _alpha_gates(version: str) -> tuple[dict[str, str], str]:
    """1.35 and 1.36: GenericWorkload on the API server, GenericWorkload and GangScheduling on the scheduler."""
    return ({"kube-apiserver": "GenericWorkload=true", "kube-scheduler": "GenericWorkload=true,GangScheduling=true"},
            f"{GROUP}/{version}=true")


#: 1.37: one gate on the three components (GangScheduling is gone), the group version by runtime config.
_GATES_1_37 = {c: "GenericWorkload=true" for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")}

SHAPES: dict[str, GangApi] = {
    s.version: s
    for s in (
        GangApi("v1alpha1", "1.35", False, "workloadRef", "", *_alpha_gates("v1alpha1")),
        GangApi("v1alpha2", "1.36", True, "schedulingGroup", "podGroupTemplateRef", *_alpha_gates("v1alpha2")),
        GangApi("v1alpha3", "1.37", True, "schedulingGroup", "workloadRef", _GATES_1_37, f"{GROUP}/v1alpha3=true"),
        GangApi("v1beta1", "1.37", True, "schedulingGroup", "workloadRef", _GATES_1_37, f"{GROUP}/v1beta1=true"),
    )
}
#: Newest first: a cluster serving two versions (an upgrade in progress, or 1.37's beta and alpha) gets the newer.
PREFERENCE = ("v1beta1", "v1alpha3", "v1alpha2", "v1alpha1")


class NativeGangUnavailable(LookupError):
    """The cluster serves no shape of the native gang API gpufleet knows; the message says how to enable one."""


def for_release(kubernetes_version: str) -> GangApi:
    """The shape a control plane of ``kubernetes_version`` should be started to serve (its most stable one).

    Used to start a cluster (its flags: :attr:`GangApi.feature_gates`,
    :attr:`GangApi.runtime_config`); what a running cluster serves is found
    by :func:`discover` and :func:`choose`.

    Args:
        kubernetes_version: ``"v1.37.2"``, ``"1.37"`` or the like.

    Raises:
        KeyError: a release with no known shape (the message lists the known releases).
    """
    minor = ".".join(kubernetes_version.lstrip("v").split(".")[:2])
    for version in PREFERENCE:
        if SHAPES[version].kubernetes == minor:
            return SHAPES[version]
    known = sorted({s.kubernetes for s in SHAPES.values()})
    raise KeyError(f"Kubernetes {kubernetes_version!r}: no known {GROUP} gang shape (known releases: {', '.join(known)})")


def choose(served: Mapping[str, Collection[str]]) -> GangApi:
    """The newest gang shape the cluster serves.

    Args:
        served: ``scheduling.k8s.io`` version -> resource names that version
            lists in discovery (e.g. ``{"v1": {"priorityclasses"}, "v1alpha1": {"workloads"}}``).

    Raises:
        NativeGangUnavailable: no version lists ``workloads`` (and ``podgroups``
            where the shape needs them); the message lists what is served and
            the flags that serve each shape.
    """
    for version in PREFERENCE:
        resources = set(served.get(version, ()))
        shape = SHAPES[version]
        if "workloads" in resources and (not shape.pod_group_object or "podgroups" in resources):
            return shape
    seen = ", ".join(f"{v} ({', '.join(sorted(r)) or 'no resources'})" for v, r in sorted(served.items())) or "none"
    how = "; ".join(f"Kubernetes {s.kubernetes} ({s.version}): {s.enable}" for s in SHAPES.values())
    raise NativeGangUnavailable(
        f"--gang native: the cluster serves no Workload API of {GROUP} (versions served: {seen}); "
        f"enable it — {how} — or use --gang kueue")


def by_version(version: str) -> GangApi:
    """The shape of ``version`` (``v1alpha1``, ``v1alpha2``, ``v1alpha3`` or ``v1beta1``).

    Raises:
        KeyError: an unknown version (the message lists the known ones).
    """
    try:
        return SHAPES[version]
    except KeyError:
        raise KeyError(f"{version!r}: expected one of {', '.join(SHAPES)}") from None


def discover(kube: Kube) -> dict[str, set[str]]:
    """``scheduling.k8s.io`` versions the cluster serves, with their resource names (API discovery).

    Args:
        kube: a client of the target cluster.

    Raises:
        gpufleet.kube.KubeError: the API server refused a discovery request other than with 404.
    """
    def get(path: str) -> dict[str, Any] | None:
        try:
            return kube.request("GET", path)
        except NotFound:
            return None

    group = get(f"/apis/{GROUP}") or {}
    out: dict[str, set[str]] = {}
    for v in group.get("versions") or []:
        listing = get(f"/apis/{GROUP}/{v['version']}") or {}
        out[v["version"]] = {r["name"] for r in listing.get("resources") or [] if "/" not in r["name"]}
    return out


def pod_group_name(job: str) -> str:
    """Name of the PodGroup object of job ``job`` (1.36 on): ``<job>-workers``."""
    return f"{job}-{POD_GROUP}"


def pod_reference(shape: GangApi, job: str) -> tuple[str, dict[str, str]]:
    """The pod spec field and value that put a pod of job ``job`` into its gang.

    1.35: ``workloadRef: {name: <job>, podGroup: workers}``; 1.36 on:
    ``schedulingGroup: {podGroupName: <job>-workers}``.
    """
    if shape.pod_group_object:
        return shape.pod_field, {"podGroupName": pod_group_name(job)}
    return shape.pod_field, {"name": job, "podGroup": POD_GROUP}


def objects(shape: GangApi, job: str, namespace: str, pods: int, controller: tuple[str, str],
            labels: Mapping[str, str], priority_class: str | None = None) -> list[dict[str, Any]]:
    """The Workload (and PodGroup) that make the ``pods`` pods of ``job`` one gang (``minCount`` = ``pods``).

    Args:
        shape: the served shape (:func:`choose`).
        job: the job's name (the Workload's name).
        namespace: the job's namespace (Workload, PodGroup and pods share it).
        pods: pods in the gang; the scheduler binds all of them or none.
        controller: ``(apiGroup, kind)`` of the job object (``spec.controllerRef``).
        labels: labels of the objects (the job label, so they are found with the job's pods).
        priority_class: the pods' PriorityClass. From 1.36 a pod group has a
            priority of its own (``priorityClassName`` on the template and the
            PodGroup, resolved by the Priority admission plugin), and the 1.37
            scheduler refuses to schedule a pod whose priority differs from its
            group's ("all pods in a single pod group should have the same
            priority"), so it is set there too; 1.35 has no such field.
    """
    gang = {"gang": {"minCount": pods}}
    ref = {"apiGroup": controller[0], "kind": controller[1], "name": job}
    meta = {"name": job, "namespace": namespace, "labels": dict(labels)}
    if not shape.pod_group_object:
        return [{"apiVersion": shape.api_version, "kind": "Workload", "metadata": meta,
                 "spec": {"controllerRef": ref, "podGroups": [{"name": POD_GROUP, "policy": gang}]}}]
    priority = {"priorityClassName": priority_class} if priority_class else {}
    return [
        {"apiVersion": shape.api_version, "kind": "Workload", "metadata": meta,
         "spec": {"controllerRef": ref,
                  "podGroupTemplates": [{"name": POD_GROUP, "schedulingPolicy": gang, **priority}]}},
        {"apiVersion": shape.api_version, "kind": "PodGroup",
         "metadata": {**meta, "name": pod_group_name(job)},
         "spec": {**template_reference(shape, job), "schedulingPolicy": gang, **priority}},
    ]


def template_reference(shape: GangApi, job: str) -> dict[str, Any]:
    """The PodGroup spec field naming its Workload's pod group template (1.36 and 1.37 differ).

    1.36 (``v1alpha2``): ``podGroupTemplateRef: {workload: {workloadName, podGroupTemplateName}}``;
    1.37 (``v1alpha3``, ``v1beta1``): ``workloadRef: {workloadName, templateName}``.

    Raises:
        ValueError: ``shape`` has no PodGroup objects (1.35).
    """
    if shape.template_ref == "podGroupTemplateRef":
        return {"podGroupTemplateRef": {"workload": {"workloadName": job, "podGroupTemplateName": POD_GROUP}}}
    if shape.template_ref == "workloadRef":
        return {"workloadRef": {"workloadName": job, "templateName": POD_GROUP}}
    raise ValueError(f"{shape.api_version} has no PodGroup objects")


def crd_pod_spec_has(crd: Mapping[str, Any], version: str, field: str) -> bool | None:
    """Whether the pod templates of a CRD's ``version`` keep pod spec field ``field``.

    An API server prunes fields a structural CRD schema does not declare,
    silently: a JobSet whose CRD predates ``workloadRef`` loses it and its
    pods never join the gang. Every object schema with a ``containers``
    property is taken for a pod spec.

    Returns:
        True or False; None when the version has no schema (nothing to prune by).
    """
    schema = next((v.get("schema", {}).get("openAPIV3Schema") for v in crd.get("spec", {}).get("versions", [])
                   if v.get("name") == version), None)
    if not schema:
        return None
    found: list[bool] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and "containers" in props:
                found.append(field in props or bool(node.get("x-kubernetes-preserve-unknown-fields")))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return bool(found) and all(found)


def cluster_check(kube: Kube, api_version: str, kind: str, field: str) -> str | None:
    """Why the cluster would drop pod spec ``field`` from a ``kind`` object, or None when it keeps it.

    Built-in kinds (``batch/v1`` Job) keep every field the API server knows;
    a custom kind keeps it only if the cluster's CRD declares it
    (:func:`crd_pod_spec_has`).

    Raises:
        gpufleet.kube.KubeError: the CRDs cannot be listed.
    """
    group, _, version = api_version.rpartition("/")
    if group in ("", "batch"):
        return None
    crds, _ = kube.list_all(api_path("apiextensions.k8s.io/v1", "customresourcedefinitions"))
    for crd in crds:
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            if crd_pod_spec_has(crd, version, field) is False:
                return (f"the cluster's {kind} CRD ({crd['metadata']['name']}) has no pod spec.{field}, so the API "
                        "server would drop it and the pods would not join the gang: use --template job, or a "
                        f"{kind} release whose CRD has it")
            return None
    return f"the cluster serves no {api_version} {kind} (is its controller installed?)"
