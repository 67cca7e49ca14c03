"""The virtual node's kubelet API: HTTPS with its own certificate, callers authenticated by client certificate
or TokenReview, authorized by SubjectAccessReview on nodes/<subresource>, answers as the kubelet's."""

from __future__ import annotations

import datetime
import http.client
import json
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufleet.kube import ServerError
from gpufleet.virtual_kubelet.kubelet_api import KubeletApi, subresources_for
from gpufleet.virtual_kubelet.stats import ContainerStats, PodStats
from gpufleet_workshop.testing import FakeKube

NODE = "vk-rental"
T0 = 1_800_000_000.0


def _cert(cn: str, orgs: list[str], issuer: tuple | None = None):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                         *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs)])
    signer_name, signer_key = (subject, key) if issuer is None else (issuer[0].subject, issuer[1])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(signer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(hours=1)))
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return builder.sign(signer_key, hashes.SHA256()), key


def _pem(cert, key, tmp_path, name):
    c, k = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return str(c), str(k)


@pytest.fixture
def setup(tmp_path):
    ca = _cert("kubernetes-ca", [])
    kube = FakeKube({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                     "data": {"client-ca-file": ca[0].public_bytes(serialization.Encoding.PEM).decode()}})
    reviews = {"tokens": [], "access": []}
    tokens = {"good-token": {"username": "system:serviceaccount:monitoring:metrics-server",
                             "groups": ["system:serviceaccounts"]},
              "weak-token": {"username": "system:serviceaccount:default:nobody", "groups": []}}
    allowed = {("system:serviceaccount:monitoring:metrics-server", "metrics"),
               ("system:serviceaccount:monitoring:metrics-server", "stats"), ("system:kube-apiserver", "stats")}

    def token_review(a):
        reviews["tokens"].append(a.body["spec"]["token"])
        user = tokens.get(a.body["spec"]["token"])
        return {**a.body, "status": {"authenticated": user is not None, **({"user": user} if user else {})}}

    def access_review(a):
        reviews["access"].append(a.body["spec"])
        attrs = a.body["spec"]["resourceAttributes"]
        ok = attrs["name"] == NODE and (a.body["spec"]["user"], attrs["subresource"]) in allowed
        return {**a.body, "status": {"allowed": ok}}

    kube.prepend_reactor("create", "tokenreviews", token_review)
    kube.prepend_reactor("create", "subjectaccessreviews", access_review)
    stats = [PodStats("inference", "chat-1", "u1", (ContainerStats("server", 3.25, 50 << 20, T0 - 60, T0),))]
    source = {"stats": lambda: (stats, False)}
    api = KubeletApi(kube, NODE, lambda: source["stats"](), port=0, host_ip="127.0.0.1",
                     cert_dir=tmp_path / "serving").start()
    server_ctx = ssl.create_default_context(cafile=str(tmp_path / "serving" / "kubelet.crt"))
    try:
        api.source = source  # a test may swap what the provider reports
        yield api, ca, server_ctx, reviews, tmp_path
    finally:
        api.stop()
        kube.close()


def get(api, ctx, path, token=None, method="GET", body=None, authorization=None):
    conn = http.client.HTTPSConnection("127.0.0.1", api.port, context=ctx, timeout=10)
    headers = {"Authorization": authorization or f"Bearer {token}"} if token or authorization else {}
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_paths_are_authorized_as_the_kubelet_maps_them():
    got = [subresources_for(p) for p in ("/stats/summary", "/stats", "/statsfoo", "/metrics/resource", "/logs/",
                                         "/pods", "/healthz", "/exec/x")]
    assert got == [("stats",), ("stats",), ("proxy",), ("metrics",), ("log",), ("pods", "proxy"),
                   ("healthz", "proxy"), ("proxy",)]


def test_no_credentials_is_401_and_a_token_is_reviewed_once_then_cached(setup):
    api, _, ctx, reviews, _ = setup
    assert get(api, ctx, "/metrics/resource")[0] == 401
    assert get(api, ctx, "/metrics/resource", "forged")[0] == 401
    status, body = get(api, ctx, "/metrics/resource", "good-token")
    assert status == 200
    assert b'container_cpu_usage_seconds_total{container="server",namespace="inference",pod="chat-1"} 3.25' in body
    assert reviews["access"][-1]["resourceAttributes"] == {"verb": "get", "version": "v1", "resource": "nodes",
                                                          "subresource": "metrics", "name": NODE}
    assert get(api, ctx, "/metrics/resource", "good-token")[0] == 200
    assert reviews["tokens"].count("good-token") == 1 and len(reviews["access"]) == 1


def test_a_caller_without_the_right_is_403_naming_user_verb_and_subresource(setup):
    api, _, ctx, _, _ = setup
    status, body = get(api, ctx, "/stats/summary", "weak-token")
    assert status == 403
    assert body == (b"Forbidden (user=system:serviceaccount:default:nobody, verb=get, resource=nodes, "
                    b"subresource(s)=[stats])\n")


def test_a_client_certificate_of_the_cluster_ca_authenticates_another_ca_is_refused(setup):
    api, ca, server_ctx, reviews, tmp_path = setup
    cert, key = _cert("system:kube-apiserver", ["system:masters"], issuer=ca)
    server_ctx.load_cert_chain(*_pem(cert, key, tmp_path, "apiserver"))
    status, body = get(api, server_ctx, "/stats/summary")
    assert status == 200
    doc = json.loads(body)
    assert doc["node"]["nodeName"] == NODE and doc["pods"][0]["podRef"]["name"] == "chat-1"
    assert reviews["access"][-1]["user"] == "system:kube-apiserver" and reviews["access"][-1]["groups"] == ["system:masters"]
    assert not reviews["tokens"]
    other = _cert("other-ca", [])
    stranger = _cert("system:kube-apiserver", ["system:masters"], issuer=other)
    ctx = ssl.create_default_context(cafile=str(tmp_path / "serving" / "kubelet.crt"))
    ctx.load_cert_chain(*_pem(*stranger, tmp_path, "stranger"))
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
        get(api, ctx, "/stats/summary")


def test_the_serving_certificate_names_the_node_and_its_ip(setup):
    api, _, _, _, tmp_path = setup
    cert = x509.load_pem_x509_certificate((tmp_path / "serving" / "kubelet.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert NODE in sans.get_values_for_type(x509.DNSName)
    assert [str(i) for i in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert oct((tmp_path / "serving" / "kubelet.key").stat().st_mode & 0o777) == "0o600"


def test_reviews_that_fail_answer_as_the_kubelet_does(setup):
    api, _, ctx, _, _ = setup
    kube = api.kube
    kube.fail("create", "subjectaccessreviews", ServerError(503, "ServiceUnavailable", "etcd is down"))
    status, body = get(api, ctx, "/stats/summary", "good-token")
    assert status == 500 and body.startswith(b"Authorization error (user=system:serviceaccount:monitoring:")
    kube.fail("create", "tokenreviews", ServerError(503, "ServiceUnavailable", "etcd is down"))
    assert get(api, ctx, "/stats/summary", "another-token")[0] == 401


def test_what_goes_wrong_inside_is_a_500_and_other_methods_are_refused_after_authentication(setup):
    api, _, ctx, _, _ = setup

    def broken():
        raise RuntimeError("the provider's client is gone")

    api.source["stats"] = broken
    assert get(api, ctx, "/metrics/resource", "good-token") == (500, b"Internal Server Error")
    assert get(api, ctx, "/healthz", method="POST")[0] == 401
    assert get(api, ctx, "/healthz", "good-token", method="POST", body=b"x")[0] == 405


def test_a_body_is_never_read_as_the_next_request_and_bearer_is_parsed_as_the_kubelet_parses_it(setup):
    api, _, ctx, reviews, _ = setup
    smuggled = b"GET /stats/summary HTTP/1.1\r\nHost: x\r\n\r\n"
    conn = http.client.HTTPSConnection("127.0.0.1", api.port, context=ctx, timeout=10)
    conn.request("GET", "/healthz", body=smuggled)
    assert conn.getresponse().status == 401
    conn.close()
    assert get(api, ctx, "/healthz", authorization="Bearer  good-token")[0] == 401  # two spaces: an empty token
    assert get(api, ctx, "/stats/summary", authorization="Bearer good-token extra")[0] == 200
    assert reviews["tokens"] == ["good-token"]


def test_a_review_answered_in_the_wrong_types_is_not_believed(setup):
    api, _, ctx, _, _ = setup
    api.kube.prepend_reactor("create", "tokenreviews", lambda a: {**a.body, "status": {
        "authenticated": "true", "user": {"username": "mallory", "groups": "system:masters"}}})
    assert get(api, ctx, "/stats/summary", "odd-token")[0] == 401


def test_a_client_ca_that_is_not_pem_leaves_tokens_working(tmp_path, caplog):
    kube = FakeKube({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                     "data": {"client-ca-file": "-----BEGIN CERTIFICATE-----\njunk\n-----END CERTIFICATE-----\n"}})
    api = KubeletApi(kube, NODE, lambda: ([], False), port=0, cert_dir=tmp_path / "s").start()
    try:
        assert "is not a PEM CA bundle" in caplog.text
    finally:
        api.stop()
        kube.close()
