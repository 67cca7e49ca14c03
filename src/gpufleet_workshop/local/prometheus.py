"""Prometheus (Debian's package) for one local cluster: file_sd targets, the control plane, annotated Services.

Our own process with its config, data and port in the cluster's state
folder, never the distribution's service. Jobs:

* ``gpufleet-targets``: every target listed in ``*.yaml``/``*.json`` files
  under ``<state>/prometheus/targets/`` (Prometheus ``file_sd`` format,
  re-read every 5 s): the environment's exporters drop files there, through
  :func:`write_targets` or by hand. A ``job`` label in a file overrides the
  job name.
* ``etcd``, ``kube-apiserver``, ``kube-controller-manager``,
  ``kube-scheduler``, ``kueue``, ``jobset``, ``descheduler``, ``kwok``: the
  local control plane, authenticated with a token of service account
  ``kube-system/gpufleet-prometheus`` (allowed ``get /metrics``).
* ``kubernetes-service-endpointslices`` (:data:`SERVICE_ENDPOINTS_JOB`),
  every 5 s: the ready endpoints of every Service annotated
  ``prometheus.io/scrape: "true"``, found through its EndpointSlices. The
  Prometheus community's convention, as its Helm chart's
  ``kubernetes-service-endpoints`` job reads it: the Service's
  ``prometheus.io/scheme``, ``prometheus.io/path`` and ``prometheus.io/port``
  annotations, when present, say how to scrape. Through the slices, not the
  pods: a pod a virtual kubelet runs outside is published in slices of its
  own (:mod:`gpufleet.virtual_kubelet.endpoints`), at the address that
  reaches it, and is scraped like a pod inside. Inference scales on what
  this job scrapes (``vllm:num_requests_running``). Target labels
  ``namespace``, ``service``, ``pod`` (an endpoint backed by a Pod) and
  ``node``. Debian's Prometheus is built without Kubernetes discovery (its
  NEWS.Debian, 1.5.0: "Kubernetes support has been completely removed"; 2.42
  refuses a configuration naming ``kubernetes_sd_configs``, losing every
  job), so the targets come from a file that
  :mod:`gpufleet_workshop.local.endpointslice_sd` keeps, labelled as role
  ``endpointslice`` labels them: the relabeling
  (:func:`service_endpoints_relabeling`) is the one a Prometheus with that
  discovery would use.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import yaml

from gpufleet.names import PROMETHEUS_PATH_ANNOTATION, PROMETHEUS_PORT_ANNOTATION, PROMETHEUS_SCRAPE_ANNOTATION
from gpufleet_workshop.local.layout import Layout
from gpufleet_workshop.local.ports import Ports

SERVICE_ACCOUNT = ("kube-system", "gpufleet-prometheus")
TOKEN_SECRET = "gpufleet-prometheus-token"
#: The job scraping annotated Services' endpoints, and its scrape interval: short, because inference scales on
#: what it scrapes and the serving signal should lag little behind load.
SERVICE_ENDPOINTS_JOB = "kubernetes-service-endpointslices"
SERVICE_ENDPOINTS_INTERVAL = "5s"
#: The convention's scheme annotation (``http``, the default, or ``https``); gpufleet's Services need not set it.
SCHEME_ANNOTATION = "prometheus.io/scheme"


def _service_annotation(annotation: str) -> str:
    """Kubernetes SD's meta label of a Service annotation (SanitizeLabelName: ``[^a-zA-Z0-9_]`` -> ``_``)."""
    return "__meta_kubernetes_service_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", annotation)


def service_endpoints_relabeling() -> list[dict]:
    """Relabeling of :data:`SERVICE_ENDPOINTS_JOB`'s targets (one per endpoint address and slice port).

    Keeps the ready endpoints of Services annotated ``prometheus.io/scrape: "true"``, takes scheme, path and
    port from the Service's annotations where present (an absent annotation is an empty label, which
    ``(.+)``-like regexes do not match), and sets ``namespace``, ``service``, ``pod`` and ``node``.
    """
    return [
        {"source_labels": [_service_annotation(PROMETHEUS_SCRAPE_ANNOTATION)], "regex": "true", "action": "keep"},
        # Ready endpoints only (a Service's own view of who serves). It also drops the targets Prometheus adds
        # for a backing pod's other container ports: they carry no endpoint conditions.
        {"source_labels": ["__meta_kubernetes_endpointslice_endpoint_conditions_ready"], "regex": "true",
         "action": "keep"},
        {"source_labels": [_service_annotation(SCHEME_ANNOTATION)], "regex": "(https?)",
         "target_label": "__scheme__", "action": "replace"},
        {"source_labels": [_service_annotation(PROMETHEUS_PATH_ANNOTATION)], "regex": "(.+)",
         "target_label": "__metrics_path__", "action": "replace"},
        # host[:port] + the annotation's port -> host:port (non-greedy host: an IPv6 "[a::b]" keeps its colons).
        {"source_labels": ["__address__", _service_annotation(PROMETHEUS_PORT_ANNOTATION)],
         "regex": r"(.+?)(?::\d+)?;(\d+)", "replacement": "$1:$2", "target_label": "__address__",
         "action": "replace"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace", "action": "replace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service", "action": "replace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod", "action": "replace"},
        # The endpoint's nodeName: Prometheus 2.52 and later name it; 2.42 (Debian's) only through the backing
        # pod's spec.nodeName. The first of the two that is set.
        {"source_labels": ["__meta_kubernetes_endpointslice_endpoint_node_name", "__meta_kubernetes_pod_node_name"],
         "regex": ";*([^;]+).*", "target_label": "node", "action": "replace"},
    ]


def binary() -> str:
    """Path of the ``prometheus`` binary.

    Raises:
        FileNotFoundError: Prometheus is not installed (``invoke local.install``).
    """
    found = shutil.which("prometheus")
    if not found:
        raise FileNotFoundError("prometheus not found: run `invoke local.install` (apt package prometheus)")
    return found


def config(layout: Layout, ports: Ports, ca: Path, token_file: Path, scrape_interval: str = "15s") -> dict:
    """The Prometheus configuration of one cluster (see the module docstring for its jobs)."""

    def tls_job(name: str, port: int, scheme: str = "https") -> dict:
        job = {"job_name": name, "scheme": scheme, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        if scheme == "https":
            job["tls_config"] = {"ca_file": str(ca)}
            job["authorization"] = {"credentials_file": str(token_file)}
        return job

    return {
        "global": {
            "scrape_interval": scrape_interval,
            "evaluation_interval": scrape_interval,
            "external_labels": {"gpufleet_cluster": layout.name},
        },
        "scrape_configs": [
            {
                "job_name": "gpufleet-targets",
                "file_sd_configs": [
                    {"files": [str(layout.scrape_targets / "*.yaml"), str(layout.scrape_targets / "*.json")], "refresh_interval": "5s"}
                ],
            },
            tls_job("etcd", ports.etcd_metrics, "http"),
            tls_job("kube-apiserver", ports.apiserver),
            tls_job("kube-controller-manager", ports.controller_manager),
            tls_job("kube-scheduler", ports.scheduler),
            tls_job("kueue", ports.kueue_metrics),
            tls_job("jobset", ports.jobset_metrics),
            tls_job("descheduler", ports.descheduler),
            tls_job("kwok", ports.kwok, "http"),
            service_endpoints_job(layout.endpointslice_targets),
        ],
    }


def service_endpoints_job(targets: Path) -> dict:
    """The scrape config of :data:`SERVICE_ENDPOINTS_JOB`: the target groups in file ``targets`` (JSON, kept by
    :mod:`gpufleet_workshop.local.endpointslice_sd`), relabeled by :func:`service_endpoints_relabeling`."""
    return {
        "job_name": SERVICE_ENDPOINTS_JOB,
        "scrape_interval": SERVICE_ENDPOINTS_INTERVAL,
        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "5s"}],
        "relabel_configs": service_endpoints_relabeling(),
    }


def rbac_objects() -> list[dict]:
    """ServiceAccount, token Secret, ClusterRole (get /metrics) and binding for the scrapes."""
    ns, sa = SERVICE_ACCOUNT
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {"name": TOKEN_SECRET, "namespace": ns, "annotations": {"kubernetes.io/service-account.name": sa}},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "gpufleet:metrics-reader"},
            "rules": [{"nonResourceURLs": ["/metrics", "/metrics/*"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpufleet:metrics-reader:prometheus"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpufleet:metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        },
    ]


def argv(config_file: Path, data_dir: Path, port: int, retention: str = "2d") -> list[str]:
    """Command line of our Prometheus (web UI and API on ``127.0.0.1:<port>``)."""
    return [
        binary(),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data_dir}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]


_JOB = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_-]*$")


def write_targets(folder: Path, job: str, targets: list[str], labels: dict[str, str] | None = None) -> Path:
    """Publish scrape targets for Prometheus (file_sd): ``<folder>/<job>.json``.

    Args:
        folder: the cluster's ``Layout.scrape_targets``.
        job: job name (letters, digits, ``_``, ``-``); becomes label ``job``.
        targets: ``host:port`` strings.
        labels: extra labels on every target.

    Returns:
        The file written (atomically; Prometheus picks it up within 5 s).

    Raises:
        ValueError: an invalid job name.
    """
    if not _JOB.match(job):
        raise ValueError(f"scrape job name {job!r}: expected [a-zA-Z_][a-zA-Z0-9_-]*")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job}.json"
    tmp = folder / f".{job}.json.tmp"
    tmp.write_text(json.dumps([{"targets": list(targets), "labels": {"job": job, **(labels or {})}}], indent=1))
    tmp.replace(path)
    return path


def dump(cfg: dict, path: Path) -> Path:
    """Write a Prometheus configuration as YAML and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path
