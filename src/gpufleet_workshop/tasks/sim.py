"""invoke tasks for simulations: ``sim.flip`` on the local cluster; ``sim.goodput`` (gpufleet_workshop.tasks.goodput).

The task parses its flags and calls :func:`gpufleet_workshop.sim.flip.run`. Bad
flags exit with code 2; a phase that does not finish in time exits with
code 1 and what the cluster looked like (the timeline is written anyway).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from invoke import Collection, Context, task
from invoke.exceptions import Exit

from gpufleet_workshop.tasks import goodput
from gpufleet_workshop.tasks.common import fail_on_inventory_error
from gpufleet.kube.intstr import parse_int_or_percent
from gpufleet.names import FLIP_MODES
from gpufleet_workshop.sim.traffic import TIMEOUT_SECONDS


@contextmanager
def flip_errors() -> Iterator[None]:
    """Turn what a flip run raises into exits: bad inventory or input 2, a component or phase that fails 1.

    Raises:
        invoke.exceptions.Exit: with the error's own message (no traceback).
    """
    from gpufleet_admin.build.gobuild import GoError
    from gpufleet_workshop.local.processes import ComponentFailed
    from gpufleet_workshop.sim.flip import SimError

    with fail_on_inventory_error():
        try:
            yield
        except ValueError as exc:
            raise Exit(str(exc), code=2) from None
        except (SimError, GoError, ComponentFailed, TimeoutError) as exc:
            raise Exit(str(exc), code=1) from None


@task(help={
    "env": "inventory environment (default local)",
    "nodes": "GPU nodes of the local cluster (default: the inventory's fleet_simulated_nodes)",
    "replicas": "inference replicas (default: the inventory's; the PDB's minAvailable stays below it)",
    "out": "folder for timeline.json, flip.png and summary.json (default out/sim-flip)",
    "duration": "seconds the training runs once its last pod started; then all its pods end together (default 30)",
    "cluster": "local cluster name (default gpufleet)",
    "pools": "comma-separated pools to run (default: every pool of the inventory)",
    "timeout": "seconds each phase may take (default 300)",
    "keep": "leave the inference Deployment, the JobSet and the virtual nodes behind",
    "verbose": "log what the controllers do",
    "mode": "flip-out mode: make_before_break or evict_first (default: the inventory's taint_controller_flip_mode); "
            "both: one run of each, one after the other, in OUT/<mode>/, compared side by side (OUT/comparison.json)",
    "rate": "requests per second sent through the inference Service for the whole run (default 20; 0: none, "
            "inference then runs on simulated nodes and only Ready pods count)",
    "latency_ms": "milliseconds the inference stand-in takes per request (default 20, or 200 with --load-step: "
                  "inference scales on requests in flight, rate x latency; below the request stream's 2000 ms timeout)",
    "pdb_max_unavailable": "the inference PodDisruptionBudget's maxUnavailable, pods or a percentage such as 10% "
                           "(default: the inventory's budget)",
    "pool_gpus": "every pool's capacity_gpus (default: the inventory's): outside capacity for a fleet-size run",
    "migration_pods_per_minute": "the way back's pace, descheduler_migration_pods_per_minute (default: the "
                                 "inventory's)",
    "load_step": "requests per second through the Service during a load step the HPA must follow, once with every "
                 "replica in-cluster and once with every replica outside (above --rate; default 0: no step)",
})
def flip(c: Context, env: str = "local", nodes: int = 0, replicas: int = 0, out: str = "out/sim-flip",
         duration: int = 30, cluster: str = "gpufleet", pools: str = "", timeout: int = 300,
         keep: bool = False, verbose: bool = False, mode: str = "", rate: int = 20, latency_ms: int = 0,
         pdb_max_unavailable: str = "", pool_gpus: int = 0, migration_pods_per_minute: float = 0.0,
         load_step: int = 0) -> None:
    """Run the flip on the local cluster: inference out when training takes every GPU, back when it ends.

    Ups the local cluster if needed (and the second cluster of each
    kubernetes pool), deploys inference (HPA, PDB), uses the taint
    controller and a virtual kubelet per pool running on the real node
    (deploying them there when no stack did), submits a
    JobSet through Kueue that needs every GPU, records a per-second
    timeline and prints a summary. Example:
    invoke sim.flip --env local --nodes 16 --replicas 4 --out out/sim-flip
    """
    from gpufleet_workshop.sim.flip import Options, run

    problems = [f"--{flag} {value:g}: expected a number >= 0 (0: the inventory's)"
                for flag, value in (("nodes", nodes), ("replicas", replicas)) if value < 0]
    problems += [f"--{flag} {value:g}: expected a number >= 0 (0: the inventory's)"
                 for flag, value in (("pool-gpus", pool_gpus), ("migration-pods-per-minute", migration_pods_per_minute))
                 if value < 0]
    problems += [f"--{flag} {value:g}: expected seconds > 0" for flag, value in (("duration", duration), ("timeout", timeout))
                 if value <= 0]
    if pools and not pools.strip(", "):
        problems.append(f"--pools {pools!r}: expected pool names separated by commas (leave it out for every pool)")
    problems += [f"--{flag} {value:g}: expected {what}" for flag, value, what in (
        ("rate", rate, "requests per second >= 0 (0: none)"), ("latency-ms", latency_ms, "milliseconds > 0 (0: the default)"),
        ("load-step", load_step, "requests per second >= 0 (0: no step)"))
        if value < 0]
    if rate > 0 and latency_ms >= TIMEOUT_SECONDS * 1000:
        problems.append(f"--latency-ms {latency_ms:g}: expected milliseconds below {TIMEOUT_SECONDS * 1000:g} "
                        "(the request stream's timeout: every request would fail)")
    budget: int | str | None = None
    if pdb_max_unavailable:
        try:
            budget = parse_int_or_percent(int(pdb_max_unavailable) if pdb_max_unavailable.isdigit()
                                          else pdb_max_unavailable, "--pdb-max-unavailable")
        except ValueError as exc:
            problems.append(str(exc))
    if mode and mode not in (*FLIP_MODES, "both"):
        problems.append(f"--mode {mode!r}: expected one of {', '.join(FLIP_MODES)} or both")
    if problems:
        raise Exit("\n".join(problems), code=2)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    opts = Options(env=env, nodes=nodes or None, replicas=replicas or None, duration=duration, cluster=cluster,
                   pools=tuple(p.strip() for p in pools.split(",") if p.strip()) or None, out=out, timeout=timeout,
                   keep=keep, mode=mode or None, rate=rate, latency_ms=latency_ms or None, pdb_max_unavailable=budget,
                   pool_gpus=pool_gpus or None, migration_pods_per_minute=migration_pods_per_minute or None,
                   load_step=load_step)
    with flip_errors():
        if mode == "both":
            summary = _both(opts)
        else:
            summary = run(opts)
    print(json.dumps(summary))


def _both(opts) -> dict:
    """One run per flip mode (``OUT/<mode>/``), then the summaries side by side: a table and ``OUT/comparison.json``."""
    from dataclasses import replace
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from gpufleet_workshop.sim.flip import TABLE_KEYS, check_both, run

    check_both(opts)
    summaries = {m: run(replace(opts, mode=m, out=Path(opts.out) / m)) for m in FLIP_MODES}
    (Path(opts.out) / "comparison.json").write_text(json.dumps(summaries, indent=1))
    table = Table(title="sim.flip, both modes")
    table.add_column("figure")
    for m in FLIP_MODES:
        table.add_column(m, justify="right")
    for k in TABLE_KEYS:
        table.add_row(k, *("-" if summaries[m][k] is None else str(summaries[m][k]) for m in FLIP_MODES))
    Console(stderr=True).print(table)
    return summaries


sim = Collection("sim", flip)
sim.add_task(goodput.simulate, name="goodput")
sim.add_task(goodput.replay, name="goodput-replay")
ns = sim
