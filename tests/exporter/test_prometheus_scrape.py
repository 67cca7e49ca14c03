"""A real Prometheus (Debian's package) scrapes a real ``gpufleet exporter`` process.

The fixture node's ``port_xmit_data`` grows by a known number of 4-octet
units per second; ``rate(gpufleet_infiniband_port_transmit_bytes_total[4s])``
must come back as 4 x that, within tolerance.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from gpufleet_workshop.fixtures.node import healthy_node, write_node
from gpufleet.prom.server import free_port, running_prometheus
from gpufleet.wait import poll_until

UNITS_PER_SECOND = 25_000_000  # 4-octet units: 100 MB/s, 800 Mb/s
BYTES_PER_SECOND = 4 * UNITS_PER_SECOND


class GrowingCounter(threading.Thread):
    """Rewrites a sysfs counter file every 20 ms as ``base + rate * elapsed`` (atomic rename).

    The new content is written in ``scratch`` (same filesystem), not beside the counter: the
    exporter reads every file of ``counters/``, and would read a half-written one there.
    """

    def __init__(self, path, scratch, base: int, per_second: int) -> None:
        super().__init__(daemon=True)
        self.path, self.scratch, self.base, self.per_second = path, scratch, base, per_second
        self.stop = threading.Event()
        self.start_time = time.monotonic()

    def run(self) -> None:
        tmp = self.scratch / f"{self.path.name}.tmp"
        while not self.stop.is_set():
            value = self.base + int(self.per_second * (time.monotonic() - self.start_time))
            tmp.write_text(f"{value}\n")
            os.replace(tmp, self.path)
            self.stop.wait(0.02)


@pytest.fixture
def exporter(tmp_path):
    paths = write_node(healthy_node(gpus=2, hcas=1, nvlinks=4, roce=False), tmp_path / "node")
    counter = paths.sysfs_root / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
    grower = GrowingCounter(counter, tmp_path, base=10_000, per_second=UNITS_PER_SECOND)
    grower.start()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "exporter", "--listen-address", "127.0.0.1", "--metrics-port", str(port),
         "--sysfs-root", str(paths.sysfs_root), "--nvml-fake", str(paths.description)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    def serving() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"exporter exited: {proc.stderr.read().decode()[-2000:]}")
        return httpx.get(url, timeout=1).status_code == 200

    try:
        poll_until(serving, what=f"the exporter serving {url}", timeout=20, interval=0.1, ignore=(httpx.TransportError,))
    except TimeoutError:
        proc.kill()
        pytest.fail(f"exporter did not serve {url}: {proc.stderr.read().decode()[-2000:]}")
    yield f"127.0.0.1:{port}"
    grower.stop.set()
    proc.terminate()
    try:
        assert proc.wait(10) == 0, "exporter did not exit cleanly on SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_prometheus_sees_the_byte_rate(exporter, tmp_path):
    scrape = [{"job_name": "gpufleet-exporter", "scrape_interval": "500ms", "static_configs": [{"targets": [exporter]}]}]
    with running_prometheus(scrape, workdir=tmp_path / "prometheus") as prom:
        prom.wait_for_targets_up(1)
        selector = 'gpufleet_infiniband_port_transmit_bytes_total{hca="mlx5_0",port="1"}'
        # rate() extrapolates less towards a window start that precedes the series' first
        # sample: wait until the series is older than the window (6 samples in 3 s).
        # (Prometheus' discovery manager syncs targets after 5 s: the first scrape comes late.)
        prom.wait_for(f"count_over_time({selector}[5s]) >= 10", timeout=30)
        # A 4 s window: a scrape's timing jitter on a loaded machine (100-200 ms) moves the rate by a few
        # percent; 10% still tells 4-octet units converted to bytes from a missing or doubled factor.
        rate = prom.query_value(f"rate({selector}[4s])")
        assert rate == pytest.approx(BYTES_PER_SECOND, rel=0.1), f"rate {rate} B/s, expected {BYTES_PER_SECOND}"
        # The rest of the exposition made it too: GPUs, enums, the exporter's own timing.
        assert prom.query_value("gpufleet_gpu_nvml_available") == 1
        assert prom.query_value('gpufleet_infiniband_port_state_id{hca="mlx5_0"}') == 4
        assert prom.query_value('count(gpufleet_gpu_nvlink_up == 1)') == 8
        assert prom.query_value('gpufleet_exporter_collector_duration_seconds{collector="infiniband"}') is not None
        assert prom.query_value('gpufleet_infiniband_read_errors_total') is None  # atomic rewrites: no torn reads
