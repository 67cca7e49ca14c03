"""Where one local cluster keeps its state: ``state_dir()/<name>/``.

::

    <name>/
      kubeconfig              admin kubeconfig (what `local.kubeconfig` prints)
      cluster.json            what `up` built: env, node count, ports, started
      certs/                  PKI (see gpufleet_workshop.local.certs)
      config/                 generated component configs and kubeconfigs
      data/etcd/              etcd data
      data/prometheus/        Prometheus TSDB
      logs/<component>.log    stdout+stderr of each process
      pids/<component>.pid    process ids (each process leads its own group)
      prometheus/targets/     file_sd target files anyone may drop here
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet import paths

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")


#: The cluster ``invoke local.up`` starts when no ``--name`` is given.
DEFAULT_NAME = "gpufleet"


def check_name(name: str) -> str:
    """Validate a cluster name (DNS label, at most 32 characters) and return it.

    Raises:
        ValueError: the name is not a short DNS label.
    """
    if not _NAME.match(name):
        raise ValueError(f"cluster name {name!r}: expected a DNS label of 1-32 characters [a-z0-9-]")
    return name


@dataclass(frozen=True)
class Layout:
    """Paths of one cluster's state folder (nothing is created until :meth:`create`)."""

    name: str

    @property
    def root(self) -> Path:
        """``state_dir()/<name>``."""
        return paths.state_dir() / self.name

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig."""
        return self.root / "kubeconfig"

    @property
    def record(self) -> Path:
        """``cluster.json``: what the last ``up`` built."""
        return self.root / "cluster.json"

    @property
    def certs(self) -> Path:
        """PKI folder."""
        return self.root / "certs"

    @property
    def config(self) -> Path:
        """Generated configuration files."""
        return self.root / "config"

    @property
    def data(self) -> Path:
        """Persistent data (etcd, Prometheus)."""
        return self.root / "data"

    @property
    def logs(self) -> Path:
        """One log per component."""
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        """One pid file per component."""
        return self.root / "pids"

    @property
    def scrape_targets(self) -> Path:
        """Prometheus file_sd folder: every ``*.yaml``/``*.json`` here is scraped."""
        return self.root / "prometheus" / "targets"

    @property
    def endpointslice_targets(self) -> Path:
        """The file_sd file of annotated Services' endpoints (:mod:`gpufleet_workshop.local.endpointslice_sd`)."""
        return self.root / "prometheus" / "endpointslices.json"

    def log(self, component: str) -> Path:
        """Log file of a component."""
        return self.logs / f"{component}.log"

    def pid(self, component: str) -> Path:
        """Pid file of a component."""
        return self.pids / f"{component}.pid"

    def create(self) -> Layout:
        """Create every folder (idempotent) and return self."""
        for d in (self.certs, self.config, self.data / "etcd", self.data / "prometheus", self.logs, self.pids, self.scrape_targets):
            d.mkdir(parents=True, exist_ok=True)
        (self.data / "etcd").chmod(0o700)
        return self
