"""One job's account for people: a rich table and a PNG timeline of its phases and interruptions."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from gpufleet.goodput import BUCKETS
from gpufleet.goodput.account import PRODUCTIVE, Account

#: Colours of the timeline, by state.
COLOURS = {PRODUCTIVE: "tab:green", "queued": "tab:gray", "starting": "tab:blue", "checkpoint_saving": "tab:olive",
           "progress_lost": "tab:red", "waiting_for_hardware": "tab:orange", "other": "tab:purple"}


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def table(a: Account):
    """A rich Table: window, ETTR, productive time and each bucket (time and share), interruptions."""
    from rich.table import Table

    wall = a.wall_seconds or 1.0
    state = "finished" if a.finished else "running"
    t = Table(title=f"{a.kind} {a.namespace}/{a.job}: {_when(a.start)} to {_when(a.end)} ({state})")
    t.add_column("")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    t.add_row("ETTR", "", f"{a.ettr:.1%}", style="bold")
    t.add_row("wall clock", _duration(a.wall_seconds), "100%")
    t.add_row(PRODUCTIVE, _duration(a.productive_seconds), f"{a.productive_seconds / wall:.1%}", style="green")
    for bucket in BUCKETS:
        t.add_row(bucket, _duration(a.badput[bucket]), f"{a.badput[bucket] / wall:.1%}")
    rate = f", {a.step_rate:.3g} steps/s" if a.step_rate else ""
    known = f"{a.checkpoints} checkpoints{rate}" if a.checkpoints_known else "checkpoints not readable (nothing counted lost)"
    t.add_row("checkpoints", known, "")
    if a.checkpoints_not_counted:
        t.add_row("not the job's", f"{a.checkpoints_not_counted} checkpoints",
                  "copied in, another job's, or while queued")
    if a.clock_offset_source != "none":
        t.add_row("checkpoint clock", f"{a.clock_offset:+.1f} s", f"{a.clock_offset_source}, against the API server's")
    if a.reconstructed_runs:
        t.add_row("rebuilt runs", f"{a.reconstructed_runs}", "from checkpoints: their pods are gone")
    for i, x in enumerate(a.interruptions, 1):
        resumed = f"running again after {_duration(x.resumed - x.time)}" if x.resumed else "not running again yet"
        t.add_row(f"interruption {i}", f"{_when(x.time)}", f"lost {_duration(x.lost_seconds)}; {resumed}")
    return t


def plot_timeline(a: Account, path: Path) -> Path:
    """Write ``path``: the job's phases as coloured bars over minutes since submission, interruptions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    scale = 3600.0 if a.wall_seconds > 6 * 3600 else 60.0
    unit = "hours" if scale == 3600.0 else "minutes"
    fig, ax = plt.subplots(figsize=(11, 3.2), dpi=120)
    for state in (PRODUCTIVE, *BUCKETS):
        bars = [((p.start - a.start) / scale, (p.end - p.start) / scale) for p in a.phases if p.state == state]
        if bars:
            ax.broken_barh(bars, (0.2, 0.6), facecolors=COLOURS[state])
    for x in a.interruptions:
        ax.axvline((x.time - a.start) / scale, color="black", linestyle="--", linewidth=1)
        ax.annotate(f"-{_duration(x.lost_seconds)}", ((x.time - a.start) / scale, 0.9), fontsize=8, ha="right")
    ax.set_ylim(0, 1.1)
    ax.set_yticks([])
    ax.set_xlim(0, max(a.wall_seconds / scale, 1e-9))
    ax.set_xlabel(f"{unit} since submission ({_when(a.start)})")
    ax.set_title(f"{a.namespace}/{a.job}: ETTR {a.ettr:.1%} over {_duration(a.wall_seconds)}, "
                 f"{len(a.interruptions)} interruptions (dashed)")
    present = {p.state for p in a.phases}
    ax.legend(handles=[Patch(color=COLOURS[s], label=s) for s in (PRODUCTIVE, *BUCKETS) if s in present],
              loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=7, fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
