"""``invoke install`` and ``invoke demo``: what a newcomer's two commands run.

``install`` makes every component the main job and the tests need available
(the local cluster's, and the Pulumi CLI and provider), building what is not
cached yet. ``demo`` is the main job on the built-in local environment: a
local cluster, ``pulumi up --stack local`` on it, the fleet on one screen,
and the flip (training takes every GPU, inference is served outside, then
comes back).
"""

from __future__ import annotations

from invoke import Context, task
from invoke.exceptions import Exit
from rich.console import Console


#: Stack config of the demo's ``pulumi up``: sim.flip brings its own inference workload (its replicas, its PDB),
#: so the inference role declares none; the role stays enabled because it is what says inference runs in its
#: namespace, and the taint controller's surge rights and the virtual kubelet's reflection rights follow it
#: (with the role off the flip loses make before break: a surge ReplicaSet read is forbidden).
DEMO_CONFIG = {"gpufleet:inference_deployments": "[]"}


@task(help={"force": "rebuild every component even if cached and verified"})
def install(c: Context, force: bool = False) -> None:
    """Build or verify everything the main job and the tests need (a no-op when cached)."""
    from gpufleet_admin.build.gobuild import GoError
    from gpufleet_workshop.local.install import install as install_components
    from gpufleet_admin.build import pulumi as tools

    console = Console(stderr=True, highlight=False)
    try:
        install_components(None, force=force, console=console)
        for name, path in tools.ensure_all(force=force, progress=console.print).items():
            console.print(f"{name}: {path}")
    except GoError as exc:
        raise Exit(str(exc), code=1) from None


@task(help={
    "nodes": "simulated GPU nodes of the local fleet (default: the inventory's, 16)",
    "out": "folder for the flip's timeline.json, flip.png and summary.json (default out/demo)",
    "duration": "seconds the training job runs (default 30)",
})
def demo(c: Context, nodes: int = 0, out: str = "out/demo", duration: int = 30) -> None:
    """The main job on the local environment: cluster, ``pulumi up``, status, then the flip.

    1. ``invoke local.up``: a real control plane with kwok GPU nodes, Kueue,
       JobSet, the descheduler and Prometheus on loopback.
    2. ``pulumi up --stack local`` (``invoke up --env local --yes``): every
       role's objects; gpufleet's controllers (taint controller, a virtual
       kubelet per pool, quota sync, node health) and the exporter run from
       gpufleet's image on the cluster's real node, and the ``other`` pool's
       cluster is started. The flip simulation brings its own inference
       workload, so that role declares its namespace but no Deployment
       here (``DEMO_CONFIG``).
    3. ``invoke status --env local``.
    4. ``invoke sim.flip``: training takes every GPU, inference flips to the
       virtual nodes and comes back, driven by those in-cluster controllers;
       prints the summary and the chart's path.
    """
    from gpufleet_workshop.local import cluster as local_cluster
    from gpufleet_workshop.sim.flip import Options, run
    from gpufleet_admin.stack import engine
    from gpufleet_workshop.tasks.sim import flip_errors
    from gpufleet_workshop.tasks.stack import local_environment
    from gpufleet_workshop.tasks.status import show_status

    console = Console(highlight=False)
    if nodes < 0 or duration <= 0:
        raise Exit("--nodes >= 0 and --duration > 0 expected", code=2)
    with flip_errors():
        console.rule("1. local cluster")
        # A stopped cluster restarts from empty state (see gpufleet_workshop.sim.flip._up); the stack's state is
        # refreshed from the cluster below, so pulumi up recreates what the cluster lacks.
        fresh = not local_cluster.main_pids(local_cluster.DEFAULT_NAME)
        cl = local_cluster.up(local_cluster.DEFAULT_NAME, env="local", nodes=nodes or None, log=console.print,
                              fresh=fresh)
        console.print(f"kubeconfig: {cl.kubeconfig}")
        console.rule("2. pulumi up --stack local")
        target = engine.Target(env="local", kubeconfig=cl.kubeconfig, backend=engine.default_backend(),
                               config={**local_environment(cl), **DEMO_CONFIG},
                               refresh=True)
        try:
            result = engine.up(target, printer=lambda line: console.print(line, markup=False, highlight=False))
        except engine.EngineError as exc:
            raise Exit(str(exc), code=1) from None
        console.print(f"pulumi up: {result.summary}")
        console.rule("3. the fleet")
        show_status("local", kubeconfig=str(cl.kubeconfig), console=console)
        console.rule("4. the flip")
        summary = run(Options(env="local", nodes=nodes or None, out=out, duration=duration, cluster=cl.name),
                      console=console)
    console.print(f"summary: {out}/summary.json  timeline: {out}/timeline.json  chart: {out}/flip.png")
    console.print(summary)
