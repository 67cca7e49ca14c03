"""``gpufleet node-health``: the remediation controller (Deployment of the node_health role).

Every ``--interval`` seconds, while holding Lease
``<node_health_namespace>/gpufleet-node-health``: evaluate the exporter's
series in Prometheus and act (:mod:`gpufleet.node_health.remediate`). Serves
``/metrics`` (``gpufleet_node_health_*``) and ``/healthz`` on
``--metrics-port`` (``--port``: deprecated alias).
Settings come from the inventory (``--env``); flags override them.
``--once`` evaluates and acts once, waits for the drains, prints what it did
and exits (no Lease): the way to try it by hand, with ``--dry-run``.
Exit codes: 0 ok, 1 leadership lost, the metrics port in use or a failed
``--once``, 2 bad input (argparse refuses out-of-range flag values first).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading

from gpufleet import cliargs
from gpufleet.controllers import flags, runtime
from gpufleet.controllers.serve import Liveness

log = logging.getLogger("gpufleet.node-health")

LEASE_NAME = "gpufleet-node-health"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``node-health`` subcommand's flags."""
    parser.add_argument("--env", required=True, help="inventory environment (folder of inventories/)")
    parser.add_argument("--prometheus-url", type=cliargs.http_url,
                        help="Prometheus base URL, http(s)://host[:port] (default: node_health_prometheus_url)")
    parser.add_argument("--dry-run", action="store_true", default=None, help="decide and record Events, change no node")
    flags.add_kube(parser)
    parser.add_argument("--interval", type=cliargs.positive_seconds,
                        help="seconds (> 0) between evaluations (default 5)")
    flags.add_metrics_port(parser, port_alias=True)
    parser.add_argument("--namespace", help="swap requests and Lease namespace (default: node_health_namespace)")
    # Counts are checked like the inventory checks node_health_* (roles/node_health/vars.py).
    parser.add_argument("--max-nodes-out", type=cliargs.integer_type(0), help="override node_health_max_nodes_out (>= 0)")
    parser.add_argument("--max-unhealthy-share", type=cliargs.share,
                        help="override node_health_max_unhealthy_share: most of the GPU fleet out of service at once "
                             "before the circuit breaker holds actions (0..1)")
    parser.add_argument("--telemetry-stale", type=cliargs.positive_seconds, dest="telemetry_stale_seconds",
                        help="GPU telemetry older than this is stale, s > 0 (default: gpu_metrics_telemetry_stale_seconds)")
    parser.add_argument("--hot-samples", type=cliargs.integer_type(1), help="override node_health_hot_samples (>= 1)")
    parser.add_argument("--scrape-interval", type=cliargs.positive_seconds, dest="scrape_interval_seconds",
                        help="exporter scrape interval in seconds, > 0 (default: gpu_metrics_scrape_interval_seconds)")
    parser.add_argument("--error-window", type=cliargs.positive_seconds, dest="error_window_seconds",
                        help="NVLink/IB error window, s > 0 (default 300)")
    parser.add_argument("--event-window", type=cliargs.positive_seconds, dest="event_window_seconds",
                        help="XID/ECC event window, s > 0 (default 600)")
    parser.add_argument("--nvlink-error-threshold", type=cliargs.integer_type(0),
                        help="NVLink errors tolerated per node and window, >= 0 (default 0)")
    parser.add_argument("--ib-error-threshold", type=cliargs.integer_type(0),
                        help="InfiniBand errors tolerated per node and window, >= 0 (default 0)")
    parser.add_argument("--roce-error-threshold", type=cliargs.integer_type(0),
                        help="RoCE lost/retransmitted packets tolerated per node and window, >= 0 (default 0)")
    parser.add_argument("--node-label", help="series label naming the node (default node)")
    parser.add_argument("--drain-timeout", type=cliargs.positive_seconds, dest="drain_timeout_seconds",
                        help="seconds (> 0) a swap's drain may take (600)")
    parser.add_argument("--degraded-clear", type=cliargs.positive_seconds, dest="degraded_clear_seconds",
                        help="fault-free seconds (> 0) before a degraded node returns by itself (600)")
    parser.add_argument("--return-checks-inventory", metavar="FILE",
                        help="Ansible inventory to run the node checks (tests/nodes, needs pytest-testinfra) with before a "
                             "degraded node returns by itself; without it no node returns by itself (invoke node.return)")
    parser.add_argument("--return-checks-args", default="", metavar="ARGS",
                        help="extra pytest arguments for those node checks, quoted")
    parser.add_argument("--once", action="store_true", help="one evaluation, wait for drains, print a JSON summary, exit")
    flags.add_leader_election(parser)
    flags.add_log_level(parser)


def settings_from_args(args: argparse.Namespace):
    """:class:`~gpufleet.node_health.remediate.Settings` from the inventory and the flags.

    Raises:
        gpufleet_admin.inventory.InventoryError: unknown environment or invalid inventory.
    """
    from gpufleet.node_health.remediate import Settings
    from roles.registry import load

    inv = load(args.env)
    return Settings.from_inventory(
        inv, prometheus_url=args.prometheus_url, dry_run=args.dry_run, interval_seconds=args.interval,
        namespace=args.namespace, max_nodes_out=args.max_nodes_out, hot_samples=args.hot_samples,
        max_unhealthy_share=args.max_unhealthy_share, telemetry_stale_seconds=args.telemetry_stale_seconds,
        scrape_interval_seconds=args.scrape_interval_seconds, error_window_seconds=args.error_window_seconds,
        event_window_seconds=args.event_window_seconds, nvlink_error_threshold=args.nvlink_error_threshold,
        ib_error_threshold=args.ib_error_threshold, roce_error_threshold=args.roce_error_threshold,
        node_label=args.node_label,
        drain_timeout_seconds=args.drain_timeout_seconds, degraded_clear_seconds=args.degraded_clear_seconds)


def run(args: argparse.Namespace) -> int:
    """Run the controller (module docstring)."""
    from gpufleet.node_health.remediate import Remediator
    from gpufleet_admin.inventory import InventoryError
    from gpufleet.kube import ConfigError
    from gpufleet.ops.reads import InputError
    from gpufleet.ops.nodechecks import NodeChecks
    from gpufleet.prom.client import PromClient

    runtime.setup_logging(args.log_level)
    try:
        settings = settings_from_args(args)
        cliargs.check("node_health_prometheus_url", cliargs.http_url, settings.prometheus_url)
        timings = flags.timings(args)
        kube = runtime.kube_from_args(args, user_agent="gpufleet-node-health")
        checks = (NodeChecks.for_env(args.env, args.return_checks_inventory, args.return_checks_args)
                  if args.return_checks_inventory else None)
    except (InventoryError, ConfigError, ValueError, InputError) as exc:
        print(f"gpufleet node-health: {exc}", file=sys.stderr)
        return 2
    if not args.once and runtime.port_in_use("node-health", args.metrics_port):
        return 1
    rem = Remediator(kube, PromClient(settings.prometheus_url), settings, return_checks=checks)
    if args.once:
        report = rem.step()
        rem.wait()
        rem.close()
        print(json.dumps({
            "faults": {n: [f"{f.kind}: {f.detail}" for f in fs] for n, fs in report.faults.items()},
            "decisions": [{"node": d.node, "action": d.action, "why": d.why, "lemon": d.lemon,
                           **({"breaker": True} if d.breaker else {})} for d in report.decisions],
            "recovered": report.recovered, "errors": report.errors, "dry_run": settings.dry_run,
        }, indent=1))
        return 1 if report.errors else 0
    liveness = Liveness(max_age=max(120.0, 10 * settings.interval_seconds))

    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            report = rem.step()
            for e in report.errors:
                log.warning("%s", e)
            for d in report.decisions:
                if d.action != "skip":
                    log.info("%s %s: %s (%s)", d.action, d.node, d.detail, d.why)
            liveness.beat()
            stop.wait(settings.interval_seconds)

    try:
        return runtime.run("node-health", loop, metrics_port=args.metrics_port, liveness=liveness,
                           registry=rem.registry, kube=kube,
                           lease=(LEASE_NAME, settings.namespace) if args.leader_elect else None, timings=timings)
    finally:
        rem.close()
