"""ConfigMaps and Secrets that pods outside reference: translation keeps the references, the reflector puts,
syncs and removes the provider's copies, the simulated rental waits for them, Secret data stays out of messages."""

from __future__ import annotations

import base64
import logging

import pytest

from gpufleet.kube import Forbidden, NotFound
from gpufleet.vk.pods import PodController
from gpufleet.vk.provider import ObjectRef, ProviderError, redact
from gpufleet.vk.providers.simulated import SimulatedProvider
from gpufleet.vk.reflect import MissingObjects, Reflector
from gpufleet.vk.translate import Reference, Refused, references, translate

H100 = "NVIDIA-H100-80GB-HBM3"
TOKEN = "s3cr3t-t0ken-value"


def pod(name="p", uid="u1", *, env=None, env_from=None, volumes=None, mounts=None) -> dict:
    container = {"name": "server", "image": "img:1", "resources": {"requests": {"nvidia.com/gpu": "1"}},
                 "env": env or [], "envFrom": env_from or [], "volumeMounts": mounts or []}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "uid": uid, "labels": {"app": "chat"},
                         "resourceVersion": "1"},
            "spec": {"containers": [container], "volumes": volumes or []}, "status": {"phase": "Pending"}}


def full_pod(name="p", uid="u1") -> dict:
    """A ConfigMap volume, env from a Secret key, envFrom a ConfigMap, a projected volume and the token volume."""
    return pod(name, uid,
               env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
                    {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "extra", "key": "k", "optional": True}}}],
               env_from=[{"configMapRef": {"name": "settings"}}],
               volumes=[{"name": "model", "configMap": {"name": "model-config"}},
                        {"name": "certs", "projected": {"sources": [{"secret": {"name": "tls"}},
                                                                    {"downwardAPI": {"items": []}}]}},
                        {"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}],
               mounts=[{"name": "model", "mountPath": "/etc/model"}, {"name": "certs", "mountPath": "/etc/tls"},
                       {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}])


# ------------------------------------------------------------------ translate


def test_translate_keeps_config_map_and_secret_references_and_lists_them():
    p = full_pod()
    out = translate(p, node_name="vk", namespace="remote-inference")
    spec = out["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["model", "certs"]  # the token volume still dropped
    c = spec["containers"][0]
    assert c["env"] == p["spec"]["containers"][0]["env"] and c["envFrom"] == [{"configMapRef": {"name": "settings"}}]
    assert [m["name"] for m in c["volumeMounts"]] == ["model", "certs"]
    assert references(p) == [Reference("ConfigMap", "extra", True), Reference("ConfigMap", "model-config"),
                             Reference("ConfigMap", "settings"), Reference("Secret", "api"), Reference("Secret", "tls")]


def test_an_object_referenced_both_optionally_and_not_is_not_optional():
    p = pod(env=[{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a", "optional": True}}}],
            env_from=[{"secretRef": {"name": "s"}}],
            volumes=[{"name": "v", "secret": {"secretName": "o", "optional": True}}])
    assert references(p) == [Reference("Secret", "o", True), Reference("Secret", "s", False)]


def test_projected_sources_of_this_cluster_are_refused():
    p = pod(volumes=[{"name": "aud", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "x"}}]}}])
    with pytest.raises(Refused, match="'aud': projected source serviceAccountToken"):
        translate(p, node_name="vk")


# ------------------------------------------------------------------ the reflector


class FakeKube:
    """The objects of one cluster, read with ``get`` as :class:`gpufleet.kube.Kube` does (NotFound, Forbidden)."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.forbidden: set[str] = set()
        self.rv = 0
        self.patches: list = []
        self.events: list = []

    KINDS = {"configmaps": "ConfigMap", "secrets": "Secret"}

    def put(self, plural: str, name: str, data: dict, namespace: str = "inference") -> None:
        self.rv += 1
        self.objects[(plural, namespace, name)] = {
            "apiVersion": "v1", "kind": self.KINDS[plural], "data": data,
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.rv)}}

    def get(self, api_version, plural, name, namespace=None, subresource=None):
        if plural in self.forbidden:
            raise Forbidden(403, "Forbidden", f"{plural} is forbidden")
        try:
            return self.objects[(plural, namespace, name)]
        except KeyError:
            raise NotFound(404, "NotFound", f'{plural} "{name}" not found') from None

    def patch(self, *args, **kwargs):
        self.patches.append((args, kwargs))
        return {}

    def create(self, api_version, plural, body, namespace=None, **kwargs):
        self.events.append(body)
        return {**body, "metadata": {**body.get("metadata", {}), "name": f"e{len(self.events)}"}}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def kube():
    k = FakeKube()
    for name in ("settings", "model-config"):
        k.put("configmaps", name, {"k": name})
    k.put("secrets", "api", {"token": b64(TOKEN)})
    k.put("secrets", "tls", {"tls.crt": b64("cert")})
    return k


def sim(**kw) -> SimulatedProvider:
    return SimulatedProvider("rental", gpus=8, gpu_product=H100, price_per_gpu_hour=1, node_name="vk-rental", **kw)


def test_objects_are_put_before_the_pod_synced_on_change_and_removed_with_the_last_pod(kube):
    prov = sim()
    r = Reflector(kube, "vk-rental", {"rental": prov}, watch=False)
    r.ensure(full_pod("a", "ua"), prov, starting=True)
    held = {o.name for o in prov.get_objects()}
    assert held == {"settings", "model-config", "api", "tls"}  # "extra" is optional and absent
    assert prov.get_object("Secret", "inference", "api")["payload"] == {"data": {"token": b64(TOKEN)}, "type": "Opaque"}
    version = prov.get_object("ConfigMap", "inference", "settings")["version"]
    r.ensure(full_pod("b", "ub"), prov, starting=True)  # a second pod: nothing new to put
    assert prov.get_object("ConfigMap", "inference", "settings")["version"] == version
    # A change here reaches the copy.
    kube.put("configmaps", "settings", {"k": "v2"})
    r.ensure(full_pod("a", "ua"), prov, starting=False)
    assert prov.get_object("ConfigMap", "inference", "settings")["payload"] == {"data": {"k": "v2"}}
    # An optional object that appears is reflected too.
    kube.put("configmaps", "extra", {"k": "x"})
    r.ensure(full_pod("a", "ua"), prov, starting=False)
    assert prov.get_object("ConfigMap", "inference", "extra") is not None
    # Deleted here: deleted there.
    del kube.objects[("configmaps", "inference", "extra")]
    r.ensure(full_pod("a", "ua"), prov, starting=False)
    assert prov.get_object("ConfigMap", "inference", "extra") is None
    # The first pod leaves: the second still references everything; the last leaves: nothing is left.
    r.release("ua")
    assert {o.name for o in prov.get_objects()} == held
    r.release("ub")
    assert prov.get_objects() == []


def test_a_missing_object_raises_names_it_and_puts_nothing(kube):
    prov = sim()
    r = Reflector(kube, "vk-rental", {"rental": prov}, watch=False)
    del kube.objects[("secrets", "inference", "api")]
    with pytest.raises(MissingObjects, match='secret "api" not found') as e:
        r.ensure(full_pod(), prov, starting=True)
    assert e.value.reason == "CreateContainerConfigError" and prov.get_objects() == []
    kube.forbidden.add("secrets")
    with pytest.raises(MissingObjects, match='secret "api" cannot be read: the virtual kubelet may not get secrets'):
        r.ensure(full_pod(), prov, starting=True)


def test_the_sweep_removes_copies_no_pod_references(kube):
    prov = sim()
    r = Reflector(kube, "vk-rental", {"rental": prov}, watch=False)
    r.ensure(full_pod("a", "ua"), prov, starting=True)
    prov.put_object("ConfigMap", "inference", {"metadata": {"name": "left-by-an-earlier-run"}, "data": {}})
    prov.put_object("ConfigMap", "inference", {"metadata": {"name": "of-a-pod-known-here"}, "data": {}})
    assert r.sweep(prov, live=[ObjectRef("ConfigMap", "inference", "of-a-pod-known-here")]) == 1
    assert {o.name for o in prov.get_objects()} == {"settings", "model-config", "api", "tls", "of-a-pod-known-here"}


def test_a_provider_without_objects_refuses_a_pod_that_references_some(kube):
    class Bare:
        name = "bare"

    r = Reflector(kube, "vk-rental", {"bare": Bare()}, watch=False)
    with pytest.raises(Refused, match="provider bare carries no ConfigMaps or Secrets"):
        r.ensure(full_pod(), Bare(), starting=True)
    r.ensure(pod(), Bare(), starting=True)  # references nothing: nothing to carry


# ------------------------------------------------------------------ the simulated rental


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_simulated_instance_waits_for_the_objects_its_pod_references():
    clock = Clock()
    prov = sim(start_latency_seconds=2, clock=clock, wall=lambda: 1_700_000_000.0)
    prov.create_pod(full_pod())
    clock.t = 5
    status = prov.get_pod_status("inference", "p")
    assert status["phase"] == "Pending"
    assert status["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    for kind, name in (("ConfigMap", "model-config"), ("ConfigMap", "settings"), ("Secret", "api")):
        prov.put_object(kind, "inference", {"metadata": {"name": name}, "data": {}})
    assert prov.get_pod_status("inference", "p")["phase"] == "Pending"  # tls is still missing
    prov.put_object("Secret", "inference", {"metadata": {"name": "tls"}, "data": {}})
    clock.t = 6.9
    assert prov.get_pod_status("inference", "p")["phase"] == "Pending"
    clock.t = 7
    assert prov.get_pod_status("inference", "p")["phase"] == "Running"


# ------------------------------------------------------------------ Secret data stays out of messages


def test_redact_removes_a_secrets_values_encoded_and_decoded():
    secret = {"kind": "Secret", "data": {"token": b64(TOKEN)}, "stringData": {"pw": "hunter2"}}
    text = f"refused: {b64(TOKEN)} / {TOKEN} / hunter2 / data.token"
    assert redact(text, secret) == "refused: <redacted> / <redacted> / <redacted> / data.token"
    assert redact(TOKEN, {"kind": "ConfigMap", "data": {"k": TOKEN}}) == TOKEN


def test_a_pod_waiting_for_a_secret_stays_pending_and_no_message_carries_secret_data(kube, caplog):
    """The pod side: missing Secret -> Pending, containers waiting, one Event naming it; once it exists the pod is
    created; a provider failing to store it leaves no Secret data in logs, Events or status."""
    caplog.set_level(logging.DEBUG)
    prov = sim()
    ctl = PodController(kube, "vk-rental", {"rental": prov}, publish_endpoints=False)
    ctl.reflector.watch = False
    p = full_pod()
    p["metadata"]["resourceVersion"] = "1"
    del kube.objects[("secrets", "inference", "api")]
    assert ctl._create(p) is not None  # requeued, not failed
    ((args, kwargs),) = kube.patches
    status = args[3]["status"]
    assert status["phase"] == "Pending" and "startTime" not in status
    assert status["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    assert 'secret "api" not found' in status["containerStatuses"][0]["state"]["waiting"]["message"]
    (event,) = kube.events
    assert event["reason"] == "CreateContainerConfigError" and 'secret "api" not found' in event["message"]
    assert prov.get_pods() == []
    # The Secret appears, but the provider refuses to store it, quoting it (as an API server's validation might).
    kube.put("secrets", "api", {"token": b64(TOKEN)})
    real_put = prov.put_object

    def refusing(kind, namespace, obj):
        if kind == "Secret":
            raise ProviderError(redact(f"invalid value {base64.b64decode(obj['data'].get('token', '')).decode()}", obj),
                                reason="ProviderUnavailable", retryable=True)
        return real_put(kind, namespace, obj)

    prov.put_object = refusing
    assert ctl._create(p) is not None  # retried
    assert "invalid value <redacted>" in kube.events[-1]["message"]
    prov.put_object = real_put
    assert ctl._create(p) is None and len(prov.get_pods()) == 1
    everything = caplog.text + repr(kube.events) + repr(kube.patches)
    assert TOKEN not in everything and b64(TOKEN) not in everything


def test_after_a_restart_the_resync_keeps_the_copies_running_pods_reference_and_sweeps_the_rest(kube):
    prov = sim()
    first = PodController(kube, "vk-rental", {"rental": prov}, publish_endpoints=False)
    first.reflector.watch = False
    assert first._create(full_pod("a", "ua")) is None and len(prov.get_pods()) == 1
    prov.put_object("ConfigMap", "inference", {"metadata": {"name": "of-a-pod-gone-meanwhile"}, "data": {}})
    # A new process: nothing registered; the pod, still here, runs at the provider.
    again = PodController(kube, "vk-rental", {"rental": prov}, publish_endpoints=False)
    again.reflector.watch = False
    again.pods.apply("ADDED", full_pod("a", "ua"))
    again.pods.synced.set()
    again.resync()
    assert {o.name for o in prov.get_objects()} == {"settings", "model-config", "api", "tls"}


# ------------------------------------------------------------------ optional objects the pod starts without


OPTIONAL = {
    "configMapKeyRef": dict(env=[{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "opt", "key": "a",
                                                                                 "optional": True}}}]),
    "secretKeyRef": dict(env=[{"name": "A", "valueFrom": {"secretKeyRef": {"name": "opt", "key": "a",
                                                                           "optional": True}}}]),
    "envFrom": dict(env_from=[{"configMapRef": {"name": "opt", "optional": True}}]),
    "volume": dict(volumes=[{"name": "v", "secret": {"secretName": "opt", "optional": True}}],
                   mounts=[{"name": "v", "mountPath": "/etc/opt"}]),
}


def test_the_reflector_names_the_optional_objects_a_pod_starts_without(kube):
    prov = sim()
    r = Reflector(kube, "vk-rental", {"rental": prov}, watch=False)
    (u,) = r.ensure(full_pod("a", "ua"), prov, starting=True)
    assert (u.ref, u.namespace, u.why, u.forbidden) == (Reference("ConfigMap", "extra", True), "inference",
                                                        "not found", False)
    assert u.reason == "OptionalObjectNotFound"
    assert r.ensure(full_pod("a", "ua"), prov, starting=False) == []  # running: nothing to say again
    del kube.objects[("secrets", "inference", "api")]
    with pytest.raises(MissingObjects):  # a required one missing: the pod waits, the optional one is not its news
        r.ensure(full_pod("b", "ub"), prov, starting=True)


@pytest.mark.parametrize("shape", sorted(OPTIONAL))
def test_an_absent_optional_object_gives_a_warning_event_and_the_pod_starts_without_it(kube, shape):
    prov = sim()
    ctl = PodController(kube, "vk-rental", {"rental": prov}, publish_endpoints=False)
    ctl.reflector.watch = False
    p = pod(**OPTIONAL[shape])
    assert ctl._create(p) is None and len(prov.get_pods()) == 1
    (event,) = kube.events
    kind = "secret" if shape in ("secretKeyRef", "volume") else "configmap"
    assert (event["type"], event["reason"]) == ("Warning", "OptionalObjectNotFound")
    assert event["involvedObject"]["kind"] == "Pod" and event["involvedObject"]["name"] == "p"
    assert event["message"] == (f'optional {kind} "opt" not found in namespace inference: the pod starts without it, '
                                "as it would under a kubelet")


def test_an_optional_object_the_virtual_kubelet_may_not_read_gives_a_warning_event_saying_so(kube):
    prov = sim()
    ctl = PodController(kube, "vk-rental", {"rental": prov}, publish_endpoints=False)
    ctl.reflector.watch = False
    kube.put("secrets", "opt", {"a": b64("x")})
    kube.forbidden.add("secrets")
    p = pod(**OPTIONAL["volume"])
    assert ctl._create(p) is None and len(prov.get_pods()) == 1 and prov.get_objects() == []
    (event,) = kube.events
    assert (event["type"], event["reason"]) == ("Warning", "OptionalObjectForbidden")
    assert event["message"].startswith('optional secret "opt" cannot be read: the virtual kubelet may not get secrets '
                                       "in namespace inference (its role's RBAC); the pod starts without it, where a "
                                       "kubelet")
    ctl.pods.apply("ADDED", p)
    assert ctl._reconcile("inference/p") is None  # running there now: no second Event
    assert len(kube.events) == 1
