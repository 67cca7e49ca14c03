"""KEDA's local wiring (:mod:`gpufleet_workshop.local.keda`): where it runs and what routes to it (pure)."""

from __future__ import annotations

import base64
from types import SimpleNamespace

from gpufleet_workshop.local import dataplane, keda
from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.local.ports import Ports

PORTS = Ports(20000)


def _cluster(tmp_path):
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    return SimpleNamespace(name="c", ports=PORTS, pki=SimpleNamespace(ca=SimpleNamespace(cert=ca)))


def test_keda_sits_on_the_node_bridge_above_every_pod_and_beside_the_data_plane(tmp_path):
    c = _cluster(tmp_path)
    assert keda.address(c) == "10.244.0.251"
    assert realnode.POD_RANGE_END < keda.HOST_OCTET and keda.HOST_OCTET != dataplane.HOST_OCTET
    assert len(keda.netns_name("a-long-cluster-name")) <= 15
    assert keda.netns_name("c") != dataplane.netns_name("c")


def test_the_aggregator_reaches_the_adapter_by_an_external_name_that_is_its_address(tmp_path):
    c = _cluster(tmp_path)
    objs = {o["kind"]: o for o in keda.objects(c)}
    svc, api = objs["Service"], objs["APIService"]
    assert svc["spec"] == {"type": "ExternalName", "externalName": "10.244.0.251",
                           "ports": [{"name": "https", "port": keda.SECURE_PORT, "protocol": "TCP"}]}
    assert api["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert api["spec"]["service"] == {"namespace": "keda", "name": "keda-metrics-apiserver", "port": keda.SECURE_PORT}
    assert base64.b64decode(api["spec"]["caBundle"]) == c.pki.ca.cert.read_bytes()
    # The name the aggregator checks is on the certificate.
    assert f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc" in keda.SERVING_NAMES
    # The HPA controller may read external metrics under either identity kube-controller-manager uses.
    subjects = {s["name"] for s in objs["ClusterRoleBinding"]["subjects"]}
    assert subjects == {"horizontal-pod-autoscaler", "system:kube-controller-manager"}


def test_a_cluster_without_keda_forgets_its_apiservice_and_a_second_forget_is_fine(tmp_path):
    from gpufleet_workshop.testing import FakeKube
    from gpufleet_workshop.testing.fakekube import Kind

    k = FakeKube()
    k.register(Kind("apiregistration.k8s.io/v1", "APIService", "apiservices", namespaced=False, status=True))
    try:
        api = next(o for o in keda.objects(_cluster(tmp_path)) if o["kind"] == "APIService")
        k.add(api)
        keda.forget(k)
        assert k.get_or_none("apiregistration.k8s.io/v1", "apiservices", keda.API_SERVICE) is None
        keda.forget(k)
    finally:
        k.close()
