"""``gpufleet quota-sync``: ClusterQueue quota follows the real capacity, continuously (kueue role's Deployment).

Watches Nodes and resyncs on capacity changes (debounced) and every
``--resync`` seconds, while holding Lease
``<kueue_quota_sync_namespace>/gpufleet-quota-sync``
(:mod:`gpufleet.quota_sync.controller`). Serves ``/metrics``
(``gpufleet_quota_*``) and ``/healthz`` on ``--metrics-port`` (``--port``:
deprecated alias). Exit codes: 0 on SIGTERM, 1 leadership lost or the port
in use, 2 bad input (argparse refuses out-of-range flag values before
anything runs).
"""

from __future__ import annotations

import argparse
import sys
import threading

from gpufleet import cliargs
from gpufleet.controllers import flags, runtime
from gpufleet.controllers.serve import Liveness

LEASE_NAME = "gpufleet-quota-sync"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``quota-sync`` subcommand's flags."""
    from gpufleet.quota_sync.controller import DEBOUNCE_SECONDS, RESYNC_SECONDS

    parser.add_argument("--env", required=True, help="inventory environment (folder of inventories/)")
    parser.add_argument("--fleet-nodes", type=cliargs.integer_type(0), default=0,
                        help="simulated fleets only: nodes in the fleet, >= 0 (default 0: the inventory's fleet_simulated_nodes)")
    flags.add_kube(parser)
    parser.add_argument("--namespace", help="Lease namespace (default: kueue_quota_sync_namespace)")
    parser.add_argument("--debounce", type=cliargs.nonnegative_seconds, default=DEBOUNCE_SECONDS,
                        help=f"seconds (>= 0) to wait after a node event before resyncing (default {DEBOUNCE_SECONDS:g})")
    parser.add_argument("--resync", type=cliargs.positive_seconds, default=RESYNC_SECONDS,
                        help=f"seconds (> 0) between resyncs without node events (default {RESYNC_SECONDS:g})")
    flags.add_metrics_port(parser, port_alias=True)
    flags.add_leader_election(parser)
    flags.add_log_level(parser)


def run(args: argparse.Namespace) -> int:
    """Run the controller (module docstring)."""
    from gpufleet_admin.inventory import InventoryError
    from gpufleet.kube import ConfigError
    from gpufleet.quota_sync.controller import QuotaSync
    from roles.registry import load

    runtime.setup_logging(args.log_level)
    try:
        inv = load(args.env, nodes=args.fleet_nodes or None)
        timings = flags.timings(args)
        kube = runtime.kube_from_args(args, user_agent="gpufleet-quota-sync")
    except (InventoryError, ConfigError, ValueError) as exc:
        print(f"gpufleet quota-sync: {exc}", file=sys.stderr)
        return 2
    if runtime.port_in_use("quota-sync", args.metrics_port):
        return 1
    sync = QuotaSync(kube, inv, debounce_seconds=args.debounce, resync_seconds=args.resync)
    liveness = Liveness(max_age=120.0)

    def loop(stop: threading.Event) -> None:
        sync.run(stop, on_beat=liveness.beat)

    namespace = args.namespace or inv.role("kueue").kueue_quota_sync_namespace
    return runtime.run("quota-sync", loop, metrics_port=args.metrics_port, liveness=liveness, registry=sync.registry,
                       kube=kube, lease=(LEASE_NAME, namespace) if args.leader_elect else None, timings=timings)
