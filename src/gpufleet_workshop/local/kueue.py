"""Kueue and JobSet on the local cluster: run configuration, CRDs and webhooks.

Both controllers run as plain processes with the admin kubeconfig (no RBAC
to install) and serve their webhooks on ``127.0.0.1``. Their own certificate
management is off: the webhook servers read ``tls.crt``/``tls.key`` from
the cluster's cert folder, and the webhook configurations and CRD
conversion webhooks rendered here carry ``url`` + ``caBundle`` (see
:mod:`gpufleet_workshop.local.webhooks`).

Upstream manifests come from the pinned modules in the Go module cache
(``config/components/{crd,webhook}``), so schemas and webhook rules are
exactly those of the pinned versions.

Kueue (0.17 to 0.19) reads its metrics serving certificate from the fixed path
``/etc/kueue/metrics/certs`` when internal cert management is off; the
process therefore runs in a private mount namespace (``unshare -m``) where
that path is a bind mount of the cluster's cert folder, leaving the host's
``/etc`` untouched apart from the empty mount point.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpufleet_workshop.local import manifests, webhooks
from gpufleet_workshop.local.components import component
from gpufleet_admin.build.gobuild import module_dir
from gpufleet_workshop.local.ports import Ports
from gpufleet.names import KUEUE_GROUP
from roles.kueue.manifests import DEVICE_CLASS_MAPPINGS, DRA_FEATURE_GATES

#: Kueue integrations the local cluster enables.
FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")

#: Which (apiGroup, resource) each Kueue integration's webhooks intercept.
FRAMEWORK_TARGETS: dict[str, set[tuple[str, str]]] = {
    "batch/job": {("batch", "jobs")},
    "jobset.x-k8s.io/jobset": {("jobset.x-k8s.io", "jobsets")},
    "pod": {("", "pods")},
    "deployment": {("apps", "deployments")},
    "statefulset": {("apps", "statefulsets")},
    "leaderworkerset.x-k8s.io/leaderworkerset": {("leaderworkerset.x-k8s.io", "leaderworkersets")},
    "kubeflow.org/pytorchjob": {("kubeflow.org", "pytorchjobs")},
    "kubeflow.org/mpijob": {("kubeflow.org", "mpijobs")},
}

KUEUE_NAMESPACE = "kueue-system"
JOBSET_NAMESPACE = "jobset-system"
KUEUE_METRICS_CERT_PATH = Path("/etc/kueue/metrics/certs")


def kueue_source() -> Path:
    """Folder of the pinned Kueue module in the Go module cache."""
    c = component("kueue")
    return module_dir(c.module, c.version)


def jobset_source() -> Path:
    """Folder of the pinned JobSet module in the Go module cache."""
    c = component("jobset")
    return module_dir(c.module, c.version)


# --------------------------------------------------------------------------- Kueue


def kueue_configuration(
    ports: Ports,
    cert_dir: Path,
    *,
    frameworks: tuple[str, ...] = FRAMEWORKS,
    pods_ready_timeout_seconds: int = 600,
    block_admission: bool = False,
) -> dict:
    """Kueue's ``config.kueue.x-k8s.io/v1beta2`` Configuration for the local cluster.

    Args:
        ports: the cluster's port block (webhook, health, metrics ports used).
        cert_dir: folder with ``tls.crt``/``tls.key`` for the webhook server.
        frameworks: integrations to enable (Kueue's names, e.g. ``"batch/job"``).
        pods_ready_timeout_seconds: ``waitForPodsReady.timeout``: a gang not
            all Ready in this time is evicted and requeued (all-or-nothing).
        block_admission: ``waitForPodsReady.blockAdmission``.
    """
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.kueue_health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.kueue_metrics}"},
        "webhook": {"host": "127.0.0.1", "port": ports.kueue_webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "waitForPodsReady": {
            "timeout": f"{pods_ready_timeout_seconds}s",
            "blockAdmission": block_admission,
        },
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 100, "burst": 200},
        "integrations": {"frameworks": list(frameworks)},
        # DRA: claims of NVIDIA's DeviceClass count as nvidia.com/gpu quota, as the kueue role configures it.
        "resources": {"deviceClassMappings": DEVICE_CLASS_MAPPINGS},
        # The visibility API is an aggregated apiserver; the local cluster runs no aggregation layer.
        "featureGates": {"VisibilityOnDemand": False, **DRA_FEATURE_GATES},
    }


def kueue_crds(ports: Ports, ca_pem: bytes) -> list[dict]:
    """Kueue's CRDs, with conversion webhooks (where upstream has them) at the local server.

    Which CRDs convert is read from ``config/components/crd/kustomization.yaml``
    (its ``patches/webhook_in_<plural>.yaml`` entries).
    """
    crd_dir = kueue_source() / "config" / "components" / "crd"
    kust = manifests.load_one(crd_dir / "kustomization.yaml")
    converting = set()
    for p in kust.get("patches", []):
        body = manifests.load_one(crd_dir / p["path"])
        if body.get("spec", {}).get("conversion", {}).get("strategy") == "Webhook":
            converting.add(body["metadata"]["name"])
    out = []
    for crd in webhooks.load_crds(crd_dir / "bases"):
        if crd["metadata"]["name"] in converting:
            crd = webhooks.localize_crd_conversion(crd, port=ports.kueue_webhook, ca_pem=ca_pem)
        out.append(crd)
    return out


def kueue_webhook_configurations(ports: Ports, ca_pem: bytes, frameworks: tuple[str, ...] = FRAMEWORKS) -> list[dict]:
    """Kueue's webhook configurations for its own API and the enabled integrations only.

    Webhooks of integrations that are not enabled are left out: Kueue does
    not serve them, and ``failurePolicy: Fail`` would block those kinds.

    Raises:
        KeyError: an integration without an entry in :data:`FRAMEWORK_TARGETS`.
    """
    allowed: set[tuple[str, str]] = set()
    for f in frameworks:
        allowed |= FRAMEWORK_TARGETS[f]

    def keep(w: dict) -> bool:
        targets = webhooks.webhook_targets(w)
        return any(g == KUEUE_GROUP for g, _ in targets) or bool(targets & allowed)

    docs = webhooks.kustomize_webhooks(kueue_source() / "config" / "components" / "webhook")
    return webhooks.localize_webhooks(docs, port=ports.kueue_webhook, ca_pem=ca_pem, name_prefix="kueue-", keep=keep)


def kueue_argv(config_file: Path, webhook_cert_dir: Path) -> list[str]:
    """Command line of the Kueue controller manager.

    As root with ``unshare`` available, Kueue runs in a private mount
    namespace where :data:`KUEUE_METRICS_CERT_PATH` is ``webhook_cert_dir``.
    Otherwise that path must already hold a ``tls.crt``/``tls.key``.

    Raises:
        RuntimeError: neither a mount namespace nor certificates at the fixed
            path are available.
    """
    kueue = str(component("kueue").binary())
    base = [kueue, f"--config={config_file}", "--zap-log-level=info"]
    unshare = shutil.which("unshare")
    if os.geteuid() == 0 and unshare:
        KUEUE_METRICS_CERT_PATH.mkdir(parents=True, exist_ok=True)
        script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        return [unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", script, "kueue",
                str(webhook_cert_dir), str(KUEUE_METRICS_CERT_PATH), *base]
    if (KUEUE_METRICS_CERT_PATH / "tls.crt").exists():
        return base
    raise RuntimeError(
        f"Kueue {component('kueue').version} needs a metrics certificate at {KUEUE_METRICS_CERT_PATH}: "
        "run as root (private mount namespace) or install tls.crt/tls.key there"
    )


# --------------------------------------------------------------------------- JobSet


def jobset_configuration(ports: Ports, cert_dir: Path) -> dict:
    """JobSet's ``config.jobset.x-k8s.io/v1alpha1`` Configuration for the local cluster."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.jobset_health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.jobset_metrics}", "certDir": str(cert_dir)},
        "webhook": {"host": "127.0.0.1", "port": ports.jobset_webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def jobset_crds() -> list[dict]:
    """JobSet's CRDs (single version, no conversion)."""
    return webhooks.load_crds(jobset_source() / "config" / "components" / "crd" / "bases")


def jobset_webhook_configurations(ports: Ports, ca_pem: bytes) -> list[dict]:
    """JobSet's webhook configurations (JobSet objects, and pods labelled with a JobSet name)."""
    docs = webhooks.kustomize_webhooks(jobset_source() / "config" / "components" / "webhook")
    return webhooks.localize_webhooks(docs, port=ports.jobset_webhook, ca_pem=ca_pem, name_prefix="jobset-")


def jobset_argv(config_file: Path) -> list[str]:
    """Command line of the JobSet controller manager."""
    return [str(component("jobset").binary()), f"--config={config_file}", "--zap-log-level=info"]
