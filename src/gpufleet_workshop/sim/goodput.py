"""Long-horizon goodput model: one synchronous training job over days, two policies, the same failures.

``invoke sim.goodput`` runs this. A discrete-event simulation (seconds of
wall-clock time, deterministic for a seed) draws one failure sequence for a
job of ``gpus`` GPUs over ``days`` days and plays it against two policies:

* **gpufleet**: node health pulls a node with a GPU fault within seconds of
  the sample that shows it (taint, drain through the Eviction API, a
  replacement request), so the gang restarts at once on healthy nodes; a
  fault that hangs the job ends when its pods are evicted instead of at
  the collective timeout; the checkpoint interval is the advisor's
  (:mod:`gpufleet_admin.training.checkpoint`, Daly's optimum) for the job MTTF
  measured from the cluster's own remediation Events; lemon nodes
  (``node_health_lemon_failures`` failures within
  ``node_health_lemon_window_hours``) stay out.
* **baseline** (common practice): health checks every 5 minutes, a person
  swaps the bad node, a fixed 30-minute checkpoint interval, no lemon
  quarantine.

Failures (all cited where defined below):

* rate: Meta's RSC-1 cluster, 6.5 failures per 1,000 node-days for jobs
  above 128 GPUs (Kokolis et al., "Revisiting Reliability in Large-Scale
  Machine Learning Research Clusters", arXiv:2410.21680, HPCA 2025), a
  series system: job MTTF = 1 / (nodes x rate). That gives 28.8 h at
  1,024 GPUs and 1.8 h at 16,384 GPUs. The paper also reports an MTTF of
  about 7.9 h for 1,024-GPU jobs, more failures than the fitted rate gives
  at that size; :func:`rate_for_mttf` runs the model at such a figure.
* causes: the 419 unexpected interruptions of Llama 3 405B's 54-day
  pre-training snapshot on 16,384 H100 GPUs (Llama Team, "The Llama 3 Herd
  of Models", arXiv:2407.21783, 2024, Table 5), each mapped to how it
  reaches the job (:data:`CAUSES`).

Each interruption costs the job, by bucket (:data:`gpufleet.goodput.BUCKETS`):
``progress_lost`` (work since the last completed checkpoint, and a hang
until it is noticed), ``waiting_for_hardware`` (until the bad node is out
of the way), ``starting`` (the gang restarts, the trainer starts and loads
its checkpoint); every checkpoint write costs ``checkpoint_saving``. The
job is never queued (it starts admitted at time 0) and nothing is
``other``. ETTR = productive time / wall-clock time; the buckets add up to
the rest.

What is left out, in favour of both policies alike: spare nodes always
exist (no waiting for repairs), failures of nodes while the job is down
do not stop it, the person's swap itself takes no time once they respond.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpufleet.goodput import BUCKETS
from gpufleet_admin.inventory.roles import defaults_path
from gpufleet_admin.training import checkpoint

#: GPUs per node (HGX A100 in RSC-1, HGX H100 in Llama 3's cluster).
GPUS_PER_NODE = 8
#: Kokolis et al. (above): failures per 1,000 node-days on RSC-1 for jobs above 128 GPUs.
RSC1_FAILURES_PER_1000_NODE_DAYS = 6.5
#: Kokolis et al.: MTTF reported for 1,024-GPU jobs (hours), above what the fitted rate gives.
RSC1_MTTF_HOURS_1024_GPUS = 7.9
#: Job sizes of the ETTR chart (GPUs).
CHART_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: Seeds averaged per size on the chart.
CHART_SEEDS = 5

#: summary.json keys, exactly.
SUMMARY_KEYS = ("gpus", "days", "failures", "ettr_gpufleet", "ettr_baseline", "checkpoint_interval_seconds_gpufleet",
                "badput_seconds_gpufleet", "badput_seconds_baseline")


@dataclass(frozen=True)
class Kind:
    """How a class of failure reaches the job.

    Attributes:
        node_fault: a node is at fault and must be taken out before the gang can run again.
        remediation: what gpufleet's node health does: ``swap`` (cordon, taint, drain:
            GPU faults, XIDs, ECC), ``degrade`` (taint only: InfiniBand faults are in
            ``node_health_degraded_faults`` by default), ``not_ready`` (the kubelet stops
            reporting; Kubernetes' own taints act), ``none`` (nothing to see in the metrics).
    """

    node_fault: bool
    remediation: str


#: Failure kinds of :data:`CAUSES`.
KINDS: dict[str, Kind] = {
    "gpu": Kind(True, "swap"),          # XID / ECC / GPU lost / temperature: node health swaps the node
    "fabric": Kind(True, "degrade"),    # IB port down or error growth: ib_errors
    "host": Kind(True, "not_ready"),    # PSU, CPU, memory, chassis, host maintenance: the node goes away
    "sdc": Kind(True, "none"),          # silent data corruption: found by people, not by metrics
    "software": Kind(False, "none"),    # a crash; the same nodes run again
    "hang": Kind(False, "none"),        # NCCL watchdog timeout of unknown cause
}


@dataclass(frozen=True)
class Cause:
    """One row of Llama 3's Table 5: component, category, interruptions in 54 days, and how it acts here.

    ``hangs``: the job stalls in a collective instead of exiting (peers of a lost NIC,
    link or host wait until the collective timeout; a GSP timeout hangs the GPU).
    """

    name: str
    category: str
    count: int
    kind: str
    hangs: bool


#: Llama 3 405B pre-training, 54 days, 16,384 H100: the 419 unexpected interruptions by root cause
#: (arXiv:2407.21783, Table 5). ``kind``/``hangs`` are our mapping.
CAUSES: tuple[Cause, ...] = (
    Cause("Faulty GPU", "GPU", 148, "gpu", False),
    Cause("GPU HBM3 Memory", "GPU", 72, "gpu", False),
    Cause("Software Bug", "Dependency", 54, "software", False),
    Cause("Network Switch/Cable", "Network", 35, "fabric", True),
    Cause("Host Maintenance", "Unplanned Maintenance", 32, "host", True),
    Cause("GPU SRAM Memory", "GPU", 19, "gpu", False),
    Cause("GPU System Processor", "GPU", 17, "gpu", True),
    Cause("NIC", "Host", 7, "fabric", True),
    Cause("NCCL Watchdog Timeouts", "Unknown", 7, "hang", True),
    Cause("Silent Data Corruption", "GPU", 6, "sdc", False),
    Cause("GPU Thermal Interface + Sensor", "GPU", 6, "gpu", False),
    Cause("SSD", "Host", 3, "host", True),
    Cause("Power Supply", "Host", 3, "host", True),
    Cause("Server Chassis", "Host", 2, "host", True),
    Cause("IO Expansion Board", "Host", 2, "host", True),
    Cause("Dependency", "Dependency", 2, "software", False),
    Cause("CPU", "Host", 2, "host", True),
    Cause("System Memory", "Host", 2, "host", True),
)


def _role_default(role: str, key: str) -> Any:
    """A role default (``roles/<role>/defaults.yaml``): the sim models gpufleet as it ships."""
    return yaml.safe_load(defaults_path(role).read_text())[key]


@dataclass(frozen=True)
class Latencies:
    """Seconds each step of a recovery takes; from a fault replay's ``latencies.json`` when one exists.

    Attributes:
        fault_to_tainted: fault to the node tainted by node health. Default 25 s: one
            scrape (``gpu_metrics_scrape_interval_seconds`` 15 s), one controller step
            (``node_health_interval_seconds`` 5 s) and the API writes; bench/ops_remediation.py
            holds the sample-to-taint part under 15 s.
        fault_to_evicted: fault to the gang's pods evicted (drain through the Eviction API). Default 30 s.
        gang_restart: pods gone to all pods of the new gang running (scheduling, container
            start on a real node). Default 60 s (an assumption; the replay's kwok pods start at once).
        startup: trainer start, NCCL bootstrap and checkpoint load until it trains again.
            Default 300 s (an assumption: minutes at scale; Llama 3 section 3.3.4 names
            job start-up among what they cut).
        source: where the figures came from.
    """

    fault_to_tainted: float = 25.0
    fault_to_evicted: float = 30.0
    gang_restart: float = 60.0
    startup: float = 300.0
    source: str = "documented defaults (gpufleet_workshop.sim.goodput.Latencies)"

    @classmethod
    def from_file(cls, path: Path) -> Latencies:
        """Latencies measured by a fault replay (``latencies.json``: ``*_seconds`` keys); missing keys keep defaults.

        Keys read: ``fault_to_tainted_seconds`` and ``fault_to_evicted_seconds``
        (node health, measured at the ``scrape_interval_seconds`` the file
        records). The gang restart keeps its default: the replay's pods run on
        kwok, which starts containers at once.

        Raises:
            ValueError: the file is not JSON with finite numbers >= 0 (names the file and key).
        """
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--latencies {path}: {exc}: expected the JSON a fault replay writes") from None
        if not isinstance(data, dict):
            raise ValueError(f"--latencies {path}: expected a JSON object of *_seconds keys")
        mapping = {"fault_to_tainted_seconds": "fault_to_tainted", "fault_to_evicted_seconds": "fault_to_evicted"}
        values: dict[str, Any] = {}
        for key, attr in mapping.items():
            if key not in data:
                continue
            v = data[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"--latencies {path}: {key}: {v!r}: expected seconds >= 0")
            values[attr] = float(v)
        scrape = data.get("scrape_interval_seconds")
        at = f", scrape every {scrape:g} s" if isinstance(scrape, (int, float)) and not isinstance(scrape, bool) else ""
        return cls(**values, source=f"node health's measured by the fault replay ({path}{at}); gang restart and "
                                    "start-up documented defaults")


@dataclass(frozen=True)
class Policy:
    """How one operating practice reacts to failures (seconds).

    Attributes:
        name: ``gpufleet`` or ``baseline``.
        checkpoint_interval: compute time between two checkpoints.
        automated: node health takes bad nodes out (else a health check finds them and a person acts).
        health_check_period: baseline: seconds between health checks.
        operator: mean seconds for a person to act once a problem is known (exponential).
        lemon_failures: failures within ``lemon_window`` that keep a node out (None: no quarantine).
        lemon_window: seconds.
        drain_degraded: whether a ``degrade`` fault also drains (not with the shipped defaults).
    """

    name: str
    checkpoint_interval: float
    automated: bool
    health_check_period: float = 300.0
    operator: float = 1800.0
    lemon_failures: int | None = None
    lemon_window: float = 168 * 3600.0
    drain_degraded: bool = False


@dataclass(frozen=True)
class Model:
    """The job and the cluster's failure model.

    Attributes:
        gpus: GPUs of the job (whole nodes of :data:`GPUS_PER_NODE`).
        days: wall-clock days simulated.
        failures_per_1000_node_days: RSC-1's 6.5 by default (:func:`rate_for_mttf` turns a
            job MTTF into this rate).
        checkpoint_seconds: seconds one checkpoint write stalls training
            (``training_checkpoint_seconds``, 60).
        collective_timeout: seconds a hung collective waits before the job exits: PyTorch's
            default NCCL process-group timeout, 10 minutes (``torch.distributed``).
        not_ready: seconds from a node's death to its pods evicted: the node-monitor grace
            period (50 s, kube-controller-manager since 1.32) and the 300 s the
            DefaultTolerationSeconds admission plugin gives pods for not-ready/unreachable.
        repeat_share: share of node faults that strike a node that failed before (lemons).
            An assumption (10%); lemons are a known cause of repeat failures (Kokolis et al.
            detect them), the figure is ours.
        repair_hours: hours a failed node is out for repair before it can fail again.
        latencies: recovery step latencies.
    """

    gpus: int
    days: float
    failures_per_1000_node_days: float = RSC1_FAILURES_PER_1000_NODE_DAYS
    checkpoint_seconds: float = field(default_factory=lambda: float(_role_default("training", "training_checkpoint_seconds")))
    collective_timeout: float = 600.0
    not_ready: float = 350.0
    repeat_share: float = 0.10
    repair_hours: float = 24.0
    latencies: Latencies = field(default_factory=Latencies)

    @property
    def nodes(self) -> int:
        """Nodes of the job."""
        return max(1, math.ceil(self.gpus / GPUS_PER_NODE))

    @property
    def horizon(self) -> float:
        """Simulated seconds."""
        return self.days * 86400.0

    @property
    def job_mttf_seconds(self) -> float:
        """Mean time between failures of the job: ``1 / (nodes x rate)``."""
        return 86400.0 * 1000.0 / (self.nodes * self.failures_per_1000_node_days)


def rate_for_mttf(gpus: int, mttf_hours: float) -> float:
    """Failures per 1,000 node-days that give a job of ``gpus`` GPUs an MTTF of ``mttf_hours``.

    Example: 7.9 h at 1,024 GPUs (RSC-1's reported figure) -> 23.7.
    """
    nodes = max(1, math.ceil(gpus / GPUS_PER_NODE))
    return 1000.0 * 24.0 / (nodes * mttf_hours)


def validate(gpus: Any, days: Any, seed: Any = 0, *, failure_rate: Any = RSC1_FAILURES_PER_1000_NODE_DAYS,
             mttf_hours: Any = None, checkpoint_seconds: Any = 60.0) -> list[str]:
    """Problems with the simulation's flags, one ``--flag value: expected ...`` line each (empty: all good)."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    problems = []
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < GPUS_PER_NODE or gpus % GPUS_PER_NODE:
        problems.append(f"--gpus {gpus}: expected a whole number of {GPUS_PER_NODE}-GPU nodes, "
                        f"at least {GPUS_PER_NODE} (e.g. 1024)")
    elif gpus > 1_048_576:
        problems.append(f"--gpus {gpus}: expected at most 1,048,576 GPUs")
    if not number(days) or not 0 < days <= 3650:
        problems.append(f"--days {days}: expected a finite number of days > 0 and <= 3650")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        problems.append(f"--seed {seed}: expected a whole number >= 0")
    if not number(failure_rate) or failure_rate <= 0:
        problems.append(f"--failure-rate {failure_rate}: expected failures per 1,000 node-days > 0")
    if mttf_hours is not None and (not number(mttf_hours) or mttf_hours <= 0):
        problems.append(f"--mttf-hours {mttf_hours}: expected finite hours > 0")
    if not number(checkpoint_seconds) or checkpoint_seconds <= 0:
        problems.append(f"--checkpoint-seconds {checkpoint_seconds}: expected finite seconds > 0")
    return problems


# ------------------------------------------------------------------------------ failures


@dataclass(frozen=True)
class Failure:
    """One failure of the shared sequence.

    Attributes:
        time: seconds since the job started.
        cause: its :class:`Cause`.
        node: the node at fault (an id; repeats are lemons), None when no node is.
        check_phase: where in the baseline's health-check period it falls (0..1).
        operator_draw: the person's response, in means (Exp(1)); the same for both policies.
    """

    time: float
    cause: Cause
    node: int | None
    check_phase: float
    operator_draw: float


def failures(model: Model, seed: int) -> list[Failure]:
    """The failure sequence of ``model`` for ``seed``: a Poisson process at the job's failure rate.

    Causes are drawn with Llama 3's weights; a node fault strikes a node that
    failed before with probability ``repeat_share``, else a new node.
    """
    rng = random.Random(seed)
    rate = 1.0 / model.job_mttf_seconds
    weights = [c.count for c in CAUSES]
    seen: list[int] = []
    out: list[Failure] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= model.horizon:
            return out
        cause = rng.choices(CAUSES, weights)[0]
        repeat, pick, phase, draw = rng.random(), rng.random(), rng.random(), rng.expovariate(1.0)
        node = None
        if KINDS[cause.kind].node_fault:
            if seen and repeat < model.repeat_share:
                node = seen[int(pick * len(seen))]
            else:
                node = len(seen)
                seen.append(node)
        out.append(Failure(t, cause, node, phase, draw))


# ------------------------------------------------------------------------------ policies


def measured_mttf_hours(model: Model) -> float:
    """The job MTTF node health's Events show: only failures it acts on (``swap``/``degrade`` kinds) are counted."""
    share = sum(c.count for c in CAUSES if KINDS[c.kind].remediation in ("swap", "degrade")) / sum(c.count for c in CAUSES)
    return model.job_mttf_seconds / share / 3600.0


def gpufleet_policy(model: Model) -> Policy:
    """gpufleet as it ships: the advisor's interval for the measured MTTF, node health's lemon settings."""
    advice = checkpoint.advise(model.gpus, model.checkpoint_seconds, measured_mttf_hours(model),
                               restart_seconds=model.latencies.gang_restart + model.latencies.startup)
    degraded = set(_role_default("node_health", "node_health_degraded_faults"))
    return Policy("gpufleet", advice.daly_seconds, automated=True,
                  lemon_failures=int(_role_default("node_health", "node_health_lemon_failures")),
                  lemon_window=float(_role_default("node_health", "node_health_lemon_window_hours")) * 3600.0,
                  drain_degraded="ib_errors" not in degraded)


#: Baseline: health checks every 300 s (Slurm's HealthCheckInterval as LBNL NHC's documentation sets it),
#: a person acting within 30 minutes (Google SRE book, "Being On-Call": 30-minute response for
#: less time-critical systems), and a fixed 30-minute checkpoint interval.
BASELINE_HEALTH_CHECK_SECONDS = 300.0
BASELINE_OPERATOR_SECONDS = 1800.0
BASELINE_CHECKPOINT_INTERVAL_SECONDS = 1800.0


def baseline_policy(model: Model) -> Policy:
    """Common practice (module docstring and the constants above)."""
    return Policy("baseline", BASELINE_CHECKPOINT_INTERVAL_SECONDS, automated=False,
                  health_check_period=BASELINE_HEALTH_CHECK_SECONDS, operator=BASELINE_OPERATOR_SECONDS)


# ------------------------------------------------------------------------------ simulation


@dataclass
class Outcome:
    """One policy's account of the job.

    Attributes:
        policy: its name.
        wall_seconds: simulated wall-clock seconds.
        productive_seconds: training progress kept.
        badput: bucket -> seconds (:data:`gpufleet.goodput.BUCKETS`); sums to wall - productive.
        interruptions: failures that stopped the job.
        lemons: nodes kept out as lemons.
        checkpoint_interval: seconds of compute between checkpoints.
    """

    policy: str
    wall_seconds: float
    productive_seconds: float = 0.0
    badput: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    interruptions: int = 0
    lemons: int = 0
    checkpoint_interval: float = 0.0

    @property
    def ettr(self) -> float:
        """Productive / wall-clock time."""
        return self.productive_seconds / self.wall_seconds if self.wall_seconds else 0.0


def _node_ready(policy: Policy, model: Model, f: Failure, kind: Kind, interrupted: float) -> float:
    """When the gang may run again after ``f``: its bad node is out of the way (or there is none)."""
    operator = f.operator_draw * policy.operator
    if not kind.node_fault:
        return interrupted
    if kind.remediation == "not_ready":  # pods stuck terminating on a dead node: a person releases them
        return f.time + min(model.not_ready, 50.0) + operator
    if kind.remediation == "none":  # nothing in the metrics: a person finds the node after the crash
        return interrupted + operator
    if policy.automated:
        return f.time + model.latencies.fault_to_tainted
    detected = f.time + f.check_phase * policy.health_check_period
    return detected + operator


def _hang_end(policy: Policy, model: Model, f: Failure, kind: Kind) -> float:
    """When the job stops after ``f``: at once (a crash), or when a hang is cut short or times out."""
    if not f.cause.hangs:
        return f.time
    end = f.time + model.collective_timeout
    if kind.remediation == "not_ready":
        end = min(end, f.time + model.not_ready)
    evicts = kind.remediation == "swap" or (kind.remediation == "degrade" and policy.drain_degraded)
    if policy.automated and evicts:
        end = min(end, f.time + model.latencies.fault_to_evicted)
    return end


def simulate(model: Model, policy: Policy, sequence: Sequence[Failure]) -> Outcome:
    """Play ``sequence`` against ``policy``; returns the job's account (module docstring).

    Training cycles are ``checkpoint_interval`` seconds of compute then
    ``checkpoint_seconds`` of writing; a failure loses everything since the
    last completed checkpoint, and a hang adds the time until it ends.
    """
    horizon = model.horizon
    tau, save = policy.checkpoint_interval, model.checkpoint_seconds
    period = tau + save
    lat = model.latencies
    out = Outcome(policy.name, horizon, checkpoint_interval=tau)
    b = out.badput
    startup_begin = 0.0
    resume = lat.gang_restart + lat.startup
    out_until: dict[int, float] = {}
    history: dict[int, list[float]] = {}

    def run(begin: float, stalled: float, end: float, interrupted: bool) -> None:
        """Account a run that trained from ``begin``, made progress until ``stalled`` and ended at ``end``."""
        cycles = math.floor((stalled - begin) / period)
        last = begin + cycles * period
        out.productive_seconds += cycles * tau
        b["checkpoint_saving"] += cycles * save
        if interrupted:
            b["progress_lost"] += end - last
        else:
            rest = end - last
            out.productive_seconds += min(rest, tau)
            b["checkpoint_saving"] += max(0.0, rest - tau)

    def book_node(f: Failure, kind: Kind, ready: float) -> None:
        if f.node is None:
            return
        out_until[f.node] = max(ready, f.time) + model.repair_hours * 3600.0
        if policy.lemon_failures and kind.remediation in ("swap", "degrade"):
            seen = [t for t in history.get(f.node, []) if f.time - t <= policy.lemon_window] + [f.time]
            history[f.node] = seen
            if len(seen) >= policy.lemon_failures:
                out_until[f.node] = math.inf
                out.lemons += 1

    for f in sequence:
        if f.time >= horizon:
            break
        kind = KINDS[f.cause.kind]
        if f.node is not None and out_until.get(f.node, -1.0) > f.time:
            continue  # the node is in repair or quarantined: not part of the job
        if f.time < startup_begin:  # the job is down already: nothing more to stop
            book_node(f, kind, f.time)
            continue
        stop = min(_hang_end(policy, model, f, kind), horizon)
        if f.time < resume:
            b["starting"] += stop - startup_begin
        else:
            b["starting"] += resume - startup_begin
            run(resume, f.time, stop, interrupted=True)
        out.interruptions += 1
        ready = _node_ready(policy, model, f, kind, stop)
        book_node(f, kind, ready)
        restart = max(stop, ready)
        b["waiting_for_hardware"] += min(restart, horizon) - stop
        startup_begin, resume = restart, restart + lat.gang_restart + lat.startup
        if restart >= horizon:
            break
    if startup_begin < horizon:
        if horizon < resume:
            b["starting"] += horizon - startup_begin
        else:
            b["starting"] += resume - startup_begin
            run(resume, horizon, horizon, interrupted=False)
    return out


# ------------------------------------------------------------------------------ reports


@dataclass(frozen=True)
class Result:
    """Both policies on one failure sequence."""

    model: Model
    seed: int
    sequence: tuple[Failure, ...]
    gpufleet: Outcome
    baseline: Outcome

    def summary(self) -> dict[str, Any]:
        """``summary.json``: exactly :data:`SUMMARY_KEYS`."""
        return {
            "gpus": self.model.gpus,
            "days": self.model.days,
            "failures": len(self.sequence),
            "ettr_gpufleet": round(self.gpufleet.ettr, 6),
            "ettr_baseline": round(self.baseline.ettr, 6),
            "checkpoint_interval_seconds_gpufleet": round(self.gpufleet.checkpoint_interval, 1),
            "badput_seconds_gpufleet": {k: round(v, 1) for k, v in self.gpufleet.badput.items()},
            "badput_seconds_baseline": {k: round(v, 1) for k, v in self.baseline.badput.items()},
        }

    def parameters(self) -> dict[str, Any]:
        """Every input of the run and per-policy detail (``parameters.json``)."""
        m = self.model
        return {
            "seed": self.seed, "nodes": m.nodes, "job_mttf_hours": m.job_mttf_seconds / 3600,
            "measured_mttf_hours_for_advisor": measured_mttf_hours(m),
            "failures_per_1000_node_days": m.failures_per_1000_node_days,
            "checkpoint_seconds": m.checkpoint_seconds, "collective_timeout_seconds": m.collective_timeout,
            "not_ready_seconds": m.not_ready, "repeat_share": m.repeat_share, "repair_hours": m.repair_hours,
            "latencies": asdict(m.latencies),
            "policies": {o.policy: {"checkpoint_interval_seconds": o.checkpoint_interval, "interruptions": o.interruptions,
                                    "lemons": o.lemons, "productive_seconds": o.productive_seconds, "ettr": o.ettr}
                         for o in (self.gpufleet, self.baseline)},
            "failures_by_cause": {c.name: sum(1 for f in self.sequence if f.cause is c) for c in CAUSES},
        }


def run(model: Model, seed: int) -> Result:
    """Draw the failures for ``seed`` and simulate both policies on them."""
    sequence = tuple(failures(model, seed))
    return Result(model, seed, sequence, simulate(model, gpufleet_policy(model), sequence),
                  simulate(model, baseline_policy(model), sequence))


def sweep(model: Model, seed: int, sizes: Iterable[int] = CHART_SIZES, seeds: int = CHART_SEEDS,
          step: Callable[[], None] | None = None) -> dict[int, dict[str, list[float]]]:
    """ETTR of both policies for each job size: ``{gpus: {"gpufleet": [...], "baseline": [...]}}``, one per seed.

    ``step`` is called after each run (progress).
    """
    out: dict[int, dict[str, list[float]]] = {}
    for gpus in sizes:
        row: dict[str, list[float]] = {"gpufleet": [], "baseline": []}
        for s in range(seed, seed + seeds):
            r = run(replace(model, gpus=gpus), s)
            row["gpufleet"].append(r.gpufleet.ettr)
            row["baseline"].append(r.baseline.ettr)
            if step:
                step()
        out[gpus] = row
    return out


def plot(curve: dict[int, dict[str, list[float]]], path: Path, title: str) -> Path:
    """``goodput.png``: mean ETTR (and the range over seeds) of both policies against job size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(curve)
    fig, ax = plt.subplots(figsize=(9, 5), dpi=120)
    for name, color in (("gpufleet", "tab:green"), ("baseline", "tab:red")):
        means = [statistics.fmean(curve[s][name]) for s in sizes]
        ax.plot(sizes, means, marker="o", color=color, label=name)
        ax.fill_between(sizes, [min(curve[s][name]) for s in sizes], [max(curve[s][name]) for s in sizes],
                        color=color, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{s:,}" for s in sizes])
    ax.set_xlabel("job size (GPUs)")
    ax.set_ylabel("ETTR (productive / wall-clock time)")
    ax.set_ylim(0, 1)
    ax.axhline(0.95, color="grey", linestyle=":", linewidth=1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def table(result: Result):
    """A rich Table of both policies: ETTR, interval, interruptions, badput by bucket (hours)."""
    from rich.table import Table

    g, b = result.gpufleet, result.baseline
    t = Table(title=f"{result.model.gpus:,} GPUs, {result.model.days:g} days, {len(result.sequence)} failures "
                    f"(job MTTF {result.model.job_mttf_seconds / 3600:.1f} h), seed {result.seed}")
    t.add_column("")
    t.add_column("gpufleet", justify="right")
    t.add_column("baseline", justify="right")
    t.add_row("ETTR", f"{g.ettr:.3f}", f"{b.ettr:.3f}", style="bold")
    t.add_row("checkpoint interval", f"{g.checkpoint_interval / 60:.1f} min", f"{b.checkpoint_interval / 60:.1f} min")
    t.add_row("interruptions", str(g.interruptions), str(b.interruptions))
    t.add_row("lemon nodes kept out", str(g.lemons), str(b.lemons))
    for bucket in BUCKETS:
        t.add_row(f"{bucket} (h)", f"{g.badput[bucket] / 3600:.1f}", f"{b.badput[bucket] / 3600:.1f}")
    return t


def write(result: Result, curve: dict[int, dict[str, list[float]]], out: Path) -> list[Path]:
    """Write ``summary.json``, ``parameters.json`` and ``goodput.png`` to ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    summary, params = out / "summary.json", out / "parameters.json"
    summary.write_text(json.dumps(result.summary(), indent=2) + "\n")
    params.write_text(json.dumps({**result.parameters(), "chart": {str(k): v for k, v in curve.items()}}, indent=2) + "\n")
    m = result.model
    png = plot(curve, out / "goodput.png", f"ETTR over {m.days:g} days, {m.failures_per_1000_node_days:.3g} failures "
                                           f"per 1,000 node-days, Llama 3 cause mix")
    return [summary, params, png]
