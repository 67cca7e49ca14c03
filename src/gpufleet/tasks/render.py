"""``invoke render``: every object the stack declares for an environment, as YAML files."""

from __future__ import annotations

from pathlib import Path

from invoke import task
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table

from gpufleet.tasks.common import fail_on_inventory_error


@task(help={"env": "environment: a folder of inventories/ (local, staging, prod)",
            "out": "output folder; one YAML file per object, helm/ for Helm releases; files an earlier "
                   "render wrote there that the stack no longer declares are removed, others are kept"})
def render(c, env, out):
    """Write every Kubernetes object the Pulumi stack declares for ENV into OUT.

    Runs the real stack program under Pulumi's mock runtime (no engine, no
    cluster). Helm releases are written with their chart, version and values;
    the objects inside the charts are not shown (they come from the chart at
    install time).
    """
    from gpufleet.inventory import load
    from gpufleet.stack.render import render as render_stack, write

    with fail_on_inventory_error():
        inv = load(env)
    rendered = render_stack(inv)
    try:
        paths = write(rendered, Path(out))
    except NotADirectoryError as exc:
        raise Exit(str(exc), code=2) from None
    table = Table(title=f"{env}: {len(rendered.objects)} objects, {len(rendered.releases)} Helm releases")
    table.add_column("kind")
    table.add_column("count", justify="right")
    counts: dict[str, int] = {}
    for o in rendered.objects:
        counts[o["kind"]] = counts.get(o["kind"], 0) + 1
    for kind, n in sorted(counts.items()):
        table.add_row(kind, str(n))
    Console().print(table)
    print(f"wrote {len(paths)} files to {out}")
