"""gpufleet's workshop image: gpufleet's image with the workshop's run-time part as one more layer.

What the local environment runs that is not the product: the inference
stand-in (``gpufleet-standin``, :mod:`gpufleet_workshop.inference_standin`),
the test workload ``sim.flip`` serves requests with, in both local clusters;
and the simulated GPU rental (:mod:`gpufleet_workshop.rental`, the
``simulated`` provider plugin), which runs inside its pool's virtual kubelet
and starts stand-in processes beside it. gpufleet's own image carries the
product alone (:func:`gpufleet_admin.build.image.product_pyproject`); this
image is that image, unchanged, plus one layer: a wheel of
:data:`MODULES` (distribution ``gpufleet-workshop-runtime``) with the
stand-in's console script and the provider's entry point. Its first layers
and their digests are gpufleet's image's; only the last differs.

Built from the product image's archive (``skopeo`` to an OCI layout,
``umoci`` to add the layer and set the title and name), reproducibly
(every file carries the product image's creation time), cached by the
product image's key and the workshop files' contents.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from gpufleet import paths
from gpufleet_admin.build import image as images
from gpufleet_admin.files import digest, locked
from gpufleet_admin.versions import pin

#: The workshop modules the image carries (paths under ``src/``): nothing else of the workshop runs in a pod.
MODULES = ("gpufleet_workshop/__init__.py", "gpufleet_workshop/inference_standin.py",
           "gpufleet_workshop/rental/__init__.py", "gpufleet_workshop/rental/provider.py",
           "gpufleet_workshop/rental/instances.py")
#: Tag inside the OCI layout (as gpufleet's image's).
LAYOUT_TAG = images.LAYOUT_TAG


def reference() -> str:
    """The image's name: the ``gpufleet.workshop_image`` pin (``ghcr.io/gpufleet/gpufleet-workshop:0.1.0``)."""
    return pin("gpufleet", "workshop_image")


def pyproject(version: str, backend: str) -> str:
    """The ``pyproject.toml`` of the workshop layer's wheel (version ``version``, gpufleet's; ``backend``: the
    pinned build requirement of gpufleet's own ``pyproject.toml``, so both wheels build alike)."""
    return f'''[build-system]
requires = ["{backend}"]
build-backend = "setuptools.build_meta"

[project]
name = "gpufleet-workshop-runtime"
version = "{version}"
description = "gpufleet's workshop in a pod: the inference stand-in and the simulated GPU rental"
requires-python = ">=3.11"
dependencies = ["gpufleet=={version}"]

[project.scripts]
gpufleet-standin = "gpufleet_workshop.inference_standin:main"

[project.entry-points."gpufleet.providers"]
simulated = "gpufleet_workshop.rental.provider:from_pool"

[tool.setuptools]
packages = ["gpufleet_workshop", "gpufleet_workshop.rental"]
package-dir = {{"" = "src"}}
'''


def build(product: images.ImageBuild, repo: Path = paths.REPO_ROOT, *, out_dir: Path | None = None,
          say: Callable[[str], None] = lambda m: None) -> images.ImageBuild:
    """The workshop image on top of ``product`` (a built gpufleet image), from cache when its inputs are unchanged.

    Args:
        product: gpufleet's image (:func:`gpufleet_admin.build.image.build`).
        repo: the checkout whose :data:`MODULES` go in.
        out_dir: where the archive and ``workshop-image.json`` go (default ``<repo>/out/image``).
        say: progress, one line per step with its seconds.

    Returns:
        The image, as :class:`gpufleet_admin.build.image.ImageBuild` (no SBOM of its own: ``sbom`` is the
        product's; the layer adds only gpufleet's own files).

    Raises:
        gpufleet_admin.build.image.ImageError: a step failed (its log's tail).
    """
    started = time.monotonic()
    spec = images.image_spec(repo)
    ref = reference()
    key = digest({"product": product.key, "digest": product.digest, "reference": ref,
                  "modules": [(m, (repo / "src" / m).read_bytes().hex()) for m in MODULES]})
    done = images.image_dir() / "workshop" / key
    out_dir = out_dir or repo / "out" / "image"
    stem = f"gpufleet-workshop-{spec.version}"
    steps = images.Steps(images.image_dir() / "build.log", say)
    with locked(images.image_dir() / ".workshop.lock"):
        record_file = done / "image.json"
        cached = record_file.exists()
        if not cached:
            with images.tempdir("workshop") as work:
                layout = work / "layout"
                image = f"{layout}:{LAYOUT_TAG}"
                t = time.monotonic()
                steps.run("product image (skopeo)", ["skopeo", "copy", "--quiet", f"oci-archive:{product.archive}",
                                                     f"oci:{image}"])
                src = work / "src"
                for m in MODULES:
                    (src / "src" / m).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(repo / "src" / m, src / "src" / m)
                backend = tomllib.loads((repo / "pyproject.toml").read_text())["build-system"]["requires"][0]
                (src / "pyproject.toml").write_text(pyproject(spec.version, backend))
                env = dict(os.environ, SOURCE_DATE_EPOCH=str(spec.created))
                steps.run("workshop wheel", [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                                             "-w", str(work / "dist"), str(src)], env=env)
                root = work / "rootfs"
                images.install_wheels(sorted((work / "dist").glob("*.whl")), root, spec.base.python, exclude=())
                layer = work / "workshop.tar"
                images.layer_tar(root, layer, spec.created)
                steps.run("umoci workshop layer", ["umoci", "raw", "add-layer", "--image", image, "--history.created",
                                                   spec.created_iso, "--history.created_by",
                                                   f"gpufleet-workshop-runtime {spec.version}", str(layer)])
                steps.run("umoci config", ["umoci", "config", "--image", image, "--no-history",
                                           "--created", spec.created_iso,
                                           "--config.label", "org.opencontainers.image.title=gpufleet-workshop",
                                           "--manifest.annotation", "org.opencontainers.image.title=gpufleet-workshop",
                                           "--manifest.annotation", f"org.opencontainers.image.ref.name={ref}"])
                steps.run("umoci gc", ["umoci", "gc", "--layout", str(layout)])
                staging = work / "done"
                staging.mkdir()
                steps.run("archive (skopeo)", ["skopeo", "copy", "--quiet", f"oci:{image}",
                                               f"oci-archive:{staging / (stem + '.oci.tar')}:{ref}"])
                steps.timed("workshop image", t)
                manifest_digest, compressed = images.layout_facts(layout)
                record = {"reference": ref, "digest": manifest_digest, "archive": f"{stem}.oci.tar",
                          "product": {"reference": product.reference, "digest": product.digest},
                          "compressed_bytes": compressed,
                          "unpacked_bytes": product.unpacked_bytes + layer.stat().st_size,
                          "steps": steps.seconds, "key": key, "modules": list(MODULES)}
                (staging / "image.json").write_text(json.dumps(record, indent=1) + "\n")
                if done.exists():
                    shutil.rmtree(done)
                done.parent.mkdir(parents=True, exist_ok=True)
                staging.replace(done)
        record = json.loads(record_file.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    images.link_or_copy(done / record["archive"], out_dir / record["archive"])
    images.link_or_copy(record_file, out_dir / "workshop-image.json")
    return images.ImageBuild(
        reference=record["reference"], digest=record["digest"], archive=out_dir / record["archive"],
        sbom=product.sbom, compressed_bytes=record["compressed_bytes"], unpacked_bytes=record["unpacked_bytes"],
        seconds=0.0 if cached else round(time.monotonic() - started, 1), steps=record["steps"], cached=cached,
        key=key)
