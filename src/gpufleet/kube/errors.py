"""Typed errors of the Kubernetes client layer: one class per answer a caller acts on.

Every failed call raises a :class:`KubeError` (``status``: the HTTP code,
0 when the server was not reached; ``reason``: the Status object's reason,
e.g. ``AlreadyExists``; ``message``: its message). Callers catch the
subclass they handle: :class:`NotFound` (404), :class:`Conflict` (409:
exists, or a UID/resourceVersion precondition failed), :class:`Expired`
(410: a watch's resourceVersion is too old), :class:`TooManyRequests` (429:
throttled, or the Eviction API refused because of a PodDisruptionBudget),
:class:`Forbidden` (403), :class:`Unauthorized` (401), :class:`Invalid`
(422), :class:`ServerError` (5xx) and :class:`Unreachable` (no answer:
connection refused, TLS failure, timeout). A write refused because this
process is not, or no longer, the leader of its Lease raises
:class:`LeadershipLost` before it is sent. A kubeconfig or in-cluster
configuration that cannot be used raises :class:`ConfigError`.
"""

from __future__ import annotations

import json
from typing import Any


class KubeError(RuntimeError):
    """The API server answered ``status`` (HTTP code; 0: no answer) with ``reason`` and ``message``.

    Attributes:
        status: HTTP status code, 0 when the server was not reached.
        reason: the Status object's ``reason`` (``NotFound``, ``AlreadyExists``...), may be empty.
        message: the Status object's ``message`` (at most 2,000 characters).
        path: ``METHOD /path`` of the call, for messages.
    """

    def __init__(self, status: int, reason: str, message: str, *, path: str = ""):
        super().__init__(f"{status} {reason}: {message}" + (f" ({path})" if path else ""))
        self.status = status
        self.reason = reason
        self.message = message
        self.path = path


class NotFound(KubeError):
    """404: the object (or its kind) does not exist."""


class Conflict(KubeError):
    """409: the object already exists, or its UID/resourceVersion precondition failed."""


class TooManyRequests(KubeError):
    """429: throttled (API priority and fairness), or the Eviction API refused because of a PodDisruptionBudget."""


class Expired(KubeError):
    """410: a watch's resourceVersion is too old; list again."""


class Forbidden(KubeError):
    """403: RBAC does not allow this call (the message names the verb, resource and user)."""


class Unauthorized(KubeError):
    """401: the credentials were refused (expired token, unknown client certificate)."""


class Invalid(KubeError):
    """422: the object failed validation (the message lists the fields)."""


class ServerError(KubeError):
    """5xx: the API server (or an admission webhook behind it) failed; retrying later may help."""


class Unreachable(KubeError):
    """No answer (status 0): connection refused or reset, TLS failure, DNS failure, timeout."""

    def __init__(self, message: str, *, path: str = ""):
        super().__init__(0, "Unreachable", message, path=path)


class LeadershipLost(KubeError):
    """A write refused without being sent: this process does not hold its Lease now (status 0).

    Raised by a client whose writes are fenced (:class:`gpufleet.kube.fence.Fence`):
    before the Lease is acquired, once the renew deadline has passed without
    a renewal, and for good once leadership was lost. Never worth retrying
    in the same process: it exits and restarts as a follower.
    """

    def __init__(self, message: str, *, path: str = ""):
        super().__init__(0, "LeadershipLost", message, path=path)


class ConfigError(ValueError):
    """No usable cluster configuration: the message names the kubeconfig (or in-cluster file) and what is wrong."""


_BY_STATUS: dict[int, type[KubeError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
                                          410: Expired, 422: Invalid, 429: TooManyRequests}


def error_from(status: int, body: bytes | str | dict | None, path: str = "") -> KubeError:
    """The :class:`KubeError` subclass for HTTP ``status`` and a Status object ``body`` (JSON text or dict)."""
    data: Any = body
    if isinstance(body, (bytes, str)):
        try:
            data = json.loads(body)
        except ValueError:
            data = {"message": body.decode(errors="replace") if isinstance(body, bytes) else body}
    reason = message = ""
    if isinstance(data, dict):
        reason, message = str(data.get("reason", "")), str(data.get("message", ""))
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else KubeError)
    return cls(status, reason, message[:2000], path=path)
