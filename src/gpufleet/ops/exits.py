"""Turning ops errors into clear task exits: 2 for bad input, 1 for an operation that cannot proceed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from invoke.exceptions import Exit
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error


@contextlib.contextmanager
def fail_on_ops_error(task: str) -> Iterator[None]:
    """Exit 2 on :class:`~gpufleet.ops.kube.InputError`, 1 on other OpsErrors and API errors, with one clear line."""
    from gpufleet.ops.kube import InputError, OpsError, api_error

    try:
        yield
    except InputError as exc:
        raise Exit(f"{task}: {exc}", code=2) from None
    except OpsError as exc:
        raise Exit(f"{task}: {exc}", code=1) from None
    except ApiException as exc:
        raise Exit(f"{task}: the API server answered HTTP {exc.status}: {api_error(exc)}", code=1) from None
    except (OSError, Urllib3Error) as exc:
        raise Exit(f"{task}: cannot reach the API server: {exc}", code=1) from None
