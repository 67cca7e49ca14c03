"""invoke tasks for nodes: ``node.swap`` and ``node.return``.

Each task parses its flags and calls a plain function of this module
(:func:`swap_node`, :func:`return_node`), which calls :mod:`gpufleet.ops.swap`.
Exit codes: 0 done, or nothing to do (a swap of a node already out and
drained, a return of a node not out: both tasks are idempotent); 1 the
operation cannot proceed (a lemon, pods left on the node after the drain
timeout, conflicts, a return whose node checks failed); 2 bad input, refused before anything is written (NODE
not a DNS subdomain; unknown node, with near matches; empty reason;
--namespace not a DNS label, or naming a namespace that does not exist:
only the default gpufleet-system is created on demand; bad kubeconfig).
"""

from __future__ import annotations

import sys

from invoke import Collection, Context, task
from invoke.exceptions import Exit
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufleet.ops.exits import fail_on_ops_error
from gpufleet.ops.nodechecks import RETURN_CHECKS_TIMEOUT_SECONDS
from gpufleet.names import SYSTEM_NAMESPACE

_KUBE_HELP = {
    "kubeconfig": "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)",
    "context": "kubeconfig context (default: the current one)",
    "namespace": f"namespace of swap-request ConfigMaps (node_health_namespace; default {SYSTEM_NAMESPACE}, "
                 "created on demand; any other must exist)",
}


def _diff_table(title: str, plan) -> Table:
    """A plan's changes as a table."""
    t = Table(title=title)
    for col in ("field", "now", "after"):
        t.add_column(col)
    for ch in plan.changes:
        t.add_row(ch.what, ch.before, ch.after)
    if not plan.changes:
        t.add_row("(no change)", "", "")
    return t


def _pods_table(title: str, drain) -> Table:
    """A drain's pods (evicted, blocked, skipped) as a table."""
    t = Table(title=title)
    for col in ("pod", "outcome", "why"):
        t.add_column(col)
    for p in drain.evicted:
        t.add_row(str(p), "would be evicted" if drain.dry_run else "evicted", "")
    for p, why in drain.blocked.items():
        t.add_row(str(p), "[red]blocked, never as configured[/red]" if p in drain.permanent else "[red]blocked[/red]", why)
    for p, why in drain.skipped.items():
        t.add_row(str(p), "skipped", why)
    if not (drain.evicted or drain.blocked or drain.skipped):
        t.add_row("(no pods on the node)", "", "")
    return t


def _confirm(question: str) -> bool:
    """Ask on the terminal; refuse (exit 2) when stdin is not one."""
    if not sys.stdin.isatty():
        raise Exit("refusing to act without confirmation: pass --yes (stdin is not a terminal)", code=2)
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def swap_node(node: str, reason: str, *, dry_run: bool = False, yes: bool = False, timeout: float = 600.0,
              force: bool = False, namespace: str = SYSTEM_NAMESPACE, kubeconfig: str | None = None,
              context: str | None = None, console: Console | None = None):
    """Show the swap's diff and eviction check; unless dry run, confirm, then swap with a progress bar.

    Returns:
        The :class:`gpufleet.ops.swap.SwapResult` (the dry-run one when ``dry_run`` or not confirmed).

    Raises:
        gpufleet.ops.reads.OpsError (and subclasses): see :func:`gpufleet.ops.swap.swap`.
    """
    from gpufleet.ops import swap as swapper
    from gpufleet.ops.reads import InputError
    from gpufleet_workshop.tasks.common import kube_for

    console = console or Console()
    if timeout <= 0:
        raise InputError(f"--timeout {timeout:g}: expected seconds > 0")
    if not reason.strip():
        raise InputError("--reason is empty: say why the node goes out (it is recorded for the replacement)")
    kube = kube_for(None, kubeconfig, context)
    try:
        check = swapper.swap(kube, node, reason, dry_run=True, force=force, namespace=namespace, timeout=timeout)
        verb = "resume swap of" if check.plan.resume else "swap"
        console.print(_diff_table(f"node.swap {node}: node changes", check.plan))
        console.print(_pods_table(f"drain check (Eviction API, dryRun=All): {len(check.drain.evicted)} evictable now, "
                                  f"{len(check.drain.blocked)} blocked", check.drain))
        console.print(f"swap request: {check.request} (ConfigMap, label gpufleet.io/swap-request=true)")
        if check.drain.permanent:
            console.print(f"[bold red]{len(check.drain.permanent)} pods can never be evicted as configured[/bold red] "
                          "(listed above): the drain will end with them still on the node unless their budgets change")
        if dry_run:
            console.print("[bold]dry run: nothing changed[/bold]")
            return check
        if not yes and not _confirm(f"{verb} {node}?"):
            console.print("not confirmed: nothing changed")
            return check
        with Progress(TextColumn("[bold]draining {task.fields[node]}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[blocked]}"), TimeElapsedColumn(), console=console) as bar:
            tid = bar.add_task("drain", total=len(check.drain.evicted) + len(check.drain.blocked), node=node, blocked="")

            def progress(p) -> None:
                left = f"{len(p.blocked)} waiting (PDB or API)" if p.blocked else ""
                bar.update(tid, total=p.total, completed=p.done, blocked=left)

            result = swapper.swap(kube, node, reason, timeout=timeout, force=force, namespace=namespace, progress=progress)
    finally:
        kube.close()
    d = result.drain
    console.print(_pods_table(f"drain of {node}: {len(d.evicted)} evicted in {d.seconds:.1f}s, "
                              f"{len(d.blocked)} left", d))
    console.print(f"{node}: out for swap; replacement requested in {result.request} (state {result.state})")
    return result


def return_node(node: str, *, dry_run: bool = False, clear_lemon: bool = False, namespace: str = SYSTEM_NAMESPACE,
                skip_checks: bool = False, env: str | None = None, checks_inventory: str | None = None,
                checks_args: str = "", checks_timeout: float = RETURN_CHECKS_TIMEOUT_SECONDS,
                kubeconfig: str | None = None, context: str | None = None, console: Console | None = None):
    """Show the return's diff and, unless dry run, run the node checks on the node and return it to service.

    The checks are ``tests/nodes`` on host ``node`` of ``checks_inventory``
    (default ``inventories/<env>/hosts.yml``), :class:`gpufleet.ops.nodechecks.NodeChecks`;
    ``skip_checks`` returns the node without them, with a warning.

    Returns:
        The :class:`gpufleet.ops.swap.ReturnResult`.

    Raises:
        gpufleet.ops.reads.InputError: no inventory for the checks, bad ``checks_args``.
        gpufleet.ops.reads.NodeNotFound, gpufleet.ops.swap.NotOut, gpufleet.ops.swap.LemonNode.
        gpufleet.ops.nodechecks.ChecksFailed: the node checks failed (the failed test ids) or could not run.
    """
    from gpufleet.ops import swap as swapper
    from gpufleet.ops.reads import InputError
    from gpufleet.ops.nodechecks import NodeChecks
    from gpufleet_workshop.tasks.common import kube_for

    console = console or Console()
    if not (skip_checks or env or checks_inventory):
        raise InputError("--env is needed: the node checks run with inventories/ENV/hosts.yml before the node returns "
                         "(or pass --inventory FILE, or --skip-checks to return it unchecked)")
    checks = None if skip_checks else NodeChecks.for_env(env or "", checks_inventory, checks_args, checks_timeout)
    kube = kube_for(env, kubeconfig, context)
    try:
        result = swapper.return_node(kube, node, checks=checks, clear_lemon=clear_lemon, dry_run=dry_run,
                                     namespace=namespace, on_checks=lambda command: console.print(
                                         f"running the node checks on {node}: {command}", markup=False, highlight=False))
    finally:
        kube.close()
    console.print(_diff_table(f"node.return {node}" + (" (dry run: nothing changed)" if dry_run else ""), result.plan))
    for note in result.notes:
        console.print(f"[bold yellow]{note}[/bold yellow]" if note.startswith("warning:") else note, highlight=False)
    if not dry_run:
        console.print(f"{node}: back in service")
    return result


@task(help={
    "node": "node name (kubectl get nodes)",
    "reason": "why it goes out (free text; recorded in the taint, the node and the swap request)",
    "dry_run": "show the node diff and check each eviction with dryRun=All; change nothing",
    "yes": "do not ask for confirmation",
    "timeout": "seconds the drain may take before the pods left are reported (default 600)",
    "force": "also evict pods no controller owns (they are not recreated)",
    **_KUBE_HELP,
})
def swap(c: Context, node: str, reason: str = "", dry_run: bool = False, yes: bool = False, timeout: int = 600,
         force: bool = False, namespace: str = SYSTEM_NAMESPACE, kubeconfig: str = "", context: str = "") -> None:
    """Take NODE out for replacement: cordon, taint gpufleet.io/swap, drain through the Eviction API, request a replacement.

    PodDisruptionBudgets are respected (blocked evictions are retried until
    --timeout); pods that cannot leave are listed, never deleted. Labels the
    node gpufleet.io/replacement-requested=true and records the request as
    ConfigMap <namespace>/swap-<node> for the provider integration.
    Idempotent: re-running resumes an unfinished swap. Example:
    invoke node.swap gpu-rack-a-0003 --reason "GPU 5 at 84 C" --yes
    """
    from gpufleet.ops.swap import AlreadyOut

    with fail_on_ops_error("node.swap"):
        try:
            result = swap_node(node, reason, dry_run=dry_run, yes=yes, timeout=timeout, force=force,
                               namespace=namespace, kubeconfig=kubeconfig or None, context=context or None)
        except AlreadyOut as exc:
            print(f"node.swap: {exc}")
            return
    if not result.dry_run and result.drain is not None and not result.drain.complete:
        raise Exit(f"node.swap: {node} is out, but {len(result.drain.blocked)} pods are still on it (listed above); "
                   f"re-run to retry them", code=1)


@task(name="return", help={
    "node": "node name",
    "dry_run": "show the diff and the node checks that would run; change nothing",
    "clear_lemon": "also return a lemon node (a person's decision, after its hardware was replaced or checked)",
    "skip_checks": "return the node without running the node checks (tests/nodes) on it first (a warning says so)",
    "env": "environment whose inventory the node checks connect with: inventories/ENV/hosts.yml (needed unless "
           "--inventory or --skip-checks; --env local also picks the local cluster's kubeconfig)",
    "inventory": "Ansible inventory the node checks use instead of inventories/ENV/hosts.yml (e.g. one listing "
                 "fixture nodes for simulated ones)",
    **_KUBE_HELP,
})
def return_(c: Context, node: str, dry_run: bool = False, clear_lemon: bool = False, namespace: str = SYSTEM_NAMESPACE,
            kubeconfig: str = "", context: str = "", skip_checks: bool = False, env: str = "", inventory: str = "") -> None:
    """Run the node checks on NODE, then bring it back into service: remove the swap/degraded taints and the replacement label, uncordon.

    The node checks (tests/nodes, pytest-testinfra) run first on NODE alone
    (--connection=ansible --ansible-inventory=inventories/ENV/hosts.yml
    --hosts=NODE); any failure refuses the return (exit 1) naming the failed
    test ids, and nothing changes. --skip-checks returns it without them,
    with a warning. Uncordons only if the swap cordoned it; marks the swap request
    <namespace>/swap-<node> returned (kept as a record). Lemon nodes need
    --clear-lemon. --namespace must exist. Rule: the node is returned
    whatever the namespace holds (a node out for swap without a request
    there is returned with a note saying so, naming open requests found in
    other namespaces); a request there that is not yet returned is marked
    returned, also when the node is already back (so re-running with the
    right namespace completes an earlier return). Nothing to do: exit 0.
    Example: invoke node.return gpu-rack-a-0003 --env prod
    """
    from gpufleet.ops.swap import NotOut

    with fail_on_ops_error("node.return"):
        try:
            return_node(node, dry_run=dry_run, clear_lemon=clear_lemon, namespace=namespace, skip_checks=skip_checks,
                        env=env or None, checks_inventory=inventory or None, kubeconfig=kubeconfig or None, context=context or None)
        except NotOut as exc:
            print(f"node.return: {exc}")


#: The ``node`` collection; tasks.py adds it with ``ns.add_collection(node)``.
node = Collection("node", swap, return_)
