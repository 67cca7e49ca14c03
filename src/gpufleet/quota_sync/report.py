"""Rich rendering of a resync plan: capacity, the quota diff, drift and gangs that cannot fit."""

from __future__ import annotations

from decimal import Decimal

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpufleet.quota_sync.resync import ApplyResult, ResyncPlan


def _fmt(resource: str, value: Decimal | int | None) -> str:
    """A quota value for the table: memory in GiB, others as integers, ``-`` for none."""
    if value is None:
        return "-"
    if resource == "memory":
        return f"{Decimal(value) / 2**30:,.0f}Gi"
    return f"{int(value):,}"


def _with_unmanaged(resource: str, schedulable: int, unmanaged: Decimal | int) -> str:
    """``schedulable`` and, when some, what unmanaged pods (DaemonSets, system pods) request: ``1,780 (-12)``."""
    shown = _fmt(resource, schedulable)
    if unmanaged:
        shown += f" (-{_fmt(resource, unmanaged) if resource == 'memory' else f'{Decimal(unmanaged):,.1f}'} unmanaged)"
    return shown


def render(plan: ResyncPlan, applied: ApplyResult | None = None) -> Group:
    """Capacity per flavor, the diff (nominalQuota before -> after), drift, gangs, missing objects."""
    cap = Table(title=f"schedulable capacity — env {plan.env} (reserve {plan.reserve} GPUs per flavor)")
    for col, j in (("flavor", "left"), ("nodes", "right"), ("schedulable", "right"), ("GPUs", "right"),
                   ("schedulable GPUs", "right"), ("schedulable cores", "right"), ("schedulable memory", "right"),
                   ("out (why)", "left")):
        cap.add_column(col, justify=j)
    for f, c in plan.capacity.items():
        reasons: dict[str, int] = {}
        for rs in c.out.values():
            for r in rs:
                reasons[r] = reasons.get(r, 0) + 1
        why = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])) or "-"
        style = "red" if f in plan.zero_flavors else None
        cap.add_row(Text(f, style=style), str(c.nodes), str(c.schedulable_nodes), str(c.gpus),
                    Text(str(c.schedulable_gpus), style=style), _with_unmanaged("cpu", c.schedulable_cpu, c.unmanaged_cpu),
                    _with_unmanaged("memory", c.schedulable_memory_bytes, c.unmanaged_memory_bytes), why)
    diff = Table(title="nominalQuota diff" + (" (applied)" if applied and applied.patched else
                                               "" if applied else " (not applied: pass --apply)"))
    for col, j in (("ClusterQueue", "left"), ("flavor", "left"), ("resource", "left"), ("now", "right"),
                   ("after", "right"), ("change", "right")):
        diff.add_column(col, justify=j)
    for c in plan.changes:
        delta = None if c.before is None else Decimal(c.after) - c.before
        style = "red" if delta is not None and delta < 0 else "green"
        change = Text(("+" if delta and delta > 0 else "") + _fmt(c.resource, delta) if delta is not None else "new", style=style)
        diff.add_row(c.cluster_queue, c.flavor, c.resource, _fmt(c.resource, c.before), _fmt(c.resource, c.after), change)
    if not plan.changes:
        diff.add_row("(in sync: nothing to change)", "", "", "", "", "")
    parts: list = [cap, diff]
    if plan.drift:
        t = Table(title="admitted above the new quota (nothing is evicted; metric gpufleet_quota_drift_gpus)")
        for col in ("ClusterQueue", "flavor", "admitted GPUs", "new quota", "over", "workloads"):
            t.add_column(col)
        for d in plan.drift:
            t.add_row(d.cluster_queue, d.flavor, str(d.reserved), str(d.nominal), Text(str(d.gpus), style="yellow"),
                      ", ".join(d.workloads) or "-")
        parts.append(t)
    if plan.cannot_fit:
        t = Table(title="pending gangs that can no longer fit (they stay pending until capacity returns)")
        for col in ("workload", "ClusterQueue", "GPUs wanted", "most the queue can get"):
            t.add_column(col)
        for g in plan.cannot_fit:
            t.add_row(g.workload, g.cluster_queue, str(g.gpus), Text(str(g.max_gpus), style="yellow"))
        parts.append(t)
    notes = []
    if plan.missing_queues:
        notes.append(f"ClusterQueues of the inventory missing in the cluster: {', '.join(plan.missing_queues)} (pulumi up)")
    for q, fs in plan.missing_flavors.items():
        notes.append(f"ClusterQueue {q} has no quota entry for flavor(s) {', '.join(fs)}: not added (pulumi up)")
    if plan.zero_flavors:
        notes.append(f"zero schedulable capacity: {', '.join(plan.zero_flavors)}")
    if applied is not None:
        notes.append(f"patched {len(applied.patched)} ClusterQueues ({', '.join(applied.patched) or 'none'}) in "
                     f"{applied.seconds:.2f}s, {applied.conflicts} conflicts retried")
    notes.append(f"computed in {plan.seconds * 1000:.0f} ms")
    parts.append(Text("\n".join(notes)))
    return Group(*parts)
