"""``invoke health.nodes``: the testinfra node checks over an environment's inventory, with a summary.

The checks themselves are ``tests/nodes/`` (pytest-testinfra);
:func:`gpufleet.ops.nodechecks.run_node_checks` runs them in a pytest
subprocess with the Ansible connection on ``inventories/<env>/hosts.yml``
(``invoke node.return`` runs the same before a node returns), and this
module turns their ``--node-report`` JSON into a rich table per host and
area (gpu, fabric, storage, software).
"""

from __future__ import annotations

from collections import Counter

import yaml
from invoke import Collection, task
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table

from gpufleet.componentconfig import yaml_problem
from gpufleet.ops.nodechecks import NODE_CHECKS, CheckResult, NodeCheckRun, run_node_checks  # noqa: F401 (re-exported)
from gpufleet.paths import INVENTORIES

AREAS = ("gpu", "fabric", "storage", "software")


def summary_table(run: NodeCheckRun, title: str) -> Table:
    """Rich table: one row per host and area with passed/failed/skipped counts and the first failures."""
    table = Table(title=title)
    table.add_column("host")
    table.add_column("area")
    table.add_column("passed", justify="right", style="green")
    table.add_column("failed", justify="right", style="red")
    table.add_column("skipped", justify="right", style="yellow")
    table.add_column("first failures")
    counts: dict[tuple[str, str], Counter[str]] = {}
    failures: dict[tuple[str, str], list[str]] = {}
    for r in run.results:
        key = (r.host or "-", r.area)
        counts.setdefault(key, Counter())[r.outcome] += 1
        if r.outcome == "failed":
            failures.setdefault(key, []).append(r.message or r.test)
    order = {a: i for i, a in enumerate(AREAS)}
    for host, area in sorted(counts, key=lambda k: (k[0], order.get(k[1], 99), k[1])):
        c = counts[(host, area)]
        shown = failures.get((host, area), [])
        more = f" (+{len(shown) - 3} more)" if len(shown) > 3 else ""
        table.add_row(host, area, str(c["passed"]), str(c["failed"] or ""), str(c["skipped"] or ""), "\n".join(shown[:3]) + more)
    return table


def print_summary(run: NodeCheckRun, title: str, console: Console | None = None) -> None:
    """Print the summary table and, for a broken run (pytest rc >= 2), the tail of pytest's output."""
    console = console or Console()
    console.print(summary_table(run, title))
    total = Counter(r.outcome for r in run.results)
    console.print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    if run.returncode >= 2:
        console.print(f"[red]pytest exited {run.returncode}[/red]: {' '.join(run.command)}")
        console.print(run.output[-4000:], markup=False, highlight=False)


@task(
    help={
        "env": "environment: a folder of inventories/ (local, staging, prod)",
        "limit": "only hosts matching this host or group pattern (Ansible-style, e.g. rack_a or gpu-a-0*)",
        "pytest_args": "extra pytest arguments, quoted, e.g. \"-k temperature -x\"",
    }
)
def nodes(c, env, limit=None, pytest_args=""):
    """Run the testinfra node checks (tests/nodes) on ENV's hosts and print a summary per host and area.

    Connects with Ansible's inventory inventories/ENV/hosts.yml (its
    ansible_user, ansible_host, become settings); expected values (GPU count,
    HCAs and rates, thresholds, pinned versions) come from the same
    inventory. Exits 1 when any check fails, 2 when the run itself broke.
    """
    inventory = INVENTORIES / env / "hosts.yml"
    if not inventory.exists():
        raise Exit(f"no inventory {inventory} (environments: {', '.join(sorted(p.name for p in INVENTORIES.iterdir() if p.is_dir()))})", code=2)
    try:
        groups = yaml.safe_load(inventory.read_text()) or {}
    except yaml.YAMLError as exc:
        raise Exit(f"{inventory}: not valid YAML ({yaml_problem(exc)})", code=2) from None
    if not isinstance(groups, dict) or not _lists_hosts(groups):
        raise Exit(f"--env {env}: {inventory} lists no hosts to connect to (a simulated fleet's nodes are kwok "
                   f"nodes of the local cluster); run the node checks on real hosts (--env staging or prod), or on "
                   f"this machine: pytest tests/nodes --hosts=local:// --node-var KEY=VALUE", code=2)
    import shlex

    run = run_node_checks(inventory, limit=limit, pytest_args=shlex.split(pytest_args))
    print_summary(run, f"health.nodes --env {env}" + (f" --limit {limit}" if limit else ""))
    if run.returncode >= 2 and run.returncode != 5:
        raise Exit(code=2)
    if run.returncode == 5 or not run.results:
        raise Exit(f"no node checks ran (no host matches {limit or 'the inventory'}?)", code=2)
    if run.failed:
        raise Exit(code=1)


def _lists_hosts(groups: dict) -> bool:
    """True when an Ansible YAML inventory (``{group: {hosts, children, vars}}``) names at least one host."""
    return any(isinstance(g, dict) and (bool(g.get("hosts")) or _lists_hosts(g.get("children") or {}))
               for g in groups.values())


ns = Collection("health")
ns.add_task(nodes)


def resume_breaker(env: str, minutes: float, *, dry_run: bool = False, kubeconfig: str | None = None,
                   context: str | None = None, console: Console | None = None):
    """Lift (or, with 0 minutes, withdraw lifting) node health's circuit breaker limit; returns the
    :class:`gpufleet.node_health.breaker.ResumePlan`.

    Raises:
        gpufleet_admin.inventory.InventoryError: unknown environment or invalid inventory.
        gpufleet.ops.reads.InputError: bad ``minutes`` (as ``--minutes``).
        gpufleet.kube.KubeError: the API server refused or is unreachable.
    """
    import getpass
    import socket

    from gpufleet.node_health import breaker
    from gpufleet.ops.reads import InputError
    from gpufleet_workshop.tasks.common import kube_for
    from roles.registry import load

    console = console or Console()
    namespace = load(env).role("node_health").node_health_namespace
    by = f"{getpass.getuser()}@{socket.gethostname()}"
    try:
        breaker.plan_resume(None, namespace, minutes, 0.0, by)  # refuse a bad --minutes before connecting
    except ValueError as exc:
        raise InputError(str(exc)) from None
    kube = kube_for(env, kubeconfig, context)
    try:
        plan = breaker.resume(kube, namespace, minutes, by=by, dry_run=dry_run)
    finally:
        kube.close()
    where = f"ConfigMap {namespace}/{breaker.BREAKER_CONFIGMAP}"
    what = ("withdraw the resume: the share limit applies again" if plan.until is None else
            f"lift the share limit until {plan.data[breaker.RESUME_UNTIL]} (node_health_max_nodes_out still applies)")
    state = plan.before.get(breaker.STATE, "never written")
    if not plan.changed:
        console.print(f"health.breaker-resume: nothing to do ({where} already says so; breaker {state})")
    elif dry_run:
        console.print(f"health.breaker-resume (dry run: nothing changed): would {what} in {where}; breaker {state}")
    else:
        console.print(f"health.breaker-resume: {what} ({where}, by {by}); node health reads it at its next step")
    return plan


@task(name="breaker-resume", help={
    "env": "environment: a folder of inventories/ (local, staging, prod); names node_health_namespace",
    "minutes": "how long node health may act past node_health_max_unhealthy_share (default 60; 0 withdraws a resume)",
    "dry_run": "say what would be written; change nothing",
    "kubeconfig": "kubeconfig file (default: $KUBECONFIG or ~/.kube/config; for --env local, the local cluster's)",
    "context": "kubeconfig context (default: the current one)",
})
def breaker_resume(c, env, minutes=60, dry_run=False, kubeconfig="", context=""):
    """Let node health act although its circuit breaker is open, for --minutes (a person's decision).

    The breaker holds new remediation while taking another node out would put
    more than node_health_max_unhealthy_share of the GPU fleet out of service
    (see invoke status). It resumes by itself when the share falls; after
    checking that the faults are real (not an exporter rollout or Prometheus
    problem), this lifts the limit until the time it writes into ConfigMap
    <node_health_namespace>/gpufleet-node-health-breaker. Idempotent; 0
    minutes withdraws it. Example: invoke health.breaker-resume --env prod --minutes 30
    """
    from gpufleet.ops.exits import fail_on_ops_error
    from gpufleet_workshop.tasks.common import fail_on_inventory_error

    with fail_on_inventory_error(), fail_on_ops_error("health.breaker-resume"):
        resume_breaker(env, float(minutes), dry_run=dry_run, kubeconfig=kubeconfig or None, context=context or None)


ns.add_task(breaker_resume)
