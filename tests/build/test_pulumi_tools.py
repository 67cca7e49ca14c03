"""The Pulumi CLI/provider build modules and the engine's settings, without building or running anything."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet_admin.build import gobuild
from gpufleet.paths import REPO_ROOT
from gpufleet_admin.build import pulumi as tools
from gpufleet_admin.stack import engine

PKG_GOMOD = """module github.com/pulumi/pulumi/pkg/v3

go 1.26.6

replace github.com/pulumi/pulumi/sdk/v3 => ../sdk

replace github.com/atotto/clipboard => github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e

replace (
\tgithub.com/example/fork v1.0.0 => github.com/example/fork2 v1.0.1 // a comment
)

require (
\tgithub.com/pulumi/pulumi/sdk/v3 v3.274.1
)
"""


def test_upstream_replaces_reads_both_forms() -> None:
    assert gobuild.parse_replaces(PKG_GOMOD) == [
        ("github.com/pulumi/pulumi/sdk/v3", "../sdk", ""),
        ("github.com/atotto/clipboard", "github.com/tgummerer/clipboard", "v0.0.0-20241001131231-d02d263e614e"),
        ("github.com/example/fork", "github.com/example/fork2", "v1.0.1"),
    ]


def test_cli_build_module_requires_the_sibling_sdk_and_copies_forks() -> None:
    files = tools.build_files(tools.cli(), PKG_GOMOD)
    gomod = files["go.mod"]
    assert "\tgithub.com/pulumi/pulumi/pkg/v3 v3.274.1\n" in gomod
    assert "\tgithub.com/pulumi/pulumi/sdk/v3 v3.274.1\n" in gomod
    assert "github.com/atotto/clipboard => github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e" in gomod
    assert "../sdk" not in gomod and "go 1.26.6" in gomod
    assert 'import _ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"' in files["tools.go"]


def test_an_uncovered_local_replace_is_refused() -> None:
    with pytest.raises(tools.ToolError, match="local path"):
        tools.build_files(tools.cli(), "module x\n\ngo 1.24\n\nreplace example.com/other => ../other\n")


def test_provider_main_package_gets_its_generated_embeds(tmp_path: Path) -> None:
    main = tmp_path / "cmd" / "pulumi-resource-kubernetes"
    main.mkdir(parents=True)
    (main / "main.go").write_text("package main\n//go:embed schema-embed.json\n")
    (main / "generate.go").write_text("//go:build ignore\n\npackage main\n")
    (main / "schema.json").write_text(json.dumps({"name": "kubernetes", "version": "", "resources": {}}, indent=4))
    (main / "terraform-mapping.json").write_text('{\n  "a": 1\n}\n')
    gomod = "module github.com/pulumi/pulumi-kubernetes/provider/v4\n\ngo 1.24.7\n\n" \
            "replace github.com/pulumi/pulumi-kubernetes/sdk/v4 => ../sdk\n"
    files = tools.build_files(tools.provider(), gomod, tmp_path)
    assert set(files) == {"go.mod", "main.go", "schema-embed.json", "terraform-mapping-embed.json"}
    assert json.loads(files["schema-embed.json"])["version"] == tools.provider().reports
    assert files["terraform-mapping-embed.json"] == '{"a":1}'
    assert "github.com/pulumi/pulumi-kubernetes/sdk/v4 => github.com/pulumi/pulumi-kubernetes/sdk/v4 v4.24.0" \
        in files["go.mod"]


def test_provider_reports_the_version_it_really_is() -> None:
    prov = tools.provider()
    assert prov.reports == prov.version.lstrip("v") == "4.0.0-20260115033456-f47bc2d6f199"
    assert any(x.endswith(f"version.Version={prov.reports}") for x in prov.ldflags)
    assert prov.dir.name == f"pulumi-kubernetes-{prov.version}"


def test_generated_passphrase_is_private_and_stable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE", raising=False)
    monkeypatch.setenv("GPUFLEET_STATE", str(tmp_path / "state"))
    first = engine.passphrase_env()
    path = Path(first["PULUMI_CONFIG_PASSPHRASE_FILE"])
    assert path == tmp_path / "state" / "pulumi" / "passphrase"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_text()) >= 24
    assert engine.passphrase_env() == first
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "given")
    assert engine.passphrase_env() == {}


def test_engine_env_is_a_file_backend_without_downloads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "x")
    env = engine.engine_env(engine.Target(env="local", kubeconfig=tmp_path / "kc", backend=tmp_path / "b"))
    assert env["PULUMI_BACKEND_URL"] == (tmp_path / "b").as_uri()
    assert env["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] == "true"
    assert (tmp_path / "b").is_dir()


@pytest.mark.parametrize("name", ["preview", "up", "destroy"])
def test_stack_tasks_are_documented(name: str) -> None:
    invoke = Path(sys.executable).with_name("invoke")
    proc = subprocess.run([str(invoke), "--help", name], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=dict(os.environ, NO_COLOR="1"))
    assert proc.returncode == 0, proc.stderr
    for flag in ("--env", "--kubeconfig", "--cluster", "--backend"):
        assert flag in proc.stdout


def test_a_real_environment_is_refused_on_the_local_cluster(tmp_path: Path) -> None:
    from gpufleet_workshop.local.certs import KeyPair
    from gpufleet_workshop.local.kubeconfig import local_cluster_of, write

    key = tmp_path / "k.pem"
    key.write_text("key")
    local = write(tmp_path / "local.kubeconfig", "https://127.0.0.1:20000", key, KeyPair(cert=key, key=key),
                  cluster="gpufleet-gpufleet", user="gpufleet-admin")
    assert local_cluster_of(local) == "gpufleet"
    foreign = tmp_path / "prod.kubeconfig"
    foreign.write_text(local.read_text().replace("gpufleet-gpufleet", "prod-east").replace("127.0.0.1", "10.0.0.1"))
    assert local_cluster_of(foreign) is None and local_cluster_of(tmp_path / "missing") is None
    invoke = Path(sys.executable).with_name("invoke")
    proc = subprocess.run([str(invoke), "preview", "--env", "staging", "--kubeconfig", str(local)], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"--env staging: kubeconfig {local} is the local cluster 'gpufleet'" in proc.stderr


def test_an_engine_failure_keeps_the_diagnostics_not_the_whole_output() -> None:
    from pulumi import automation as auto

    class Result:
        def __str__(self) -> str:
            return ("\n code: 1\n stdout: Updating (local):\n +  kubernetes:x creating\n\nDiagnostics:\n"
                    "  kubernetes:x (training):\n    error: conflict\n\nOutputs:\n    env: local\n\n"
                    "Resources:\n    1 errored\n\n stderr: boom\n")

    message = str(engine._fail("up", auto.CommandError(Result())))
    assert message == "pulumi up failed:\nDiagnostics:\n  kubernetes:x (training):\n    error: conflict\nboom"


@pytest.mark.parametrize("changes, tty, answer, expected", [
    ({}, True, "", "unchanged"),
    ({"urn:a": "create"}, True, "y", "confirmed"),
    ({"urn:a": "create"}, True, "n", "refused"),
    ({"urn:a": "create"}, False, "", "refused"),  # without a terminal, never proceed
])
def test_up_and_destroy_ask_after_a_preview(monkeypatch, capsys, changes, tty, answer, expected) -> None:
    from invoke.exceptions import Exit

    from gpufleet_workshop.tasks import stack as stack_tasks

    monkeypatch.setattr(sys.stdin, "isatty", lambda: tty, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: answer)
    preview = lambda target, out: engine.Result(changes=changes)  # noqa: E731
    try:
        got = stack_tasks._previewed_and_confirmed(preview, None, "no changes", "apply {n} changes to x", "not applied")
        outcome = "confirmed" if got else "unchanged"
    except Exit as exc:
        assert (exc.code, exc.message) == (1, "not applied (rerun with --yes)")
        outcome = "refused"
    assert outcome == expected
    assert ("no changes" in capsys.readouterr().out) == (expected == "unchanged")
