"""Start, watch and stop the local cluster's processes.

Every process leads its own process group (``start_new_session``), so
:func:`stop` signals the whole group and nothing is left behind. A pid file
records the pid, the binary and the kernel start time of the process, so a
recycled pid is never mistaken for ours. stdout and stderr go to one log
file per component; :func:`tail` reads its end for error messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gpufleet_admin.files import tail
from gpufleet_workshop.local.certs import KeyPair
from gpufleet.wait import PollTimeout, poll_until


class ComponentFailed(RuntimeError):
    """A component exited or did not become healthy in time.

    The message names the component, what went wrong, its log file and the
    tail of that log. Attributes: ``component``, ``log``.
    """

    def __init__(self, component: str, reason: str, log: Path):
        self.component = component
        self.log = log
        super().__init__(f"{component} {reason}; last lines of {log}:\n{tail(log, 25)}")


@dataclass(frozen=True)
class Health:
    """A health endpoint: GET ``url`` must answer 200.

    Attributes:
        url: ``http(s)://127.0.0.1:<port>/<path>``.
        ca: CA file to verify the server with (https only).
        client: client certificate to present, if the endpoint needs one.
    """

    url: str
    ca: Path | None = None
    client: KeyPair | None = None


@dataclass(frozen=True)
class ProcessSpec:
    """How to run one component.

    Attributes:
        name: component name (log and pid file stem).
        argv: command line; ``argv[0]`` is an absolute path.
        log: file receiving stdout and stderr (appended).
        pidfile: where the pid is recorded.
        health: endpoint that says the component is ready, if it has one.
        env: extra environment variables.
    """

    name: str
    argv: Sequence[str]
    log: Path
    pidfile: Path
    health: Health | None = None
    env: Mapping[str, str] = field(default_factory=dict)


# Popen objects of children started by this Python process, so they get reaped.
_children: dict[int, subprocess.Popen] = {}


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def start(spec: ProcessSpec) -> int:
    """Start ``spec`` in its own session; record and return its pid.

    Raises:
        FileNotFoundError: ``argv[0]`` does not exist.
    """
    if not Path(spec.argv[0]).exists():
        raise FileNotFoundError(f"{spec.name}: {spec.argv[0]} not found (run `invoke local.install`)")
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    spec.pidfile.parent.mkdir(parents=True, exist_ok=True)
    with open(spec.log, "ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} start: {' '.join(spec.argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(spec.argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.env},
            start_new_session=True,
            close_fds=True,
        )
    _children[proc.pid] = proc
    record = {"pid": proc.pid, "argv": list(spec.argv), "start_time": _start_time(proc.pid)}
    spec.pidfile.write_text(json.dumps(record))
    return proc.pid


def running(pidfile: Path) -> int | None:
    """The pid recorded in ``pidfile`` if that very process is still alive, else None."""
    try:
        rec = json.loads(pidfile.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    pid = int(rec["pid"])
    _reap(pid)
    st = _start_time(pid)
    if st is None or (rec.get("start_time") and st != rec["start_time"]):
        return None
    return pid


def recorded_argv(pidfile: Path) -> list[str] | None:
    """The command line a pid file recorded at start (None without a readable pid file)."""
    try:
        return list(json.loads(pidfile.read_text())["argv"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


def _reap(pid: int) -> None:
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        _children.pop(pid, None)


def _group_alive(pgid: int) -> bool:
    _reap(pgid)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - not ours
        return True
    # Only a zombie leader left (not ours to reap) counts as gone.
    return not (_start_time(pgid) is None and _only_member(pgid))


def _only_member(pgid: int) -> bool:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != pgid:
            try:
                if os.getpgid(int(proc.name)) == pgid:
                    return False
            except OSError:
                continue
    return True


def stop(pidfile: Path, timeout: float = 10.0) -> bool:
    """Stop the process group recorded in ``pidfile``: SIGTERM, then SIGKILL after ``timeout`` s.

    Removes the pid file. Returns True if something was running.
    """
    pid = running(pidfile)
    if pid is None:
        pidfile.unlink(missing_ok=True)
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    gone = lambda: not _group_alive(pid)  # noqa: E731
    try:
        poll_until(gone, what=f"process group {pid} gone after SIGTERM", timeout=timeout, interval=0.1)
    except PollTimeout:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        with contextlib.suppress(PollTimeout):
            poll_until(gone, what=f"process group {pid} gone after SIGKILL", timeout=5, interval=0.1)
    proc = _children.pop(pid, None)
    if proc is not None:
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
    pidfile.unlink(missing_ok=True)
    return True


def _ssl_context(health: Health) -> ssl.SSLContext | bool:
    if not health.url.startswith("https"):
        return False
    ctx = ssl.create_default_context(cafile=str(health.ca) if health.ca else None)
    if health.client:
        ctx.load_cert_chain(str(health.client.cert), str(health.client.key))
    return ctx


def probe(health: Health, timeout: float = 2.0) -> bool:
    """One GET of the health endpoint; True on HTTP 200."""
    try:
        with httpx.Client(verify=_ssl_context(health), timeout=timeout) as client:
            return client.get(health.url).status_code == 200
    except (httpx.HTTPError, OSError, ssl.SSLError):
        return False


def wait_healthy(spec: ProcessSpec, timeout: float = 60.0, interval: float = 0.25) -> None:
    """Wait until ``spec.health`` answers 200 (or, without one, the process stays up 1 s).

    Raises:
        ComponentFailed: the process exited, or it was not healthy within
            ``timeout`` seconds; the message carries the log tail.
    """
    deadline = time.monotonic() + timeout
    if spec.health is None:
        time.sleep(1.0)
        if running(spec.pidfile) is None:
            raise ComponentFailed(spec.name, "exited", spec.log)
        return
    ctx = _ssl_context(spec.health)
    with httpx.Client(verify=ctx, timeout=2.0) as client:
        def healthy() -> bool:
            if running(spec.pidfile) is None:
                raise ComponentFailed(spec.name, "exited during startup", spec.log)
            return client.get(spec.health.url).status_code == 200

        try:
            poll_until(healthy, what=f"{spec.name} healthy", timeout=max(0.0, deadline - time.monotonic()),
                       interval=interval, ignore=(httpx.HTTPError, OSError, ssl.SSLError))
        except PollTimeout:
            raise ComponentFailed(spec.name, f"not healthy at {spec.health.url} after {timeout:.0f}s", spec.log) from None


def rss_bytes(pid: int) -> int:
    """Resident set size of one process in bytes (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
