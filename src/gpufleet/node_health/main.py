"""``gpufleet node-health``: the remediation controller (Deployment of the node_health role).

Every ``interval_seconds``, while holding Lease
``<namespace>/gpufleet-node-health``: evaluate the exporter's series in
Prometheus and act (:mod:`gpufleet.node_health.remediate`). Serves
``/metrics`` (``gpufleet_node_health_*``) and ``/healthz`` on
``--metrics-port`` (``--port``: deprecated alias).
Settings come from ``--config FILE`` (:mod:`gpufleet.node_health.config`,
rendered by the node_health role from the inventory and stack config);
without it, the defaults. A flag given overrides the file. Nothing else of
the inventory is read.
``--once`` evaluates and acts once, waits for the drains, prints what it did
and exits (no Lease): the way to try it by hand, with ``--dry-run``.
Exit codes: 0 ok, 1 leadership lost, the metrics port in use or a failed
``--once``, 2 bad input (a bad file or flag value; argparse refuses
out-of-range flag values first).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading

from gpufleet import componentconfig as cc
from gpufleet.controllers import flags, runtime
from gpufleet.controllers.serve import Liveness
from gpufleet.node_health.config import DEFAULTS, FILE, Configuration

log = logging.getLogger("gpufleet.node-health")

LEASE_NAME = "gpufleet-node-health"

#: Flags that set a field of the configuration: flag -> (argparse dest, dotted field).
FIELD_FLAGS: dict[str, tuple[str, str]] = {
    "--prometheus-url": ("prometheus_url", "prometheus_url"),
    "--dry-run": ("dry_run", "dry_run"),
    "--interval": ("interval", "interval_seconds"),
    "--namespace": ("namespace", "namespace"),
    "--max-nodes-out": ("max_nodes_out", "max_nodes_out"),
    "--max-unhealthy-share": ("max_unhealthy_share", "max_unhealthy_share"),
    "--telemetry-stale": ("telemetry_stale_seconds", "rules.telemetry_stale_seconds"),
    "--hot-samples": ("hot_samples", "rules.hot_samples"),
    "--scrape-interval": ("scrape_interval_seconds", "rules.scrape_interval_seconds"),
    "--error-window": ("error_window_seconds", "rules.error_window_seconds"),
    "--event-window": ("event_window_seconds", "rules.event_window_seconds"),
    "--nvlink-error-threshold": ("nvlink_error_threshold", "rules.nvlink_error_threshold"),
    "--ib-error-threshold": ("ib_error_threshold", "rules.ib_error_threshold"),
    "--roce-error-threshold": ("roce_error_threshold", "rules.roce_error_threshold"),
    "--node-label": ("node_label", "rules.node_label"),
    "--drain-timeout": ("drain_timeout_seconds", "drain_timeout_seconds"),
    "--degraded-clear": ("degraded_clear_seconds", "degraded_clear_seconds"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``node-health`` subcommand's flags: ``--config``, the process's, one per setting run by hand.

    A setting's flag is checked by its field's own kind (:func:`gpufleet.componentconfig.flag_type`).
    """
    def kind(field: str):
        return cc.flag_type(Configuration, field)

    d = DEFAULTS
    flags.add_config(parser, role="node_health", command="node-health")
    parser.add_argument("--prometheus-url", type=kind("prometheus_url"),
                        help=f"Prometheus base URL, http(s)://host[:port] (default {d.prometheus_url})")
    parser.add_argument("--dry-run", action="store_true", default=None, help="decide and record Events, change no node")
    flags.add_kube(parser)
    parser.add_argument("--interval", type=kind("interval_seconds"),
                        help=f"seconds (> 0) between evaluations (default {d.interval_seconds:g})")
    flags.add_metrics_port(parser, port_alias=True)
    parser.add_argument("--namespace", help=f"swap requests and Lease namespace (default {d.namespace})")
    parser.add_argument("--max-nodes-out", type=kind("max_nodes_out"),
                        help=f"most nodes out at once, >= 0 (default {d.max_nodes_out})")
    parser.add_argument("--max-unhealthy-share", type=kind("max_unhealthy_share"),
                        help="most of the GPU fleet out of service at once before the circuit breaker holds actions "
                             f"(0..1, default {d.max_unhealthy_share:g})")
    parser.add_argument("--telemetry-stale", type=kind("rules.telemetry_stale_seconds"), dest="telemetry_stale_seconds",
                        help=f"GPU telemetry older than this is stale, s > 0 (default {d.rules.telemetry_stale_seconds:g})")
    parser.add_argument("--hot-samples", type=kind("rules.hot_samples"),
                        help=f"samples above a temperature threshold before a fault, >= 1 (default {d.rules.hot_samples})")
    parser.add_argument("--scrape-interval", type=kind("rules.scrape_interval_seconds"), dest="scrape_interval_seconds",
                        help=f"exporter scrape interval in seconds, > 0 (default {d.rules.scrape_interval_seconds:g})")
    parser.add_argument("--error-window", type=kind("rules.error_window_seconds"), dest="error_window_seconds",
                        help=f"NVLink/IB error window, s > 0 (default {d.rules.error_window_seconds:g})")
    parser.add_argument("--event-window", type=kind("rules.event_window_seconds"), dest="event_window_seconds",
                        help=f"XID/ECC event window, s > 0 (default {d.rules.event_window_seconds:g})")
    parser.add_argument("--nvlink-error-threshold", type=kind("rules.nvlink_error_threshold"),
                        help=f"NVLink errors tolerated per node and window, >= 0 (default {d.rules.nvlink_error_threshold})")
    parser.add_argument("--ib-error-threshold", type=kind("rules.ib_error_threshold"),
                        help=f"InfiniBand errors tolerated per node and window, >= 0 (default {d.rules.ib_error_threshold})")
    parser.add_argument("--roce-error-threshold", type=kind("rules.roce_error_threshold"),
                        help="RoCE lost/retransmitted packets tolerated per node and window, >= 0 "
                             f"(default {d.rules.roce_error_threshold})")
    parser.add_argument("--node-label", help=f"series label naming the node (default {d.rules.node_label})")
    parser.add_argument("--drain-timeout", type=kind("drain_timeout_seconds"), dest="drain_timeout_seconds",
                        help=f"seconds (> 0) a swap's drain may take (default {d.drain_timeout_seconds:g})")
    parser.add_argument("--degraded-clear", type=kind("degraded_clear_seconds"), dest="degraded_clear_seconds",
                        help="fault-free seconds (> 0) before a degraded node returns by itself "
                             f"(default {d.degraded_clear_seconds:g})")
    parser.add_argument("--return-checks-inventory", metavar="FILE",
                        help="Ansible inventory to run the node checks (tests/nodes, needs pytest-testinfra) with before a "
                             "degraded node returns by itself; without it no node returns by itself (invoke node.return)")
    parser.add_argument("--return-checks-args", default="", metavar="ARGS",
                        help="extra pytest arguments for those node checks, quoted")
    parser.add_argument("--once", action="store_true", help="one evaluation, wait for drains, print a JSON summary, exit")
    flags.add_leader_election(parser)
    flags.add_log_level(parser)


def configuration(args: argparse.Namespace) -> Configuration:
    """The configuration: ``--config FILE`` (else the defaults) with the flags given applied over it.

    Raises:
        gpufleet.componentconfig.ConfigFileError: a bad file, or a flag that breaks a check (names the flag).
    """
    return FILE.with_flags(args, FIELD_FLAGS, DEFAULTS)


def gpu_remediator(config: Configuration, kube, checks):
    """The per-GPU path (:class:`gpufleet.node_health.devices.GpuRemediator`) on the node path's configuration
    (its ``gpu_*`` fields, degraded faults, lemon limits and dry run); a GPU's return runs the node checks of
    that GPU (when ``checks`` are configured)."""
    from gpufleet.node_health.devices import GpuRemediator
    from gpufleet.ops.gpus import gpu_check_ids

    gpu_checks = None
    if checks is not None:
        def gpu_checks(gpu):
            return gpu_check_ids(gpu, [r.test for r in checks.run(gpu.node).failed])
    return GpuRemediator(kube, config, checks=gpu_checks)


def run(args: argparse.Namespace) -> int:
    """Run the controller (module docstring)."""
    from gpufleet.node_health.remediate import Remediator
    from gpufleet.kube import ConfigError
    from gpufleet.ops.reads import InputError
    from gpufleet.ops.nodechecks import NodeChecks
    from gpufleet.prom.client import PromClient

    runtime.setup_logging(args.log_level)
    try:
        settings = configuration(args)
        timings = flags.timings(args)
        kube = runtime.kube_from_args(args, user_agent="gpufleet-node-health")
        # The file is given: no inventory folder is looked up.
        checks = (NodeChecks.for_env("", args.return_checks_inventory, args.return_checks_args)
                  if args.return_checks_inventory else None)
    except (cc.ConfigFileError, ConfigError, ValueError, InputError) as exc:
        print(f"gpufleet node-health: {exc}", file=sys.stderr)
        return 2
    if not args.once and runtime.port_in_use("node-health", args.metrics_port):
        return 1
    rem = Remediator(kube, PromClient(settings.prometheus_url), settings, return_checks=checks,
                     gpus=gpu_remediator(settings, kube, checks))
    if args.once:
        report = rem.step()
        rem.wait()
        rem.close()
        print(json.dumps({
            "faults": {n: [f"{f.kind}: {f.detail}" for f in fs] for n, fs in report.faults.items()},
            "decisions": [{"node": d.node, "action": d.action, "why": d.why, "lemon": d.lemon,
                           **({"breaker": True} if d.breaker else {})} for d in report.decisions],
            "recovered": report.recovered, "errors": report.errors, "dry_run": settings.dry_run,
            "gpus": [{"node": d.gpu.node, "gpu": d.gpu.device, "action": d.action, "why": d.why, "lemon": d.lemon}
                     for d in (report.gpu.decisions if report.gpu else [])],
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
