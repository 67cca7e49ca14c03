"""Helpers shared by invoke tasks: turning known errors into clear exits."""

from __future__ import annotations

import contextlib
from typing import Iterator

from invoke.exceptions import Exit

from gpufleet_admin.inventory import InventoryError


@contextlib.contextmanager
def fail_on_inventory_error() -> Iterator[None]:
    """Exit 2 with the inventory's problems (file: key: value: expected) instead of a traceback."""
    try:
        yield
    except InventoryError as exc:
        raise Exit(str(exc), code=2) from None


def kube_for(env: str | None = None, kubeconfig: str | None = None, context: str | None = None, *,
             user_agent: str = "gpufleet"):
    """The API client a task uses (:class:`gpufleet.kube.Kube`).

    Sources in :func:`gpufleet.kube.config.load_config`'s order, with one
    step added for ``--env local``: when neither ``--kubeconfig`` nor
    ``$KUBECONFIG`` is given, the admin kubeconfig of the local cluster
    (``invoke local.up``), as ``invoke up --env local`` uses.

    Raises:
        gpufleet.ops.reads.InputError: no usable configuration (names the file, or says where none was found).
    """
    import os

    from gpufleet.kube import ConfigError, Kube
    from gpufleet.ops.reads import InputError

    if not kubeconfig and env == "local" and not os.environ.get("KUBECONFIG"):
        from gpufleet_workshop.local.layout import DEFAULT_NAME, Layout

        local = Layout(DEFAULT_NAME).kubeconfig
        if local.is_file():
            kubeconfig = str(local)
    try:
        return Kube.from_kubeconfig(kubeconfig or None, context or None, user_agent=user_agent)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
