"""``invoke render``: every object the stack declares for an environment, as YAML files."""

from __future__ import annotations

from pathlib import Path

from invoke import task
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table

from gpufleet_workshop.tasks.common import fail_on_inventory_error


@task(help={"env": "environment: a folder of inventories/ (local, staging, prod)",
            "config_file": "stack config whose gpufleet:* values override the inventory, as in `pulumi up` "
                           "(default: Pulumi.ENV.yaml of the checkout, when present)",
            "out": "output folder; one YAML file per object, helm/ for Helm releases; files an earlier "
                   "render wrote there that the stack no longer declares are removed, others are kept"})
def render(c, env, out, config_file=""):
    """Write every Kubernetes object the Pulumi stack declares for ENV into OUT.

    Runs the real stack program under Pulumi's mock runtime (no engine, no
    cluster). Helm releases are written with their chart, version and values;
    the objects inside the charts are not shown (they come from the chart at
    install time).
    """
    from gpufleet.paths import REPO_ROOT
    from gpufleet_admin.stack.program import file_config
    from gpufleet_admin.stack.render import check_out, render as render_stack, write
    from roles.registry import load

    if not out.strip():
        raise Exit(f"--out {out!r}: expected a folder", code=2)
    path = Path(config_file) if config_file else REPO_ROOT / f"Pulumi.{env}.yaml"
    if config_file and not path.is_file():
        raise Exit(f"--config-file {config_file}: no such file", code=2)
    try:
        overrides, secrets = file_config(path)
    except ValueError as exc:
        raise Exit(str(exc), code=2) from None
    if overrides or secrets:
        print(f"stack config {config_file or path.name}: {', '.join(sorted(overrides)) or 'no plain values'}"
              + (f"; secrets not shown: {', '.join(secrets)}" if secrets else ""))
    with fail_on_inventory_error():
        inv = load(overrides.pop("inventory", None) or env, overrides=overrides, overrides_file=config_file or path.name)
    try:
        check_out(Path(out))  # before the mock runtime starts: nothing to render for
    except NotADirectoryError as exc:
        raise Exit(str(exc), code=2) from None
    rendered = render_stack(inv)
    paths = write(rendered, Path(out))
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
