"""``gpufleet taint-controller``: the taint controller, flip-out and flip-back, one active instance.

Settings come from ``--config FILE`` (:mod:`gpufleet.taint_controller.config`,
rendered by the taint_controller role from the inventory and stack config:
marks, hold times, signal, pools, the flip-out's PriorityClass, the
flip-back budget); without it, the defaults. A flag given overrides the file.
Nothing else of the inventory is read.

Exit codes: 0 on SIGTERM/SIGINT; 2 for bad input (a bad file or flag value,
inconsistent marks); 1 when the metrics port is in use, the cluster cannot be
reached or the Lease was lost.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time

from gpufleet import componentconfig as cc
from gpufleet.controllers import flags, runtime
from gpufleet.controllers.serve import Liveness
from gpufleet.kube import ConfigError, Kube, KubeError
from gpufleet.names import SYSTEM_NAMESPACE
from gpufleet.virtual_kubelet.orphans import OrphanedEndpoints

from .budget import MigrationBudget
from .config import DEFAULTS, Configuration, load
from .controller import TaintController
from .decision import Hysteresis
from .flipback import FlipBack
from .flipout import FlipOut
from .published import ServiceEndpoints
from .constants import LEASE_NAME
from .signal import ApiServerSignal, PrometheusSignal
from .surge import Deployments

log = logging.getLogger("gpufleet.taint_controller")

#: Flags that set a field of the configuration: flag -> (argparse dest, field).
FIELD_FLAGS: dict[str, tuple[str, str]] = {
    "--high-water": ("high_water", "high_water_gpus"),
    "--low-water": ("low_water", "low_water_gpus"),
    "--hold-seconds": ("hold_seconds", "hold_seconds"),
    "--add-hold-seconds": ("add_hold_seconds", "add_hold_seconds"),
    "--remove-hold-seconds": ("remove_hold_seconds", "remove_hold_seconds"),
    "--signal": ("signal", "signal"),
    "--prometheus-url": ("prometheus_url", "prometheus_url"),
    "--promql": ("promql", "promql"),
    "--pool": ("pools", "pools"),
    "--flip-out": ("flip_out", "flip_out"),
    "--flip-out-priority-class": ("flip_out_classes", "flip_out_priority_classes"),
    "--flip-out-max-wait": ("flip_out_max_wait", "flip_out_max_wait_seconds"),
    "--flip-mode": ("flip_mode", "flip_mode"),
    "--surge-max-wait": ("surge_max_wait", "surge_max_wait_seconds"),
    "--flip-back": ("flip_back", "flip_back"),
    "--pods-per-minute": ("pods_per_minute", "flip_back_pods_per_minute"),
}


def configuration(args: argparse.Namespace) -> Configuration:
    """The configuration: ``--config FILE`` (else the defaults) with the flags given applied over it.

    ``--hold-seconds`` sets both hold times unless one is given apart (as a
    file's ``add_hold_seconds``/``remove_hold_seconds`` would otherwise win).

    Raises:
        gpufleet.componentconfig.ConfigError: a bad file, or a flag that breaks a check (names the flag).
    """
    base = load(args.config) if args.config else DEFAULTS
    given = {}
    for flag, (dest, field) in FIELD_FLAGS.items():
        value = getattr(args, dest)
        given[field] = (flag, tuple(value) if isinstance(value, list) else value)
    cfg = cc.override(base, given, source=args.config or "defaults")
    if args.hold_seconds is not None:
        apart = {k: None for k, dest in (("add_hold_seconds", "add_hold_seconds"),
                                         ("remove_hold_seconds", "remove_hold_seconds"))
                 if getattr(args, dest) is None}
        cfg = cfg.model_copy(update=apart)
    if args.pools and args.config and base.pools:
        unknown = [name for name in args.pools if name not in base.pools]
        if unknown:  # a pool run outside the inventory is legitimate (tests, trials): say so, act anyway
            log.warning("--pool %s: not among the pools of %s (%s); acting on its virtual nodes anyway",
                        ", ".join(unknown), args.config, ", ".join(base.pools))
    return cfg


def build(kube: Kube, s: Configuration, *, clock=time.monotonic) -> tuple[TaintController, ApiServerSignal]:
    """The controller and its caches (not started).

    The node/pod caches are always built (virtual nodes, flip-out and
    flip-back read them); the signal is the caches or a Prometheus query.
    The pass over orphaned endpoints (``ctl.orphans``) acts once its watches
    are started (:meth:`gpufleet.virtual_kubelet.orphans.OrphanedEndpoints.start`), and so
    does the flip-back's make-before-break (``ctl.flip_back.endpoints``,
    :meth:`gpufleet.taint_controller.published.ServiceEndpoints.start`).
    """
    caches = ApiServerSignal(kube)
    sig = caches if s.signal == "apiserver" else PrometheusSignal(s.prometheus_url, s.promql)
    machine = Hysteresis(s.high_water_gpus, s.low_water_gpus, s.hold_seconds, add_hold=s.add_hold_seconds,
                         remove_hold=s.remove_hold_seconds)
    deployments = Deployments(kube)  # one cache per inference namespace, for both directions' surges
    out = FlipOut(kube, caches.nodes, caches.pods, s.flip_out_priority_classes,
                  max_wait_seconds=s.flip_out_max_wait_seconds, mode=s.flip_mode,
                  surge_max_wait_seconds=s.surge_max_wait_seconds, surge_priority_class=s.surge_priority_class,
                  deployments=deployments, concurrent_syncs=s.flip_out_concurrent_syncs, clock=clock) if s.flip_out else None
    back = None
    if s.flip_back != "off":
        mbb = s.flip_mode == "make_before_break"
        back = FlipBack(kube, caches.nodes, caches.pods,
                        MigrationBudget(s.flip_back_pods_per_minute, max_in_flight=s.flip_back_max_in_flight),
                        mode=s.flip_back, make_before_break=mbb, endpoints=ServiceEndpoints(kube) if mbb else None,
                        surge_max_wait_seconds=s.surge_max_wait_seconds, deployments=deployments, clock=clock)
    orphans = OrphanedEndpoints(kube, caches.nodes, clock=clock)
    ctl = TaintController(kube, sig, caches, machine, pools=s.pools, flip_out=out, flip_back=back, orphans=orphans,
                          clock=clock)
    return ctl, caches


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpufleet taint-controller``: ``--config``, the process's, and one per setting run by hand.

    A setting's flag is checked by its field's own kind (:func:`gpufleet.componentconfig.flag_type`).
    """
    def kind(field: str):
        return cc.flag_type(Configuration, field)

    flags.add_config(parser, role="taint_controller", command="taint-controller")
    flags.add_kube(parser)
    parser.add_argument("--high-water", type=kind("high_water_gpus"), default=None,
                        help="free GPUs (>= 0) above which virtual nodes are tainted (high_water_gpus)")
    parser.add_argument("--low-water", type=kind("low_water_gpus"), default=None,
                        help="free GPUs (>= 0, below the high-water mark) below which the taint is removed "
                             "(low_water_gpus)")
    parser.add_argument("--hold-seconds", type=kind("hold_seconds"), default=None,
                        help="seconds (>= 0) a mark must be crossed before acting, both ways (the two below override it)")
    parser.add_argument("--add-hold-seconds", type=kind("add_hold_seconds"), default=None,
                        help="seconds (>= 0) free GPUs must stay above the high-water mark before the taint is added")
    parser.add_argument("--remove-hold-seconds", type=kind("remove_hold_seconds"), default=None,
                        help="seconds (>= 0) free GPUs must stay below the low-water mark before the taint is removed")
    parser.add_argument("--signal", choices=cc.flag_choices(Configuration, "signal"), default=None,
                        help="where free GPUs come from")
    parser.add_argument("--prometheus-url", type=kind("prometheus_url"), default=None,
                        help="Prometheus base URL, http(s)://host[:port] (signal prometheus)")
    parser.add_argument("--promql", default=None, help="PromQL giving free GPUs (signal prometheus)")
    parser.add_argument("--pool", action="append", dest="pools", default=None,
                        help="manage the virtual node of this pool (repeatable; default: the file's pools, else every "
                             "virtual node)")
    parser.add_argument("--flip-out", action=argparse.BooleanOptionalAction, default=None,
                        help="evict inference PDB-respecting for pending training pods (default on)")
    parser.add_argument("--flip-out-priority-class", action="append", dest="flip_out_classes", default=None,
                        help="PriorityClass of pods the flip-out makes room for (repeatable; default: the file's, "
                             "the highest of the inventory)")
    parser.add_argument("--flip-out-max-wait", type=kind("flip_out_max_wait_seconds"), default=None,
                        help="seconds (>= 0) of PDB refusals after which flip-out deletes victims "
                             f"(default {DEFAULTS.flip_out_max_wait_seconds:g})")
    parser.add_argument("--flip-mode", choices=cc.flag_choices(Configuration, "flip_mode"), default=None,
                        help="make_before_break: a replacement outside is Ready before each flip-out eviction "
                             "(default); evict_first: evict within the PDB, the replacement starts afterwards")
    parser.add_argument("--surge-max-wait", type=kind("surge_max_wait_seconds"), default=None,
                        help="seconds (>= 0) after a reservation past which make_before_break evicts without a Ready "
                             f"replacement (default {DEFAULTS.surge_max_wait_seconds:g})")
    parser.add_argument("--flip-back", choices=cc.flag_choices(Configuration, "flip_back"), default=None,
                        help="release: label pods for the descheduler (default); evict: Eviction API here; off")
    parser.add_argument("--pods-per-minute", type=kind("flip_back_pods_per_minute"), default=None,
                        help="flip-back budget per workload, > 0 (default: the file's, "
                             "descheduler_migration_pods_per_minute)")
    parser.add_argument("--namespace", default=SYSTEM_NAMESPACE, help="namespace of the leader-election Lease")
    flags.add_leader_election(parser)
    flags.add_metrics_port(parser)
    flags.add_log_level(parser)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (see the module docstring for exit codes)."""
    runtime.setup_logging(args.log_level)
    try:
        s = configuration(args)
        timings = flags.timings(args)
        kube = runtime.kube_from_args(args, user_agent="gpufleet-taint-controller")
    except (cc.ConfigFileError, ValueError, ConfigError) as exc:
        print(f"gpufleet taint-controller: {exc}", file=sys.stderr)
        return 2
    if runtime.port_in_use("taint-controller", args.metrics_port):
        return 1
    ctl, caches = build(kube, s)
    try:
        caches.start()
        ctl.orphans.start()
    except (TimeoutError, KubeError) as exc:
        print(f"gpufleet taint-controller: cannot list nodes/pods/EndpointSlices/node Leases on {kube.server}: {exc}",
              file=sys.stderr)
        return 1
    if ctl.flip_back is not None and ctl.flip_back.endpoints is not None:
        try:
            ctl.flip_back.endpoints.start(timeout=15.0)  # not listed by then: the watches go on trying
        except (TimeoutError, KubeError) as exc:
            # Only the way back's make before break needs them: it waits --surge-max-wait per pod until they list.
            log.error("flip-back: cannot list Services/EndpointSlices (%s): in-cluster replacements count as not "
                      "published until they are listed; each pod outside goes %gs after its replacement started",
                      exc, s.surge_max_wait_seconds)
    liveness = Liveness(max_age=max(60.0, 10 * s.tick_seconds))
    machine = ctl.machine
    log.info("taint controller: high %g, low %g, hold %gs to taint / %gs to untaint, signal %s, pools %s",
             s.high_water_gpus, s.low_water_gpus, machine.add_hold, machine.remove_hold, s.signal,
             ", ".join(s.pools) or "all")

    def loop(stop: threading.Event) -> None:
        threading.Thread(target=lambda: (stop.wait(), ctl.stop()), daemon=True, name="taint-controller-stop").start()
        try:
            ctl.run(s.tick_seconds, liveness.beat)
        finally:
            if ctl.flip_out is not None:
                ctl.flip_out.close()

    return runtime.run("taint-controller", loop, metrics_port=args.metrics_port, liveness=liveness, kube=kube,
                       lease=(LEASE_NAME, args.namespace) if args.leader_elect else None, timings=timings)
