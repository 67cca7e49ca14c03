"""gpufleet's image inputs and references, without building: the lock, the split dependencies, gpufleet_image."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import yaml

from gpufleet_admin import imageref
from gpufleet_admin.build import image
from gpufleet.cli import COMMANDS
from gpufleet_admin.inventory import InventoryError
from gpufleet.paths import INVENTORIES, REPO_ROOT
from gpufleet_admin.stack.render import render
from roles.registry import load

DIGEST = "sha256:" + "0123456789abcdef" * 4
#: Distributions that provision, build or test: never in the image.
TOOLS = ("pulumi", "pulumi-kubernetes", "ansible-core", "matplotlib", "pytest", "pytest-testinfra", "invoke",
         "cyclonedx-bom", "kopf", "grafana-foundation-sdk", "jinja2")


def test_lock_matches_pyproject_runtime_dependencies():
    assert image.lock_problems() == []


def test_lock_has_no_tools_and_every_wheel_is_hashed():
    locked = image.parse_lock(image.LOCK_FILE.read_text())
    assert not set(TOOLS) & set(locked)
    # cryptography: the virtual kubelet's serving certificate (gpufleet.virtual_kubelet.kubelet_api).
    assert {"kubernetes", "pydantic", "prometheus-client", "httpx", "nvidia-ml-py", "cryptography"} <= set(locked)
    assert all(len(sha) == 64 for _, sha in locked.values())


def test_lock_problems_name_a_stale_pin(tmp_path, monkeypatch):
    text = image.LOCK_FILE.read_text().replace("kubernetes==37.0.2", "kubernetes==36.0.0")
    monkeypatch.setattr(image, "LOCK_FILE", tmp_path / "image-requirements.txt")
    image.LOCK_FILE.write_text(text)
    assert image.lock_problems() == [
        "kubernetes==37.0.2: image-requirements.txt has 36.0.0 (run `invoke image.lock`)"]


def test_runtime_dependencies_carry_no_tools_and_dev_still_installs_them():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    runtime = {image.normalise(d.split("==")[0]) for d in project["dependencies"]}
    assert not runtime & set(TOOLS)
    tools = {image.normalise(d.split("==")[0]) for d in project["optional-dependencies"]["tools"]}
    assert {"pulumi", "ansible-core", "matplotlib", "pytest-testinfra", "invoke"} <= tools
    assert "gpufleet[tools]" in project["optional-dependencies"]["dev"]
    assert "'.[tools,dev]'" in (REPO_ROOT / "Makefile").read_text()


@pytest.mark.parametrize("text, parsed", [
    ("ghcr.io/gpufleet/gpufleet:0.1.0", ("ghcr.io", "gpufleet/gpufleet", "0.1.0", "")),
    (f"registry.example:5000/p/gpufleet@{DIGEST}", ("registry.example:5000", "p/gpufleet", "", DIGEST)),
    (f"localhost/gpufleet:1@{DIGEST}", ("localhost", "gpufleet", "1", DIGEST)),
    ("gpufleet/gpufleet:1", ("", "gpufleet/gpufleet", "1", "")),
])
def test_image_references_parse(text, parsed):
    ref = imageref.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == parsed
    assert str(ref) == text


@pytest.mark.parametrize("text", ["ghcr.io/gpufleet/gpufleet", "ghcr.io/GPUfleet/gpufleet:1", "ghcr.io/x:1@sha256:abc",
                                  "ghcr.io/x:a b", "", "ghcr.io//x:1"])
def test_bad_image_references_say_what_is_expected(text):
    with pytest.raises(ValueError, match="expected an image reference REGISTRY/REPO:TAG"):
        imageref.parse(text)


def _gpufleet_containers(objs: list[dict]) -> dict[str, str]:
    """``{Kind/name: image}`` of every container that runs a ``gpufleet`` command."""
    out = {}
    for o in objs:
        if o["kind"] in ("Deployment", "DaemonSet"):
            for c in o["spec"]["template"]["spec"]["containers"]:
                if (c.get("args") or [""])[0] in COMMANDS:
                    out[f"{o['kind']}/{o['metadata']['name']}"] = c["image"]
    return out


def test_every_gpufleet_workload_runs_the_default_image():
    images = _gpufleet_containers(render(load("prod")).objects)
    assert {"Deployment/taint-controller", "Deployment/quota-sync", "Deployment/node-health"} <= set(images)
    assert any(k.startswith("Deployment/vk-") for k in images) and any(k.startswith("DaemonSet/") for k in images)
    assert set(images.values()) == {"ghcr.io/gpufleet/gpufleet:0.1.0"}


def test_gpufleet_image_from_the_inventory_pinned_by_digest_reaches_every_role():
    pinned = f"registry.example.com/platform/gpufleet:0.1.0@{DIGEST}"
    objs = render(load("prod", overrides={"gpufleet_image": pinned})).objects
    images = _gpufleet_containers(objs)
    kinds = {k.split("/")[0] for k in images}
    assert kinds == {"Deployment", "DaemonSet"}
    assert len(images) >= 5 and set(images.values()) == {pinned}


def test_bad_gpufleet_image_names_file_key_and_expectation(tmp_path: Path):
    root = tmp_path / "inventories" / "staging"
    shutil.copytree(INVENTORIES / "staging", root)
    (root / "group_vars/all/image.yml").write_text(yaml.safe_dump({"gpufleet_image": "ghcr.io/gpufleet/gpufleet"}))
    with pytest.raises(InventoryError) as info:
        load("staging", root=root)
    msg = str(info.value)
    for part in ("group_vars/all/image.yml", "gpufleet_image", "'ghcr.io/gpufleet/gpufleet'",
                 "REGISTRY/REPO:TAG", "neither tag nor digest"):
        assert part in msg, msg


@pytest.mark.parametrize("to, dest", [
    ("registry.example.com/p/gpufleet:0.1.0", "docker://registry.example.com/p/gpufleet:0.1.0"),
    ("docker://localhost:5000/gpufleet:1", "docker://localhost:5000/gpufleet:1"),
    ("oci:/tmp/x:0.1.0", "oci:/tmp/x:0.1.0"),
    ("dir:/tmp/x", "dir:/tmp/x"),
])
def test_push_destinations(to, dest):
    assert image.push_destination(to) == dest


@pytest.mark.parametrize("to, why", [
    ("gpufleet:1", "registry host"), (f"ghcr.io/x@{DIGEST}", "not a digest"), ("ghcr.io/x", "neither tag"),
    ("oci:", "path after"),
])
def test_bad_push_destinations(to, why):
    with pytest.raises(ValueError, match=why):
        image.push_destination(to)


def test_base_is_debian_python_without_perl_or_apt():
    spec = image.base_spec()
    argv = spec.mmdebstrap_argv(Path("/tmp/base.tar"))
    assert "--variant=essential" in argv and "--include=python3-minimal,libpython3.11-stdlib" in argv
    assert "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr" in argv  # not the usrmerge package (Perl)
    assert argv[-3:] == list(spec.sources) and all(s.startswith("deb http") for s in spec.sources)
    assert spec.uid == 65532 and f"gpufleet:x:{spec.uid}:{spec.uid}" in " ".join(argv)


def test_the_image_wheel_declares_only_the_image_packages():
    text = image.product_pyproject((REPO_ROOT / "pyproject.toml").read_text())
    project = tomllib.loads(text)
    found = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted({p.removesuffix(".*") for p in found}) == sorted(image.IMAGE_PACKAGES)
    assert "gpufleet_workshop" not in image.IMAGE_PACKAGES
    assert project["project"]["scripts"] == {"gpufleet": "gpufleet.cli:main"}
    assert project["tool"]["setuptools"]["package-data"] == \
        tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "entry-points" not in project["project"]  # the simulated rental is the workshop image's plugin
    assert not any("workshop" in p for p in image.SOURCE_PATHS)
    assert tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["gpufleet.providers"] \
        == {"simulated": "gpufleet_workshop.rental.provider:from_pool"}


def test_a_pyproject_of_another_shape_is_refused_not_guessed():
    with pytest.raises(image.ImageError, match=r"tool.setuptools.packages.find"):
        image.product_pyproject('[project]\nname = "gpufleet"\n')
