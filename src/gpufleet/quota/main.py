"""``gpufleet quota-sync``: ClusterQueue quota follows the real capacity, continuously (kueue role's Deployment).

Watches Nodes and resyncs on capacity changes (debounced) and every
``--resync`` seconds, while holding Lease
``<kueue_quota_sync_namespace>/gpufleet-quota-sync``
(:mod:`gpufleet.quota.controller`). Serves ``/metrics``
(``gpufleet_quota_*``) and ``/healthz`` on ``--port``. Exit codes: 0 on
SIGTERM, 1 leadership lost or ``--port`` in use, 2 bad input (argparse
refuses out-of-range flag values before anything runs).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading

from gpufleet import cliargs
from gpufleet.controllers.serve import Liveness


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``quota-sync`` subcommand's flags."""
    from gpufleet.quota.controller import DEBOUNCE_SECONDS, RESYNC_SECONDS

    parser.add_argument("--env", required=True, help="inventory environment (folder of inventories/)")
    parser.add_argument("--fleet-nodes", type=cliargs.integer_type(0), default=0,
                        help="simulated fleets only: nodes in the fleet, >= 0 (default 0: the inventory's fleet_simulated_nodes)")
    parser.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, else $KUBECONFIG)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--namespace", help="Lease namespace (default: kueue_quota_sync_namespace)")
    parser.add_argument("--debounce", type=cliargs.nonnegative_seconds, default=DEBOUNCE_SECONDS,
                        help=f"seconds (>= 0) to wait after a node event before resyncing (default {DEBOUNCE_SECONDS:g})")
    parser.add_argument("--resync", type=cliargs.positive_seconds, default=RESYNC_SECONDS,
                        help=f"seconds (> 0) between resyncs without node events (default {RESYNC_SECONDS:g})")
    parser.add_argument("--port", type=cliargs.port_or_off, default=8080,
                        help="port of /metrics and /healthz, 0 to 65535, 0 for none (default 8080)")
    parser.add_argument("--no-leader-election", action="store_true", help="run without the Lease (a single instance)")
    cliargs.add_log_level(parser)


def run(args: argparse.Namespace) -> int:
    """Run the controller (module docstring)."""
    from gpufleet.inventory import InventoryError, load
    from gpufleet.ops.kube import OpsError, api_client
    from gpufleet.ops.runtime import run_controller
    from gpufleet.quota.controller import QuotaSync

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        inv = load(args.env, nodes=args.fleet_nodes or None)
        api = api_client(args.kubeconfig, args.context)
    except (InventoryError, OpsError) as exc:
        print(f"gpufleet quota-sync: {exc}", file=sys.stderr)
        return 2
    busy = cliargs.listen_error(args.port)
    if busy:
        print(f"gpufleet quota-sync: --port: {busy}", file=sys.stderr)
        return 1
    sync = QuotaSync(api, inv, debounce_seconds=args.debounce, resync_seconds=args.resync)
    liveness = Liveness(max_age=120.0)

    def loop(stop: threading.Event) -> None:
        sync.run(stop, on_beat=liveness.beat)

    return run_controller("gpufleet-quota-sync", args.namespace or inv.role("kueue").kueue_quota_sync_namespace, loop,
                          port=args.port, liveness=liveness, registry=sync.registry,
                          leader_election=not args.no_leader_election, kubeconfig=args.kubeconfig, context=args.context)
