"""Simulated GPU nodes for the remediation controller's tests and benchmark.

Each :class:`SimulatedNode` is the project's own exporter (the collectors of
:mod:`gpufleet.exporter.collector`, NVML through
:class:`~gpufleet_workshop.fixtures.node.FakeNvmlBackend`, a fixture sysfs tree)
served over HTTP on loopback, with knobs that change what the next scrape
sees: heat a GPU, raise an XID, lose a GPU or fail its NVML handle, grow
NVLink errors or a port's counters (InfiniBand or RoCE). A real Prometheus scrapes them with a ``node`` label per target
(:func:`scrape_config`), exactly as the gpu_metrics role's relabeling
labels the DaemonSet's pods, so the controller's queries and the metric
names are the ones production uses.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from gpufleet.exporter.nvml_fake import FakeNvmlBackend
from gpufleet_workshop.fixtures.node import build_sysfs, healthy_node
from gpufleet.exporter.main import build_registry


@dataclass
class SimulatedNode:
    """One node's exporter on ``127.0.0.1:port``; mutate it with the methods below.

    Attributes:
        name: the Kubernetes node it stands for (the ``node`` label).
        desc: the node description the fake NVML reads (mutated in place).
        port: the HTTP port of ``/metrics``.
    """

    name: str
    desc: dict[str, Any]
    backend: FakeNvmlBackend
    port: int
    _server: Any = field(repr=False, default=None)
    sysfs_root: Path | None = None

    @property
    def target(self) -> str:
        """``host:port`` for a scrape config."""
        return f"127.0.0.1:{self.port}"

    def set_temperature(self, gpu: int, celsius: float, memory: bool = False) -> None:
        """Set GPU ``gpu``'s die (or HBM) temperature as of the next scrape."""
        self.desc["gpus"][gpu]["memory_temperature" if memory else "temperature"] = celsius

    def raise_xid(self, gpu: int, xid: int) -> None:
        """Deliver one XID event on GPU ``gpu`` (counted by the next scrape)."""
        self.backend._pending.append((gpu, xid))  # the fake's event queue, as NVML's event set

    def add_ecc_uncorrected(self, gpu: int, n: int = 1) -> None:
        """Add ``n`` uncorrected ECC errors on GPU ``gpu``."""
        self.desc["gpus"][gpu]["ecc"]["uncorrected"] += n

    def add_nvlink_errors(self, gpu: int, link: int = 0, kind: str = "replay", n: int = 1) -> None:
        """Add ``n`` NVLink errors of ``kind`` on one link."""
        self.desc["gpus"][gpu]["nvlinks"][link][kind] += n

    def lose_gpu(self, gpu: int) -> None:
        """Make NVML report GPU ``gpu`` lost."""
        self.desc["gpus"][gpu]["lost"] = True

    def fail_gpu_handle(self, gpu: int, error: str = "unknown") -> None:
        """Make NVML's device handle of GPU ``gpu`` fail with ``error`` (an NVML error name, not lost)."""
        self.desc["gpus"][gpu]["handle_error"] = error

    def add_port_counter(self, hca: str, counter: str, n: int = 1, *, port: int = 1, group: str = "counters") -> None:
        """Add ``n`` to ``<group>/<counter>`` of ``hca`` port ``port`` in the sysfs tree (``hw_counters`` too)."""
        assert self.sysfs_root is not None
        path = self.sysfs_root / "class" / "infiniband" / hca / "ports" / str(port) / group / counter
        path.write_text(f"{int(path.read_text()) + n}\n")

    def set_port_counter(self, hca: str, counter: str, value: int, *, port: int = 1, group: str = "counters") -> None:
        """Set ``<group>/<counter>`` of ``hca`` port ``port`` to ``value`` (e.g. its width's maximum: saturated)."""
        assert self.sysfs_root is not None
        path = self.sysfs_root / "class" / "infiniband" / hca / "ports" / str(port) / group / counter
        path.write_text(f"{int(value)}\n")

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def start_node(name: str, *, gpus: int = 8, workdir: str | Path | None = None, roce: bool = False) -> SimulatedNode:
    """Serve a healthy simulated node's metrics on a free loopback port.

    Args:
        name: node name (the ``node`` label Prometheus adds).
        gpus: GPUs (two NVLinks each, one InfiniBand HCA ``mlx5_0``, to keep scrapes small).
        workdir: where the sysfs tree goes (default: a new temp dir).
        roce: add a RoCE HCA ``mlx5_1`` (Ethernet link layer).
    """
    desc = healthy_node(name, gpus=gpus, hcas=1, nvlinks=2, roce=roce)
    root = Path(workdir or tempfile.mkdtemp(prefix=f"gpufleet-sim-{name}-")) / "sys"
    build_sysfs(desc, root)
    backend = FakeNvmlBackend(desc)
    registry = build_registry(str(root), nvml_backend=backend)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    return SimulatedNode(name, desc, backend, server.server_port, server, sysfs_root=root)


def scrape_config(nodes: list[SimulatedNode], interval: str = "1s", job: str = "gpufleet-fabric") -> dict[str, Any]:
    """A Prometheus scrape job for ``nodes``, each target labelled ``node=<name>``."""
    return {"job_name": job, "scrape_interval": interval, "scrape_timeout": interval,
            "static_configs": [{"targets": [n.target], "labels": {"node": n.name}} for n in nodes]}
