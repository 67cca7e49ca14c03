"""``gpufleet goodput``: the goodput accountant (Deployment of the goodput role).

Watches the Kueue Workloads and pods of ``--namespace`` (all namespaces
when not given), reads the Workloads' Events once at start (the history of
admissions and evictions the API still holds), and every ``interval_seconds``
(``--config FILE``, :mod:`gpufleet.goodput.config`, rendered by the goodput
role; ``--interval`` overrides it) computes every training job's account
(:mod:`gpufleet.goodput.account`), reading checkpoints from the
``CHECKPOINT_DIR`` its pods were given (the checkpoint filesystem is
mounted read-only where training pods mount it). Serves ``/metrics``
(:mod:`gpufleet.goodput.metrics`) and ``/healthz`` on ``--metrics-port``
(``--port``: its deprecated alias). Reads
only; one instance (its memory of a job is the history: a restart keeps
what the API and the checkpoint filesystem still show). ``--once`` lists
once, prints every account as JSON and exits.
Exit codes: 0 ok, 1 ``--metrics-port`` in use, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

from gpufleet import componentconfig as cc
from gpufleet.controllers import flags
from gpufleet.controllers.serve import Liveness
from gpufleet.goodput.config import DEFAULTS, FILE, Configuration

log = logging.getLogger("gpufleet.goodput")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``goodput`` subcommand's flags."""
    parser.add_argument("--config", metavar="FILE",
                        help="configuration file, as the goodput role renders it from the inventory and stack config "
                             "(by hand: invoke config --env ENV --component goodput --out FILE); flags given override "
                             "it; without it, the defaults")
    parser.add_argument("--namespace", help="namespace of the training jobs (default: every namespace)")
    parser.add_argument("--interval", type=cc.flag_type(Configuration, "interval_seconds"), default=None,
                        help=f"seconds (> 0) between passes over every job's account (default: the file's, "
                             f"{DEFAULTS.interval_seconds:g})")
    flags.add_metrics_port(parser, port_alias=True)
    flags.add_kube(parser)
    parser.add_argument("--once", action="store_true", help="list once, print every job's account as JSON, exit")
    flags.add_log_level(parser)


def configuration(args: argparse.Namespace) -> Configuration:
    """The configuration: ``--config FILE`` (else the defaults) with ``--interval`` over it.

    Raises:
        gpufleet.componentconfig.ConfigFileError: a bad file.
    """
    return FILE.with_flags(args, {"--interval": ("interval", "interval_seconds")}, DEFAULTS)


def account_json(a) -> dict:
    """One account as JSON: ETTR, seconds by bucket, interruptions (what ``--once`` prints)."""
    return {"namespace": a.namespace, "job": a.job, "kind": a.kind, "ettr": round(a.ettr, 6),
            "wall_clock_seconds": round(a.wall_seconds, 1), "productive_seconds": round(a.productive_seconds, 1),
            "badput_seconds": {k: round(v, 1) for k, v in a.badput.items()},
            "interruptions": [{"time": i.time, "lost_seconds": round(i.lost_seconds, 1), "resumed": i.resumed}
                              for i in a.interruptions],
            "checkpoints": a.checkpoints, "checkpoints_known": a.checkpoints_known,
            "reconstructed_runs": a.reconstructed_runs, "finished": a.finished,
            "checkpoints_not_counted": a.checkpoints_not_counted,
            "checkpoint_clock_offset_seconds": round(a.clock_offset, 3),
            "checkpoint_clock_offset_source": a.clock_offset_source}


def snapshot(client, tracker, namespace: str | None, *, pods: bool = True) -> None:
    """Feed ``tracker`` one list of the Workloads of ``namespace`` with their Events, and of its pods.

    ``client`` is a :class:`gpufleet.kube.Kube` (raises :class:`gpufleet.kube.KubeError`).
    """
    from gpufleet.goodput import api

    workloads = api.list_workloads(client, namespace)
    history: dict[str, list] = {}
    for ns in sorted({(w.get("metadata") or {}).get("namespace", "") for w in workloads}):
        for e in api.workload_events(client, ns):
            history.setdefault(f"{ns}/{(e.get('involvedObject') or {}).get('name')}", []).append(e)
    for w in workloads:
        meta = w.get("metadata") or {}
        tracker.observe_workload(w, history.get(f"{meta.get('namespace')}/{meta.get('name')}", ()))
    if pods:
        tracker.pods_listed(api.list_pages(client, api.pods_path(namespace)), api.now())


def run(args: argparse.Namespace) -> int:
    """Run the accountant (module docstring)."""
    from gpufleet.controllers import runtime
    from gpufleet.goodput import api
    from gpufleet.goodput.metrics import GoodputCollector, registry
    from gpufleet.goodput.tracker import Tracker
    from gpufleet.kube import ConfigError, KubeError

    runtime.setup_logging(args.log_level)
    try:
        config = configuration(args)
        client = runtime.kube_from_args(args, user_agent="gpufleet-goodput")
    except (cc.ConfigFileError, ConfigError) as exc:
        print(f"gpufleet goodput: {exc}", file=sys.stderr)
        return 2
    tracker = Tracker()
    if args.once:
        try:
            snapshot(client, tracker, args.namespace)
        except KubeError as exc:
            print(f"gpufleet goodput: {exc}", file=sys.stderr)
            return 1
        finally:
            client.close()
        print(json.dumps([account_json(a) for a in tracker.accounts(api.now())], indent=1))
        return 0
    if runtime.port_in_use("goodput", args.metrics_port):
        return 1
    collector = GoodputCollector()
    liveness = Liveness(max_age=max(120.0, 10 * config.interval_seconds))

    def loop(stop: threading.Event) -> None:
        try:
            snapshot(client, tracker, args.namespace, pods=False)  # the Events' history; the informers list the rest
        except Exception as exc:  # noqa: BLE001 - the informers list again by themselves
            log.warning("reading the Workloads' history: %s", exc)
        watches = [w.start() for w in api.informers(client, tracker, args.namespace)]
        api.forget_unlisted(tracker, watches[0])
        try:
            while not stop.is_set():
                t = time.monotonic()
                try:
                    accounts = tracker.accounts(api.now())
                    collector.update(accounts, duration=time.monotonic() - t, at=api.now())
                    liveness.beat()
                except Exception:  # noqa: BLE001 - report, keep serving the last accounts
                    log.exception("computing the accounts")
                stop.wait(config.interval_seconds)
        finally:
            for w in watches:
                w.stop()

    return runtime.run("goodput", loop, metrics_port=args.metrics_port, liveness=liveness,
                       registry=registry(collector))
