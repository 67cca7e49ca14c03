"""gpufleet's image, built for real: its config, contents, SBOM, reproducibility, and copies with skopeo.

One build per session (cached by its inputs, so a warm cache builds
nothing); the rebuild checks that two builds of one checkout give one digest.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpufleet_admin.build import image
from gpufleet_workshop.local.install import install
from gpufleet.cli import COMMANDS

#: Builds the image for real (mmdebstrap from the Debian mirror, wheels, umoci, skopeo): the build tier.
pytestmark = pytest.mark.build

#: Distributions that provision, build or test: never in the image.
TOOLS = {"pulumi", "pulumi-kubernetes", "ansible-core", "matplotlib", "pytest", "pytest-testinfra", "invoke",
         "grafana-foundation-sdk", "jinja2", "cyclonedx-bom", "kopf"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> image.ImageBuild:
    install(["image_tools"])
    return image.build(out_dir=tmp_path_factory.mktemp("out"))


@pytest.fixture(scope="module")
def bundle(built, tmp_path_factory) -> Path:
    """The image unpacked as a runtime bundle (``config.json`` + ``rootfs``), as a container runtime sees it."""
    where = tmp_path_factory.mktemp("bundle")
    subprocess.run(["skopeo", "copy", "--quiet", f"oci-archive:{built.archive}", f"oci:{where / 'layout'}:t"], check=True)
    subprocess.run(["umoci", "unpack", "--image", f"{where / 'layout'}:t", str(where / "b")], check=True,
                   capture_output=True)
    return where / "b"


def manifest_and_config(archive: Path, tmp: Path) -> tuple[dict, dict, dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    layout = tmp / "layout"
    subprocess.run(["skopeo", "copy", "--quiet", f"oci-archive:{archive}", f"oci:{layout}:t"], check=True)
    index = json.loads((layout / "index.json").read_text())
    blob = lambda d: json.loads((layout / "blobs" / "sha256" / d.split(":")[1]).read_text())  # noqa: E731
    manifest = blob(index["manifests"][0]["digest"])
    return index, manifest, blob(manifest["config"]["digest"])


def run_in(bundle: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the image's entrypoint with ``args`` as its user, env and working dir (chroot into the rootfs)."""
    process = json.loads((bundle / "config.json").read_text())["process"]
    user = process["user"]
    argv = ["chroot", f"--userspec={user['uid']}:{user['gid']}", str(bundle / "rootfs"), "/usr/bin/env", "-i",
            *process["env"], *process["args"], *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_archive_digest_and_record(built):
    assert built.archive.name == "gpufleet-0.1.0.oci.tar" and built.archive.is_file()
    assert (built.archive.parent / "gpufleet-0.1.0.digest").read_text().strip() == built.digest
    record = json.loads((built.archive.parent / "image.json").read_text())
    assert record["digest"] == built.digest and record["reference"] == "ghcr.io/gpufleet/gpufleet:0.1.0"
    assert record["debian_packages"]["python3.11-minimal"].startswith("3.11")
    assert built.pinned == f"ghcr.io/gpufleet/gpufleet:0.1.0@{built.digest}"


def test_config_non_root_entrypoint_and_labels(built, tmp_path):
    import tarfile

    with tarfile.open(built.archive) as tar:  # the archive's own index names the image, for `ctr images import`
        index = json.loads(tar.extractfile("index.json").read())
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == built.reference
    assert index["manifests"][0]["digest"] == built.digest
    _, manifest, config = manifest_and_config(built.archive, tmp_path)
    cfg = config["config"]
    assert cfg["User"] == "65532:65532" and cfg["Entrypoint"] == ["gpufleet"]
    spec = image.image_spec()
    labels = cfg["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.revision"].removesuffix("-dirty") == spec.revision.removesuffix("-dirty")
    assert labels["org.opencontainers.image.source"] == "https://github.com/gpufleet/gpufleet"
    assert labels["org.opencontainers.image.created"] == image.iso(spec.created) == config["created"]
    assert manifest["annotations"]["org.opencontainers.image.revision"] == labels["org.opencontainers.image.revision"]
    assert len(manifest["layers"]) == 2 and [h["created"] for h in config["history"]][1] == config["created"]


def test_two_builds_of_one_checkout_give_one_digest(built, tmp_path):
    again = image.build(out_dir=tmp_path, force=True)
    assert not again.cached
    assert again.digest == built.digest


def test_a_warm_build_builds_nothing(built, tmp_path):
    again = image.build(out_dir=tmp_path)
    assert again.cached and again.seconds == 0.0 and again.digest == built.digest


def test_every_command_runs_from_the_image_as_its_user(bundle):
    for command in COMMANDS:
        proc = run_in(bundle, command, "--help")
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        assert "usage: gpufleet" in proc.stdout


def test_controllers_import_from_the_image(bundle):
    code = ("import gpufleet.virtual_kubelet.main, gpufleet.taint_controller.main, gpufleet.quota_sync.main, gpufleet.node_health.main, "
            "gpufleet.exporter.main, gpufleet.goodput.main, kubernetes.client, pydantic, sys; "
            "print(sys.version.split()[0], sys.executable)")
    proc = subprocess.run(["chroot", "--userspec=65532:65532", str(bundle / "rootfs"), "/usr/bin/python3", "-c", code],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("3.11.") and "/usr/bin/python3" in proc.stdout


def test_a_controller_reads_its_configuration_file_inside_the_image(bundle):
    """As a controller pod does: the file its role renders (prod's), mounted; no inventory, no roles in the image."""
    from roles.registry import load
    from roles.taint_controller.config import configuration
    from gpufleet.taint_controller.config import dump

    (bundle / "rootfs/tmp/config.yaml").write_text(dump(configuration(load("prod"))))
    code = ("import importlib.util; from gpufleet.taint_controller.config import load; c = load('/tmp/config.yaml'); "
            "print(c.high_water_gpus, c.signal, importlib.util.find_spec('roles'), importlib.util.find_spec('gpufleet_admin'))")
    proc = subprocess.run(["chroot", "--userspec=65532:65532", str(bundle / "rootfs"), "/usr/bin/python3", "-c", code],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["64", "prometheus", "None", "None"]


def test_image_carries_no_tools_and_no_package_manager(bundle):
    site = bundle / "rootfs/usr/local/lib/python3.11/dist-packages"
    dists = {image.normalise(p.name.split("-")[0]) for p in site.glob("*.dist-info")}
    assert {"gpufleet", "kubernetes", "pydantic", "prometheus-client"} <= dists
    assert not dists & TOOLS
    assert not (bundle / "rootfs/usr/bin/apt-get").exists()  # no package manager: nothing is installed at run time
    assert not (site / "kubernetes/aio").exists()  # image.EXCLUDE


def test_sbom_lists_python_and_debian_components(built, bundle):
    doc = json.loads(built.sbom.read_text())
    assert doc["bomFormat"] == "CycloneDX" and "serialNumber" not in doc  # reproducible output
    purls = [c.get("purl", "") for c in doc["components"]]
    assert any(p.startswith("pkg:pypi/kubernetes@37.0.2") for p in purls)
    assert any(p.startswith("pkg:deb/debian/python3.11-minimal@") for p in purls)
    assert not any(p.startswith(("pkg:pypi/pulumi@", "pkg:pypi/ansible-core@")) for p in purls)
    inside = json.loads((bundle / "rootfs/usr/share/gpufleet/sbom.cdx.json").read_text())
    assert inside == doc


def test_push_copies_to_local_destinations_keeping_the_digest(built, tmp_path):
    dest, digest = image.push(f"oci:{tmp_path / 'oci'}:0.1.0", archive=built.archive)
    assert digest == built.digest
    index = json.loads((tmp_path / "oci" / "index.json").read_text())
    assert index["manifests"][0]["digest"] == built.digest
    image.push(f"dir:{tmp_path / 'dir'}", archive=built.archive)
    assert (tmp_path / "dir" / "manifest.json").is_file()


def test_push_dry_run_names_the_registry_and_runs_nothing(built):
    cmd, digest = image.push("registry.example.com/platform/gpufleet:0.1.0", archive=built.archive, dry_run=True)
    assert cmd.endswith(f"oci-archive:{built.archive} docker://registry.example.com/platform/gpufleet:0.1.0")
    assert digest == built.digest


def test_out_folder_holds_only_the_image_files(built):
    """A warm build over an earlier one leaves no temporary files beside the archive."""
    image.build(out_dir=built.archive.parent)
    names = sorted(p.name for p in built.archive.parent.iterdir())
    assert names == ["gpufleet-0.1.0.digest", "gpufleet-0.1.0.oci.tar", "gpufleet-0.1.0.sbom.cdx.json", "image.json"]


# ------------------------------------------------------------------------------ the workshop's image


@pytest.fixture(scope="module")
def workshop(built, tmp_path_factory) -> image.ImageBuild:
    from gpufleet_workshop.local import workshop_image

    return workshop_image.build(built, out_dir=tmp_path_factory.mktemp("workshop"))


def unpack(archive: Path, where: Path) -> Path:
    subprocess.run(["skopeo", "copy", "--quiet", f"oci-archive:{archive}", f"oci:{where / 'layout'}:t"], check=True)
    subprocess.run(["umoci", "unpack", "--image", f"{where / 'layout'}:t", str(where / "b")], check=True,
                   capture_output=True)
    return where / "b"


def test_the_product_image_carries_nothing_of_the_workshop(bundle):
    site = bundle / "rootfs/usr/local/lib/python3.11/dist-packages"
    assert (site / "gpufleet").is_dir() and not (site / "gpufleet_workshop").exists()
    assert not (bundle / "rootfs/usr/local/bin/gpufleet-standin").exists()
    proc = run_in(bundle, "inference-standin")
    assert proc.returncode == 2 and "gpufleet-standin" in proc.stderr
    code = "from gpufleet.virtual_kubelet.providers import plugins; print(sorted(plugins()))"
    proc = subprocess.run(["chroot", "--userspec=65532:65532", str(bundle / "rootfs"), "/usr/bin/python3", "-c", code],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-2000:]


def test_the_workshop_image_is_gpufleets_image_and_one_layer(built, workshop, tmp_path):
    _, product, _ = manifest_and_config(built.archive, tmp_path / "p")
    _, manifest, config = manifest_and_config(workshop.archive, tmp_path / "w")
    assert manifest["layers"][:-1] == product["layers"] and len(manifest["layers"]) == len(product["layers"]) + 1
    assert config["config"]["Entrypoint"] == ["gpufleet"] and config["config"]["User"] == "65532:65532"
    assert workshop.reference == "ghcr.io/gpufleet/gpufleet-workshop:0.1.0"


def test_the_workshop_image_runs_the_stand_in_and_offers_the_simulated_rental(workshop, tmp_path):
    root = unpack(workshop.archive, tmp_path) / "rootfs"
    code = "from gpufleet.virtual_kubelet.providers import plugins; print(sorted(plugins()))"
    proc = subprocess.run(["chroot", "--userspec=65532:65532", str(root), "/usr/bin/python3", "-c", code],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "['simulated']", proc.stderr[-2000:]
    proc = subprocess.run(["chroot", "--userspec=65532:65532", str(root), "/usr/local/bin/gpufleet-standin", "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "usage: gpufleet-standin" in proc.stdout, proc.stderr[-2000:]


def test_a_warm_workshop_build_builds_nothing(built, workshop, tmp_path):
    from gpufleet_workshop.local import workshop_image

    again = workshop_image.build(built, out_dir=tmp_path)
    assert again.cached and again.digest == workshop.digest
