"""gpufleet's one Kubernetes client layer: configuration, client, errors, watch cache, work queue, leader election.

Every part of gpufleet talks to the API server through this package, and
no other module imports a Kubernetes client library. It is built on the
official ``kubernetes`` client (kubeconfig loading with exec plugins,
in-cluster service-account tokens refreshed, urllib3 connection pools),
and keeps objects as plain JSON dicts.

* :mod:`~gpufleet.kube.config`: which cluster and credentials, decided once;
* :mod:`~gpufleet.kube.client`: :class:`Kube` (get/list/create/patch/replace/
  delete/evict, server-side apply, watch) and :func:`api_path`;
* :mod:`~gpufleet.kube.errors`: :class:`KubeError` and its subclasses;
* :mod:`~gpufleet.kube.informer` and :mod:`~gpufleet.kube.workqueue`: the
  watch cache and work queue controllers share, with the queue's
  per-key rate limiters in :mod:`~gpufleet.kube.ratelimit`;
* :mod:`~gpufleet.kube.leader`: leader election through a Lease, and
  :mod:`~gpufleet.kube.fence`: the client's writes only while it is held;
* :mod:`~gpufleet.kube.retry`: backoff and retry policy;
* :mod:`~gpufleet.kube.events`, :mod:`~gpufleet.kube.times`,
  :mod:`~gpufleet.kube.quantity`: Events, API timestamps, quantities.
"""

from __future__ import annotations

from .client import Kube, api_path
from .config import ClusterConfig, load_config
from .errors import (
    ConfigError, Conflict, Expired, Forbidden, Invalid, KubeError, LeadershipLost, NotFound, ServerError,
    TooManyRequests, Unauthorized, Unreachable,
)

__all__ = ["ClusterConfig", "ConfigError", "Conflict", "Expired", "Forbidden", "Invalid", "Kube", "KubeError",
           "LeadershipLost", "NotFound", "ServerError", "TooManyRequests", "Unauthorized", "Unreachable", "api_path",
           "load_config"]
