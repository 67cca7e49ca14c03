"""The local Prometheus' configuration (pure): the annotated Services' EndpointSlices job.

The relabeling is checked by applying it, the way Prometheus does (``keep``/``replace`` on the source labels
joined by ``;``, the regex anchored at both ends), to the meta labels role ``endpointslice`` gives a target
(Prometheus 2.42's ``discovery/kubernetes/endpointslice.go``). Where ``promtool`` is installed, it checks the
whole file as Debian's Prometheus reads it, and relabels the same targets (from a file_sd file: Debian's has
no Kubernetes discovery) to show that this test's relabeling is Prometheus'.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpufleet.names import PROMETHEUS_PATH_ANNOTATION, PROMETHEUS_PORT_ANNOTATION, PROMETHEUS_SCRAPE_ANNOTATION
from gpufleet_workshop.local import prometheus
from gpufleet_workshop.local.layout import Layout
from gpufleet_workshop.local.ports import Ports

PORTS = Ports(20000)
SERVICE_ANNOTATION = "__meta_kubernetes_service_annotation_"


def _config(tmp_path: Path) -> dict:
    ca, token = tmp_path / "ca.crt", tmp_path / "prometheus.token"
    return prometheus.config(Layout("c"), PORTS, ca, token)


def _job(cfg: dict) -> dict:
    [job] = [j for j in cfg["scrape_configs"] if j["job_name"] == prometheus.SERVICE_ENDPOINTS_JOB]
    return job


def _relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str] | None:
    """``labels`` after ``rules`` (keep and replace, Prometheus' defaults), or None when a rule drops the target."""
    out = dict(labels)
    for r in rules:
        value = ";".join(out.get(s, "") for s in r["source_labels"])
        m = re.fullmatch(r.get("regex", "(.*)"), value)
        if r["action"] == "keep":
            if not m:
                return None
        elif r["action"] == "replace":
            if m:
                new = re.sub(r"\$(\d+)", lambda g: m.group(int(g.group(1))) or "", r.get("replacement", "$1"))
                if new:
                    out[r["target_label"]] = new
                else:
                    out.pop(r["target_label"], None)
        else:
            raise AssertionError(f"unexpected action {r['action']}")
    return {k: v for k, v in out.items() if not k.startswith("__meta_")}


def _target(**annotations: str) -> dict[str, str]:
    """A ready endpoint of Service ``serving/llm`` backed by pod ``llm-0`` on node ``n1`` (2.42's meta labels)."""
    labels = {
        "__address__": "10.244.0.7:8000",
        "__scheme__": "http",
        "__metrics_path__": "/metrics",
        "__meta_kubernetes_namespace": "serving",
        "__meta_kubernetes_service_name": "llm",
        "__meta_kubernetes_endpointslice_endpoint_conditions_ready": "true",
        "__meta_kubernetes_endpointslice_address_target_kind": "Pod",
        "__meta_kubernetes_endpointslice_address_target_name": "llm-0",
        "__meta_kubernetes_pod_name": "llm-0",
        "__meta_kubernetes_pod_node_name": "n1",
    }
    for key, value in annotations.items():
        labels[SERVICE_ANNOTATION + key] = value
    return labels


def test_the_job_reads_the_endpointslice_targets_file_every_5s_and_names_no_kubernetes_sd(tmp_path):
    cfg = _config(tmp_path)
    job = _job(cfg)
    assert job["scrape_interval"] == "5s"
    assert job["file_sd_configs"] == [{"files": [str(Layout("c").endpointslice_targets)], "refresh_interval": "5s"}]
    # Not in the folder the gpufleet-targets job globs: its targets are this job's alone.
    assert Layout("c").endpointslice_targets.parent != Layout("c").scrape_targets
    # The service account's token is the control plane's only, never sent to the workloads scraped.
    assert "authorization" not in job and "tls_config" not in job and "scheme" not in job
    # Debian's Prometheus refuses a configuration naming Kubernetes discovery, losing every job.
    assert all("kubernetes_sd_configs" not in j for j in cfg["scrape_configs"])
    names = [j["job_name"] for j in cfg["scrape_configs"]]
    assert names[:2] == ["gpufleet-targets", "etcd"] and names[-1] == prometheus.SERVICE_ENDPOINTS_JOB


def test_the_annotations_are_the_communitys_and_their_meta_labels_prometheus_sanitized():
    assert (PROMETHEUS_SCRAPE_ANNOTATION, PROMETHEUS_PORT_ANNOTATION, PROMETHEUS_PATH_ANNOTATION,
            prometheus.SCHEME_ANNOTATION) == ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path",
                                              "prometheus.io/scheme")
    sources = {s for r in prometheus.service_endpoints_relabeling() for s in r["source_labels"]}
    assert {SERVICE_ANNOTATION + a for a in ("prometheus_io_scrape", "prometheus_io_port", "prometheus_io_path",
                                             "prometheus_io_scheme")} <= sources


def test_an_annotated_services_ready_endpoint_is_scraped_as_it_says_with_its_labels():
    got = _relabel(prometheus.service_endpoints_relabeling(),
                   _target(prometheus_io_scrape="true", prometheus_io_port="9000", prometheus_io_path="/m",
                           prometheus_io_scheme="https"))
    assert got == {"__address__": "10.244.0.7:9000", "__scheme__": "https", "__metrics_path__": "/m",
                   "namespace": "serving", "service": "llm", "pod": "llm-0", "node": "n1"}


def test_without_port_path_or_scheme_the_endpoint_is_scraped_at_its_own_port_over_http():
    got = _relabel(prometheus.service_endpoints_relabeling(), _target(prometheus_io_scrape="true"))
    assert got == {"__address__": "10.244.0.7:8000", "__scheme__": "http", "__metrics_path__": "/metrics",
                   "namespace": "serving", "service": "llm", "pod": "llm-0", "node": "n1"}


@pytest.mark.parametrize("scrape", [None, "false", "True "])
def test_a_service_not_annotated_true_is_not_scraped(scrape):
    annotations = {} if scrape is None else {"prometheus_io_scrape": scrape}
    assert _relabel(prometheus.service_endpoints_relabeling(), _target(**annotations)) is None


@pytest.mark.parametrize("ready", ["false", None])
def test_an_endpoint_not_ready_or_a_pods_extra_port_is_not_scraped(ready):
    labels = _target(prometheus_io_scrape="true")
    if ready is None:  # a backing pod's container port no slice port names: Prometheus gives no conditions
        del labels["__meta_kubernetes_endpointslice_endpoint_conditions_ready"]
    else:
        labels["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] = ready
    assert _relabel(prometheus.service_endpoints_relabeling(), labels) is None


def test_an_endpoint_without_a_pod_has_no_pod_label_and_its_node_from_newer_prometheus():
    labels = _target(prometheus_io_scrape="true", prometheus_io_port="9000")
    for k in [k for k in labels if k.startswith("__meta_kubernetes_pod_") or "_address_target_" in k]:
        del labels[k]
    labels["__address__"] = "[fd00::7]:8000"
    got = _relabel(prometheus.service_endpoints_relabeling(), labels)
    assert got["__address__"] == "[fd00::7]:9000" and "pod" not in got and "node" not in got
    labels["__meta_kubernetes_endpointslice_endpoint_node_name"] = "vk-pool-a"  # Prometheus >= 2.52
    assert _relabel(prometheus.service_endpoints_relabeling(), labels)["node"] == "vk-pool-a"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt package prometheus)")
def test_promtool_accepts_the_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_STATE", str(tmp_path / "state"))  # file_sd globs under a state folder of our own
    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "prometheus.token").write_text("token\n")
    path = prometheus.dump(_config(tmp_path), tmp_path / "prometheus.yaml")
    done = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt package prometheus)")
def test_promtool_relabels_the_targets_as_these_tests_do(tmp_path):
    bare = {k: v for k, v in _target(prometheus_io_scrape="true", prometheus_io_port="9000").items()
            if not k.startswith("__meta_kubernetes_pod_") and "_address_target_" not in k}
    cases = [_target(prometheus_io_scrape="true", prometheus_io_port="9000", prometheus_io_path="/m",
                     prometheus_io_scheme="https"),
             _target(prometheus_io_scrape="true"),
             _target(prometheus_io_scrape="false"),
             {**_target(prometheus_io_scrape="true"),
              "__meta_kubernetes_endpointslice_endpoint_conditions_ready": "false"},
             {**bare, "__address__": "[fd00::7]:8000", "__meta_kubernetes_endpointslice_endpoint_node_name": "vk"}]
    for i, labels in enumerate(cases):  # one address each: promtool lists targets in its own order
        labels["__address__"] = labels["__address__"].replace(".7:", f".{7 + i}:").replace("::7]", f"::{7 + i}]")
    groups = [{"targets": [c["__address__"]],
               "labels": {k: v for k, v in c.items() if k not in ("__address__", "__scheme__", "__metrics_path__")}}
              for c in cases]
    (tmp_path / "targets.json").write_text(json.dumps(groups))
    job = {"job_name": "j", "file_sd_configs": [{"files": [str(tmp_path / "targets.json")]}],
           "relabel_configs": prometheus.service_endpoints_relabeling()}
    path = prometheus.dump({"scrape_configs": [job]}, tmp_path / "prometheus.yaml")
    done = subprocess.run(["promtool", "check", "service-discovery", "--timeout=2s", str(path), "j"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    keep = ("__address__", "__scheme__", "__metrics_path__", "namespace", "service", "pod", "node")
    got = {t["discoveredLabels"]["__address__"]: {k: v for k, v in t["labels"].items() if k in keep} or None
           for t in json.loads(done.stdout)}
    want = {c["__address__"]: _relabel(prometheus.service_endpoints_relabeling(), c) for c in cases}
    # promtool 2.42 shows a kept target's relabeled address as the discovered one too: key both by host.
    assert len(got) == len(cases)
    assert {a.rsplit(":", 1)[0]: v for a, v in got.items()} == {a.rsplit(":", 1)[0]: v for a, v in want.items()}
    assert sum(v is None for v in want.values()) == 2
