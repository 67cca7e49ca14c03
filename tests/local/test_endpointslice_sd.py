"""The local stand-in for Prometheus' EndpointSlice discovery (:mod:`gpufleet_workshop.local.endpointslice_sd`):
the target groups it writes, read through the scrape job's relabeling."""

from __future__ import annotations

import json
import re

from gpufleet_workshop.local import endpointslice_sd as sd
from gpufleet_workshop.local import prometheus


def _service(name: str = "chat", ns: str = "inference", **annotations: str) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "annotations": annotations}}


def _slice(name: str, endpoints: list[dict], service: str = "chat", ns: str = "inference", port: int = 8000) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "labels": {sd.SERVICE_NAME_LABEL: service}},
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}], "endpoints": endpoints}


def _endpoint(addr: str, pod: str | None, node: str | None, ready: bool | None = True) -> dict:
    ep: dict = {"addresses": [addr], "conditions": {} if ready is None else {"ready": ready}}
    if pod:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "inference"}
    if node:
        ep["nodeName"] = node
    return ep


def _relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str] | None:
    out = dict(labels)
    for r in rules:
        m = re.fullmatch(r.get("regex", "(.*)"), ";".join(out.get(s, "") for s in r["source_labels"]))
        if r["action"] == "keep" and not m:
            return None
        if r["action"] == "replace" and m:
            new = re.sub(r"\$(\d+)", lambda g: m.group(int(g.group(1))) or "", r.get("replacement", "$1"))
            if new:
                out[r["target_label"]] = new
    return {k: v for k, v in out.items() if not k.startswith("__meta_")}


def test_pods_inside_and_outside_are_targets_at_their_published_addresses_with_their_pod_and_node():
    svc = _service(**{"prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"})
    inside = _slice("chat-abc", [_endpoint("10.244.0.7", "chat-1", "gpufleet-system")])
    # A virtual kubelet's slice: the address its provider reports, the virtual node.
    outside = _slice("chat-vk-pool-a", [_endpoint("10.244.1.9", "chat-2", "vk-pool-a"),
                                        _endpoint("10.244.1.10", "chat-3", "vk-pool-a", ready=False)])
    groups = sd.target_groups([svc], [inside, outside])
    scraped = [_relabel(prometheus.service_endpoints_relabeling(),
                        {"__address__": g["targets"][0], "__scheme__": "http", "__metrics_path__": "/metrics",
                         **g["labels"]}) for g in groups]
    assert [s for s in scraped if s] == [
        {"__address__": "10.244.0.7:8000", "__scheme__": "http", "__metrics_path__": "/metrics",
         "namespace": "inference", "service": "chat", "pod": "chat-1", "node": "gpufleet-system"},
        {"__address__": "10.244.1.9:8000", "__scheme__": "http", "__metrics_path__": "/metrics",
         "namespace": "inference", "service": "chat", "pod": "chat-2", "node": "vk-pool-a"}]
    assert scraped[2] is None  # not ready: not scraped


def test_a_slice_without_its_service_and_an_unannotated_service_give_no_scraped_target():
    assert sd.target_groups([], [_slice("orphan", [_endpoint("10.0.0.1", "p", "n")])]) == []
    groups = sd.target_groups([_service()], [_slice("s", [_endpoint("10.0.0.1", "p", "n")])])
    assert len(groups) == 1
    assert _relabel(prometheus.service_endpoints_relabeling(), {"__address__": groups[0]["targets"][0],
                                                                **groups[0]["labels"]}) is None


def test_an_endpoint_with_no_ready_condition_counts_as_ready_as_the_api_says():
    # discovery.k8s.io/v1: a nil ready condition is interpreted as ready.
    [g] = sd.target_groups([_service()], [_slice("s", [_endpoint("fd00::7", None, None, ready=None)])])
    assert g["targets"] == ["[fd00::7]:8000"]
    assert g["labels"]["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] == "true"
    assert "__meta_kubernetes_pod_name" not in g["labels"]


def test_the_file_is_written_only_when_it_changes(tmp_path):
    path = tmp_path / "endpointslices.json"
    groups = sd.target_groups([_service()], [_slice("s", [_endpoint("10.0.0.1", "p", "n")])])
    assert sd.write_atomic(path, groups) is True
    assert sd.write_atomic(path, groups) is False
    assert json.loads(path.read_text()) == groups
    assert sd.write_atomic(path, []) is True and json.loads(path.read_text()) == []


def test_addresses_of_kwoks_pods_are_never_targets_a_scrape_would_leave_the_machine():
    from ipaddress import ip_network

    from gpufleet_workshop.local.kwok import POD_CIDR

    slices = [_slice("s", [_endpoint("10.128.0.5", "kwok-pod", "kwok-node"), _endpoint("10.244.0.7", "p", "n"),
                           _endpoint("not-an-ip", "q", "n")])]
    groups = sd.target_groups([_service()], slices, exclude=[ip_network(POD_CIDR)])
    assert [g["targets"] for g in groups] == [["10.244.0.7:8000"]]
