"""The flags every gpufleet process shares, spelled the same in every command.

* ``--config FILE``: the component's configuration file (:mod:`gpufleet.componentconfig`),
  and ``--env``, kept so old command lines parse: it says what replaced it;
* ``--log-level`` (every command);
* ``--metrics-port``: the ``/metrics`` and ``/healthz`` port (commands that
  had ``--port`` keep it as a deprecated alias that prints a note);
* ``--kubeconfig``, ``--context``: which cluster (:func:`gpufleet.kube.config.load_config`);
* ``--leader-elect`` / ``--no-leader-elect`` and the Lease timings
  ``--leader-elect-lease-duration``, ``--leader-elect-renew-deadline``,
  ``--leader-elect-retry-period`` (kube-scheduler's names); the older
  ``--no-leader-election`` keeps working as a deprecated alias.

Values are checked by :mod:`gpufleet.cliargs` (argparse exits 2 naming the
flag, the value and what is expected).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from typing import TYPE_CHECKING

from gpufleet import cliargs

if TYPE_CHECKING:  # imported where used: a command without leader election never loads the client
    from gpufleet.kube.leader import Timings


class DeprecatedAlias(argparse.Action):
    """An old flag name: stores like ``replacement`` and prints a one-line note to stderr.

    Pass ``replacement`` (the new spelling, for the note) and, for a switch,
    ``const`` (the value it stores; ``nargs=0``).
    """

    def __init__(self, option_strings: list[str], dest: str, replacement: str, nargs: Any = None,
                 const: Any = None, **kwargs: Any):
        self.replacement = replacement
        super().__init__(option_strings, dest, nargs=nargs, const=const, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated; use {self.replacement} (same meaning)", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


class NoLongerUsed(argparse.Action):
    """A flag kept so that existing command lines still parse: it does nothing and prints what replaced it.

    Pass ``note`` (what to use instead); the value, if the flag takes one, is read and dropped.
    """

    def __init__(self, option_strings: list[str], dest: str, note: str, nargs: Any = None, **kwargs: Any):
        self.note = note
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated and has no effect: {self.note}", file=sys.stderr)


def add_config(parser: argparse.ArgumentParser, *, role: str, command: str, required: bool = False) -> None:
    """``--config FILE`` (the component's configuration file) and the deprecated ``--env``.

    Args:
        role: the role that renders the file (for the help).
        command: the ``gpufleet`` command (for the help: how to get a file by hand).
        required: the command cannot run on defaults (a virtual kubelet needs its pool).
    """
    by_hand = f"invoke config --env ENV --component {command} --out FILE"
    parser.add_argument("--config", metavar="FILE", required=required,
                        help=f"configuration file, as the {role} role renders it from the inventory and stack config "
                             f"(by hand: {by_hand}); flags given override it"
                             + ("" if required else "; without it, the defaults"))
    parser.add_argument("--env", action=NoLongerUsed, metavar="ENV",
                        note=f"settings come from --config FILE, which the {role} role renders from the inventory "
                             f"and stack config (by hand: {by_hand})",
                        help="deprecated, has no effect (the inventory is no longer read here): use --config FILE")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` (:data:`gpufleet.cliargs.LOG_LEVELS`, default INFO)."""
    cliargs.add_log_level(parser)


def add_metrics_port(parser: argparse.ArgumentParser, *, default: int = 8080, allow_off: bool = True,
                     port_alias: bool = False, what: str = "/metrics and /healthz") -> None:
    """``--metrics-port`` (and, with ``port_alias``, the deprecated ``--port``), stored as ``metrics_port``.

    Args:
        default: the default port.
        allow_off: 0 turns the endpoint off (controllers); otherwise 1..65535 (the exporter must listen).
        port_alias: the command had ``--port``: keep it working, with a deprecation note.
    """
    kind: Callable[[str], int] = cliargs.port_or_off if allow_off else cliargs.port
    span = "0 to 65535 (0: off)" if allow_off else "1 to 65535"
    parser.add_argument("--metrics-port", type=kind, default=default, dest="metrics_port",
                        help=f"{what} port, {span} (default {default})")
    if port_alias:
        parser.add_argument("--port", type=kind, dest="metrics_port", action=DeprecatedAlias,
                            replacement="--metrics-port", help="deprecated: --metrics-port")


def add_kube(parser: argparse.ArgumentParser, *, what: str = "") -> None:
    """``--kubeconfig`` and ``--context`` (the order of sources is :func:`gpufleet.kube.config.load_config`'s)."""
    parser.add_argument("--kubeconfig", default=None,
                        help=f"kubeconfig{what} (default: $KUBECONFIG, in-cluster service account, ~/.kube/config)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: its current-context)")


def add_leader_election(parser: argparse.ArgumentParser) -> None:
    """``--leader-elect`` (default on), its timings, and the deprecated ``--no-leader-election``."""
    from gpufleet.kube.leader import LEASE_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_SECONDS

    parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True, dest="leader_elect",
                        help="act only while holding the Lease, one active instance (default on; "
                             "--no-leader-elect for a single instance or tests)")
    parser.add_argument("--no-leader-election", action=DeprecatedAlias, nargs=0, const=False, dest="leader_elect",
                        replacement="--no-leader-elect", help="deprecated: --no-leader-elect")
    for flag, default, what in (("lease-duration", LEASE_SECONDS, "a follower waits after the last renewal"),
                                ("renew-deadline", RENEW_DEADLINE_SECONDS, "the leader keeps trying to renew"),
                                ("retry-period", RETRY_SECONDS, "between attempts")):
        parser.add_argument(f"--leader-elect-{flag}", type=cliargs.positive_seconds, default=default,
                            help=f"seconds (> 0) {what} (default {default:g})")


def timings(args: argparse.Namespace) -> Timings:
    """The Lease :class:`~gpufleet.kube.leader.Timings` from parsed flags.

    Raises:
        ValueError: not lease duration > renew deadline > retry period (names the three flags).
    """
    from gpufleet.kube.leader import Timings

    try:
        return Timings(args.leader_elect_lease_duration, args.leader_elect_renew_deadline,
                       args.leader_elect_retry_period)
    except ValueError as exc:
        raise ValueError(f"--leader-elect-lease-duration/--leader-elect-renew-deadline/--leader-elect-retry-period: "
                         f"{exc}") from None
