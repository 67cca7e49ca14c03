"""The pause image (the sandbox of every pod on the local cluster's real node), built from source.

``build/pause/linux/pause.c`` of the pinned ``k8s.io/kubernetes`` module,
compiled static with the host's gcc as upstream's Makefile does
(``-Os -Wall -Werror -static -DVERSION=v<TAG>-<REV>``), in a one-layer OCI
image named as upstream names it (``registry.k8s.io/pause:<TAG>``, TAG from
that Makefile): containerd's ``sandbox_image`` must find it under exactly
that name, or it would try to pull it.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet_admin.build import gobuild
from gpufleet_admin.build.image import ImageError, Steps, image_dir, iso, layer_tar, tempdir
from gpufleet_admin.files import digest, locked
from gpufleet_admin.versions import pin

#: uid/gid the pause process runs as (upstream's image: 65535).
PAUSE_UID = 65535
#: Files of the image get this time (any fixed one: the image is reproducible).
EPOCH = 1764547200


def source_dir() -> Path:
    """``build/pause`` of the pinned Kubernetes module (downloaded into Go's module cache if missing)."""
    return gobuild.module_dir(pin("kubernetes", "module"), pin("kubernetes")) / "build" / "pause"


def pause_tag(folder: Path | None = None) -> str:
    """The pause version upstream builds at this Kubernetes version (``TAG ?=`` of its Makefile, e.g. ``3.10.1``).

    Raises:
        ImageError: the Makefile has no ``TAG ?=`` line.
    """
    makefile = (folder or source_dir()) / "Makefile"
    m = re.search(r"^TAG \?= *(\S+)", makefile.read_text(), re.M)
    if not m:
        raise ImageError(f"{makefile}: no 'TAG ?=' line to take the pause version from")
    return m[1]


def reference() -> str:
    """``registry.k8s.io/pause:<TAG>``: the name containerd's ``sandbox_image`` gives and the image carries."""
    return f"registry.k8s.io/pause:{pause_tag()}"


def build(say: Callable[[str], None] = lambda m: None) -> Path:
    """The pause image's OCI archive (built unless cached); its index names :func:`reference`.

    Raises:
        ImageError: gcc, umoci or skopeo failed (log tail).
        gpufleet_admin.build.gobuild.GoError: the Kubernetes module cannot be had.
    """
    src = source_dir()
    tag = pause_tag(src)
    ref = f"registry.k8s.io/pause:{tag}"
    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = digest([pin("kubernetes"), tag, gcc, (src / "linux" / "pause.c").read_text()])
    folder = image_dir() / "pause" / key
    archive = folder / "pause.oci.tar"
    with locked(image_dir() / "pause" / ".lock"):
        if archive.exists():
            return archive
        started = time.monotonic()
        steps = Steps(image_dir() / "pause.log", say)
        with tempdir("pause") as work:
            root = work / "rootfs"
            root.mkdir()
            steps.run("pause (gcc)", ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{tag}-gpufleet",
                                      "-o", str(root / "pause"), str(src / "linux" / "pause.c")])
            steps.run("pause (strip)", ["strip", str(root / "pause")])
            layer = work / "layer.tar"
            layer_tar(root, layer, EPOCH)
            image = f"{work / 'layout'}:pause"
            steps.run("umoci init", ["umoci", "init", "--layout", str(work / "layout")])
            steps.run("umoci new", ["umoci", "new", "--image", image])
            steps.run("umoci layer", ["umoci", "raw", "add-layer", "--image", image, "--no-history", str(layer)])
            steps.run("umoci config", ["umoci", "config", "--image", image, "--no-history", "--created", iso(EPOCH),
                                       "--architecture", "amd64", "--os", "linux",
                                       "--config.user", f"{PAUSE_UID}:{PAUSE_UID}", "--config.entrypoint", "/pause"])
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / "pause.oci.tar.tmp"
            steps.run("pause (skopeo)", ["skopeo", "copy", "--quiet", f"oci:{image}", f"oci-archive:{tmp}:{ref}"])
            tmp.replace(archive)
        steps.timed("pause image", started)
    return archive
