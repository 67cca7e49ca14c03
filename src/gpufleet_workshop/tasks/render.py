"""``invoke render``: every object the stack declares for an environment, as YAML files; ``invoke config``:
one component's configuration file, for a run by hand (``gpufleet COMMAND --config FILE``)."""

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
    from gpufleet_admin.stack.render import check_out, render as render_stack, write

    if not out.strip():
        raise Exit(f"--out {out!r}: expected a folder", code=2)
    inv = _inventory(env, config_file)
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


def _inventory(env: str, config_file: str, *, say=print):
    """``env``'s inventory with the stack config's ``gpufleet:*`` values over it, as ``pulumi up`` loads it.

    Raises:
        invoke.exceptions.Exit: (2) the stack config file is missing or bad, or the inventory is invalid.
    """
    from gpufleet.paths import REPO_ROOT
    from gpufleet_admin.stack.program import file_config
    from roles.registry import load

    path = Path(config_file) if config_file else REPO_ROOT / f"Pulumi.{env}.yaml"
    if config_file and not path.is_file():
        raise Exit(f"--config-file {config_file}: no such file", code=2)
    try:
        overrides, secrets = file_config(path)
    except ValueError as exc:
        raise Exit(str(exc), code=2) from None
    if overrides or secrets:
        say(f"stack config {config_file or path.name}: {', '.join(sorted(overrides)) or 'no plain values'}"
            + (f"; secrets not shown: {', '.join(secrets)}" if secrets else ""))
    with fail_on_inventory_error():
        return load(overrides.pop("inventory", None) or env, overrides=overrides, overrides_file=config_file or path.name)


@task(name="config", help={
    "env": "environment: a folder of inventories/ (local, staging, prod)",
    "component": "the gpufleet command: taint-controller, quota-sync, node-health, virtual-kubelet or goodput",
    "pool": "virtual-kubelet only: the pool (a name of virtual_kubelet_pools; default: the only one)",
    "config_file": "stack config whose gpufleet:* values override the inventory, as in `pulumi up` "
                   "(default: Pulumi.ENV.yaml of the checkout, when present)",
    "out": "file to write (default: print it)",
})
def config(c, env, component, pool="", config_file="", out=""):
    """Write COMPONENT's configuration file for ENV, as its role renders it into the component's ConfigMap.

    The inventory with stack config over it, built into the component's
    configuration (the role's builder, roles/<role>/config.py), written as
    the file the component reads: run the component by hand against a
    cluster with it, e.g.
    invoke config --env local --component taint-controller --out tc.yaml &&
    gpufleet taint-controller --config tc.yaml --no-leader-elect (flags given override the file).
    """
    from roles.registry import component as find

    try:
        comp = find(component)
    except KeyError as exc:
        raise Exit(f"--component {exc.args[0]}", code=2) from None
    quiet = (lambda _: None) if not out else print
    inv = _inventory(env, config_file, say=quiet)
    instances = comp.instances(inv)
    if pool and comp.command != "virtual-kubelet":
        raise Exit(f"--pool {pool!r}: only for --component virtual-kubelet", code=2)
    if comp.command == "virtual-kubelet":
        if not pool and len(instances) != 1:
            raise Exit(f"--pool: expected one of {', '.join(instances) or '(none: inventories/' + env + ' has no pools)'}",
                       code=2)
        pool = pool or instances[0]
        if pool not in instances:
            raise Exit(f"--pool {pool!r}: expected one of {', '.join(instances) or 'none'}", code=2)
    with fail_on_inventory_error():
        text = comp.dump(comp.build(inv, pool or instances[0]))
    if not out:
        print(text, end="")
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(f"wrote {out}: gpufleet {comp.command} --config {out}")
