"""The fault replay: a training gang on the local cluster, faults as production sees them, goodput measured.

What :func:`run` does, real components end to end:

1. On the local cluster (kwok GPU nodes, Kueue, JobSet), labels ``nodes``
   nodes for the replay and starts an exporter stand-in for each
   (:mod:`gpufleet_workshop.sim.fleet`: the project's collectors over a fake NVML
   and sysfs), scraped every ``scrape_seconds`` by a real Prometheus with
   the ``node`` label production's relabeling sets.
2. Runs node health (:class:`gpufleet.node_health.remediate.Remediator`) against
   that Prometheus, every fault kind a swap (``node_health_degraded_faults:
   []``: each fault interrupts the gang), and the goodput accountant
   (:class:`gpufleet.goodput.tracker.Tracker` fed by watches, as
   ``gpufleet goodput`` runs).
3. Submits a JobSet gang of ``pods`` pods from the training template through
   Kueue; a simulated trainer in this process (:class:`Trainer`) trains
   while every pod of the gang runs, writes checkpoints by the convention
   (``step-<N>/COMPLETE`` with ``started``) and, after each restart, resumes
   from its last complete checkpoint. It is the ground truth: it knows the
   progress it kept.
4. Injects faults through the stand-ins while the gang trains, on a node
   running one of its pods: a fatal XID (79, fallen off the bus), a GPU at
   90 C (above the 78 C threshold for ``node_health_hot_samples``
   samples), an InfiniBand port going DOWN. Node health taints and drains
   the node; JobSet recreates the gang (``BlockingRecreate``) on healthy
   nodes; Kueue's waitForPodsReady evicts and requeues it if it is not
   ready in time.
5. When the trainer has made ``total_steps`` steps its pods finish; the
   accountant's ETTR is compared with the trainer's: ``total_steps /
   steps_per_second`` productive seconds over the Workload's wall-clock time.

Each fault gives measured latencies (seconds): fault to node tainted, to
the gang's pod evicted, to the gang recreated (or re-admitted by Kueue
after an eviction), to every pod running again. ``latencies.json`` holds
their medians under the keys :meth:`gpufleet_workshop.sim.goodput.Latencies.from_file`
reads, with the scrape and node-health intervals they were measured at
(by default the inventory's, as production runs). kwok starts containers
at once, so recreated-to-running is control-plane time only. Not replayed: a node going NotReady (Kubernetes evicts its pods
after the 300 s DefaultTolerationSeconds, with no gpufleet step to time).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpufleet.fleet import nodes as nodeutil
from gpufleet.goodput import api as gkube
from gpufleet.goodput.account import Account
from gpufleet.goodput.tracker import Tracker
from gpufleet.names import (CHECKPOINT_MARKER, FIELD_MANAGER, GOODPUT_REPLAY_LABEL, SIMULATED_DURATION_ANNOTATION,
                            SIMULATED_LABEL, SWAP_TAINT)
from gpufleet.wait import PollTimeout, poll_until

log = logging.getLogger(__name__)

#: Node label marking the nodes offered to the replay's gang.
#: Faults the replay can inject (module docstring).
FAULTS = ("xid", "gpu_temp", "ib_down")
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"


class ReplayError(RuntimeError):
    """A step of the replay did not happen in time (the message says which)."""


@dataclass(frozen=True)
class Options:
    """The replay's settings.

    Attributes:
        cluster: local cluster name (started if not running).
        pods: pods of the gang (one 8-GPU node each).
        nodes: nodes offered to the gang (at least ``pods`` + faults).
        faults: fault kinds, in order (:data:`FAULTS`).
        steps_per_second: the simulated trainer's step rate.
        checkpoint_steps: steps between checkpoints.
        save_seconds: seconds one checkpoint save stalls training.
        startup_seconds: seconds from all pods running to training (start and restore).
        total_steps: steps to the end of the job.
        first_fault_seconds: training seconds before the first fault.
        fault_gap_seconds: seconds of training between a recovery and the next fault.
        scrape_seconds: Prometheus scrape interval (None: the inventory's
            ``gpu_metrics_scrape_interval_seconds``, as production scrapes).
        step_seconds: node health's step interval (None: ``node_health_interval_seconds``).
        timeout: seconds the whole replay may take.
        out: folder of ``latencies.json``, ``replay.json``, ``timeline.png``.
        namespace: team namespace of the job (its LocalQueue's).
        keep: leave the finished JobSet (and its Workload) for ``invoke train.goodput``.
    """

    cluster: str = "gpufleet"
    pods: int = 4
    nodes: int = 8
    faults: tuple[str, ...] = FAULTS
    steps_per_second: float = 10.0
    checkpoint_steps: int = 150
    save_seconds: float = 2.0
    startup_seconds: float = 3.0
    total_steps: int = 2400
    first_fault_seconds: float = 40.0
    fault_gap_seconds: float = 30.0
    scrape_seconds: float | None = None
    step_seconds: float | None = None
    timeout: float = 1200.0
    out: str = "out/goodput-replay"
    namespace: str = "team-pretrain"
    keep: bool = False

    def problems(self) -> list[str]:
        """What is wrong with these settings, one ``--flag value: expected ...`` line each."""
        out = []
        if self.pods < 1:
            out.append(f"--pods {self.pods}: expected at least 1")
        bad = [f for f in self.faults if f not in FAULTS]
        if bad:
            out.append(f"--faults {','.join(bad)}: expected some of {', '.join(FAULTS)}")
        if self.nodes < self.pods + len(self.faults):
            out.append(f"--nodes {self.nodes}: expected at least pods + faults = {self.pods + len(self.faults)} "
                       "(each fault takes a node out)")
        for name in ("steps_per_second", "save_seconds", "scrape_seconds", "step_seconds", "timeout"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                out.append(f"--{name.replace('_', '-')} {getattr(self, name)}: expected a number > 0")
        if self.checkpoint_steps < 1 or self.total_steps <= self.checkpoint_steps:
            out.append(f"--total-steps {self.total_steps}: expected more than --checkpoint-steps {self.checkpoint_steps}")
        return out


# ------------------------------------------------------------------------------ the trainer


@dataclass
class Trainer:
    """A synchronous training job simulated in this process: the replay's ground truth.

    It trains only while ``gang()`` says every pod of its gang runs: a
    start-up of ``startup_seconds``, then steps at ``steps_per_second``, a
    checkpoint every ``checkpoint_steps`` steps that stalls it
    ``save_seconds`` (``step-<N>/`` written, then the marker with
    ``started``, its mtime the exact completion). When the gang breaks it
    loses the steps since its last complete checkpoint and resumes from
    that checkpoint when the gang runs again.
    """

    checkpoint_dir: Path
    gang: Callable[[], bool]
    steps_per_second: float
    checkpoint_steps: int
    save_seconds: float
    startup_seconds: float
    total_steps: int
    phase: str = "down"
    step: float = 0.0
    saved: int = 0
    interruptions: list[dict[str, float]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def _save(self, step: int, started: float) -> None:
        d = self.checkpoint_dir / f"step-{step:06d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.pt").write_text(str(step))
        os.utime(d / "model.pt", (started, started))

    def _commit(self, step: int, started: float, completed: float) -> None:
        marker = self.checkpoint_dir / f"step-{step:06d}" / CHECKPOINT_MARKER
        marker.write_text(json.dumps({"started": started}))
        os.utime(marker, (completed, completed))

    def run(self, stop: threading.Event, tick: float = 0.05) -> None:
        """Train until ``total_steps`` (sets ``done``) or ``stop``."""
        rate = self.steps_per_second
        t_mark = 0.0  # start of the current phase (starting, saving) or of the last compute stretch
        save_step, save_started = 0, 0.0
        while not stop.is_set() and not self.done.is_set():
            now = time.time()
            running = self.gang()
            if self.phase == "down":
                if running:
                    self.phase, t_mark = "starting", now
            elif not running:  # the gang broke: back to the last complete checkpoint
                self.interruptions.append({"time": now, "phase_was": self.phase, "lost_steps": self.step - self.saved})
                self.phase, self.step = "down", float(self.saved)
            elif self.phase == "starting":
                if now - t_mark >= self.startup_seconds:
                    self.phase, t_mark = "training", t_mark + self.startup_seconds
            elif self.phase == "training":
                target = min(self.saved + self.checkpoint_steps, self.total_steps)
                reach = t_mark + (target - self.step) / rate
                if now >= reach:
                    self.step = float(target)
                    if target >= self.total_steps:
                        self.done.set()
                        break
                    self.phase, save_step, save_started = "saving", target, reach
                    self._save(target, reach)
                    t_mark = reach
                else:
                    self.step += (now - t_mark) * rate
                    t_mark = now
            elif self.phase == "saving":
                if now - save_started >= self.save_seconds:
                    self._commit(save_step, save_started, save_started + self.save_seconds)
                    self.saved = save_step
                    self.phase, t_mark = "training", save_started + self.save_seconds
            stop.wait(tick)

    @property
    def productive_seconds(self) -> float:
        """Training time kept: every step of the finished job, once."""
        return self.total_steps / self.steps_per_second


# ------------------------------------------------------------------------------ the replay


def _jobset(opts: Options, name: str, run_id: str, checkpoint_dir: Path) -> dict:
    """The training template's JobSet, offered only the replay's nodes, its CHECKPOINT_DIR here."""
    from gpufleet_admin.training.render import build_context, render_context
    from roles.registry import load

    inv = load("local")
    queue = next(q for q in inv.role("kueue").kueue_local_queues if q.namespace == opts.namespace)
    ctx = build_context(inv, "jobset", name, opts.pods, queue=f"{queue.namespace}/{queue.name}", sets=[])
    (js,) = [d for d in yaml.safe_load_all(render_context(ctx)) if d]
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    pod["spec"]["nodeSelector"][GOODPUT_REPLAY_LABEL] = run_id
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    js["metadata"]["namespace"] = opts.namespace
    for c in pod["spec"]["containers"]:
        for env in c.get("env") or []:
            if env["name"] == "CHECKPOINT_DIR":
                env["value"] = str(checkpoint_dir)
    return js


def _ib_down(workdir: Path) -> None:
    """Take the stand-in's InfiniBand port DOWN (sysfs ``state``), as a cable pull shows."""
    for state in (workdir / "sys" / "class" / "infiniband").glob("*/ports/*/state"):
        state.write_text("1: DOWN\n")
        (state.parent / "phys_state").write_text("3: Disabled\n")
        return


@dataclass
class FaultTimes:
    """One fault's timeline (Unix seconds; None: not seen)."""

    kind: str
    node: str
    fault: float
    tainted: float | None = None
    evicted: float | None = None
    restarted: float | None = None
    readmitted: float | None = None
    running: float | None = None

    def latencies(self) -> dict[str, float | None]:
        """Seconds from the fault to each step, and from the gang's restart to all pods running."""
        def since(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(b - a, 2)
        back = self.readmitted or self.restarted
        return {"fault_to_tainted_seconds": since(self.fault, self.tainted),
                "fault_to_evicted_seconds": since(self.fault, self.evicted),
                "fault_to_readmitted_seconds": since(self.fault, back),
                "fault_to_running_seconds": since(self.fault, self.running),
                "readmitted_to_running_seconds": since(back, self.running)}


def _wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    try:
        return poll_until(check, what=what, timeout=timeout, interval=interval)
    except PollTimeout as exc:
        raise ReplayError(str(exc)) from None


def run(opts: Options, *, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Run the replay (module docstring); returns ``replay.json``'s content and writes the files to ``opts.out``.

    Raises:
        ValueError: bad options.
        ReplayError: a step did not happen in time.
    """
    problems = opts.problems()
    if problems:
        raise ValueError("\n".join(problems))
    from gpufleet.prom.client import PromClient
    from gpufleet.node_health.remediate import Remediator
    from roles.node_health.config import configuration as node_health_configuration
    from gpufleet_workshop.local import cluster as local
    from gpufleet.ops import swap as swapper
    from gpufleet.prom.server import running_prometheus
    from gpufleet_workshop.sim.fleet import scrape_config, start_node
    from roles.registry import load, node_specs

    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:6]
    name = f"replay-{run_id}"
    work = Path(tempfile.mkdtemp(prefix="gpufleet-goodput-replay-"))
    ckpt = work / "checkpoints"
    ckpt.mkdir()
    say(f"local cluster {opts.cluster}")
    try:
        c = local.get(opts.cluster)
        if not local.status(opts.cluster).up:
            raise LookupError
    except LookupError:
        c = local.up(opts.cluster, specs=node_specs("local", 16), timeout=300)
    api = c.kube(field_manager=FIELD_MANAGER, user_agent="gpufleet-goodput-replay")
    stop = threading.Event()
    nodes: list[str] = []
    sims: dict[str, Any] = {}
    try:
        from roles.kueue.manifests import objects as kueue_objects

        gkube.ensure_queues(api, kueue_objects(load("local")))
        nodes = sorted(nodeutil.name(n) for n in gkube.list_nodes(api)
                       if nodeutil.labels(n).get(SIMULATED_LABEL) == "true" and not nodeutil.is_out(n)
                       and nodeutil.schedulable(n))
        nodes = nodes[-opts.nodes:]
        if len(nodes) < opts.nodes:
            raise ReplayError(f"only {len(nodes)} healthy simulated nodes, expected {opts.nodes}")
        for n in nodes:
            gkube.label_node(api, n, GOODPUT_REPLAY_LABEL, run_id)
            sims[n] = start_node(n, workdir=work / n)
        inv = load("local")
        scrape = opts.scrape_seconds or float(inv.role("gpu_metrics").gpu_metrics_scrape_interval_seconds)
        step = opts.step_seconds or float(inv.role("node_health").node_health_interval_seconds)
        opts = replace(opts, scrape_seconds=scrape, step_seconds=step)
        interval = f"{scrape:g}s"
        with running_prometheus([scrape_config(list(sims.values()), interval=interval)],
                                global_config={"scrape_interval": interval, "evaluation_interval": interval}) as prom:
            prom.wait_for_targets_up(len(sims), timeout=60 + 3 * scrape)
            base = node_health_configuration(inv)  # what the role configures node health with, then the replay's
            settings = base.replace(degraded_faults=frozenset(), max_nodes_out=len(opts.faults) + 1,
                                    drain_timeout_seconds=60.0, interval_seconds=step,
                                    rules=base.rules.model_copy(update={"scrape_interval_seconds": scrape}))
            rem = Remediator(api, PromClient(prom.url), settings)
            return _replay(opts, api, rem, sims, nodes, name, ckpt, work, out, stop, say)
    finally:
        stop.set()
        for s in sims.values():
            s.stop()
        if not opts.keep:
            gkube.delete(api, JOBSET_API, "jobsets", name, opts.namespace)
        for n in nodes:
            try:
                swapper.return_node(api, n, checks=None, clear_lemon=True)  # simulated nodes: nothing to check
            except Exception:  # noqa: BLE001 - not out
                pass
            gkube.delete(api, "v1", "configmaps", swapper.request_name(n), settings_namespace())
            gkube.label_node(api, n, GOODPUT_REPLAY_LABEL, None)
        api.close()


def settings_namespace() -> str:
    """Namespace of node health's swap requests (the local inventory's)."""
    from roles.registry import load

    return load("local").role("node_health").node_health_namespace


def _replay(opts: Options, api, rem, sims, nodes, name, ckpt, work, out, stop, say) -> dict[str, Any]:
    ns = opts.namespace
    selector = f"{JOBSET_NAME_LABEL}={name}"
    lock = threading.Lock()
    pods_now: list[dict] = []

    def observe() -> None:  # the replay's own view of the gang, every 0.1 s
        while not stop.is_set():
            try:
                got = gkube.list_pods(api, ns, selector)
                with lock:
                    pods_now[:] = got
            except Exception as exc:  # noqa: BLE001 - keep observing
                log.debug("listing pods: %s", exc)
            stop.wait(0.1)

    def gang_pods() -> list[dict]:
        with lock:
            return [p for p in pods_now if not p["metadata"].get("deletionTimestamp")]

    def gang() -> bool:
        running = [p for p in gang_pods() if p.get("status", {}).get("phase") == "Running"]
        attempts = {(p["metadata"].get("labels") or {}).get(RESTART_LABEL) for p in running}
        return len(running) >= opts.pods and len(attempts) == 1

    def remediate() -> None:
        while not stop.is_set():
            rem.step()
            stop.wait(opts.step_seconds)

    tracker = Tracker(checkpoint_dir=lambda _ns, _job, _d: str(ckpt))
    threads = [threading.Thread(target=observe, daemon=True), threading.Thread(target=remediate, daemon=True)]
    for t in threads:
        t.start()
    watches = [w.start() for w in gkube.informers(api, tracker, ns)]

    def stop_watches() -> None:  # the informers end with the replay
        stop.wait()
        for w in watches:
            w.stop()

    threading.Thread(target=stop_watches, daemon=True).start()
    for w in watches:
        if not w.wait_synced(30):
            raise ReplayError("the accountant's watches did not list in 30 s")
    trainer = Trainer(ckpt, gang, opts.steps_per_second, opts.checkpoint_steps, opts.save_seconds,
                      opts.startup_seconds, opts.total_steps)
    say(f"submitting JobSet {ns}/{name}: {opts.pods} pods on nodes labelled {GOODPUT_REPLAY_LABEL}")
    gkube.create(api, _jobset(opts, name, name.split("-")[-1], ckpt))
    trainer_thread = threading.Thread(target=trainer.run, args=(stop,), daemon=True)
    trainer_thread.start()
    deadline = time.monotonic() + opts.timeout
    faults: list[FaultTimes] = []

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    for i, kind in enumerate(opts.faults):
        wait_training = opts.first_fault_seconds if i == 0 else opts.fault_gap_seconds
        _wait(f"{wait_training:g} s of training before fault {i + 1}",
              lambda: trainer.phase in ("training", "saving") and gang(), left())
        t0 = time.time()
        _wait("training", lambda: time.time() - t0 >= wait_training and trainer.phase == "training", left())
        pod = next(p for p in gang_pods() if p.get("spec", {}).get("nodeName") in sims)
        node, attempt = pod["spec"]["nodeName"], (pod["metadata"].get("labels") or {}).get(RESTART_LABEL)
        say(f"fault {i + 1}: {kind} on {node} (pod {pod['metadata']['name']})")
        f = FaultTimes(kind, node, time.time())
        if kind == "xid":
            sims[node].raise_xid(3, 79)
        elif kind == "gpu_temp":
            sims[node].set_temperature(5, 90)
        else:
            _ib_down(work / node)
        f.tainted = _wait(f"{node} tainted {SWAP_TAINT}", lambda: any(
            t.get("key") == SWAP_TAINT for t in (api.get_or_none("v1", "nodes", node) or {}).get("spec", {}).get("taints") or [])
            and time.time(), left())
        f.evicted = _wait(f"the gang's pod on {node} evicted", lambda: not any(
            p.get("spec", {}).get("nodeName") == node for p in gang_pods()) and time.time(), left())
        f.restarted = _wait("the gang recreated", lambda: any(
            (p["metadata"].get("labels") or {}).get(RESTART_LABEL) != attempt for p in gang_pods()) and time.time(), left())
        f.running = _wait("every pod of the gang running again", lambda: gang() and time.time(), left())
        evicted = [x for x in tracker.jobs() if x.job_name == name]
        if evicted:
            back = [t for t, admitted in evicted[0].admissions if admitted and t >= f.fault]
            f.readmitted = back[0] if back else None
        faults.append(f)
        say(f"  tainted +{f.tainted - f.fault:.1f}s, evicted +{f.evicted - f.fault:.1f}s, "
            f"recreated +{f.restarted - f.fault:.1f}s, running +{f.running - f.fault:.1f}s")
    _wait("the trainer to finish", trainer.done.is_set, left(), interval=0.5)
    say("trainer done: finishing the pods")
    for p in gang_pods():
        gkube.annotate_pod(api, ns, p["metadata"]["name"], SIMULATED_DURATION_ANNOTATION, "0")
    wl = _wait("the Workload Finished", lambda: next((w for w in tracker.jobs() if w.job_name == name and w.finished), None),
               left(), interval=0.5)
    time.sleep(1.0)
    account = tracker.account_of(wl, gkube.now())
    stop.set()
    truth = trainer.productive_seconds / account.wall_seconds
    result = _write(out, opts, account, truth, trainer, faults)
    say(f"ETTR: accountant {account.ettr:.4f}, ground truth {truth:.4f} "
        f"(difference {abs(account.ettr - truth) * 100:.2f} points)")
    return result


def _write(out: Path, opts: Options, account: Account, truth: float, trainer: Trainer,
           faults: list[FaultTimes]) -> dict[str, Any]:
    from gpufleet.goodput.main import account_json
    from gpufleet.goodput.report import plot_timeline

    per_fault = [f.latencies() for f in faults]
    medians: dict[str, Any] = {k: round(statistics.median(v), 2) for k in (per_fault[0] if per_fault else {})
                               if (v := [x[k] for x in per_fault if x[k] is not None])}
    # what the figures depend on: detection waits for scrapes and node health's steps
    medians.update(scrape_interval_seconds=opts.scrape_seconds, node_health_interval_seconds=opts.step_seconds,
                   faults=list(opts.faults))
    (out / "latencies.json").write_text(json.dumps(medians, indent=2) + "\n")
    result = {
        "ettr_accountant": round(account.ettr, 6), "ettr_ground_truth": round(truth, 6),
        "difference_points": round(abs(account.ettr - truth) * 100, 3),
        "wall_clock_seconds": round(account.wall_seconds, 1),
        "productive_seconds_ground_truth": round(trainer.productive_seconds, 1),
        "interruptions_trainer": len(trainer.interruptions),
        "faults": [{**asdict(f), **f.latencies()} for f in faults],
        "latencies_median": medians, "account": account_json(account), "options": asdict(opts),
        "job": {"namespace": account.namespace, "name": account.job, "checkpoint_dir": str(trainer.checkpoint_dir)},
    }
    (out / "replay.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_timeline(account, out / "timeline.png")
    return result
