"""Rental instances that really serve: one local process per rented pod, for the simulated provider.

A GPU rental gives each rented pod an instance with an endpoint of its own.
The simulated provider (:mod:`gpufleet_workshop.rental.provider`) invents
those endpoints in 198.18.0.0/15, which nothing routes: enough to publish,
not to serve. With ``instances: local_process`` (the pool's inventory
variable) every instance is instead a process the virtual kubelet starts
beside itself: gpufleet's inference stand-in (``gpufleet-standin``,
:mod:`gpufleet_workshop.inference_standin`), listening on
the virtual kubelet's own address (``$POD_IP`` in its pod) at a port of its
own, one per container port of the pod (as rental APIs map ports). The
endpoint lives and dies with the process: a request sent there is served by
the instance, and an instance killed (:meth:`LocalInstances.kill`) refuses
connections while the rental API still reports the pod Running.

Only a pod that runs the stand-in itself (its first container's command
is ``gpufleet-standin``, as ``sim.flip``'s inference does) gets a
process: the local environment runs no other image, so any other rental
keeps an endpoint nothing serves (and thousands of rentals in a benchmark
start no process).

Each process is told the pod's name and the virtual node's name
(``POD_NAME``, ``NODE_NAME``) so it says who served, and keeps the pod's
``--latency-ms`` when the pod runs the stand-in too. Stopping sends
SIGTERM: the stand-in drains as a pod's server does.

What an instance uses (:meth:`LocalInstances.usage`) is its processes'
own, read from ``/proc/<pid>/stat`` (user + system CPU, in clock ticks)
and ``/proc/<pid>/statm`` (resident pages), as a rental's instance
statistics would report them (proc(5)).

Errors: :class:`OSError` from starting a process (the caller turns it into
a failed rental).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from gpufleet_workshop.inference_standin import COMMAND

#: The stand-in's flags a rented pod may set and the instance keeps.
KEPT_FLAGS = ("--latency-ms", "--drain-seconds")
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_usage(pid: int) -> tuple[float, int] | None:
    """Process ``pid``'s CPU (user + system, seconds) and resident set (bytes); None once it is gone (proc(5))."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - two small reads
        statm = open(f"/proc/{pid}/statm").read()  # noqa: SIM115
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: fields count from the last ")".
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS, int(statm.split()[1]) * _PAGE


def runs_standin(container: dict) -> bool:
    """Whether a pod whose first container is ``container`` runs gpufleet's inference stand-in (its ``command`` is
    :data:`~gpufleet_workshop.inference_standin.COMMAND`): only such pods get a local instance; any other image
    would not run here, and its rental keeps an endpoint nothing serves."""
    return list(container.get("command") or [])[:1] == [COMMAND]


def standin_flags(args: list[str]) -> list[str]:
    """The stand-in flags of a pod's container ``args`` (:data:`KEPT_FLAGS` with their values) to keep."""
    out = []
    for flag in KEPT_FLAGS:
        if flag in args[:-1]:
            out += [flag, args[args.index(flag) + 1]]
    return out


@dataclass
class LocalInstances:
    """Instances as local processes on ``address``, ports from ``port_base`` up (one per container port).

    Attributes:
        address: where the processes listen and the endpoints are reported (IPv4).
        node_name: the virtual node, as the instances report it.
        port_base: first port handed out.
    """

    address: str
    node_name: str = ""
    port_base: int = 41000
    _procs: dict[str, list[subprocess.Popen]] = field(default_factory=dict)
    _ports: dict[str, list[int]] = field(default_factory=dict)
    _specs: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    _started: dict[str, float] = field(default_factory=dict)
    _free: list[int] = field(default_factory=list)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _port(self) -> int:
        if self._free:
            return self._free.pop()
        self._next += 1
        return self.port_base + self._next - 1

    def start(self, uid: str, name: str, container_ports: int, args: list[str]) -> list[int]:
        """Start the instance of pod ``uid`` (named ``name``): one process per container port; their ports.

        Raises:
            OSError: a process could not be started (none is left running).
        """
        with self._lock:
            if uid in self._ports:
                return list(self._ports[uid])
            ports = [self._port() for _ in range(max(1, container_ports))]
            try:
                procs = self._spawn(ports, name, args)
            except OSError:
                self._free += ports
                raise
            self._procs[uid], self._ports[uid], self._specs[uid] = procs, ports, (name, list(args))
            self._started[uid] = time.time()
            return list(ports)

    def _spawn(self, ports: list[int], name: str, args: list[str]) -> list[subprocess.Popen]:
        procs: list[subprocess.Popen] = []
        try:
            for port in ports:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "gpufleet_workshop.inference_standin", "--address", self.address,
                     "--port", str(port), "--cluster", self.node_name, *standin_flags(args)],
                    env={**os.environ, "POD_NAME": name, "NODE_NAME": self.node_name},
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except OSError:
            for p in procs:
                p.kill()
                p.wait()  # reaped: no zombie per failed rental
            raise
        return procs

    def revive(self, uid: str) -> None:
        """Start pod ``uid``'s killed processes again on the same ports (nothing when it has no instance).

        Raises:
            OSError: a process could not be started.
        """
        with self._lock:
            if uid not in self._ports:
                return
            for p in self._procs[uid]:
                p.kill()
                p.wait()
            name, args = self._specs[uid]
            self._procs[uid] = self._spawn(self._ports[uid], name, args)
            self._started[uid] = time.time()

    def usage(self, uid: str) -> tuple[float, int, float] | None:
        """Pod ``uid``'s instance now: ``(CPU seconds, resident bytes, started at Unix seconds)``, summed over its
        processes; None when it has no instance or none of its processes can be read."""
        with self._lock:
            pids, started = [p.pid for p in self._procs.get(uid, [])], self._started.get(uid)
        read = [u for u in map(process_usage, pids) if u is not None]
        if not read or started is None:
            return None
        return sum(u[0] for u in read), sum(u[1] for u in read), started

    def ports(self, uid: str) -> list[int] | None:
        """The ports of pod ``uid``'s instance (None when it has none)."""
        with self._lock:
            return list(self._ports[uid]) if uid in self._ports else None

    def stop(self, uid: str) -> None:
        """Stop pod ``uid``'s instance (SIGTERM: it drains, then exits); its ports are handed out again later."""
        self._end(uid, signal.SIGTERM)

    def kill(self, uid: str) -> None:
        """Kill pod ``uid``'s processes at once (SIGKILL): the endpoint refuses connections; the ports stay its."""
        with self._lock:
            for p in self._procs.get(uid, []):
                p.kill()

    def _end(self, uid: str, sig: int) -> None:
        with self._lock:
            procs = self._procs.pop(uid, [])
            ports = self._ports.pop(uid, [])
            self._specs.pop(uid, None)
            self._started.pop(uid, None)
        for p in procs:
            p.send_signal(sig)
        if procs:
            # Reaped in the background; the ports come back once the processes are gone.
            threading.Thread(target=self._reap, args=(procs, ports), daemon=True).start()

    def _reap(self, procs: list[subprocess.Popen], ports: list[int]) -> None:
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        with self._lock:
            self._free += ports

    def close(self) -> None:
        """Stop every instance."""
        for uid in list(self._procs):
            self._end(uid, signal.SIGTERM)
