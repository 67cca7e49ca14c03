"""ConfigMaps and Secrets that pods outside reference: translation keeps the references, the reflector puts,
syncs and removes the provider's copies, the simulated rental waits for them, Secret data stays out of messages."""

from __future__ import annotations

import base64
import copy
import logging

import pytest

from gpufleet.kube import Forbidden
from gpufleet.names import FOREIGN_OBJECT_REASON
from gpufleet.virtual_kubelet.pods import PodController
from gpufleet.virtual_kubelet.provider import ObjectRef, ProviderError, redact
from gpufleet.virtual_kubelet.providers.kubernetes import KubernetesProvider, copy_name
from gpufleet_workshop.rental.provider import SimulatedProvider
from gpufleet.virtual_kubelet.reflect import MissingObjects, Reflector
from gpufleet_workshop.testing import FakeKube
from gpufleet.virtual_kubelet.translate import Reference, Refused, references, translate

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


class Cluster(FakeKube):
    """The shared in-memory API server (:mod:`gpufleet_workshop.testing`) with this module's shorthands."""

    KINDS = {"configmaps": "ConfigMap", "secrets": "Secret", "services": "Service", "pods": "Pod"}

    def put(self, plural: str, name: str, data: dict, namespace: str = "inference") -> dict:
        """Store (or change) an object with ``data``, as someone else would write it."""
        obj = self.object(plural, name, namespace) or {"apiVersion": "v1", "kind": self.KINDS[plural],
                                                       "metadata": {"name": name, "namespace": namespace}}
        obj["data"] = data
        return self.add_one(obj)

    @property
    def stored(self) -> dict[tuple[str, str, str], dict]:
        """``(plural, namespace, name)`` -> a copy of every stored object of :attr:`KINDS`."""
        return {(p, o["metadata"]["namespace"], o["metadata"]["name"]): o for p in self.KINDS for o in self.objects(p)}

    def forbid(self, plural: str) -> None:
        """Refuse every GET of ``plural`` as RBAC would."""
        self.fail("get", plural, Forbidden(403, "Forbidden", f"{plural} is forbidden"), times=None)

    @property
    def patches(self) -> list:
        """Every PATCH sent (refused ones included), in order."""
        return [a for a in self.actions if a.verb == "patch"]

    @property
    def events(self) -> list[dict]:
        """The Events created, as sent, in order."""
        return [a.body for a in self.writes() if a.resource == "events" and a.verb == "create"]

    def object_writes(self) -> list:
        """Writes of anything but Events and Namespaces (the provider makes sure its namespace exists)."""
        return [(a.verb, a.resource, a.namespace, a.name) for a in self.writes()
                if a.resource not in ("events", "namespaces")]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def kube():
    k = Cluster()
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
    kube.remove("configmaps", "extra", "inference")
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
    kube.remove("secrets", "api", "inference")
    with pytest.raises(MissingObjects, match='secret "api" not found') as e:
        r.ensure(full_pod(), prov, starting=True)
    assert e.value.reason == "CreateContainerConfigError" and prov.get_objects() == []
    kube.forbid("secrets")
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
    kube.remove("secrets", "api", "inference")
    p = kube.add_one(p)  # the pod the controller writes the status of
    assert ctl._create(p) is not None  # requeued, not failed
    (patch,) = kube.patches
    status = patch.body["status"]
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
    kube.add_one(full_pod("a", "ua"))
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
    kube.remove("secrets", "api", "inference")
    with pytest.raises(MissingObjects):  # a required one missing: the pod waits, the optional one is not its news
        r.ensure(full_pod("b", "ub"), prov, starting=True)


@pytest.mark.parametrize("shape", sorted(OPTIONAL))
def test_an_absent_optional_object_gives_a_warning_event_and_the_pod_starts_without_it(kube, shape):
    prov = sim()
    ctl = PodController(kube, "vk-rental", {"rental": prov}, publish_endpoints=False)
    ctl.reflector.watch = False
    p = pod(**OPTIONAL[shape])
    p = kube.add_one(p)  # the pod the controller writes the status of
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
    kube.forbid("secrets")
    p = pod(**OPTIONAL["volume"])
    p = kube.add_one(p)  # the pod the controller writes the status of
    assert ctl._create(p) is None and len(prov.get_pods()) == 1 and prov.get_objects() == []
    (event,) = kube.events
    assert (event["type"], event["reason"]) == ("Warning", "OptionalObjectForbidden")
    assert event["message"].startswith('optional secret "opt" cannot be read: the virtual kubelet may not get secrets '
                                       "in namespace inference (its role's RBAC); the pod starts without it, where a "
                                       "kubelet")
    ctl.pods.apply("ADDED", p)
    assert ctl._reconcile("inference/p") is None  # running there now: no second Event
    assert len(kube.events) == 1


# ------------------------------------------------------------------ the kubernetes provider's copies: its own or untouched


def kprov(remote: Cluster, pool: str = "other") -> KubernetesProvider:
    """A kubernetes provider whose remote API server is ``remote`` (not started: no watch needed here)."""
    return KubernetesProvider(pool, remote, node_name=f"vk-{pool}", gpus=8, gpu_product=H100, price_per_gpu_hour=1)


def foreign(remote: Cluster, plural: str, name: str, data: dict, namespace: str = "inference") -> dict:
    """An object someone else owns in the remote cluster."""
    return remote.add_one({"apiVersion": "v1", "kind": Cluster.KINDS[plural], "data": data,
                           "metadata": {"name": name, "namespace": namespace, "uid": f"foreign-{name}"}})


def test_translate_renames_every_reference_to_the_providers_copies():
    p = full_pod()
    p["spec"]["initContainers"] = [{"name": "init", "image": "i", "envFrom": [{"secretRef": {"name": "api"}}]}]
    out = translate(p, node_name="vk", rename=lambda kind, name: f"gf-x.{name}")
    spec, c = out["spec"], out["spec"]["containers"][0]
    assert spec["volumes"][0]["configMap"]["name"] == "gf-x.model-config"
    assert spec["volumes"][1]["projected"]["sources"][0]["secret"]["name"] == "gf-x.tls"
    assert c["envFrom"] == [{"configMapRef": {"name": "gf-x.settings"}}]
    assert [e["valueFrom"] for e in c["env"]] == [
        {"secretKeyRef": {"name": "gf-x.api", "key": "token"}},
        {"configMapKeyRef": {"name": "gf-x.extra", "key": "k", "optional": True}}]
    assert spec["initContainers"][0]["envFrom"] == [{"secretRef": {"name": "gf-x.api"}}]
    assert references(p)[1] == Reference("ConfigMap", "model-config")  # the source pod is left as it was


def test_copy_names_are_per_pool_and_fit_a_dns_subdomain():
    assert copy_name("other", "kube-root-ca.crt") == "gf-other.kube-root-ca.crt"
    long = copy_name("other", "x" * 253)
    assert len(long) == 253 and long != copy_name("other", "x" * 252) and long.startswith("gf-other.xxx")


def test_copies_go_under_the_pools_names_and_the_remote_clusters_own_objects_are_not_touched():
    remote = Cluster()
    ca = foreign(remote, "configmaps", "kube-root-ca.crt", {"ca.crt": "remote CA"})
    mine = foreign(remote, "configmaps", "settings", {"k": "someone else's"})
    prov = kprov(remote)
    prov.put_object("ConfigMap", "inference", {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "our CA"}})
    prov.put_object("ConfigMap", "inference", {"metadata": {"name": "settings"}, "data": {"k": "v1"}})
    prov.put_object("ConfigMap", "inference", {"metadata": {"name": "settings"}, "data": {"k": "v2"}})  # an update
    assert remote.stored[("configmaps", "inference", "kube-root-ca.crt")] == ca
    assert remote.stored[("configmaps", "inference", "settings")] == mine
    copy_ = remote.stored[("configmaps", "inference", "gf-other.settings")]
    assert copy_["data"] == {"k": "v2"}
    assert copy_["metadata"]["labels"] == {"gpufleet.io/reflected-for": "vk-other", "gpufleet.io/managed-by": "virtual-kubelet"}
    assert remote.stored[("configmaps", "inference", "gf-other.kube-root-ca.crt")]["data"] == {"ca.crt": "our CA"}
    assert sorted(o.name for o in prov.get_objects()) == ["kube-root-ca.crt", "settings"]
    prov.delete_object("ConfigMap", "inference", "settings")
    prov.delete_object("ConfigMap", "inference", "kube-root-ca.crt")
    assert set(remote.stored) == {("configmaps", "inference", "kube-root-ca.crt"), ("configmaps", "inference", "settings")}
    assert remote.stored[("configmaps", "inference", "kube-root-ca.crt")] == ca


def test_an_object_gpufleet_does_not_own_at_a_copys_name_is_neither_written_nor_deleted():
    remote = Cluster()
    theirs = foreign(remote, "secrets", "gf-other.api", {"token": b64("theirs")})
    prov = kprov(remote)
    with pytest.raises(ProviderError) as exc:
        prov.put_object("Secret", "inference", {"metadata": {"name": "api"}, "data": {"token": b64(TOKEN)}})
    assert exc.value.reason == FOREIGN_OBJECT_REASON and not exc.value.retryable
    assert "Secret inference/gf-other.api" in str(exc.value) and "left untouched" in str(exc.value)
    assert TOKEN not in str(exc.value) and b64(TOKEN) not in str(exc.value)
    prov.delete_object("Secret", "inference", "api")
    assert prov.get_objects() == []
    assert remote.stored[("secrets", "inference", "gf-other.api")] == theirs and remote.object_writes() == []


def test_a_copy_taken_over_by_another_pool_is_foreign_to_this_one():
    remote = Cluster()
    a = kprov(remote, "a")
    a.put_object("ConfigMap", "inference", {"metadata": {"name": "settings"}, "data": {"k": "v"}})
    remote.modify("configmaps", "gf-a.settings", "inference",
                  lambda o: o["metadata"]["labels"].update({"gpufleet.io/reflected-for": "vk-b"}))
    with pytest.raises(ProviderError, match="is the copy of virtual node vk-b: left untouched"):
        a.put_object("ConfigMap", "inference", {"metadata": {"name": "settings"}, "data": {"k": "v2"}})
    a.delete_object("ConfigMap", "inference", "settings")
    assert remote.stored[("configmaps", "inference", "gf-a.settings")]["data"] == {"k": "v"}


def test_two_pools_sharing_a_remote_namespace_never_remove_each_others_copies():
    remote = Cluster()
    a, b = kprov(remote, "a"), kprov(remote, "b")
    for prov, value in ((a, "of a"), (b, "of b")):
        prov.put_object("ConfigMap", "inference", {"metadata": {"name": "settings"}, "data": {"k": value}})
    assert a.get_objects() == [ObjectRef("ConfigMap", "inference", "settings")] == b.get_objects()
    a.delete_object("ConfigMap", "inference", "settings")
    assert ("configmaps", "inference", "gf-a.settings") not in remote.stored
    assert remote.stored[("configmaps", "inference", "gf-b.settings")]["data"] == {"k": "of b"}
    # b's sweep, with no pod of b left, removes b's copy and nothing else.
    foreign(remote, "configmaps", "settings", {"k": "theirs"})
    assert Reflector(Cluster(), "vk-b", {"b": b}, watch=False).sweep(b) == 1
    assert set(remote.stored) == {("configmaps", "inference", "settings")}


def test_writes_and_deletes_are_preconditioned_on_what_was_checked(monkeypatch):
    remote = Cluster()
    prov = kprov(remote)
    prov.put_object("ConfigMap", "inference", {"metadata": {"name": "settings"}, "data": {"k": "v"}})
    checked = copy.deepcopy(remote.stored[("configmaps", "inference", "gf-other.settings")])
    # Replaced by someone else's object between the check and the delete: the UID precondition refuses.
    remote.remove("configmaps", "gf-other.settings", "inference")
    theirs = foreign(remote, "configmaps", "gf-other.settings", {"k": "theirs"})
    monkeypatch.setattr(remote, "get_or_none", lambda *a, **k: checked)
    with pytest.raises(ProviderError) as exc:
        prov.delete_object("ConfigMap", "inference", "settings")
    assert exc.value.retryable
    with pytest.raises(ProviderError) as exc:  # and the apply's resourceVersion precondition
        prov.put_object("ConfigMap", "inference", {"metadata": {"name": "settings"}, "data": {"k": "v2"}})
    assert exc.value.retryable
    assert remote.stored[("configmaps", "inference", "gf-other.settings")] == theirs


def test_a_foreign_object_in_the_way_fails_the_pod_with_the_reason_and_a_warning_event(kube):
    remote = Cluster()
    foreign(remote, "configmaps", "gf-other.settings", {"k": "theirs"})
    prov = kprov(remote)
    ctl = PodController(kube, "vk-other", {"other": prov}, publish_endpoints=False)
    ctl.reflector.watch = False
    p = full_pod()
    p = kube.add_one(p)  # the pod the controller writes the status of
    assert ctl._create(p) is None  # failed, not retried
    status = kube.patches[-1].body["status"]
    assert (status["phase"], status["reason"]) == ("Failed", FOREIGN_OBJECT_REASON)
    assert "ConfigMap inference/gf-other.settings" in status["message"]
    (event,) = [e for e in kube.events if e["reason"] == FOREIGN_OBJECT_REASON]
    assert event["type"] == "Warning" and "left untouched" in event["message"]
    assert remote.stored[("configmaps", "inference", "gf-other.settings")]["data"] == {"k": "theirs"}


def test_a_workloads_last_pod_going_deletes_only_this_nodes_remote_service_by_its_uid():
    remote = Cluster()
    prov = KubernetesProvider("other", remote, node_name="vk-other", gpus=8, gpu_product=H100, price_per_gpu_hour=1,
                              address_mode="load_balancer")
    theirs = foreign(remote, "services", "gf-chat", {})
    gone = {"metadata": {"name": "p", "namespace": "inference", "uid": "r1",
                         "labels": {"gpufleet.io/remote-service": "gf-chat"}}}
    prov._release_service(full_pod(), gone)
    assert remote.stored[("services", "inference", "gf-chat")] == theirs and remote.object_writes() == []
    remote.modify("services", "gf-chat", "inference",
                  lambda o: o["metadata"].update(labels={"gpufleet.io/virtual-node": "vk-other"}))
    prov._release_service(full_pod(), gone)
    assert ("services", "inference", "gf-chat") not in remote.stored
