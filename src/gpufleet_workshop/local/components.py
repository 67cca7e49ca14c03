"""What the local cluster runs, and how each piece is obtained, from ``versions.yaml``.

A :class:`Component` is pure data: the Go packages to build (or the Debian
package to install), the binaries that result, and how to prove a cached
binary is the pinned one. :mod:`gpufleet_workshop.local.install` does the work.

Three ways to obtain a component:

``go-install``
    ``go install <package>@<version>`` with ``GOBIN`` pointing into the cache;
    for modules without ``replace`` directives (kwok, Kueue).
``go-module``
    A generated build module of our own (``go.mod`` requiring the upstream
    module, ``tools.go`` importing the main packages) for modules whose own
    ``go.mod`` has ``replace`` directives (etcd, Kubernetes, descheduler), or
    whose version list the module proxy refuses (JobSet: ``go install``
    reads it for deprecation notices). Each
    upstream ``replace`` that points to a local path is turned into a version
    replace: Kubernetes' staging modules go to ``staging_version``, sibling
    modules of a multi-module repository (etcd) to the component's version;
    version replaces are copied as they are.
``go-local``
    A Go main package kept in this repository (:data:`DRA_DRIVER_SOURCE`, the
    local real node's DRA driver): its sources are copied into a build
    module whose ``go.mod`` requires the pinned modules (``requires``) and is
    tidied there, so its versions too live in ``versions.yaml`` alone. The
    version in the cache key carries a digest of the sources: an edit rebuilds.
``apt``
    Debian packages (Prometheus; mmdebstrap, umoci and skopeo, which build
    gpufleet's image), installed with ``apt-get`` only if a binary is missing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from gpufleet_admin.build.gobuild import Cached
from gpufleet_admin.versions import pin, versions

Method = Literal["go-install", "go-module", "go-local", "apt"]
#: The local real node's DRA driver (Go, on k8s.io/dynamic-resource-allocation/kubeletplugin).
DRA_DRIVER_SOURCE = Path(__file__).with_name("dra_driver")
#: What the local cluster runs of k8s.io/kubernetes: the control plane, the real node's kubelet and the
#: Service data plane's kube-proxy (confined to a network namespace, :mod:`gpufleet_workshop.local.dataplane`).
KUBERNETES_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
#: KEDA's operator (ScaledObjects, the scalers that query Prometheus) and its metrics adapter (the external
#: metrics API the HPA reads), built from one module (:mod:`gpufleet_workshop.local.keda`).
KEDA_BINARIES = ("operator", "adapter")


@dataclass(frozen=True)
class Component(Cached):
    """One thing the local cluster needs, pinned to one version.

    Attributes:
        name: key in ``versions.yaml`` (``"kubernetes"``, ``"etcd"``, ...).
        version: the pinned version (``"v1.35.4"``); ``"debian"`` for apt
            (whatever the distribution ships).
        method: how it is obtained (see the module docstring).
        module: the upstream Go module (``"k8s.io/kubernetes"``); for apt the
            Debian package names, separated by spaces.
        packages: Go main packages to build, in the order of ``binaries``.
        binaries: file names produced under :attr:`bin_dir` (one per package).
        ldflags: extra ``-X`` settings so the binary reports its version.
        version_probe: binary -> argv suffix whose output must contain
            :attr:`version_text` (e.g. ``{"etcd": ("--version",)}``).
        version_text: expected substring of the probe output.
        staging_version: version for ``k8s.io/*`` staging replaces (Kubernetes only).
        extra_requires: further modules the generated ``go.mod`` requires at
            :attr:`version` (etcd's sibling modules).
        apt_dir: folder of an apt component's binaries (``/usr/bin``).
        source: ``go-local``: the folder of its Go sources.
        requires: ``go-local``: ``module version`` lines its ``go.mod`` requires.
        verify_version: the version ``go version -m`` must list for :attr:`module`
            (default :attr:`version`; a ``go-local`` version also carries a source digest).
    """

    name: str
    version: str
    method: Method
    module: str = ""
    packages: tuple[str, ...] = ()
    binaries: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    version_probe: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    version_text: str = ""
    staging_version: str = ""
    extra_requires: tuple[str, ...] = ()
    apt_dir: str = "/usr/bin"
    source: str = ""
    requires: tuple[str, ...] = ()
    verify_version: str = ""

    @property
    def bin_dir(self) -> Path:
        """Where the binaries live: ``<dir>/bin``."""
        return self.dir / "bin"

    def binary(self, name: str | None = None) -> Path:
        """Path of one binary (the first one when ``name`` is None).

        Raises:
            KeyError: ``name`` is not one of :attr:`binaries`.
        """
        name = name or self.binaries[0]
        if name not in self.binaries:
            raise KeyError(f"{self.name} has no binary {name!r} (has {', '.join(self.binaries)})")
        if self.method == "apt":
            return Path(self.apt_dir) / name
        return self.bin_dir / name


def _ldflags_kubernetes(version: str) -> tuple[str, ...]:
    major, minor = version.lstrip("v").split(".")[:2]
    return (
        f"k8s.io/component-base/version.gitVersion={version}",
        f"k8s.io/component-base/version.gitMajor={major}",
        f"k8s.io/component-base/version.gitMinor={minor}",
        "k8s.io/component-base/version.gitTreeState=clean",
        f"k8s.io/client-go/pkg/version.gitVersion={version}",
        "k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z",
    )


@cache
def components() -> dict[str, Component]:
    """Every component of the local cluster, keyed by name, in build order.

    Order: cheap builds first, so a cold install makes visible progress
    early; Kubernetes (the longest) last of the Go builds; the Debian
    packages (apt: Prometheus, image tools, node runtime, CNI plugins) after.

    Raises:
        KeyError: a needed pin is missing from ``versions.yaml``.
    """
    items = [*_go_components(), *_debian_components()]
    missing = {"kubernetes", "dynamic_resource_allocation", "etcd", "kwok", "kueue", "jobset", "descheduler",
               "metrics_server", "keda", "prometheus", "image_tools",
               "node_runtime", "cni_plugins"} - set(versions())
    if missing:  # pragma: no cover - pin() above already raised
        raise KeyError(f"versions.yaml: missing {sorted(missing)}")
    return {c.name: c for c in items}


def _go_components() -> list[Component]:
    """The components built from Go sources at their pinned versions, cheap builds first, Kubernetes last."""
    k8s = pin("kubernetes")
    etcd = pin("etcd")
    kwok, kueue, jobset, desched = pin("kwok"), pin("kueue"), pin("jobset"), pin("descheduler")
    metrics, keda = pin("metrics_server"), pin("keda")
    etcd_root = pin("etcd", "module").removesuffix("/server/v3")
    return [
        Component(
            name="etcd",
            version=etcd,
            method="go-module",
            module=pin("etcd", "module"),
            packages=(pin("etcd", "module"),),
            binaries=("etcd",),
            version_probe={"etcd": ("--version",)},
            version_text=f"etcd Version: {etcd.lstrip('v')}",
            extra_requires=tuple(
                f"{etcd_root}/{m}" for m in ("api/v3", "client/pkg/v3", "client/v3", "pkg/v3")
            ),
        ),
        Component(
            name="kwok",
            version=kwok,
            method="go-install",
            module=pin("kwok", "module"),
            packages=(f"{pin('kwok', 'module')}/cmd/kwok",),
            binaries=("kwok",),
            version_probe={"kwok": ("--version",)},
            version_text=kwok,
        ),
        Component(
            name="jobset",
            version=jobset,
            # The proxy refuses sigs.k8s.io/jobset's version list, which
            # `go install pkg@version` reads for deprecation notices.
            method="go-module",
            module=pin("jobset", "module"),
            packages=(pin("jobset", "module"),),
            binaries=("jobset",),
            ldflags=(f"sigs.k8s.io/jobset/pkg/version.GitVersion={jobset}",),
        ),
        Component(
            name="kueue",
            version=kueue,
            method="go-install",
            module=pin("kueue", "module"),
            packages=(f"{pin('kueue', 'module')}/cmd/kueue",),
            binaries=("kueue",),
            ldflags=(f"sigs.k8s.io/kueue/pkg/version.GitVersion={kueue}",),
        ),
        Component(
            name="descheduler",
            version=desched,
            method="go-module",
            module=pin("descheduler", "module"),
            packages=(f"{pin('descheduler', 'module')}/cmd/descheduler",),
            binaries=("descheduler",),
            # Upstream's Makefile stamps v<build date>-<tag>; the descheduler
            # derives its major/minor (for its Kubernetes skew check) from that form.
            ldflags=(
                f"sigs.k8s.io/descheduler/pkg/version.version=v20260101-{desched}",
                "sigs.k8s.io/descheduler/pkg/version.buildDate=2026-01-01T00:00:00Z",
            ),
            version_probe={"descheduler": ("version",)},
            version_text=f"Minor:{'.'.join(desched.lstrip('v').split('.')[1:])} GitVersion:v20260101-{desched}",
        ),
        Component(
            name="metrics_server",
            version=metrics,
            method="go-install",
            module=pin("metrics_server", "module"),
            packages=(f"{pin('metrics_server', 'module')}/cmd/metrics-server",),
            binaries=("metrics-server",),
            # Upstream's Makefile stamps client-go's version variables (what --version prints).
            ldflags=(f"k8s.io/client-go/pkg/version.gitVersion={metrics}",),
            version_probe={"metrics-server": ("--version",)},
            version_text=metrics,
        ),
        Component(
            name="keda",
            version=keda,
            # Its go.mod has a replace (a pseudo-version of one module): `go install pkg@version` refuses it.
            method="go-module",
            module=pin("keda", "module"),
            # One `go build -o bin/` for both: they share most packages; the binaries take the packages' names.
            packages=tuple(f"{pin('keda', 'module')}/cmd/{b}" for b in KEDA_BINARIES),
            binaries=KEDA_BINARIES,
            ldflags=(f"github.com/kedacore/keda/v2/version.Version={keda}",),
        ),
        Component(
            name="kubernetes",
            version=k8s,
            method="go-module",
            module=pin("kubernetes", "module"),
            # One `go build` for all four: they share most packages and Go's build cache.
            packages=tuple(f"{pin('kubernetes', 'module')}/cmd/{b}" for b in KUBERNETES_BINARIES),
            binaries=KUBERNETES_BINARIES,
            ldflags=_ldflags_kubernetes(k8s),
            version_probe={b: ("--version",) for b in KUBERNETES_BINARIES},
            version_text=f"Kubernetes {k8s}",
            staging_version=pin("kubernetes", "staging_version"),
        ),
        _dra_driver(),
    ]


def source_digest(folder: Path) -> str:
    """Digest (12 hex) of the ``*.go`` files of ``folder``: names and contents, in name order."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.go")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _dra_driver() -> Component:
    """The local real node's DRA driver: built after Kubernetes, whose staging modules it shares (build cache)."""
    dra, staging = pin("dynamic_resource_allocation"), pin("kubernetes", "staging_version")
    module = pin("dynamic_resource_allocation", "module")
    return Component(
        name="dra_driver",
        version=f"{dra}-{source_digest(DRA_DRIVER_SOURCE)}",
        method="go-local",
        module=module,
        packages=("gpufleet_workshop.local/dra-driver",),
        binaries=("gpufleet-dra-driver",),
        source=str(DRA_DRIVER_SOURCE),
        requires=(f"{module} {dra}", *(f"k8s.io/{m} {staging}" for m in ("api", "apimachinery", "client-go"))),
        verify_version=dra,
    )


def _debian_components() -> list[Component]:
    """The components installed from Debian packages (apt): Prometheus, the image tools, the real node's runtime."""
    return [
        Component(
            name="prometheus",
            version="debian",
            method="apt",
            module=pin("prometheus", "debian_package"),
            binaries=("prometheus", "promtool"),
            version_probe={"prometheus": ("--version",)},
            version_text="prometheus, version",
        ),
        Component(
            name="image_tools",
            version="debian",
            method="apt",
            module=pin("image_tools", "debian_packages"),
            binaries=("mmdebstrap", "umoci", "skopeo"),
        ),
        Component(
            name="node_runtime",
            version="debian",
            method="apt",
            module=pin("node_runtime", "debian_packages"),
            binaries=("containerd", "ctr", "containerd-shim-runc-v2", "socat"),
            version_probe={"containerd": ("--version",)},
            version_text="containerd",
        ),
        Component(
            name="cni_plugins",
            version="debian",
            method="apt",
            module=pin("cni_plugins", "debian_packages"),
            binaries=("bridge", "host-local", "loopback"),
            apt_dir="/usr/lib/cni",
        ),
    ]


def component(name: str) -> Component:
    """One component by name.

    Raises:
        KeyError: naming the unknown component and the known ones.
    """
    try:
        return components()[name]
    except KeyError:
        raise KeyError(f"unknown component {name!r}; known: {', '.join(components())}") from None


def binary(component_name: str, binary_name: str | None = None) -> Path:
    """Shortcut: path of a cached binary, e.g. ``binary("kubernetes", "kube-apiserver")``."""
    return component(component_name).binary(binary_name)
