"""Which kubeconfig the tasks use, and the error when there is none."""

from __future__ import annotations

import pytest
import yaml

from gpufleet_workshop.local.layout import DEFAULT_NAME, Layout
from gpufleet.ops.reads import InputError
from gpufleet_workshop.tasks.common import kube_for


def _kubeconfig(server: str) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}


@pytest.fixture
def no_kubeconfig(tmp_path, monkeypatch):
    """No $KUBECONFIG, not in a pod, an empty home, an empty gpufleet state folder."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("GPUFLEET_API_SERVER", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFLEET_STATE", str(tmp_path / "state"))
    return tmp_path


def test_no_kubeconfig_anywhere_says_where_it_looked_and_what_to_do(no_kubeconfig):
    with pytest.raises(InputError, match=r"no kubeconfig: --kubeconfig not given, \$KUBECONFIG unset and "
                                         r"~/.kube/config missing.*invoke local.kubeconfig"):
        kube_for("prod")


def test_env_local_uses_the_local_clusters_kubeconfig(no_kubeconfig):
    path = Layout(DEFAULT_NAME).kubeconfig
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(_kubeconfig("https://127.0.0.1:20001")))
    assert kube_for("local").server == "https://127.0.0.1:20001"
    with pytest.raises(InputError, match="no kubeconfig"):
        kube_for("prod")  # only the local environment means the local cluster


def test_explicit_kubeconfig_wins_and_a_broken_one_is_named(no_kubeconfig, monkeypatch):
    mine = no_kubeconfig / "mine.yaml"
    mine.write_text(yaml.safe_dump(_kubeconfig("https://10.0.0.1:6443")))
    assert kube_for("local", str(mine)).server == "https://10.0.0.1:6443"
    monkeypatch.setenv("KUBECONFIG", str(mine))
    assert kube_for("local").server == "https://10.0.0.1:6443"
    broken = no_kubeconfig / "broken.yaml"
    broken.write_text("kind: Config\n")
    with pytest.raises(InputError, match=f"kubeconfig {broken}: "):
        kube_for(None, str(broken))
