"""gpufleet's OCI image, built offline from pinned inputs.

Two layers:

``base``
    Debian's own packages (the distribution's ``python3``), assembled by
    ``mmdebstrap`` from the inputs in ``versions.yaml`` (``gpufleet_image``)
    with ``SOURCE_DATE_EPOCH`` = ``base_source_date_epoch``, so it is
    byte-identical for an unchanged mirror; it adds the non-root user
    ``gpufleet`` (uid/gid ``gpufleet_image.uid``). Cached by its inputs: a
    new commit reuses it; ``refresh_base`` takes the mirror's newest
    packages (security updates).
``app``
    gpufleet's wheel (built from the checkout with the pinned build
    backend) and the wheels of its run-time dependencies, locked with
    hashes in ``image-requirements.txt`` (``invoke image.lock``), installed
    by pypa's ``installer`` into ``/usr/local/lib/python3.X/dist-packages``
    (on Debian's ``sys.path``) with ``gpufleet`` in ``/usr/local/bin``;
    byte code compiled with unchecked hashes (the image is immutable); the
    CycloneDX SBOM of both layers at ``/usr/share/gpufleet/sbom.cdx.json``.
    Written as a tar of our own: sorted, owned by root, every time the
    commit's.

``umoci`` packs the layers and the config (user, entrypoint ``gpufleet``,
OCI labels version, revision, source and created = the commit time), and
``skopeo`` writes the OCI archive. Two builds of one commit give one
digest; what is cached is keyed by every input, so a warm build of the
same commit runs nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from gpufleet import paths
from gpufleet_admin import imageref
from gpufleet_admin.files import digest, locked, tail
from gpufleet_admin.versions import pin, versions

#: The lock of the run-time dependencies' wheels (``name==version --hash=sha256:...``).
LOCK_FILE = Path(__file__).with_name("image-requirements.txt")
#: Tag of the image inside the OCI layout and archive.
LAYOUT_TAG = "gpufleet"
#: The packages gpufleet's image carries (:func:`product_pyproject`): the product alone. Components read their
#: configuration file, never the inventory, so neither ``gpufleet_admin`` nor the roles run in a cluster
#: (``tests/controllers/test_imports.py``); ``gpufleet_workshop`` has an image of its own.
IMAGE_PACKAGES = ("gpufleet",)
#: Files of the checkout that make gpufleet's wheel (what ``pip wheel`` reads): that package's alone.
SOURCE_PATHS = ("pyproject.toml", "README.md", "src/gpufleet")
#: Parts of installed distributions that nothing in gpufleet imports, left out of the image:
#: the kubernetes client's asyncio twin (68 MB of generated models; gpufleet uses the
#: synchronous client). Recorded in image.json; the SBOM still lists the distribution.
EXCLUDE = ("kubernetes/aio",)
#: Where the image and its record go in the checkout.
OUT_DIR = paths.REPO_ROOT / "out" / "image"
#: Wheel platform tags a Debian bookworm x86_64 python3 accepts (glibc 2.36): manylinux 2.5 .. 2.36.
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in range(36, 4, -1)) + (
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")


class ImageError(RuntimeError):
    """A build or push step failed; the message names the step and ends with its output's tail."""


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class BaseSpec:
    """Inputs of the base layer (all from ``versions.yaml`` ``gpufleet_image``).

    Attributes:
        suite: Debian suite (``bookworm``).
        sources: ``deb`` lines mmdebstrap reads (main, updates, security).
        packages: Debian packages on top of the Essential set.
        python: ``3.11``: the minor version of the suite's python3.
        epoch: ``SOURCE_DATE_EPOCH`` of the base (seconds since 1970).
        uid: uid and gid of the user ``gpufleet``.
    """

    suite: str
    sources: tuple[str, ...]
    packages: tuple[str, ...]
    python: str
    epoch: int
    uid: int

    @property
    def key(self) -> str:
        """Cache key: changes with any input."""
        return digest(asdict(self))

    def mmdebstrap_argv(self, out: Path) -> list[str]:
        """The ``mmdebstrap`` command that writes the base root filesystem as a tar to ``out``.

        ``essential`` variant plus :attr:`packages`; no docs, man pages or
        locales except copyright files; merged ``/usr`` through mmdebstrap's
        own hook (not the ``usrmerge`` package, which pulls in Perl).
        """
        user = (f'echo "gpufleet:x:{self.uid}:{self.uid}:gpufleet:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"; '
                f'echo "gpufleet:x:{self.uid}:" >> "$1/etc/group"')
        argv = ["mmdebstrap", "--variant=essential", "--mode=root", "--format=tar",
                f"--include={','.join(self.packages)}",
                "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
                "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
                "--dpkgopt=path-exclude=/usr/share/info/*",
                f"--customize-hook={user}", self.suite, str(out)]
        return argv + list(self.sources)


def base_spec() -> BaseSpec:
    """The pinned base; ``GPUFLEET_DEBIAN_MIRROR`` / ``GPUFLEET_DEBIAN_SECURITY_MIRROR`` override the mirrors.

    Raises:
        KeyError: a pin is missing from ``versions.yaml``.
    """
    v = versions()["gpufleet_image"]
    suite = v["debian_suite"]
    mirror = os.environ.get("GPUFLEET_DEBIAN_MIRROR", v["debian_mirror"])
    security = os.environ.get("GPUFLEET_DEBIAN_SECURITY_MIRROR", v["debian_security_mirror"])
    sources = (f"deb {mirror} {suite} main", f"deb {mirror} {suite}-updates main",
               f"deb {security} {suite}-security main")
    return BaseSpec(suite, sources, tuple(v["debian_packages"].split()), str(v["python"]),
                    int(v["base_source_date_epoch"]), int(v["uid"]))


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"git {' '.join(args)} in {repo}: {proc.stderr.strip() or 'failed'}; "
                         "the image is built from a git checkout")
    return proc.stdout


def source_files(repo: Path = paths.REPO_ROOT) -> list[str]:
    """Paths (relative, sorted) of the checkout's files that make gpufleet's wheel.

    Tracked files plus untracked ones git does not ignore, under
    :data:`SOURCE_PATHS`; deleted files are left out.
    """
    out = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCE_PATHS)
    return sorted(p for p in set(out.split("\0")) if p and (repo / p).is_file())


@dataclass(frozen=True)
class ImageSpec:
    """Every input of one image build.

    Attributes:
        reference: the name it carries (``ghcr.io/gpufleet/gpufleet:0.1.0``).
        version: gpufleet's version (pyproject), the ``version`` label.
        revision: the commit (``-dirty`` appended when source files differ from it).
        source: the repository URL (pyproject ``[project.urls] Source``).
        created: ``SOURCE_DATE_EPOCH``: the commit time (seconds since 1970).
        base: the base layer's inputs.
        sources: digest of the source files' names and contents.
        lock: digest of ``image-requirements.txt``.
    """

    reference: str
    version: str
    revision: str
    source: str
    created: int
    base: BaseSpec
    sources: str
    lock: str

    @property
    def key(self) -> str:
        """Cache key of the finished image."""
        return digest(asdict(self))

    @property
    def created_iso(self) -> str:
        """:attr:`created` as RFC 3339 UTC (``2026-12-01T14:45:38Z``)."""
        return iso(self.created)

    def labels(self) -> dict[str, str]:
        """OCI annotations/labels (opencontainers image-spec ``annotations.md``)."""
        return {
            "org.opencontainers.image.title": "gpufleet",
            "org.opencontainers.image.version": self.version,
            "org.opencontainers.image.revision": self.revision,
            "org.opencontainers.image.source": self.source,
            "org.opencontainers.image.created": self.created_iso,
            "org.opencontainers.image.ref.name": self.reference,
        }


def iso(epoch: int) -> str:
    """Seconds since 1970 as RFC 3339 UTC."""
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_spec(repo: Path = paths.REPO_ROOT, reference: str | None = None) -> ImageSpec:
    """The inputs of a build of checkout ``repo``.

    ``SOURCE_DATE_EPOCH`` in the environment overrides the commit time.

    Raises:
        ImageError: ``repo`` is not a git checkout.
        ValueError: ``reference`` (default: the ``gpufleet.image`` pin) is no valid reference.
    """
    ref = str(imageref.parse(reference or pin("gpufleet", "image"), what="image name"))
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    commit = _git(repo, "rev-parse", "HEAD").strip()
    dirty = _git(repo, "status", "--porcelain", "--", *SOURCE_PATHS).strip()
    created = int(os.environ.get("SOURCE_DATE_EPOCH") or _git(repo, "log", "-1", "--format=%ct").strip())
    files = source_files(repo)
    sources = digest([(f, (repo / f).read_bytes().hex()) for f in files])
    return ImageSpec(
        reference=ref, version=project["version"], revision=commit + ("-dirty" if dirty else ""),
        source=project.get("urls", {}).get("Source", ""), created=created, base=base_spec(),
        sources=sources, lock=digest(LOCK_FILE.read_text() if LOCK_FILE.exists() else ""),
    )


# --------------------------------------------------------------------------- the lock


def parse_lock(text: str) -> dict[str, tuple[str, str]]:
    """``{normalised name: (version, sha256)}`` of a lock written by :func:`lock_text`.

    Raises:
        ValueError: a requirement without ``==version`` or ``--hash=sha256:``.
    """
    out: dict[str, tuple[str, str]] = {}
    for entry in text.replace("\\\n", " ").splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        words = entry.split()
        if "==" not in words[0] or not any(w.startswith("--hash=sha256:") for w in words[1:]):
            raise ValueError(f"{LOCK_FILE.name}: {words[0]!r}: expected name==version --hash=sha256:<hex>")
        name, version = words[0].split("==", 1)
        sha = next(w for w in words[1:] if w.startswith("--hash=sha256:")).split(":", 1)[1]
        out[normalise(name)] = (version, sha)
    return out


def normalise(name: str) -> str:
    """PEP 503 normalised project name (``PyYAML`` -> ``pyyaml``, ``typing_extensions`` -> ``typing-extensions``)."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements(repo: Path = paths.REPO_ROOT) -> list[str]:
    """The ``dependencies`` of pyproject.toml: what the image carries (``name==version``)."""
    return list(tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"])


def _platform_args(python: str) -> list[str]:
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", python,
            "--abi", f"cp{python.replace('.', '')}"]
    for p in PLATFORMS:
        args += ["--platform", p]
    return args


def lock_text(repo: Path = paths.REPO_ROOT) -> str:
    """Resolve the run-time dependencies for the image's Python and platform; the lock file's text.

    pip resolves (``install --dry-run --report``) for CPython ``python`` on
    manylinux x86_64, binary wheels only; each wheel is pinned by version
    and sha256.

    Raises:
        ImageError: pip could not resolve (its message).
    """
    python = base_spec().python
    with tempdir("lock") as tmp:
        report = tmp / "report.json"
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                "--report", str(report), "--target", str(tmp / "t"), *_platform_args(python),
                *runtime_requirements(repo)]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageError(f"pip could not resolve the run-time dependencies:\n{proc.stderr[-3000:]}")
        items = json.loads(report.read_text())["install"]
    lines = [f"# The wheels in gpufleet's image: pyproject.toml's dependencies, resolved for CPython {python}",
             "# on manylinux x86_64 (Debian's python3). Regenerate with `invoke image.lock`.", ""]
    for item in sorted(items, key=lambda i: normalise(i["metadata"]["name"])):
        name, version = normalise(item["metadata"]["name"]), item["metadata"]["version"]
        sha = item["download_info"]["archive_info"]["hashes"]["sha256"]
        lines += [f"{name}=={version} \\", f"    --hash=sha256:{sha}"]
    return "\n".join(lines) + "\n"


def lock_problems(repo: Path = paths.REPO_ROOT) -> list[str]:
    """Run-time dependencies of pyproject.toml missing from the lock or locked at another version."""
    try:
        locked_ = parse_lock(LOCK_FILE.read_text())
    except FileNotFoundError:
        return [f"{LOCK_FILE.name} is missing (run `invoke image.lock`)"]
    problems = []
    for req in runtime_requirements(repo):
        name, _, version = req.partition("==")
        got = locked_.get(normalise(name))
        if got is None or got[0] != version:
            problems.append(f"{req}: {LOCK_FILE.name} has {got[0] if got else 'nothing'} "
                            "(run `invoke image.lock`)")
    return problems


# --------------------------------------------------------------------------- steps


def image_dir() -> Path:
    """The image cache: ``cache_dir()/image`` (base layers, wheels, finished images)."""
    return paths.cache_dir() / "image"


class Steps:
    """Runs external commands for one build, logging to one file; times each step."""

    def __init__(self, log: Path, say: Callable[[str], None]):
        self.log, self.say, self.seconds = log, say, {}
        log.parent.mkdir(parents=True, exist_ok=True)

    def run(self, step: str, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
        with open(self.log, "a") as out:
            out.write(f"\n$ {' '.join(argv)}\n")
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, stdin=subprocess.DEVNULL)
        with open(self.log, "a") as out:
            out.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise ImageError(f"{step}: {argv[0]} failed (exit {proc.returncode}); log {self.log}:\n{tail(self.log)}")
        return proc.stdout

    def timed(self, step: str, started: float) -> None:
        self.seconds[step] = round(time.monotonic() - started, 1)
        self.say(f"{step:28} {self.seconds[step]:6.1f}s")


def tempdir(label: str):
    import contextlib
    import tempfile

    @contextlib.contextmanager
    def cm() -> Iterator[Path]:
        image_dir().mkdir(parents=True, exist_ok=True)
        d = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=image_dir()))
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return cm()


def base_layer(spec: BaseSpec, steps: Steps, *, refresh: bool = False) -> tuple[Path, Path]:
    """The base root filesystem tar for ``spec`` and an OCI layout holding it as its one layer.

    Both are built (mmdebstrap, then umoci, which compresses the layer) unless
    cached under ``image_dir()/base/<key>``.

    Raises:
        ImageError: mmdebstrap or umoci failed (log tail).
    """
    folder = image_dir() / "base" / spec.key
    tar, layout = folder / "base.tar", folder / "layout"
    with locked(image_dir() / "base" / f".{spec.key}.lock"):
        if tar.exists() and (layout / "index.json").exists() and not refresh:
            return tar, layout
        started = time.monotonic()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".base.{os.getpid()}.tar"
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(spec.epoch))
        steps.run("debian base (mmdebstrap)", spec.mmdebstrap_argv(tmp), env=env)
        tmp.replace(tar)
        steps.timed("debian base (mmdebstrap)", started)
        started = time.monotonic()
        shutil.rmtree(layout, ignore_errors=True)
        staging = folder / f".layout.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        image = f"{staging}:{LAYOUT_TAG}"
        steps.run("umoci init", ["umoci", "init", "--layout", str(staging)])
        steps.run("umoci new", ["umoci", "new", "--image", image])
        steps.run("umoci base layer", ["umoci", "raw", "add-layer", "--image", image, "--history.created", iso(spec.epoch),
                                       "--history.created_by", f"mmdebstrap {spec.suite} {' '.join(spec.packages)}",
                                       str(tar)])
        staging.replace(layout)
        steps.timed("base layer (umoci)", started)
    return tar, layout


def wheels(spec: ImageSpec, repo: Path, work: Path, steps: Steps) -> list[Path]:
    """The locked wheels (downloaded into the cache, hashes checked) and gpufleet's own wheel.

    Raises:
        ImageError: the lock is stale, a download failed or a hash mismatched, or the build failed.
    """
    if problems := lock_problems(repo):
        raise ImageError("the image's lock does not match pyproject.toml:\n  " + "\n  ".join(problems))
    started = time.monotonic()
    cache = image_dir() / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    locked_ = parse_lock(LOCK_FILE.read_text())
    found = _cached_wheels(cache, locked_)
    if set(found) != set(locked_):
        steps.run("wheels (pip download)", [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                                            "--require-hashes", "-r", str(LOCK_FILE), "-d", str(cache),
                                            *_platform_args(spec.base.python)])
        found = _cached_wheels(cache, locked_)
    missing = sorted(set(locked_) - set(found))
    if missing:
        raise ImageError(f"wheels missing after pip download: {missing}")
    # gpufleet's wheel, from a copy of the source files only (no build folders in the checkout).
    src = work / "src"
    for f in source_files(repo):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / f, src / f)
    (src / "pyproject.toml").write_text(product_pyproject((repo / "pyproject.toml").read_text()))
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(spec.created))
    steps.run("gpufleet wheel", [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                                 "-w", str(work / "dist"), str(src)], env=env)
    own = sorted((work / "dist").glob("gpufleet-*.whl"))
    steps.timed("wheels", started)
    return [found[n] for n in sorted(found)] + own


def product_pyproject(text: str) -> str:
    """``pyproject.toml`` text for the image's wheel: only :data:`IMAGE_PACKAGES`.

    The checkout's project also packages ``gpufleet_admin``, ``gpufleet_workshop`` and ``roles`` (found by
    ``[tool.setuptools.packages.find]``, the roles mapped by ``[tool.setuptools.package-dir]``), and declares the
    workshop's console script and provider plugin; the image's wheel keeps the same name, version, dependencies
    and ``gpufleet`` console script, and finds :data:`IMAGE_PACKAGES` alone.

    Raises:
        ImageError: the tables are not where this expects them (the pyproject changed shape), or the result
            still names another package.
    """
    find = re.compile(r"^\[tool\.setuptools\.packages\.find\]\n(?:[^\[\n].*\n|\n)*", re.M)
    pkgdir = re.compile(r"^\[tool\.setuptools\.package-dir\]\n(?:[^\[\n].*\n|\n)*", re.M)
    plugins = re.compile(r"^\[project\.entry-points\.[^\]]*\]\n(?:[^\[\n].*\n|\n)*", re.M)
    if not find.search(text) or not pkgdir.search(text):
        raise ImageError("pyproject.toml: expected [tool.setuptools.packages.find] and [tool.setuptools.package-dir] "
                         "tables to restrict the image's wheel to the gpufleet package")
    include = ", ".join(f'"{p}", "{p}.*"' for p in IMAGE_PACKAGES)
    where = '"src", "."' if "roles" in IMAGE_PACKAGES else '"src"'
    text = find.sub(f'[tool.setuptools.packages.find]\nwhere = [{where}]\ninclude = [{include}]\n\n', text)
    roles = 'roles = "roles"\n' if "roles" in IMAGE_PACKAGES else ""
    text = pkgdir.sub(f'[tool.setuptools.package-dir]\n"" = "src"\n{roles}\n', text)
    text = plugins.sub("", text)
    text = "".join(line for line in text.splitlines(keepends=True)
                   if not ("gpufleet_workshop" in line and " = " in line and not line.startswith("include")))
    project = tomllib.loads(text)
    left = [k for k, v in project["project"].get("scripts", {}).items() if not v.startswith("gpufleet.")]
    if left or project["project"].get("entry-points"):
        raise ImageError(f"pyproject.toml: the image's wheel would still declare {left or 'entry points'} "
                         "outside the gpufleet package")
    return text


def _cached_wheels(cache: Path, locked_: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """``{name: wheel}`` of the cached wheels whose version and sha256 are the locked ones."""
    import hashlib

    found = {}
    for whl in sorted(cache.glob("*.whl")):
        name, version = whl.name.split("-")[:2]
        want = locked_.get(normalise(name))
        if want and want[0] == version.replace("_", "-") and hashlib.sha256(whl.read_bytes()).hexdigest() == want[1]:
            found[normalise(name)] = whl
    return found


def install_wheels(wheel_files: list[Path], root: Path, python: str, *, exclude: tuple[str, ...] = EXCLUDE) -> Path:
    """Install wheels into ``root`` as Debian's python3 sees them; returns the site-packages folder.

    Scheme: ``/usr/local/lib/python<X.Y>/dist-packages`` (purelib and
    platlib), scripts in ``/usr/local/bin`` with ``#!/usr/bin/python3``.
    Byte code is compiled with unchecked hashes, so it is the same in
    every build and never rewritten on a read-only root. ``exclude``: folders
    of the installed distributions to leave out (:data:`EXCLUDE`).
    """
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    site = f"/usr/local/lib/python{python}/dist-packages"
    scheme = {"purelib": site, "platlib": site, "headers": f"/usr/local/include/python{python}",
              "scripts": "/usr/local/bin", "data": "/usr/local"}
    for whl in wheel_files:
        dest = SchemeDictionaryDestination(scheme, interpreter="/usr/bin/python3", script_kind="posix",
                                           destdir=str(root))
        with WheelFile.open(whl) as source:
            install(source, dest, additional_metadata={"INSTALLER": b"gpufleet-image\n"})
    target = root / site.lstrip("/")
    for part in exclude:
        shutil.rmtree(target / part)
    # A fixed hash seed: set and frozenset constants are marshalled in
    # iteration order, which follows the string hash (PEP 552 leaves this
    # to the builder).
    proc = subprocess.run([sys.executable, "-m", "compileall", "-q", "-q", "-j", "1", "-s", str(root), "-p", "/",
                           "--invalidation-mode", "unchecked-hash", str(target)],
                          env=dict(os.environ, PYTHONHASHSEED="0"), capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"byte-compiling {target} failed: {(proc.stdout + proc.stderr).strip()[-2000:]}")
    return target


def dpkg_packages(base_tar: Path) -> list[dict[str, str]]:
    """Installed Debian packages of a base tar: ``[{"name", "version", "arch", "source"}]`` from ``var/lib/dpkg/status``."""
    with tarfile.open(base_tar) as tar:
        member = next(m for m in tar.getmembers() if m.name.lstrip("./") == "var/lib/dpkg/status")
        text = tar.extractfile(member).read().decode()
    out = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line and not line.startswith(" ") and ":" in line:
                k, v = line.split(":", 1)
                fields[k] = v.strip()
        if fields.get("Status", "").endswith(" installed"):
            out.append({"name": fields["Package"], "version": fields["Version"],
                        "arch": fields.get("Architecture", ""), "source": fields.get("Source", "").split(" ")[0]})
    return sorted(out, key=lambda p: p["name"])


def sbom(site: Path, pyproject: Path, debs: list[dict[str, str]], suite_version: str, work: Path,
         steps: Steps, epoch: int) -> dict:
    """The image's CycloneDX SBOM: Python distributions from cyclonedx-py, Debian packages from dpkg's status.

    ``cyclonedx-py environment`` reads the distributions on the interpreter's
    ``sys.path``; a stand-in interpreter answers with the image's
    site-packages, so the host runs nothing of the image. Reproducible
    output (no serial number, timestamp = ``epoch``).
    """
    fake = work / "python"
    fake.write_text(f"#!/bin/sh\necho '{json.dumps([str(site)])}'\n")
    fake.chmod(0o755)
    out = work / "sbom.cdx.json"
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    steps.run("sbom (cyclonedx-py)", [sys.executable, "-m", "cyclonedx_py", "environment", "--output-reproducible",
                                      "--pyproject", str(pyproject), "--of", "JSON", "-o", str(out), str(fake)], env=env)
    doc = json.loads(out.read_text())
    for p in debs:
        purl = (f"pkg:deb/debian/{p['name']}@{urllib.parse.quote(p['version'], safe='+~.')}"
                f"?arch={p['arch']}&distro=debian-{suite_version}")
        doc.setdefault("components", []).append({"type": "library", "bom-ref": purl, "name": p["name"],
                                                 "version": p["version"], "purl": purl})
    return doc


def layer_tar(root: Path, out: Path, epoch: int) -> None:
    """Write ``root`` as a layer tar: sorted, every entry owned by root:root, mtime ``epoch``, modes 0755/0644."""
    def entries() -> Iterator[Path]:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                yield Path(dirpath) / name

    paths_ = sorted(entries(), key=lambda p: p.relative_to(root).parts)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in paths_:
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = epoch
            if info.isdir():
                info.mode = 0o755
            elif info.isfile():
                info.mode = 0o755 if info.mode & 0o111 else 0o644
            if info.isfile():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)


@dataclass(frozen=True)
class ImageBuild:
    """A built image.

    Attributes:
        reference: its name (``ghcr.io/gpufleet/gpufleet:0.1.0``).
        digest: manifest digest (``sha256:...``): what a registry and a runtime call it.
        archive: the OCI archive (``out/image/gpufleet-<version>.oci.tar``).
        sbom: the CycloneDX JSON beside it.
        compressed_bytes: manifest, config and gzip layers: what a pull transfers.
        unpacked_bytes: the layers' uncompressed tars.
        seconds: wall time of this call (0 when cached).
        steps: seconds per build step of the build that made it.
        cached: True when nothing was built.
        key: the inputs' cache key.
    """

    reference: str
    digest: str
    archive: Path
    sbom: Path
    compressed_bytes: int
    unpacked_bytes: int
    seconds: float
    steps: dict[str, float]
    cached: bool
    key: str

    @property
    def pinned(self) -> str:
        """``reference@digest``: what an inventory pins."""
        return str(imageref.parse(self.reference).with_digest(self.digest))


def _umoci(steps: Steps, layout: Path, spec: ImageSpec, app_tar: Path) -> None:
    """Add the app layer and the config to ``layout`` (a copy of the base layout); drop unreferenced blobs."""
    image = f"{layout}:{LAYOUT_TAG}"
    when = spec.created_iso
    steps.run("umoci app layer", ["umoci", "raw", "add-layer", "--image", image, "--history.created", when,
                                  "--history.created_by", f"gpufleet {spec.version} and its locked wheels", str(app_tar)])
    argv = ["umoci", "config", "--image", image, "--no-history", "--created", when, "--author", "gpufleet",
            "--architecture", "amd64", "--os", "linux",
            "--config.user", f"{spec.base.uid}:{spec.base.uid}", "--config.entrypoint", "gpufleet",
            "--config.workingdir", "/", "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
            "--config.env", "PYTHONDONTWRITEBYTECODE=1", "--config.env", "PYTHONUNBUFFERED=1"]
    for k, v in spec.labels().items():
        if k != "org.opencontainers.image.ref.name":
            argv += ["--config.label", f"{k}={v}"]
        argv += ["--manifest.annotation", f"{k}={v}"]
    steps.run("umoci config", argv)
    steps.run("umoci gc", ["umoci", "gc", "--layout", str(layout)])


def layout_facts(layout: Path) -> tuple[str, int]:
    """``(manifest digest, compressed bytes)`` of the tagged image in an OCI layout."""
    index = json.loads((layout / "index.json").read_text())
    desc = next(m for m in index["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == LAYOUT_TAG)

    def blob(d: str) -> Path:
        algo, hexd = d.split(":")
        return layout / "blobs" / algo / hexd

    manifest = json.loads(blob(desc["digest"]).read_text())
    compressed = desc["size"] + manifest["config"]["size"] + sum(layer["size"] for layer in manifest["layers"])
    return desc["digest"], compressed


def build(repo: Path = paths.REPO_ROOT, *, reference: str | None = None, refresh_base: bool = False,
          force: bool = False, out_dir: Path | None = None, say: Callable[[str], None] = lambda m: None) -> ImageBuild:
    """Build gpufleet's image (or take it from the cache) and put it under ``out_dir``.

    Args:
        repo: the checkout to build from.
        reference: the name the image carries (default the ``gpufleet.image`` pin).
        refresh_base: rebuild the base from the mirror's current packages.
        force: rebuild the app layer and image even when cached.
        out_dir: where the archive, SBOM, digest and ``image.json`` go
            (default ``<repo>/out/image``).
        say: progress, one line per step with its seconds.

    Returns:
        The :class:`ImageBuild`; ``image.json`` beside the archive records it.

    Raises:
        ImageError: a step failed (log tail), or the lock does not match pyproject.toml.
        ValueError: ``reference`` is not a valid image reference.
    """
    started = time.monotonic()
    spec = image_spec(repo, reference)
    out_dir = out_dir or repo / "out" / "image"
    stem = f"gpufleet-{spec.version}"
    done = image_dir() / "images" / spec.key
    log = image_dir() / "build.log"
    steps = Steps(log, say)
    with locked(image_dir() / ".build.lock"):
        base, base_layout = base_layer(spec.base, steps, refresh=refresh_base)
        if refresh_base:
            spec = image_spec(repo, reference)
            done = image_dir() / "images" / spec.key
        record_file = done / "image.json"
        cached = record_file.exists() and not force and not refresh_base
        if not cached:
            with tempdir("build") as work:
                app = work / "rootfs"
                wheel_files = wheels(spec, repo, work, steps)
                t = time.monotonic()
                site = install_wheels(wheel_files, app, spec.base.python)
                steps.timed("install wheels", t)
                t = time.monotonic()
                doc = sbom(site, work / "src" / "pyproject.toml", dpkg_packages(base),
                           _debian_version(spec.base.suite), work, steps, spec.created)
                sbom_file = app / "usr/share/gpufleet/sbom.cdx.json"
                sbom_file.parent.mkdir(parents=True)
                sbom_file.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
                steps.timed("sbom", t)
                t = time.monotonic()
                app_tar = work / "app.tar"
                layer_tar(app, app_tar, spec.created)
                layout = work / "layout"
                shutil.copytree(base_layout, layout)
                _umoci(steps, layout, spec, app_tar)
                steps.timed("pack (umoci)", t)
                t = time.monotonic()
                staging = work / "done"
                staging.mkdir()
                steps.run("archive (skopeo)", ["skopeo", "copy", "--quiet", f"oci:{layout}:{LAYOUT_TAG}",
                                               f"oci-archive:{staging / (stem + '.oci.tar')}:{spec.reference}"])
                steps.timed("archive (skopeo)", t)
                manifest_digest, compressed = layout_facts(layout)
                shutil.copy2(sbom_file, staging / f"{stem}.sbom.cdx.json")
                record = {
                    "reference": spec.reference, "digest": manifest_digest,
                    "archive": f"{stem}.oci.tar", "sbom": f"{stem}.sbom.cdx.json",
                    "compressed_bytes": compressed,
                    "unpacked_bytes": base.stat().st_size + app_tar.stat().st_size,
                    "build_seconds": round(time.monotonic() - started, 1), "steps": steps.seconds,
                    "key": spec.key, "inputs": asdict(spec), "excluded": list(EXCLUDE),
                    "debian_packages": {p["name"]: p["version"] for p in dpkg_packages(base)},
                    "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
                (staging / "image.json").write_text(json.dumps(record, indent=1) + "\n")
                if done.exists():
                    shutil.rmtree(done)
                done.parent.mkdir(parents=True, exist_ok=True)
                staging.replace(done)
        record = json.loads(record_file.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (record["archive"], record["sbom"], "image.json"):
        link_or_copy(done / name, out_dir / name)
    (out_dir / f"{stem}.digest").write_text(record["digest"] + "\n")
    return ImageBuild(
        reference=record["reference"], digest=record["digest"], archive=out_dir / record["archive"],
        sbom=out_dir / record["sbom"], compressed_bytes=record["compressed_bytes"],
        unpacked_bytes=record["unpacked_bytes"], seconds=0.0 if cached else round(time.monotonic() - started, 1),
        steps=record["steps"], cached=cached, key=record["key"],
    )


def _debian_version(suite: str) -> str:
    return {"bookworm": "12", "trixie": "13", "bullseye": "11"}.get(suite, suite)


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` becomes ``src`` (a hard link where the file system allows, else a copy), atomically."""
    if dst.exists() and os.path.samefile(src, dst):
        return  # rename() of two links to one file does nothing and would leave the temporary name behind
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    tmp.replace(dst)


def built(out_dir: Path | None = None) -> dict | None:
    """The record (``image.json``) of the image last built into ``out_dir`` (default ``out/image``), None if none."""
    try:
        return json.loads(((out_dir or OUT_DIR) / "image.json").read_text())
    except FileNotFoundError:
        return None


#: Transports ``push`` accepts besides a registry (skopeo's names): local copies for tests and air gaps.
LOCAL_TRANSPORTS = ("oci:", "oci-archive:", "dir:", "docker-archive:")


def push_destination(to: str) -> str:
    """The skopeo destination for ``--to``: ``docker://REF`` for a registry reference, local transports as given.

    Raises:
        ValueError: ``to`` is neither a reference with a tag or digest nor
            ``oci:PATH[:TAG]``, ``oci-archive:PATH[:REF]``, ``dir:PATH`` or
            ``docker-archive:PATH[:REF]`` with a path.
    """
    if to.startswith(LOCAL_TRANSPORTS):
        transport, _, rest = to.partition(":")
        if not rest or rest.startswith(":"):
            raise ValueError(f"--to {to!r}: expected a path after {transport}:")
        return to
    ref = imageref.parse(to.removeprefix("docker://"), what="--to")
    if not ref.registry:
        raise ValueError(f"--to {to!r}: expected a registry host in front (REGISTRY/REPO:TAG, e.g. "
                         "registry.example.com/platform/gpufleet:0.1.0)")
    if ref.digest:
        raise ValueError(f"--to {to!r}: expected a tag, not a digest (the registry computes the digest)")
    return f"docker://{ref}"


def push(to: str, *, archive: Path | None = None, dry_run: bool = False, extra: list[str] | None = None) -> tuple[str, str]:
    """Copy the built image to ``to`` with ``skopeo copy`` (blobs and manifest as they are: the digest is kept).

    Args:
        to: ``REGISTRY/REPO:TAG`` or a local transport (:func:`push_destination`).
        archive: the OCI archive (default the one :func:`build` last wrote under ``out/image``).
        dry_run: only return what would run.
        extra: further skopeo flags (``--dest-creds``, ``--dest-tls-verify=false``, ``--authfile``).

    Returns:
        ``(destination, digest)``: the digest is the image's manifest digest, which a registry keeps.

    Raises:
        ValueError: bad ``to``.
        ImageError: no built image, or skopeo failed (its message).
    """
    dest = push_destination(to)
    record = built(archive.parent if archive else None)
    if archive is None:
        if record is None:
            raise ImageError(f"no image built in {OUT_DIR} (run `invoke image.build` first)")
        archive = OUT_DIR / record["archive"]
    if not archive.is_file():
        raise ImageError(f"{archive}: no such OCI archive (run `invoke image.build` first)")
    digest_ = record["digest"] if record else ""
    argv = ["skopeo", "copy", "--quiet", "--preserve-digests", *(extra or []), f"oci-archive:{archive}", dest]
    if dry_run:
        return " ".join(argv), digest_
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise ImageError(f"skopeo copy to {dest} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return dest, digest_
