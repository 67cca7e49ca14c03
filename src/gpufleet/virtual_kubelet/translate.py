"""Translate a pod bound to a virtual node into the pod a provider runs remotely.

A source pod refers to things of *its* cluster (nodes, service accounts,
volumes, Secrets, scheduling constraints). The remote side is another
cluster or a rental API that knows none of them. The rules, field by field:

Kept (copied as is):
    ``metadata.labels`` (plus our tags), ``metadata.annotations`` (plus
    ours), ``spec.containers`` and ``spec.initContainers`` (image, command,
    args, env with plain values or ``fieldRef``/``resourceFieldRef``, ports,
    resources, probes, lifecycle, securityContext, workingDir),
    ``restartPolicy``, ``terminationGracePeriodSeconds``,
    ``activeDeadlineSeconds``, ``securityContext``, ``dnsPolicy`` (except
    ``ClusterFirstWithHostNet``), ``hostname``, ``subdomain``,
    ``imagePullPolicy``, ``shareProcessNamespace``, ``enableServiceLinks``,
    ``overhead``-free resources, volumes of kind ``emptyDir`` and
    ``downwardAPI`` with their mounts; references to ConfigMaps and Secrets
    (volumes of kind ``configMap`` and ``secret``, ``projected`` volumes of
    ``configMap``/``secret``/``downwardAPI`` sources, ``envFrom``, env
    ``valueFrom.configMapKeyRef``/``secretKeyRef``): the virtual kubelet
    reflects the objects to the provider before the pod starts there
    (:func:`references` lists them; :mod:`gpufleet.virtual_kubelet.reflect`). They keep
    their names, unless the provider keeps its copies under names of its
    own (``rename``: the kubernetes provider's ``gf-<pool>.<name>``), and
    then every reference in the translated pod names the copy.

Dropped (meaningless or harmful remotely):
    ``nodeName``, ``nodeSelector``, ``affinity``, ``tolerations`` (they name
    this cluster's nodes and taints; the provider adds its own remote
    tolerations/node selector), ``schedulerName``, ``priority``,
    ``priorityClassName``, ``preemptionPolicy``, ``runtimeClassName``,
    ``topologySpreadConstraints``, ``serviceAccountName``,
    ``serviceAccount``, ``automountServiceAccountToken`` (set to false),
    the projected service-account token volume (``kube-api-access-*``) and
    its mounts, ``imagePullSecrets`` (registry credentials stay here),
    ``readinessGates``, ``resourceClaims``, ``ownerReferences``,
    ``finalizers``, ``generateName``, ``uid``, ``resourceVersion``,
    ``creationTimestamp``, ``managedFields``, ``status``.

Refused (:class:`Refused`: the pod is marked Failed with reason
``Refused`` and an Event says which field):
    ``hostNetwork``, ``hostPID``, ``hostIPC``, volumes of kind
    ``hostPath`` (or any other kind not kept above: PVCs, CSI, projected
    volumes with other sources than the kept ones, e.g. a
    ``serviceAccountToken`` of this cluster), ephemeral containers,
    ``resourceClaims`` requests in containers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Literal

from .provider import SOURCE_NAME, SOURCE_NAMESPACE, SOURCE_UID, REMOTE_NODE_LABEL, Pod

#: Prefix of the service-account token volume the API server injects.
TOKEN_VOLUME_PREFIX = "kube-api-access-"
KEPT_VOLUME_KINDS = ("emptyDir", "downwardAPI", "configMap", "secret", "projected")
#: Sources a kept ``projected`` volume may have.
KEPT_PROJECTED_SOURCES = ("configMap", "secret", "downwardAPI")
KEPT_SPEC = (
    "containers", "initContainers", "restartPolicy", "terminationGracePeriodSeconds", "activeDeadlineSeconds",
    "securityContext", "dnsPolicy", "hostname", "subdomain", "shareProcessNamespace", "enableServiceLinks",
    "dnsConfig", "setHostnameAsFQDN", "os",
)
REFUSED_SPEC = ("hostNetwork", "hostPID", "hostIPC")


class Refused(ValueError):
    """The pod uses something the remote side cannot honour; the message names the field."""

    reason = "Refused"


def _is_token_volume(vol: dict) -> bool:
    return vol.get("name", "").startswith(TOKEN_VOLUME_PREFIX) and "projected" in vol


ObjectKind = Literal["ConfigMap", "Secret"]


@dataclass(frozen=True, order=True)
class Reference:
    """An object a pod references in its own namespace: ``kind`` ConfigMap or Secret, its ``name``, and
    whether the pod starts without it (``optional``: every reference to it is ``optional: true``)."""

    kind: ObjectKind
    name: str
    optional: bool = False


def references(pod: Pod) -> list[Reference]:
    """The ConfigMaps and Secrets ``pod`` references (volumes, projected sources, ``envFrom``, env ``valueFrom``
    of containers and init containers), one per object, sorted by kind and name.

    An object referenced both optionally and not is not optional (the pod
    cannot start without it, as the kubelet decides). The service-account
    token volume (``kube-api-access-*``) references nothing to reflect.
    """
    spec = pod.get("spec") or {}
    found: dict[tuple[str, str], bool] = {}

    def add(kind: str, name: str | None, optional: bool | None) -> None:
        if name:
            found[(kind, name)] = found.get((kind, name), True) and bool(optional)

    for vol in spec.get("volumes") or []:
        if _is_token_volume(vol):
            continue
        if "configMap" in vol:
            add("ConfigMap", vol["configMap"].get("name"), vol["configMap"].get("optional"))
        if "secret" in vol:
            add("Secret", vol["secret"].get("secretName"), vol["secret"].get("optional"))
        for src in (vol.get("projected") or {}).get("sources") or []:
            if "configMap" in src:
                add("ConfigMap", src["configMap"].get("name"), src["configMap"].get("optional"))
            if "secret" in src:
                add("Secret", src["secret"].get("name"), src["secret"].get("optional"))
    for kind in ("containers", "initContainers"):
        for c in spec.get(kind) or []:
            for ef in c.get("envFrom") or []:
                if "configMapRef" in ef:
                    add("ConfigMap", ef["configMapRef"].get("name"), ef["configMapRef"].get("optional"))
                if "secretRef" in ef:
                    add("Secret", ef["secretRef"].get("name"), ef["secretRef"].get("optional"))
            for env in c.get("env") or []:
                src = env.get("valueFrom") or {}
                if "configMapKeyRef" in src:
                    add("ConfigMap", src["configMapKeyRef"].get("name"), src["configMapKeyRef"].get("optional"))
                if "secretKeyRef" in src:
                    add("Secret", src["secretKeyRef"].get("name"), src["secretKeyRef"].get("optional"))
    return [Reference(k, n, opt) for (k, n), opt in sorted(found.items())]  # type: ignore[arg-type]


Rename = Callable[[str, str], str]


def rename_references(spec: dict, rename: Rename) -> None:
    """Make every ConfigMap/Secret reference of pod ``spec`` (the places :func:`references` reads) name
    ``rename(kind, name)`` instead, in place; the service-account token volume is left as it is."""
    def ref(kind: str, holder: dict, key: str) -> None:
        if holder.get(key):
            holder[key] = rename(kind, holder[key])

    for vol in spec.get("volumes") or []:
        if _is_token_volume(vol):
            continue
        if "configMap" in vol:
            ref("ConfigMap", vol["configMap"], "name")
        if "secret" in vol:
            ref("Secret", vol["secret"], "secretName")
        for src in (vol.get("projected") or {}).get("sources") or []:
            if "configMap" in src:
                ref("ConfigMap", src["configMap"], "name")
            if "secret" in src:
                ref("Secret", src["secret"], "name")
    for kind in ("containers", "initContainers"):
        for c in spec.get(kind) or []:
            for ef in c.get("envFrom") or []:
                if "configMapRef" in ef:
                    ref("ConfigMap", ef["configMapRef"], "name")
                if "secretRef" in ef:
                    ref("Secret", ef["secretRef"], "name")
            for env in c.get("env") or []:
                src = env.get("valueFrom") or {}
                if "configMapKeyRef" in src:
                    ref("ConfigMap", src["configMapKeyRef"], "name")
                if "secretKeyRef" in src:
                    ref("Secret", src["secretKeyRef"], "name")


def _check_container(c: dict, kind: str) -> None:
    where = f"{kind} {c.get('name')!r}"
    if (c.get("resources") or {}).get("claims"):
        raise Refused(f"{where}: resources.claims (dynamic resource allocation is local to this cluster)")


def translate(pod: Pod, *, node_name: str, namespace: str | None = None, name: str | None = None,
              tolerations: list[dict] | None = None, node_selector: dict[str, str] | None = None,
              rename: Rename | None = None) -> Pod:
    """The remote pod for source ``pod`` (see the module docstring for what is kept, dropped, refused).

    Args:
        pod: the source pod (API JSON dict); not modified.
        node_name: the virtual node it is bound to (tag :data:`REMOTE_NODE_LABEL`).
        namespace / name: remote namespace and name (default: the source's).
        tolerations / node_selector: what the remote side needs (e.g. its
            own GPU node taint), set instead of the source's.
        rename: ``(kind, name) -> name`` of the provider's copy of a
            referenced ConfigMap/Secret (:func:`rename_references`); None:
            the copies keep the source names.

    Returns:
        A new pod manifest (apiVersion, kind, metadata, spec) tagged with the
        source UID, namespace, name and the virtual node.

    Raises:
        Refused: a refused field is set (the message names it).
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    for key in REFUSED_SPEC:
        if spec.get(key):
            raise Refused(f"spec.{key} (the remote side cannot give a pod this node's {key[4:].lower()})")
    if spec.get("ephemeralContainers"):
        raise Refused("spec.ephemeralContainers")
    for kind in ("containers", "initContainers"):
        for c in spec.get(kind) or []:
            _check_container(c, kind[:-1])
    dropped_volumes = set()
    volumes = []
    for vol in spec.get("volumes") or []:
        if _is_token_volume(vol):
            dropped_volumes.add(vol["name"])
            continue
        kinds = [k for k in vol if k != "name"]
        if not kinds or kinds[0] not in KEPT_VOLUME_KINDS:
            raise Refused(f"volume {vol.get('name')!r} of kind {kinds[0] if kinds else '?'} "
                          f"(only {', '.join(KEPT_VOLUME_KINDS)} run remotely)")
        for src in (vol.get("projected") or {}).get("sources") or []:
            other = [k for k in src if k not in KEPT_PROJECTED_SOURCES]
            if other:
                raise Refused(f"volume {vol.get('name')!r}: projected source {other[0]} (only "
                              f"{', '.join(KEPT_PROJECTED_SOURCES)} sources run remotely)")
        volumes.append(copy.deepcopy(vol))

    out_spec: dict[str, Any] = {k: copy.deepcopy(spec[k]) for k in KEPT_SPEC if k in spec}
    if out_spec.get("dnsPolicy") == "ClusterFirstWithHostNet":
        out_spec["dnsPolicy"] = "ClusterFirst"
    for kind in ("containers", "initContainers"):
        for c in out_spec.get(kind) or []:
            mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") not in dropped_volumes]
            if mounts:
                c["volumeMounts"] = mounts
            else:
                c.pop("volumeMounts", None)
    if volumes:
        out_spec["volumes"] = volumes
    if rename is not None:
        rename_references(out_spec, rename)
    out_spec["automountServiceAccountToken"] = False
    if tolerations:
        out_spec["tolerations"] = copy.deepcopy(tolerations)
    if node_selector:
        out_spec["nodeSelector"] = dict(node_selector)

    labels = dict(meta.get("labels") or {})
    labels[REMOTE_NODE_LABEL] = node_name
    annotations = dict(meta.get("annotations") or {})
    annotations.update({SOURCE_UID: meta.get("uid", ""), SOURCE_NAMESPACE: meta.get("namespace", ""),
                        SOURCE_NAME: meta.get("name", "")})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name or meta.get("name"), "namespace": namespace or meta.get("namespace"),
                     "labels": labels, "annotations": annotations},
        "spec": out_spec,
    }


#: Pod condition types mirrored back from the remote side.
MIRRORED_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
#: Pod status fields mirrored back. Not ``podIP``/``podIPs``: the remote pod's IP is the remote side's, and a
#: pod with an IP would be published by kube-controller-manager's EndpointSlice controller at that address;
#: the virtual kubelet publishes it at the address its provider reports instead (:mod:`gpufleet.virtual_kubelet.endpoints`).
MIRRORED_STATUS = ("phase", "reason", "message", "startTime", "containerStatuses", "initContainerStatuses", "qosClass")


def mirror_status(remote_status: dict[str, Any], *, host_ip: str | None = None) -> dict[str, Any]:
    """The status to write on the source pod from a remote pod's status.

    Keeps :data:`MIRRORED_STATUS` and the conditions in
    :data:`MIRRORED_CONDITIONS` (``PodScheduled`` stays the source
    scheduler's; Ready/ContainersReady are False once the pod finished);
    ``hostIP`` becomes the virtual node's address.
    """
    out = {k: copy.deepcopy(remote_status[k]) for k in MIRRORED_STATUS if k in remote_status}
    conds = [copy.deepcopy(c) for c in remote_status.get("conditions") or [] if c.get("type") in MIRRORED_CONDITIONS]
    if remote_status.get("phase") in ("Succeeded", "Failed"):
        for c in conds:  # a finished pod is never Ready, whatever the remote side left in its conditions
            if c.get("type") in ("Ready", "ContainersReady") and c.get("status") == "True":
                c.update(status="False", reason="PodCompleted" if remote_status["phase"] == "Succeeded" else "PodFailed")
    if conds:
        out["conditions"] = conds
    if host_ip:
        out["hostIP"] = host_ip
        out["hostIPs"] = [{"ip": host_ip}]
    return out
