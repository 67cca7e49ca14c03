"""invoke tasks for goodput: ``sim.goodput`` (the long-horizon model), ``train.goodput`` (one job's account).

Each task parses its flags and calls :mod:`gpufleet_workshop.sim.goodput`. Bad flags
exit with code 2, one line per problem (``--flag value: expected ...``),
before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from invoke import Context, task
from invoke.exceptions import Exit

from gpufleet import cliargs

#: Where ``sim.goodput`` looks for a fault replay's measured latencies when --latencies is not given.
REPLAY_LATENCIES = Path("out/goodput-replay/latencies.json")


@task(help={
    "gpus": "GPUs of the job, whole 8-GPU nodes (e.g. 1024)",
    "days": "wall-clock days to simulate (e.g. 30)",
    "seed": "seed of the failure sequence (default 1); the same seed gives the same run",
    "out": "folder for summary.json, parameters.json and goodput.png (default out/sim-goodput)",
    "failure_rate": "failures per 1,000 node-days (default 6.5: Meta RSC-1, jobs above 128 GPUs)",
    "mttf_hours": "job MTTF in hours at --gpus instead of --failure-rate (e.g. 7.9: RSC-1's reported 1,024-GPU figure)",
    "checkpoint_seconds": "seconds one checkpoint write stalls training (default: training_checkpoint_seconds, 60)",
    "latencies": f"a fault replay's latencies.json (default: {REPLAY_LATENCIES} if it exists, else documented defaults)",
})
def simulate(c: Context, gpus: int = 0, days: float = 0.0, seed: int = 1, out: str = "out/sim-goodput",
             failure_rate: float = 0.0, mttf_hours: float = 0.0, checkpoint_seconds: float = 0.0,
             latencies: str = "") -> None:
    """Simulate one training job over days: ETTR under gpufleet and under common practice, same failures.

    Failures at Meta RSC-1's rate with Llama 3's mix of causes; gpufleet's
    remediation latencies, checkpoint advisor and lemon quarantine against
    5-minute health checks, a person swapping nodes and a 30-minute
    checkpoint interval (gpufleet_workshop.sim.goodput cites every figure). Writes
    summary.json, parameters.json and goodput.png (ETTR of both against job
    size, 128 to 16,384 GPUs). Example:
    invoke sim.goodput --gpus 1024 --days 30 --seed 1 --out out/sim-goodput
    """
    from dataclasses import replace

    from rich.console import Console
    from rich.progress import Progress

    from gpufleet_workshop.sim import goodput as model_

    rate = failure_rate or model_.RSC1_FAILURES_PER_1000_NODE_DAYS
    problems = model_.validate(gpus, days, seed, failure_rate=rate, mttf_hours=mttf_hours or None,
                               checkpoint_seconds=checkpoint_seconds or 60.0)
    if failure_rate < 0:
        problems.append(f"--failure-rate {failure_rate:g}: expected failures per 1,000 node-days > 0")
    if mttf_hours < 0:
        problems.append(f"--mttf-hours {mttf_hours:g}: expected finite hours > 0")
    if checkpoint_seconds < 0:
        problems.append(f"--checkpoint-seconds {checkpoint_seconds:g}: expected finite seconds > 0")
    if failure_rate and mttf_hours:
        problems.append("--failure-rate and --mttf-hours: expected one of them, not both")
    lat_path = Path(latencies) if latencies else (REPLAY_LATENCIES if REPLAY_LATENCIES.is_file() else None)
    lat = model_.Latencies()
    if lat_path is not None:
        try:
            lat = model_.Latencies.from_file(lat_path)
        except ValueError as exc:
            problems.append(str(exc))
    out_dir = Path(out)
    if not out or (out_dir.exists() and not out_dir.is_dir()):
        problems.append(f"--out {out!r}: expected a folder path (it is created if missing)")
    if problems:
        raise Exit("\n".join(dict.fromkeys(problems)), code=2)
    if mttf_hours:
        rate = model_.rate_for_mttf(gpus, mttf_hours)
    model = model_.Model(gpus=gpus, days=float(days), failures_per_1000_node_days=rate, latencies=lat)
    if checkpoint_seconds:
        model = replace(model, checkpoint_seconds=float(checkpoint_seconds))
    console = Console(stderr=True)
    console.print(f"latencies: {lat.source}")
    with Progress(console=console, transient=True) as progress:
        job = progress.add_task(f"{gpus:,} GPUs x {days:g} days", total=1)
        result = model_.run(model, seed)
        progress.advance(job)
        chart = progress.add_task("ETTR against job size", total=len(model_.CHART_SIZES) * model_.CHART_SEEDS)
        curve = model_.sweep(model, seed, step=lambda: progress.advance(chart))
    try:
        paths = model_.write(result, curve, out_dir)
    except OSError as exc:
        raise Exit(f"--out {out}: {exc.strerror or exc}", code=2) from None
    Console().print(model_.table(result))
    console.print("wrote " + ", ".join(str(p) for p in paths))


#: Help of ``train.goodput``'s flags (invoke consumes a Task's help while parsing: each Task gets a copy).
ACCOUNT_HELP = {
    "name": "the training job: a JobSet, PyTorchJob or Job submitted through Kueue",
    "namespace": "its namespace (default: the namespace holding a Workload of that job, if only one does)",
    "out": "folder for account.json and timeline.png (default out/train-goodput/NAME)",
    "env": "environment, for the local cluster's kubeconfig (default local)",
    "kubeconfig": "kubeconfig file (default: $KUBECONFIG or ~/.kube/config; for --env local, the local cluster's)",
    "context": "kubeconfig context (default: the current one)",
    "checkpoint_dir": "where to read the job's checkpoints here (default: the CHECKPOINT_DIR its pods were given)",
    "prometheus_url": "Prometheus base URL, http(s)://host[:port]: adds what inference held outside while the job was "
                      "admitted (GPU-seconds and cost by pool, from the virtual kubelets' counters)",
}


def account_task():
    """A fresh ``train.goodput`` Task (:func:`account` with :data:`ACCOUNT_HELP`)."""
    return task(help=dict(ACCOUNT_HELP))(account)


def account(c: Context, name: str, namespace: str = "", out: str = "", env: str = "local", kubeconfig: str = "",
            context: str = "", checkpoint_dir: str = "", prometheus_url: str = "") -> None:
    """Show one training job's goodput: ETTR, lost time by cause, interruptions, and a timeline PNG.

    Reads the job's Kueue Workload (conditions and Events), its pods and
    the checkpoints it wrote ($CHECKPOINT_DIR/step-<N>/ with a completion
    marker, templates/training/README.md), as the gpufleet goodput
    accountant does, but once: pods deleted before now and Events older
    than the API server keeps (1 h by default) are not seen. With
    --prometheus-url, also what the job's admission cost outside: the
    GPU-seconds and cost inference held on virtual nodes while the job was
    admitted, by pool (every job admitted at the same time sees the same
    outside capacity: training's priority as a whole moved it). Example:
    invoke train.goodput llm-8b-run1 --namespace team-pretrain
    """
    from rich.console import Console

    from gpufleet.goodput import api as gkube
    from gpufleet.goodput.main import account_json, snapshot
    from gpufleet.goodput.report import plot_timeline, table
    from gpufleet.goodput.tracker import Tracker
    from gpufleet.kube.validation import dns_label
    from gpufleet.ops.exits import fail_on_ops_error
    from gpufleet.ops.reads import InputError
    from gpufleet_workshop.tasks.common import kube_for

    def label(value: str) -> bool:
        try:
            return bool(dns_label(value))
        except ValueError:
            return False

    problems = []
    if not label(name):
        problems.append(f"NAME {name!r}: expected the job's name, a DNS label such as llm-8b-run1")
    if namespace and not label(namespace):
        problems.append(f"--namespace {namespace!r}: expected a namespace name (a DNS label)")
    out_dir = Path(out or f"out/train-goodput/{name}")
    if out_dir.exists() and not out_dir.is_dir():
        problems.append(f"--out {out!r}: expected a folder path (it is created if missing)")
    if checkpoint_dir and not Path(checkpoint_dir).is_dir():
        problems.append(f"--checkpoint-dir {checkpoint_dir!r}: expected an existing folder")
    if prometheus_url:
        try:
            cliargs.check("--prometheus-url", cliargs.http_url, prometheus_url)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise Exit("\n".join(problems), code=2)
    try:
        kube = kube_for(env, kubeconfig or None, context or None)
    except InputError as exc:
        raise Exit(str(exc), code=2) from None
    try:
        with fail_on_ops_error("train.goodput"):
            tracker = Tracker()
            found = [w for w in gkube.list_workloads(kube, namespace or None)
                     if any(r.get("kind") in ("JobSet", "PyTorchJob", "Job") and r.get("name") == name
                            for r in (w.get("metadata") or {}).get("ownerReferences") or [])]
            spaces = sorted({w["metadata"]["namespace"] for w in found})
            if not found:
                where = f"namespace {namespace}" if namespace else "any namespace"
                raise Exit(f"train.goodput: no Kueue Workload of a job {name!r} in {where} (Kueue creates one when a "
                           "JobSet, PyTorchJob or Job is submitted to a LocalQueue)", code=2)
            if len(spaces) > 1:
                raise Exit(f"train.goodput: jobs named {name!r} in namespaces {', '.join(spaces)}: give --namespace",
                           code=2)
            snapshot(kube, tracker, spaces[0])
            jobs = sorted((w for w in tracker.jobs() if w.job_name == name), key=lambda w: w.created)
            now = gkube.now()
            result = tracker.account_of(jobs[-1], now, checkpoint_dir or None)
    finally:
        kube.close()
    outside = None
    if prometheus_url:
        from gpufleet.prom.client import PromClient

        prom = PromClient(prometheus_url)
        try:
            outside = outside_while_admitted(prom, jobs[-1].admitted_windows(result.end))
        finally:
            prom.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    import json

    doc = account_json(result)
    if outside is not None:
        doc["outside_while_admitted"] = outside
    (out_dir / "account.json").write_text(json.dumps(doc, indent=2) + "\n")
    png = plot_timeline(result, out_dir / "timeline.png")
    Console().print(table(result))
    if outside is not None:
        Console().print(outside_table(outside))
    Console(stderr=True).print(f"wrote {out_dir / 'account.json'}, {png}")


def outside_while_admitted(prom, windows: list[tuple[float, float]]) -> dict:
    """What inference held outside while the job was admitted (``windows``, Unix seconds), for account.json.

    Args:
        prom: a :class:`gpufleet.prom.client.PromClient` where the virtual kubelets' counters are scraped.
        windows: the job's admissions (:meth:`gpufleet.goodput.history.WorkloadRecord.admitted_windows`).

    Returns:
        ``{"windows": [[start, end], ...], "pools": {pool: {"gpu_seconds", "cost", "currency"}}}``, or
        ``{"windows": ..., "error": why}`` when Prometheus cannot be read (the account is written anyway).
    """
    from gpufleet.prom.client import PromError
    from gpufleet.virtual_kubelet.ledger import read_windows

    doc: dict = {"windows": [[round(s, 3), round(e, 3)] for s, e in windows]}
    try:
        totals = read_windows(prom, windows)
    except PromError as exc:
        return {**doc, "error": str(exc)}
    doc["pools"] = {pool: {"gpu_seconds": round(t.gpu_seconds, 1), "cost": round(t.cost, 4), "currency": t.currency}
                    for pool, t in sorted(totals.items())}
    return doc


def outside_table(outside: dict):
    """A rich Table of :func:`outside_while_admitted`'s figures (or why there are none)."""
    from rich.table import Table

    t = Table(title="outside capacity while the job was admitted (virtual kubelets' counters)")
    for col, justify in (("pool", "left"), ("GPU-hours", "right"), ("cost", "right")):
        t.add_column(col, justify=justify)
    if "error" in outside:
        t.add_row("-", "-", f"not read: {outside['error']}")
    for pool, p in outside.get("pools", {}).items():
        t.add_row(pool, f"{p['gpu_seconds'] / 3600:,.2f}", f"{p['cost']:,.2f} {p['currency']}")
    if not outside.get("error") and not outside.get("pools"):
        t.add_row("-", "-", "no series for these windows: nothing ran outside, or a window is shorter than two "
                  "scrapes or older than Prometheus keeps" if outside["windows"] else "never admitted")
    return t


@task(help={
    "cluster": "local cluster name (default gpufleet; started if not running)",
    "out": "folder for latencies.json, replay.json and timeline.png (default out/goodput-replay, "
           "where sim.goodput looks for measured latencies)",
    "faults": "comma-separated faults, in order: xid, gpu_temp, ib_down (default all three)",
    "pods": "pods of the gang, one 8-GPU node each (default 4)",
    "total_steps": "steps of the simulated trainer, 10 per second (default 2400)",
    "scrape_seconds": "Prometheus scrape interval (default: gpu_metrics_scrape_interval_seconds, as production)",
    "keep": "leave the finished JobSet for invoke train.goodput (replay.json names it and its checkpoint folder)",
})
def replay(c: Context, cluster: str = "gpufleet", out: str = "out/goodput-replay", faults: str = "xid,gpu_temp,ib_down",
           pods: int = 4, total_steps: int = 2400, scrape_seconds: float = 0.0, keep: bool = False) -> None:
    """Replay faults on the local cluster and measure goodput: accountant against ground truth, recovery latencies.

    A JobSet gang of simulated GPU pods trains (a simulated trainer writing
    checkpoints); faults arrive through the exporter stand-ins and Prometheus;
    node health takes the node out; JobSet and Kueue bring the gang back;
    the trainer resumes from its last checkpoint (gpufleet_workshop.sim.goodput_replay).
    Prints the accountant's ETTR beside the trainer's and each fault's
    latencies; writes latencies.json for sim.goodput. Example:
    invoke sim.goodput-replay --out out/goodput-replay
    """
    import json
    import logging

    from gpufleet_workshop.sim import goodput_replay as r

    logging.getLogger("httpx").setLevel(logging.WARNING)
    opts = r.Options(cluster=cluster, out=out, faults=tuple(f.strip() for f in faults.split(",") if f.strip()),
                     pods=pods, total_steps=total_steps, nodes=pods + len([f for f in faults.split(",") if f.strip()]) + 1,
                     scrape_seconds=scrape_seconds or None, keep=keep)
    problems = opts.problems()
    if out and Path(out).exists() and not Path(out).is_dir():
        problems.append(f"--out {out!r}: expected a folder path")
    if problems:
        raise Exit("\n".join(problems), code=2)
    try:
        result = r.run(opts, say=print)
    except r.ReplayError as exc:
        raise Exit(f"sim.goodput-replay: {exc}", code=1) from None
    print(json.dumps({k: result[k] for k in ("ettr_accountant", "ettr_ground_truth", "difference_points",
                                             "latencies_median", "job")}, indent=1))
