"""Loopback port blocks, one per local cluster name, recorded in ``state_dir()/ports.json``.

Each cluster owns a block of :data:`BLOCK` consecutive ports starting at
``BASE + i * BLOCK``, below Linux's ephemeral range (32768+) so outgoing
connections never take them while the cluster is down. The block stays
recorded (and reused) for the name until :func:`release` is called, so
ports are stable across ``down``/``up``. Offsets within a block are fixed
(:data:`OFFSETS`); the last few are free for the environment's own
exporters (``extra``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpufleet import paths

BASE = 20000
BLOCK = 20
MAX_BLOCKS = 100

#: Offset of each component's port within a block.
OFFSETS: dict[str, int] = {
    "etcd_client": 0,
    "etcd_peer": 1,
    "etcd_metrics": 2,
    "apiserver": 3,
    "controller_manager": 4,
    "scheduler": 5,
    "kwok": 6,
    "kueue_webhook": 7,
    "kueue_health": 8,
    "kueue_metrics": 9,
    "jobset_webhook": 10,
    "jobset_health": 11,
    "jobset_metrics": 12,
    "descheduler": 13,
    "prometheus": 14,
    "kubelet": 15,
    "kubelet_healthz": 16,
    "metrics_server": 17,
}
#: Offsets left for the environment (exporters, a virtual kubelet's API).
EXTRA_OFFSETS = tuple(range(max(OFFSETS.values()) + 1, BLOCK))


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one cluster (all on 127.0.0.1).

    Attributes:
        base: first port of the block; every attribute below is ``base + offset``.
    """

    base: int

    def __getattr__(self, name: str) -> int:
        try:
            return self.base + OFFSETS[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def extra(self) -> tuple[int, ...]:
        """Ports of the block no component uses, free for exporters etc."""
        return tuple(self.base + o for o in EXTRA_OFFSETS)

    def all(self) -> dict[str, int]:
        """``{component_port_name: port}`` for every named port."""
        return {k: self.base + v for k, v in OFFSETS.items()}


def _registry() -> Path:
    return paths.state_dir() / "ports.json"


@contextlib.contextmanager
def _locked() -> Iterator[dict[str, int]]:
    reg = _registry()
    reg.parent.mkdir(parents=True, exist_ok=True)
    with open(reg.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(reg.read_text()) if reg.exists() else {}
        except json.JSONDecodeError:
            data = {}
        yield data
        tmp = reg.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(reg)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` and it can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def busy_ports(ports: Ports) -> list[int]:
    """Ports of the block that are in use right now (something listens or binds)."""
    return [p for p in range(ports.base, ports.base + BLOCK) if not port_free(p)]


def allocate(name: str) -> Ports:
    """The port block of cluster ``name``: the recorded one, or the first free block.

    A new block must be unrecorded and have every port free right now.

    Raises:
        RuntimeError: no free block among :data:`MAX_BLOCKS`.
    """
    with _locked() as data:
        if name in data:
            return Ports(int(data[name]))
        taken = {int(v) for v in data.values()}
        for i in range(MAX_BLOCKS):
            base = BASE + i * BLOCK
            if base in taken:
                continue
            if all(port_free(p) for p in range(base, base + BLOCK)):
                data[name] = base
                return Ports(base)
    raise RuntimeError(f"no free block of {BLOCK} loopback ports between {BASE} and {BASE + MAX_BLOCKS * BLOCK}")


def lookup(name: str) -> Ports | None:
    """The recorded block of ``name``, or None."""
    with _locked() as data:
        return Ports(int(data[name])) if name in data else None


def release(name: str) -> None:
    """Forget the block of ``name`` (no error if it has none)."""
    with _locked() as data:
        data.pop(name, None)
