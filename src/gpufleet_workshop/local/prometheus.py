"""Prometheus (Debian's package) for one local cluster, scraping file_sd targets.

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
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import yaml

from gpufleet_workshop.local.layout import Layout
from gpufleet_workshop.local.ports import Ports

SERVICE_ACCOUNT = ("kube-system", "gpufleet-prometheus")
TOKEN_SECRET = "gpufleet-prometheus-token"


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
        ],
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
