"""``gpufleet taint-controller``: the taint controller, flip-out and flip-back, one active instance.

Defaults come from the inventory (``--env``): the taint_controller role
(marks, hold, signal, PromQL, Prometheus URL), the virtual_kubelet pools,
the descheduler role's migration budget and the kueue role's highest
PriorityClass (flip-out preemptors). Flags override them.

Exit codes: 0 on SIGTERM/SIGINT; 2 for bad input (flag values outside their
range, unknown environment, inconsistent marks, unknown mode); 1 when the
metrics port is in use, the cluster cannot be reached or the Lease was lost.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpufleet import cliargs
from gpufleet.controllers import flags, runtime
from gpufleet.controllers.serve import Liveness
from gpufleet.kube import ConfigError, Kube, KubeError
from gpufleet.names import FLIP_MODES, SYSTEM_NAMESPACE
from gpufleet.virtual_kubelet.orphans import OrphanedEndpoints

from .budget import MigrationBudget
from .controller import TaintController
from .decision import Hysteresis
from .flipback import MODES, FlipBack
from .flipout import FlipOut
from .published import ServiceEndpoints
from .constants import LEASE_NAME, TICK_SECONDS
from .signal import ApiServerSignal, PrometheusSignal

log = logging.getLogger("gpufleet.taint_controller")


@dataclass(frozen=True)
class Settings:
    """Everything the controller needs, resolved from the inventory and flags.

    Units: GPUs for the marks, seconds for times, pods per minute for the budget.
    ``add_hold_seconds``/``remove_hold_seconds`` default to ``hold_seconds``.
    """

    high_water: float
    low_water: float
    hold_seconds: float
    add_hold_seconds: float | None = None
    remove_hold_seconds: float | None = None
    signal: str = "apiserver"
    prometheus_url: str = ""
    promql: str = ""
    pools: tuple[str, ...] = ()
    flip_out: bool = True
    flip_out_classes: tuple[str, ...] = ("gpufleet-training",)
    flip_out_max_wait: float = 300.0
    flip_mode: str = "make_before_break"
    surge_max_wait: float = 180.0
    flip_back: str = "release"
    pods_per_minute: float = 10.0
    max_in_flight: int = 1
    tick_seconds: float = TICK_SECONDS

    @property
    def add_hold(self) -> float:
        """Seconds above the high-water mark before tainting."""
        return self.hold_seconds if self.add_hold_seconds is None else self.add_hold_seconds

    @property
    def remove_hold(self) -> float:
        """Seconds below the low-water mark before untainting."""
        return self.hold_seconds if self.remove_hold_seconds is None else self.remove_hold_seconds


def settings_from_inventory(env: str, **overrides: Any) -> Settings:
    """:class:`Settings` from ``inventories/<env>`` with ``overrides`` (None values ignored).

    Raises:
        gpufleet_admin.inventory.InventoryError: the inventory is invalid.
        ValueError: the resulting marks are inconsistent.
    """
    from roles.registry import load

    inv = load(env)
    tc, vk, ds, kq = (inv.role(r) for r in ("taint_controller", "virtual_kubelet", "descheduler", "kueue"))
    top = max(kq.kueue_priority_classes, key=lambda p: p.value).name
    base = dict(
        high_water=tc.taint_controller_high_water_gpus, low_water=tc.taint_controller_low_water_gpus,
        hold_seconds=tc.taint_controller_hold_seconds, add_hold_seconds=tc.taint_controller_add_hold_seconds,
        remove_hold_seconds=tc.taint_controller_remove_hold_seconds, signal=tc.taint_controller_signal,
        prometheus_url=tc.taint_controller_prometheus_url, promql=tc.taint_controller_promql,
        pools=tuple(p.name for p in vk.virtual_kubelet_pools), flip_out_classes=(top,),
        pods_per_minute=ds.descheduler_migration_pods_per_minute, flip_mode=tc.taint_controller_flip_mode,
        surge_max_wait=tc.taint_controller_surge_max_wait_seconds,
    )
    base.update({k: v for k, v in overrides.items() if v is not None})
    if overrides.get("hold_seconds") is not None:  # --hold-seconds sets both, unless one is given apart
        for key in ("add_hold_seconds", "remove_hold_seconds"):
            if overrides.get(key) is None:
                base[key] = None
    s = Settings(**base)
    # Inventory values and programmatic overrides get the checks argparse gives the flags.
    checks = {"--high-water": (s.high_water, cliargs.nonnegative_number),
              "--low-water": (s.low_water, cliargs.nonnegative_number),
              "--hold-seconds": (s.hold_seconds, cliargs.nonnegative_seconds),
              "--add-hold-seconds": (s.add_hold if s.add_hold_seconds is None else s.add_hold_seconds,
                                     cliargs.nonnegative_seconds),
              "--remove-hold-seconds": (s.remove_hold if s.remove_hold_seconds is None else s.remove_hold_seconds,
                                        cliargs.nonnegative_seconds),
              "--flip-out-max-wait": (s.flip_out_max_wait, cliargs.nonnegative_seconds),
              "--surge-max-wait": (s.surge_max_wait, cliargs.nonnegative_seconds),
              "--pods-per-minute": (s.pods_per_minute, cliargs.positive_number)}
    for flag, (value, kind) in checks.items():
        cliargs.check(flag, kind, value)
    if s.signal == "prometheus":
        cliargs.check("--prometheus-url", cliargs.http_url, s.prometheus_url)
    known = [pool.name for pool in vk.virtual_kubelet_pools]
    unknown = [name for name in s.pools if name not in known]
    if unknown:  # a pool run outside the inventory is legitimate (tests, trials): say so, act anyway
        log.warning("--pool %s: not among inventories/%s virtual_kubelet_pools (%s); acting on its virtual nodes anyway",
                    ", ".join(unknown), env, ", ".join(known) or "none")
    if s.low_water >= s.high_water:
        raise ValueError(f"--low-water {s.low_water:g} must be below --high-water {s.high_water:g}")
    if s.flip_mode not in FLIP_MODES:
        raise ValueError(f"--flip-mode {s.flip_mode!r}: expected one of {', '.join(FLIP_MODES)}")
    if s.flip_back not in MODES:
        raise ValueError(f"--flip-back {s.flip_back!r}: expected one of {', '.join(MODES)}")
    return s


def build(kube: Kube, s: Settings, *, clock=time.monotonic) -> tuple[TaintController, ApiServerSignal]:
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
    machine = Hysteresis(s.high_water, s.low_water, s.hold_seconds, add_hold=s.add_hold, remove_hold=s.remove_hold)
    out = FlipOut(kube, caches.nodes, caches.pods, s.flip_out_classes, max_wait_seconds=s.flip_out_max_wait,
                  mode=s.flip_mode, surge_max_wait_seconds=s.surge_max_wait, clock=clock) if s.flip_out else None
    back = None
    if s.flip_back != "off":
        mbb = s.flip_mode == "make_before_break"
        back = FlipBack(kube, caches.nodes, caches.pods, MigrationBudget(s.pods_per_minute, max_in_flight=s.max_in_flight),
                        mode=s.flip_back, make_before_break=mbb, endpoints=ServiceEndpoints(kube) if mbb else None,
                        surge_max_wait_seconds=s.surge_max_wait, clock=clock)
    orphans = OrphanedEndpoints(kube, caches.nodes, clock=clock)
    ctl = TaintController(kube, sig, caches, machine, pools=s.pools, flip_out=out, flip_back=back, orphans=orphans,
                          clock=clock)
    return ctl, caches


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpufleet taint-controller``."""
    parser.add_argument("--env", default="local", help="inventory environment giving the defaults (default local)")
    flags.add_kube(parser)
    parser.add_argument("--high-water", type=cliargs.nonnegative_number, default=None,
                        help="free GPUs (>= 0) above which virtual nodes are tainted")
    parser.add_argument("--low-water", type=cliargs.nonnegative_number, default=None,
                        help="free GPUs (>= 0, below --high-water) below which the taint is removed")
    parser.add_argument("--hold-seconds", type=cliargs.nonnegative_seconds, default=None,
                        help="seconds (>= 0) a mark must be crossed before acting, both ways (the two below override it)")
    parser.add_argument("--add-hold-seconds", type=cliargs.nonnegative_seconds, default=None,
                        help="seconds (>= 0) free GPUs must stay above --high-water before the taint is added")
    parser.add_argument("--remove-hold-seconds", type=cliargs.nonnegative_seconds, default=None,
                        help="seconds (>= 0) free GPUs must stay below --low-water before the taint is removed")
    parser.add_argument("--signal", choices=("apiserver", "prometheus"), default=None, help="where free GPUs come from")
    parser.add_argument("--prometheus-url", type=cliargs.http_url, default=None,
                        help="Prometheus base URL, http(s)://host[:port] (signal prometheus)")
    parser.add_argument("--promql", default=None, help="PromQL giving free GPUs (signal prometheus)")
    parser.add_argument("--pool", action="append", dest="pools", default=None,
                        help="manage the virtual node of this pool (repeatable; default: every pool of the inventory)")
    parser.add_argument("--flip-out", action=argparse.BooleanOptionalAction, default=None,
                        help="evict inference PDB-respecting for pending training pods (default on)")
    parser.add_argument("--flip-out-priority-class", action="append", dest="flip_out_classes", default=None,
                        help="PriorityClass of pods the flip-out makes room for (default: the highest of the inventory)")
    parser.add_argument("--flip-out-max-wait", type=cliargs.nonnegative_seconds, default=None,
                        help="seconds (>= 0) of PDB refusals after which flip-out deletes victims (default 300)")
    parser.add_argument("--flip-mode", choices=FLIP_MODES, default=None,
                        help="make_before_break: a replacement outside is Ready before each flip-out eviction "
                             "(default); evict_first: evict within the PDB, the replacement starts afterwards")
    parser.add_argument("--surge-max-wait", type=cliargs.nonnegative_seconds, default=None,
                        help="seconds (>= 0) after a reservation past which make_before_break evicts without a Ready "
                             "replacement (default 180)")
    parser.add_argument("--flip-back", choices=MODES, default=None,
                        help="release: label pods for the descheduler (default); evict: Eviction API here; off")
    parser.add_argument("--pods-per-minute", type=cliargs.positive_number, default=None,
                        help="flip-back budget per workload, > 0 (default descheduler_migration_pods_per_minute)")
    parser.add_argument("--namespace", default=SYSTEM_NAMESPACE, help="namespace of the leader-election Lease")
    flags.add_leader_election(parser)
    flags.add_metrics_port(parser)
    flags.add_log_level(parser)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (see the module docstring for exit codes)."""
    from gpufleet_admin.inventory import InventoryError, environments

    runtime.setup_logging(args.log_level)
    if args.env not in environments():
        print(f"gpufleet taint-controller: --env {args.env!r}: expected one of {', '.join(environments())}",
              file=sys.stderr)
        return 2
    try:
        s = settings_from_inventory(
            args.env, high_water=args.high_water, low_water=args.low_water, hold_seconds=args.hold_seconds,
            add_hold_seconds=args.add_hold_seconds, remove_hold_seconds=args.remove_hold_seconds,
            signal=args.signal, prometheus_url=args.prometheus_url, promql=args.promql,
            pools=tuple(args.pools) if args.pools else None, flip_out=args.flip_out,
            flip_out_classes=tuple(args.flip_out_classes) if args.flip_out_classes else None,
            flip_out_max_wait=args.flip_out_max_wait, flip_mode=args.flip_mode, surge_max_wait=args.surge_max_wait,
            flip_back=args.flip_back, pods_per_minute=args.pods_per_minute)
        timings = flags.timings(args)
        kube = runtime.kube_from_args(args, user_agent="gpufleet-taint-controller")
    except (InventoryError, ValueError, ConfigError) as exc:
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
                      exc, s.surge_max_wait)
    liveness = Liveness(max_age=max(60.0, 10 * s.tick_seconds))
    log.info("taint controller: high %g, low %g, hold %gs to taint / %gs to untaint, signal %s, pools %s", s.high_water,
             s.low_water, s.add_hold, s.remove_hold, s.signal, ", ".join(s.pools) or "all")

    def loop(stop: threading.Event) -> None:
        threading.Thread(target=lambda: (stop.wait(), ctl.stop()), daemon=True, name="taint-controller-stop").start()
        ctl.run(s.tick_seconds, liveness.beat)

    return runtime.run("taint-controller", loop, metrics_port=args.metrics_port, liveness=liveness, kube=kube,
                       lease=(LEASE_NAME, args.namespace) if args.leader_elect else None, timings=timings)
