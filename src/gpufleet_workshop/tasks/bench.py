"""``invoke bench``: run the benchmark scripts under ``bench/`` and print their figures.

Targets (speed, memory) are measured here, never by timed assertions in
tests. Each script takes its own flags (``python bench/<name>.py --help``);
this task runs them with their defaults, one after the other.
"""

from __future__ import annotations

import subprocess
import sys
import time

from invoke import Context, task
from invoke.exceptions import Exit
from rich.console import Console

from gpufleet.paths import REPO_ROOT

BENCH = REPO_ROOT / "bench"


def scripts() -> list[str]:
    """Names of the benchmark scripts (``bench/<name>.py``)."""
    return sorted(p.stem for p in BENCH.glob("*.py"))


@task(help={"only": "comma-separated script names (default: all): " + ", ".join(scripts())})
def bench(c: Context, only: str = "") -> None:
    """Run the benchmarks in bench/ and print their figures (exit 1 if one fails)."""
    names = [n.strip() for n in only.split(",") if n.strip()] or scripts()
    unknown = sorted(set(names) - set(scripts()))
    if unknown:
        raise Exit(f"--only {','.join(unknown)}: no such benchmark; expected one of {', '.join(scripts())}", code=2)
    console = Console(highlight=False)
    failed = []
    for name in names:
        console.rule(f"bench/{name}.py")
        start = time.monotonic()
        rc = subprocess.run([sys.executable, str(BENCH / f"{name}.py")], cwd=REPO_ROOT).returncode
        console.print(f"bench/{name}.py: exit {rc} in {time.monotonic() - start:.0f} s")
        if rc:
            failed.append(name)
    if failed:
        raise Exit(f"benchmarks failed: {', '.join(failed)}", code=1)
