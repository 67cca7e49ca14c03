"""``gpufleet``: the command-line entry point, a thin dispatcher to per-command modules.

Each command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Only the chosen command's module is imported, so a
command's heavy dependencies (the Kubernetes client, NVML) never slow the
others down. To add a command, add one line to :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: command name -> (module with add_arguments/run, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "exporter": ("gpufleet.exporter.main", "serve InfiniBand/NVLink/GPU health metrics for Prometheus"),
    "quota-sync": ("gpufleet.quota_sync.main", "keep ClusterQueue nominalQuota equal to the real schedulable capacity"),
    "node-health": ("gpufleet.node_health.main", "remediation: pull hot or broken nodes (swap, degraded tier, lemons)"),
    "taint-controller": ("gpufleet.taint_controller.main", "taint virtual nodes while the cluster has free GPUs; flip-out and flip-back"),
    "virtual-kubelet": ("gpufleet.virtual_kubelet.main", "run one virtual node for an external capacity pool (--pool NAME)"),
    "goodput": ("gpufleet.goodput.main", "account every training job's ETTR and lost time by cause, as Prometheus metrics"),
}
#: Commands that moved out of gpufleet: name -> what to run instead (printed, exit 2).
MOVED: dict[str, str] = {
    "inference-standin": "the inference stand-in is a test workload of gpufleet's workshop: run `gpufleet-standin` "
                         "(gpufleet_workshop.inference_standin; in the gpufleet-workshop image)",
}


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The ``gpufleet`` parser; only ``selected``'s module is imported to add its flags."""
    parser = argparse.ArgumentParser(prog="gpufleet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), None)
    if selected in MOVED:
        print(f"gpufleet {selected}: deprecated and removed from gpufleet: {MOVED[selected]}", file=sys.stderr)
        return 2
    args = build_parser(selected if selected in COMMANDS else None).parse_args(argv)
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
