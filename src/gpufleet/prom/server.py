"""Start a real Prometheus on loopback, wait until it is ready, query it over the HTTP API.

Tests of the exporter, of alert rules and of controllers that read PromQL use
this instead of mocks (DESIGN.md: nothing is mocked where a real component
can run). The binary is Debian's ``prometheus`` (2.42 in bookworm; install
with ``apt-get install prometheus``), found on ``PATH`` or via
``$GPUFLEET_PROMETHEUS``.

Example::

    with running_prometheus([{"job_name": "x", "scrape_interval": "1s",
                              "static_configs": [{"targets": ["127.0.0.1:9838"]}]}]) as prom:
        prom.wait_for_targets_up(1)
        prom.query("up")
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gpufleet.prom.client import PromClient, PromError
from gpufleet.wait import PollTimeout, poll_until


class PrometheusNotFound(RuntimeError):
    """No ``prometheus`` binary: install Debian's package (``apt-get install -y prometheus``)."""


class PrometheusError(PromError):
    """Prometheus did not start, did not become ready, or a wait for targets or series timed out."""


def find_prometheus(name: str = "prometheus") -> str:
    """Path of the Prometheus binary: ``$GPUFLEET_PROMETHEUS`` or ``name`` on ``PATH``.

    Raises:
        PrometheusNotFound: naming the package to install.
    """
    explicit = os.environ.get("GPUFLEET_PROMETHEUS")
    if explicit:
        return explicit
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if not found:
        raise PrometheusNotFound(f"{name} not found on PATH: install Debian's package with `apt-get install -y prometheus`")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PrometheusServer(PromClient):
    """A running Prometheus and its client; use :func:`running_prometheus` to get one.

    Attributes:
        url: base URL, e.g. ``http://127.0.0.1:40123``.
        process: the server process.
        workdir: holds ``prometheus.yml``, ``data/`` and ``prometheus.log``.
    """

    def __init__(self, url: str, process: subprocess.Popen[bytes], workdir: Path, timeout: float = 5.0):
        super().__init__(url, timeout=timeout)
        self.process = process
        self.workdir = workdir

    @property
    def log_path(self) -> Path:
        """The server's combined stdout/stderr."""
        return self.workdir / "prometheus.log"

    def log_tail(self, lines: int = 30) -> str:
        """Last ``lines`` lines of the server log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_for_targets_up(self, count: int, timeout: float = 20.0) -> None:
        """Wait until ``count`` targets report health ``up``.

        Raises:
            PrometheusError: on timeout, with target errors and the log tail.
        """
        targets: list[dict[str, Any]] = []

        def up() -> bool:
            targets[:] = self.targets()
            return sum(t.get("health") == "up" for t in targets) >= count

        try:
            poll_until(up, what=f"{count} targets up", timeout=timeout, interval=0.2)
        except PollTimeout:
            detail = [(t.get("scrapeUrl"), t.get("health"), t.get("lastError")) for t in targets]
            raise PrometheusError(f"targets not up after {timeout}s: {detail}\n{self.log_tail()}") from None

    def wait_for(self, expr: str, timeout: float = 20.0, interval: float = 0.25) -> list[dict[str, Any]]:
        """Poll an instant query until it returns a non-empty result; return that result.

        Raises:
            PrometheusError: on timeout.
        """
        try:
            return poll_until(lambda: self.query(expr), what=f"{expr!r} non-empty", timeout=timeout, interval=interval)
        except PollTimeout:
            raise PrometheusError(f"{expr!r} still empty after {timeout}s\n{self.log_tail()}") from None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server, SIGKILL after ``timeout`` seconds; close the HTTP client."""
        self.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def render_config(
    scrape_configs: list[dict[str, Any]],
    rule_files: list[str] | None = None,
    global_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Prometheus configuration dict (``global``, ``rule_files``, ``scrape_configs``).

    Global defaults: 1 s scrape and evaluation intervals (fast tests).
    """
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", **(global_config or {})},
        "scrape_configs": scrape_configs,
    }
    if rule_files:
        config["rule_files"] = list(rule_files)
    return config


def start_prometheus(
    scrape_configs: list[dict[str, Any]],
    *,
    rule_files: list[str] | None = None,
    global_config: dict[str, Any] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    port: int | None = None,
    binary: str | None = None,
    ready_timeout: float = 30.0,
) -> PrometheusServer:
    """Start Prometheus on ``127.0.0.1:<port>`` and wait for ``/-/ready``.

    Args:
        scrape_configs: Prometheus ``scrape_configs`` entries.
        rule_files: rule file paths to load.
        global_config: overrides of the ``global`` section.
        workdir: directory for config, TSDB and log (a new temp dir if omitted).
        port: listen port (a free one if omitted).
        binary: Prometheus binary (see :func:`find_prometheus`).
        ready_timeout: seconds to wait for readiness.

    Returns:
        A :class:`PrometheusServer`; call :meth:`PrometheusServer.stop`.

    Raises:
        PrometheusNotFound: no binary.
        PrometheusError: it exited or did not become ready in time (log tail included).
    """
    binary = binary or find_prometheus()
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gpufleet-prometheus-"))
    work.mkdir(parents=True, exist_ok=True)
    config_path = work / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(render_config(scrape_configs, rule_files, global_config), sort_keys=False))
    port = port or free_port()
    log = open(work / "prometheus.log", "wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=work,
    )
    log.close()
    server = PrometheusServer(f"http://127.0.0.1:{port}", process, work)
    def ready() -> bool:
        if process.poll() is not None:
            server.stop()
            raise PrometheusError(f"prometheus exited with {process.returncode}\n{server.log_tail()}")
        return server.ready()

    try:
        poll_until(ready, what="prometheus ready", timeout=ready_timeout, interval=0.1)
    except PollTimeout:
        server.stop()
        raise PrometheusError(f"prometheus not ready after {ready_timeout}s\n{server.log_tail()}") from None
    return server


@contextmanager
def running_prometheus(scrape_configs: list[dict[str, Any]], **kwargs: Any) -> Iterator[PrometheusServer]:
    """Context manager around :func:`start_prometheus`; stops the server on exit."""
    server = start_prometheus(scrape_configs, **kwargs)
    try:
        yield server
    finally:
        server.stop()
