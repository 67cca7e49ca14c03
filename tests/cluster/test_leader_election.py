"""At most one leader at any instant, for every component with a Lease, when the leader's API server stops answering.

For the taint controller, quota sync and node health: two replicas run as
processes on this machine, with the default Lease timings (15 s lease, 10 s
renew deadline, 2 s retry). The leader reaches the real kube-apiserver
through a loopback proxy (:class:`tests.netfaults.HangProxy`), the standby
directly. Once the leader holds the Lease and the standby follows, the
proxy hangs: it keeps every connection open and forwards nothing (an API
server instance that accepts and never answers, a half-open connection).

For each component the test records when the old leader stopped acting
(its ``stopped acting`` log line, and ``gpufleet_leader_is_leader``
polled every 20 ms) and when the standby started (its ``leading`` log
line, the Lease's ``acquireTime`` it wrote, and its gauge), and asserts
that the time both acted as leader is 0: the old leader stopped at its
renew deadline, seconds before the standby could take the Lease over, and
then exited 1. The figures are printed (``-s``) and written to
``$GPUFLEET_LEADER_OVERLAP_JSON`` when set.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from gpufleet.kube import NotFound
from gpufleet.kube.times import parse_time
from gpufleet.paths import REPO_ROOT
from gpufleet.prom.server import free_port

from ..netfaults import HangProxy
from .helpers import wait
from .test_taint_controller import virtual_node

pytestmark = pytest.mark.cluster

POOL = "lead-a"
VNODE = "vk-lead-a"
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def log_time(line: str) -> float:
    """Epoch seconds of a gpufleet log line (``%(asctime)s``: local time, milliseconds)."""
    m = LOG_TIME.match(line)
    assert m, line
    return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass
class Replica:
    """One process of a component, its output collected by a thread, its gauge polled."""

    identity: str
    argv: list[str]
    port: int
    env: dict
    proc: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)
    gauge: list[tuple[float, float | None]] = field(default_factory=list)  # (epoch, value; None: no answer)

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", *self.argv, "--metrics-port", str(self.port)],
                                     cwd=REPO_ROOT, env={**os.environ, **self.env, "POD_NAME": self.identity},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def is_leader(self) -> float | None:
        try:
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=0.5).text
        except httpx.HTTPError:
            return None
        m = re.search(r"^gpufleet_leader_is_leader\{[^}]*\} (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def poll(self) -> None:
        self.gauge.append((time.time(), self.is_leader()))

    def first_line(self, pattern: str) -> str | None:
        return next((line for line in self.lines if re.search(pattern, line)), None)

    def stop(self) -> str:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return "\n".join(self.lines)


@dataclass
class Component:
    name: str
    lease: str
    argv: list[str]


def kubeconfig_via(kubeconfig: Path, server: str, out: Path) -> Path:
    """A copy of ``kubeconfig`` whose clusters point at ``server`` (same credentials, same CA)."""
    doc = yaml.safe_load(kubeconfig.read_text())
    for c in doc["clusters"]:
        c["cluster"]["server"] = server
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.fixture
def lease_namespace(local_cluster):
    api = local_cluster.kube
    ns = f"lead-{uuid.uuid4().hex[:6]}"
    api.create("v1", "namespaces", {"metadata": {"name": ns}})
    yield ns
    api.delete("v1", "namespaces", ns)


@pytest.fixture
def lead_vnode(local_cluster):
    api = local_cluster.kube
    try:
        api.delete("v1", "nodes", VNODE)
    except NotFound:
        pass
    api.create("v1", "nodes", virtual_node(VNODE, POOL))
    yield VNODE
    try:
        api.delete("v1", "nodes", VNODE)
    except NotFound:
        pass


def components(ns: str, configs: Path) -> list[Component]:
    """The three controllers as their roles configure them for the local inventory (their files), flags over them."""
    from .helpers import config_file

    def config(command: str) -> str:
        return str(config_file(configs / f"{command}.yaml", command))

    return [
        Component("taint-controller", "gpufleet-taint-controller",
                  ["taint-controller", "--config", config("taint-controller"), "--high-water", "4", "--low-water", "2",
                   "--hold-seconds", "1", "--pool", POOL, "--namespace", ns, "--flip-back", "off", "--no-flip-out"]),
        Component("quota-sync", "gpufleet-quota-sync", ["quota-sync", "--config", config("quota-sync"), "--namespace", ns]),
        Component("node-health", "gpufleet-node-health",
                  ["node-health", "--config", config("node-health"), "--namespace", ns, "--dry-run", "--interval", "1",
                   "--prometheus-url", f"http://127.0.0.1:{free_port()}"]),  # nothing there: it finds no fault
    ]


def measure(c: Component, api, ns: str, leader_kubeconfig: Path, direct_kubeconfig: Path, proxy: HangProxy) -> dict:
    """Run one component's two replicas through the hang; the figures of the handover."""
    leader = Replica(f"{c.name}-leader", [*c.argv, "--kubeconfig", str(leader_kubeconfig)], free_port(), {})
    standby = Replica(f"{c.name}-standby", [*c.argv, "--kubeconfig", str(direct_kubeconfig)], free_port(), {})

    def holder() -> str:
        lease = api.get_or_none("coordination.k8s.io/v1", "leases", c.lease, ns) or {}
        return (lease.get("spec") or {}).get("holderIdentity") or ""

    try:
        leader.start()
        wait(f"{c.name}: the leader holds the Lease", lambda: holder() == leader.identity, timeout=90)
        wait(f"{c.name}: the leader's gauge", lambda: leader.is_leader() == 1.0, timeout=30)
        standby.start()
        wait(f"{c.name}: the standby follows", lambda: standby.is_leader() == 0.0, timeout=90)
        return {"leader": leader, "standby": standby, "holder": holder}
    except BaseException:
        print(leader.stop(), standby.stop(), sep="\n----\n")
        raise


def test_the_old_leader_stops_acting_before_the_standby_starts_when_its_api_server_hangs(
        local_cluster, local_queues, lease_namespace, lead_vnode, tmp_path):
    api, ns = local_cluster.kube, lease_namespace
    proxy = HangProxy(("127.0.0.1", local_cluster.cluster.ports.apiserver))
    via_proxy = kubeconfig_via(local_cluster.kubeconfig, f"https://{proxy.address}", tmp_path / "via-proxy.yaml")
    direct = Path(local_cluster.kubeconfig)
    comps = components(ns, tmp_path)
    runs: dict[str, dict] = {}
    try:
        for c in comps:  # started one after the other (each leader first), then all hang at once
            runs[c.name] = measure(c, api, ns, via_proxy, direct, proxy)
        # The leaders act through the proxy: the taint controller has tainted its virtual node.
        wait("the leader's taint", lambda: any(t["key"] == "gpufleet.io/cluster-has-free-gpus" for t in
                                                 api.get("v1", "nodes", VNODE)["spec"].get("taints") or []), timeout=60)
        leases_before = {c.name: api.get("coordination.k8s.io/v1", "leases", c.lease, ns)["spec"] for c in comps}
        polling = threading.Event()

        def poll(r: Replica) -> None:
            while not polling.is_set():
                r.poll()
                time.sleep(0.02)

        pollers = [threading.Thread(target=poll, args=(r,), daemon=True)
                   for run in runs.values() for r in (run["leader"], run["standby"])]
        for t in pollers:
            t.start()
        hung_at = time.time()
        proxy.hang()
        for c in comps:
            run = runs[c.name]
            wait(f"{c.name}: the standby holds the Lease", lambda: run["holder"]() == run["standby"].identity,
                 timeout=60)
            wait(f"{c.name}: the standby says it leads", lambda: run["standby"].first_line(r": leading \(Lease"),
                 timeout=30)
        # The old leaders must have stopped by now; give a stuck one 60 s more to say so (the old behaviour: ~75 s).
        for c in comps:
            run = runs[c.name]
            wait(f"{c.name}: the old leader exits", lambda: run["leader"].proc.poll() is not None, timeout=60)
        time.sleep(0.5)
        polling.set()
        for t in pollers:
            t.join(5)
        figures = {}
        for c in comps:
            run = runs[c.name]
            old, new = run["leader"], run["standby"]
            stopped_line = old.first_line(r"lost by .*stopped acting")
            leading_line = new.first_line(r": leading \(Lease")
            assert stopped_line and leading_line, (old.lines, new.lines)
            lease = api.get("coordination.k8s.io/v1", "leases", c.lease, ns)["spec"]
            acquired = parse_time(lease["acquireTime"])
            old_stop = log_time(stopped_line)
            new_start = min(log_time(leading_line), acquired)
            old_gauge_last_1 = max(t for t, v in old.gauge if v == 1.0)  # the last scrape it said it leads
            new_gauge_first_1 = min(t for t, v in new.gauge if v == 1.0)
            last_renew = parse_time(leases_before[c.name]["renewTime"])
            figures[c.name] = {
                "old_leader_exit_code": old.proc.returncode,
                "last_renew_before_hang": last_renew,
                "hung_at": hung_at,
                "old_stopped_acting": old_stop,
                "standby_started": new_start,
                "standby_acquire_time": acquired,
                "old_stopped_after_hang_s": round(old_stop - hung_at, 3),
                "standby_started_after_hang_s": round(new_start - hung_at, 3),
                "gap_s": round(new_start - old_stop, 3),
                "overlap_s": round(max(0.0, old_stop - new_start), 3),
                "gauge_gap_s": round(new_gauge_first_1 - old_gauge_last_1, 3),
            }
        report = {"longest_overlap_s": max(f["overlap_s"] for f in figures.values()), "components": figures}
        print(json.dumps(report, indent=1))
        if out := os.environ.get("GPUFLEET_LEADER_OVERLAP_JSON"):
            Path(out).write_text(json.dumps(report, indent=1))
        for name, f in figures.items():
            assert f["overlap_s"] == 0 and f["gauge_gap_s"] > 0, (name, f)
            assert f["old_leader_exit_code"] == 1, (name, f)
            # At its renew deadline: 10 s after its last successful renewal started, which was before the hang.
            assert f["old_stopped_after_hang_s"] <= 10.5, (name, f)
    finally:
        outs = {r.identity: r.stop() for run in runs.values() for r in (run["leader"], run["standby"])}
        proxy.close()
    for identity, out in outs.items():
        assert "Traceback" not in out, f"{identity}:\n{out}"
