"""Which cluster and credentials gpufleet uses: decided once, in gpufleet.kube.config."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from gpufleet.kube import ConfigError, Kube
from gpufleet.kube.config import API_SERVER_ENV, api_server_override, from_text, load_config


def kubeconfig(server: str, user: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": user or {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}},
                         {"name": "other", "context": {"cluster": "c", "user": "u"}}]}


@pytest.fixture
def places(tmp_path):
    """An explicit file, a $KUBECONFIG file, a home kubeconfig and a mounted service account, each naming its server."""
    paths = {}
    for name in ("explicit", "env"):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(kubeconfig(f"https://{name}.example:6443")))
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text(yaml.safe_dump(kubeconfig("https://home.example:6443")))
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    return paths, {"HOME": str(home)}, sa


def test_sources_in_order(places):
    paths, env, sa = places
    pod = {**env, "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    load = lambda kc=None, environ=None, **kw: load_config(kc, environ=environ, in_cluster_dir=sa, **kw).server  # noqa: E731
    assert load(str(paths["explicit"]), {**pod, "KUBECONFIG": str(paths["env"])}) == "https://explicit.example:6443"
    assert load(None, {**pod, "KUBECONFIG": str(paths["env"])}) == "https://env.example:6443"
    assert load(None, pod) == "https://10.96.0.1:443"
    assert load(None, env) == "https://home.example:6443"
    # A context means a kubeconfig: not the pod's account.
    assert load(None, pod, context="other") == "https://home.example:6443"


def test_in_cluster_uses_the_token_and_the_api_server_override(places):
    _, env, sa = places
    cfg = load_config(environ={**env, "KUBERNETES_SERVICE_HOST": "10.96.0.1", API_SERVER_ENV: "https://10.0.0.5:6443"},
                      in_cluster_dir=sa)
    assert cfg.server == "https://10.0.0.5:6443" and API_SERVER_ENV in cfg.source
    assert cfg.configuration.get_api_key_with_prefix("BearerToken", alias="authorization") == "bearer pod-token"
    # No service network at all (no KUBERNETES_SERVICE_HOST): the override alone finds the API server.
    assert load_config(environ={**env, API_SERVER_ENV: "api.example"}, in_cluster_dir=sa).server == \
        "https://api.example:443"


@pytest.mark.parametrize("value, host, port", [("https://10.0.0.5:6443", "10.0.0.5", "6443"), ("10.0.0.5:6443", "10.0.0.5", "6443"),
                                               ("api.example", "api.example", "443"), ("https://[fd00::1]:6443", "fd00::1", "6443")])
def test_api_server_override_forms(value, host, port):
    assert api_server_override(value) == (host, port)


@pytest.mark.parametrize("value", ["http://10.0.0.5:6443", "https://", "10.0.0.5:http", "https://h:6443/path"])
def test_bad_api_server_override_is_named(value):
    with pytest.raises(ConfigError, match=rf"\${API_SERVER_ENV} .*expected https://host\[:port\]"):
        api_server_override(value)


def test_missing_and_broken_kubeconfigs_are_named(tmp_path):
    with pytest.raises(ConfigError, match=f"kubeconfig {tmp_path}/nope does not exist"):
        load_config(str(tmp_path / "nope"), environ={})
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Config\n")
    with pytest.raises(ConfigError, match=f"kubeconfig {broken}: "):
        load_config(str(broken), environ={})
    with pytest.raises(ConfigError, match="no kubeconfig: .*invoke local.kubeconfig"):
        load_config(environ={"HOME": str(tmp_path)})
    with pytest.raises(ConfigError, match="Secret ns/x: not YAML"):
        from_text("a: [", source="Secret ns/x")


def test_exec_credential_plugins_run(tmp_path):
    """Cloud kubeconfigs (EKS, GKE, AKS) get their token from an exec plugin."""
    credential = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": "from-plugin", "expirationTimestamp": "2099-01-01T00:00:00Z"}}
    plugin = {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
              "args": ["-c", f"print({json.dumps(json.dumps(credential))})"]}
    path = tmp_path / "cloud.yaml"
    path.write_text(yaml.safe_dump(kubeconfig("https://cloud.example:443", {"exec": plugin})))
    kube = Kube.from_kubeconfig(str(path))
    assert kube.server == "https://cloud.example:443"
    assert kube.config.configuration.get_api_key_with_prefix("BearerToken", alias="authorization") == "Bearer from-plugin"
