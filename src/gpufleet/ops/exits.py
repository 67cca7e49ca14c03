"""Turning ops errors into clear task exits: 2 for bad input, 1 for an operation that cannot proceed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from invoke.exceptions import Exit

from gpufleet.kube import ConfigError, KubeError, Unreachable


@contextlib.contextmanager
def fail_on_ops_error(task: str) -> Iterator[None]:
    """Exit 2 on :class:`~gpufleet.ops.reads.InputError` or an unusable kubeconfig, 1 on other OpsErrors and API errors.

    One clear line each, never a traceback.
    """
    from gpufleet.ops.reads import InputError, OpsError

    try:
        yield
    except (InputError, ConfigError) as exc:
        raise Exit(f"{task}: {exc}", code=2) from None
    except OpsError as exc:
        raise Exit(f"{task}: {exc}", code=1) from None
    except Unreachable as exc:
        raise Exit(f"{task}: cannot reach the API server: {exc.message}", code=1) from None
    except KubeError as exc:
        raise Exit(f"{task}: the API server answered HTTP {exc.status}: {exc.message or exc.reason}", code=1) from None
    except OSError as exc:
        raise Exit(f"{task}: cannot reach the API server: {exc}", code=1) from None
