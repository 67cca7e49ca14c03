"""invoke tasks for gpufleet's image: ``image.build``, ``image.push``, ``image.lock``.

Each parses its flags and calls one function of :mod:`gpufleet_admin.build.image`.
A bad flag exits with code 2, a failed step with code 1 and its log tail.
"""

from __future__ import annotations

from invoke import Collection, task
from invoke.exceptions import Exit
from rich.console import Console

from gpufleet_admin.build import image as images
from gpufleet_workshop.local.install import InstallError, install as install_components


def _console() -> Console:
    return Console(stderr=True, highlight=False)


def _tools(console: Console) -> None:
    try:
        install_components(["image_tools"], console=console)  # mmdebstrap, umoci, skopeo; a no-op when present
    except (InstallError, KeyError) as exc:
        raise Exit(str(exc), code=1) from None


@task(help={"refresh_base": "rebuild the Debian base from the mirror's current packages (security updates)",
            "force": "rebuild the image even when one with the same inputs is cached",
            "name": "the reference the image carries (default: versions.yaml gpufleet.image)"})
def build(c, refresh_base=False, force=False, name=""):
    """Build gpufleet's OCI image offline into out/image/ and print its digest.

    Writes out/image/gpufleet-VERSION.oci.tar, its SBOM (CycloneDX JSON), the
    digest and image.json (inputs, sizes, step times). A warm cache with the
    same inputs (commit, lock, base) builds nothing.
    """
    console = _console()
    _tools(console)
    try:
        result = images.build(reference=name or None, refresh_base=refresh_base, force=force, say=console.print)
    except ValueError as exc:
        raise Exit(str(exc), code=2) from None
    except images.ImageError as exc:
        raise Exit(str(exc), code=1) from None
    how = "cached" if result.cached else f"built in {result.seconds:.0f}s"
    console.print(f"{result.reference} {how}: {result.compressed_bytes / 2**20:.1f} MiB compressed, "
                  f"{result.unpacked_bytes / 2**20:.1f} MiB unpacked\n"
                  f"archive {result.archive}\nsbom    {result.sbom}")
    print(result.digest)


@task(help={"to": "destination: REGISTRY/REPO:TAG (a registry, through skopeo's docker transport) or a local "
                  "oci:PATH[:TAG], oci-archive:PATH, dir:PATH",
            "dry_run": "print the skopeo command instead of running it",
            "dest_creds": "USER:PASSWORD for the registry (default: skopeo's auth file, e.g. from `skopeo login`)",
            "dest_tls_verify": "verify the registry's TLS certificate (default true)"})
def push(c, to, dry_run=False, dest_creds="", dest_tls_verify=True):
    """Copy the image built by image.build to a registry (or a local folder) with skopeo; digest unchanged.

    Prints the digest-pinned reference to put in the inventory as gpufleet_image.
    """
    extra = ([f"--dest-creds={dest_creds}"] if dest_creds else []) + ([] if dest_tls_verify else ["--dest-tls-verify=false"])
    try:
        dest, digest = images.push(to, dry_run=dry_run, extra=extra)
    except ValueError as exc:
        raise Exit(str(exc), code=2) from None
    except images.ImageError as exc:
        raise Exit(str(exc), code=1) from None
    if dry_run:
        print(dest)
        return
    _console().print(f"copied to {dest}")
    pinned = f"{dest.removeprefix('docker://')}@{digest}" if dest.startswith("docker://") else digest
    print(pinned)


@task(help={"check": "only check that the lock matches pyproject.toml (exit 1 if not)"})
def lock(c, check=False):
    """Resolve pyproject.toml's run-time dependencies into the image's lock (versions and sha256 of each wheel)."""
    if check:
        if problems := images.lock_problems():
            raise Exit("\n".join(problems), code=1)
        return
    try:
        text = images.lock_text()
    except images.ImageError as exc:
        raise Exit(str(exc), code=1) from None
    images.LOCK_FILE.write_text(text)
    _console().print(f"wrote {images.LOCK_FILE} ({len(images.parse_lock(text))} wheels)")


ns = Collection("image", build, push, lock)
