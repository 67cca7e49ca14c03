"""invoke tasks for goodput: ``sim.goodput`` (the long-horizon model).

Each task parses its flags and calls :mod:`gpufleet.sim.goodput`. Bad flags
exit with code 2, one line per problem (``--flag value: expected ...``),
before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from invoke import Context, task
from invoke.exceptions import Exit

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
    checkpoint interval (gpufleet.sim.goodput cites every figure). Writes
    summary.json, parameters.json and goodput.png (ETTR of both against job
    size, 128 to 16,384 GPUs). Example:
    invoke sim.goodput --gpus 1024 --days 30 --seed 1 --out out/sim-goodput
    """
    from dataclasses import replace

    from rich.console import Console
    from rich.progress import Progress

    from gpufleet.sim import goodput as model_

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
