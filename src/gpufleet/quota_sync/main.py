"""``gpufleet quota-sync``: ClusterQueue quota follows the real capacity, continuously (kueue role's Deployment).

Watches Nodes and resyncs on capacity changes (debounced) and every
``resync_seconds``, while holding Lease ``<namespace>/gpufleet-quota-sync``
(:mod:`gpufleet.quota_sync.controller`). Settings come from ``--config FILE``
(:mod:`gpufleet.quota_sync.config`, rendered by the kueue role from the
inventory and stack config: queues, shares, pins, flavors, reserve); without
it, the defaults. A flag given overrides the file. Nothing else of the
inventory is read. Serves ``/metrics`` (``gpufleet_quota_*``) and
``/healthz`` on ``--metrics-port`` (``--port``: deprecated alias). Exit
codes: 0 on SIGTERM, 1 leadership lost or the port in use, 2 bad input (a
bad file or flag value; argparse refuses out-of-range flag values before
anything runs).
"""

from __future__ import annotations

import argparse
import sys
import threading

from gpufleet import componentconfig as cc
from gpufleet.controllers import flags, runtime
from gpufleet.controllers.serve import Liveness
from gpufleet.quota_sync.config import DEFAULTS, FILE, Configuration

LEASE_NAME = "gpufleet-quota-sync"

#: Flags that set a field of the configuration: flag -> (argparse dest, field).
FIELD_FLAGS: dict[str, tuple[str, str]] = {
    "--namespace": ("namespace", "namespace"),
    "--debounce": ("debounce", "debounce_seconds"),
    "--resync": ("resync", "resync_seconds"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``quota-sync`` subcommand's flags: ``--config``, the process's, and the loop's settings by hand."""
    flags.add_config(parser, role="kueue", command="quota-sync")
    parser.add_argument("--fleet-nodes", action=flags.NoLongerUsed, metavar="N",
                        note="quota follows the nodes the cluster has; the flavors come from --config FILE",
                        help="deprecated, has no effect (the inventory's simulated fleet is no longer read here)")
    flags.add_kube(parser)
    parser.add_argument("--namespace", help=f"Lease namespace (default: the file's namespace, {DEFAULTS.namespace})")
    parser.add_argument("--debounce", type=cc.flag_type(Configuration, "debounce_seconds"), default=None,
                        help="seconds (>= 0) to wait after a node event before resyncing "
                             f"(default {DEFAULTS.debounce_seconds:g})")
    parser.add_argument("--resync", type=cc.flag_type(Configuration, "resync_seconds"), default=None,
                        help=f"seconds (> 0) between resyncs without node events (default {DEFAULTS.resync_seconds:g})")
    flags.add_metrics_port(parser, port_alias=True)
    flags.add_leader_election(parser)
    flags.add_log_level(parser)


def configuration(args: argparse.Namespace) -> Configuration:
    """The configuration: ``--config FILE`` (else the defaults) with the flags given applied over it.

    Raises:
        gpufleet.componentconfig.ConfigFileError: a bad file, or a flag that breaks a check (names the flag).
    """
    return FILE.with_flags(args, FIELD_FLAGS, DEFAULTS)


def run(args: argparse.Namespace) -> int:
    """Run the controller (module docstring)."""
    from gpufleet.kube import ConfigError
    from gpufleet.quota_sync.controller import QuotaSync

    runtime.setup_logging(args.log_level)
    try:
        config = configuration(args)
        timings = flags.timings(args)
        kube = runtime.kube_from_args(args, user_agent="gpufleet-quota-sync")
    except (cc.ConfigFileError, ConfigError, ValueError) as exc:
        print(f"gpufleet quota-sync: {exc}", file=sys.stderr)
        return 2
    if runtime.port_in_use("quota-sync", args.metrics_port):
        return 1
    sync = QuotaSync(kube, config)
    liveness = Liveness(max_age=120.0)

    def loop(stop: threading.Event) -> None:
        sync.run(stop, on_beat=liveness.beat)

    return runtime.run("quota-sync", loop, metrics_port=args.metrics_port, liveness=liveness, registry=sync.registry,
                       kube=kube, lease=(LEASE_NAME, config.namespace) if args.leader_elect else None, timings=timings)
