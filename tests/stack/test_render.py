"""``invoke render`` output: stable files, and every object valid against the pinned schemas."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.paths import REPO_ROOT
from gpufleet_admin.schemas import validate


@pytest.fixture(scope="module", params=["local", "staging", "prod"])
def rendered(request, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param)
    invoke = Path(sys.executable).with_name("invoke")
    subprocess.run([str(invoke), "render", "--env", request.param, "--out", str(out)], cwd=REPO_ROOT, check=True,
                   capture_output=True)
    return request.param, out


def test_every_rendered_object_validates_against_pinned_schemas(rendered) -> None:
    env, out = rendered
    files = sorted(out.glob("*.yaml"))
    assert len(files) > 20
    errors = {}
    for path in files:
        obj = yaml.safe_load(path.read_text())
        problems = validate(obj)
        if problems:
            errors[path.name] = problems
    assert errors == {}


def test_file_names_are_stable_and_rerender_removes_only_its_own_stale_files(rendered) -> None:
    env, out = rendered
    index = out / ".gpufleet-render.json"
    # As if an earlier render had declared one more object; and a file of the user's own.
    index.write_text(json.dumps(json.loads(index.read_text()) + ["stale--object.yaml"]))
    (out / "stale--object.yaml").write_text("{}")
    (out / "notes.yaml").write_text("mine: true\n")
    before = sorted(p.name for p in out.glob("*.yaml") if p.name != "stale--object.yaml")
    invoke = Path(sys.executable).with_name("invoke")
    subprocess.run([str(invoke), "render", "--env", env, "--out", str(out)], cwd=REPO_ROOT, check=True, capture_output=True)
    assert sorted(p.name for p in out.glob("*.yaml")) == before
    assert "notes.yaml" in before and "stale--object.yaml" not in json.loads(index.read_text())
    assert f"clusterqueue--{'staging' if env == 'staging' else 'research'}.yaml" in before


def test_render_into_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep")
    invoke = Path(sys.executable).with_name("invoke")
    proc = subprocess.run([str(invoke), "render", "--env", "local", "--out", str(target)], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"--out {target}: {target} exists and is not a folder" in proc.stderr
    assert target.read_text() == "keep"


def test_schema_validation_catches_a_bad_field() -> None:
    bad = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "x"},
           "spec": {"cohort": "old-field-name"}}
    assert validate(bad) == ["spec: Additional properties are not allowed ('cohort' was unexpected)"]


def test_render_refuses_a_bad_inventory_with_a_clear_message(tmp_path: Path) -> None:
    invoke = Path(sys.executable).with_name("invoke")
    proc = subprocess.run([str(invoke), "render", "--env", "nope", "--out", str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "nope" in proc.stderr and "known: local, local-dra, prod, staging" in proc.stderr


def test_render_applies_stack_config_like_pulumi_up(tmp_path: Path) -> None:
    invoke = Path(sys.executable).with_name("invoke")
    config = tmp_path / "Pulumi.local.yaml"
    config.write_text('config:\n  gpufleet:kueue_reserve_gpus: "8"\n  gpufleet:token: {secure: v1:abc}\n')
    proc = subprocess.run([str(invoke), "render", "--env", "local", "--out", str(tmp_path / "out"),
                           "--config-file", str(config)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "kueue_reserve_gpus; secrets not shown: gpufleet:token" in proc.stdout
    cq = yaml.safe_load((tmp_path / "out" / "clusterqueue--training.yaml").read_text())
    gpu = [r for f in cq["spec"]["resourceGroups"][0]["flavors"] for r in f["resources"] if r["name"] == "nvidia.com/gpu"]
    assert [r["nominalQuota"] for r in gpu] == ["90"]  # 128 GPUs less 8 reserved, split 3:1

    config.write_text('config:\n  gpufleet:kueue_reserve_gpus: abc\n')
    proc = subprocess.run([str(invoke), "render", "--env", "local", "--out", str(tmp_path / "out"),
                           "--config-file", str(config)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and f"{config}: kueue_reserve_gpus: 'abc': expected a valid integer" in proc.stderr


def test_a_hand_edited_index_never_deletes_outside_the_folder(tmp_path: Path) -> None:
    from gpufleet_admin.stack.render import INDEX, Rendered, write

    out, victim = tmp_path / "out", tmp_path / "victim.yaml"
    victim.write_text("keep")
    (out / "helm").mkdir(parents=True)
    (out / INDEX).write_text(json.dumps(["../victim.yaml", str(victim), "helm", 5]))
    write(Rendered(objects=[], releases=[]), out)
    assert victim.read_text() == "keep" and (out / "helm").is_dir()
    (out / INDEX).write_text("5")  # not a list: ignored, then rewritten
    write(Rendered(objects=[], releases=[]), out)
    assert json.loads((out / INDEX).read_text()) == []


def test_out_below_a_file_is_refused(tmp_path: Path) -> None:
    from gpufleet_admin.stack.render import check_out

    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"afile exists and is not a folder"):
        check_out(tmp_path / "afile" / "sub")


@pytest.mark.parametrize("text, message", [
    ("confg:\n  gpufleet:kueue_reserve_gpus: '5'\n", "unknown top-level key 'confg'"),
    ("config:\n  kueue_reserve_gpus: 5\n", "config key 'kueue_reserve_gpus' is not namespaced: expected gpufleet:"),
    ("- a list\n", "expected a Pulumi stack config file with a config: mapping"),
])
def test_stack_config_typos_are_errors_not_ignored(tmp_path: Path, text: str, message: str) -> None:
    from gpufleet_admin.stack.program import file_config

    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        file_config(path)
