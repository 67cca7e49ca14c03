"""Quota sync's configuration: the quota policy plus how the controller runs; defaults and checks.

``gpufleet quota-sync --config FILE`` reads it (:func:`load`); the kueue
role builds it from the inventory and stack config (``roles/kueue/config.py``
says which variable feeds each field) and renders it into the controller's
ConfigMap; ``invoke quota.resync`` and ``invoke status`` build the same
object. The configuration *is* a :class:`gpufleet.fleet.quota_policy.QuotaPolicy`
(what the quota follows: queues, shares, pins, flavors, reserve) with the
settings of capacity and of the controller's loop. The defaults are written
here and in the policy only (the kueue role's ``defaults.yaml`` documents
them, ``tests/roles/test_component_config.py`` keeps the two equal), and so
are the checks.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpufleet import componentconfig as cc
from gpufleet.fleet.quota_policy import QuotaPolicy
from gpufleet.names import SYSTEM_NAMESPACE

#: ``kind`` of the file.
KIND = "QuotaSyncConfiguration"


class Configuration(QuotaPolicy):
    """Everything ``gpufleet quota-sync`` is configured with (the policy's fields, and these).

    Attributes:
        namespace: the controller's namespace (its Lease).
        partial_gpu_nodes_count: the remaining GPUs of a node whose allocatable fell below its capacity
            count toward training quota (the node classifier's switch, :mod:`gpufleet.fleet.classify`).
        subtract_unmanaged: subtract from quota what pods Kueue does not manage hold and request on
            schedulable nodes (GPUs, cores, bytes); the flip-out's victims excepted (below).
        reclaim_below_priority: pods holding GPUs with a priority below this (the highest PriorityClass,
            training's) are the flip-out's to take back, not subtracted; None: every such pod is.
        debounce_seconds: seconds to wait after a node event before resyncing (a burst gives one resync).
        resync_seconds: seconds between resyncs without node events (repairs quota edited by others).
    """

    namespace: cc.DnsLabel = SYSTEM_NAMESPACE
    partial_gpu_nodes_count: bool = False
    subtract_unmanaged: bool = True
    reclaim_below_priority: Annotated[int, Field(strict=True)] | None = 100000
    debounce_seconds: cc.Seconds = 1.0
    resync_seconds: cc.PositiveSeconds = 300.0


#: The defaults: what a controller started without ``--config`` runs with.
DEFAULTS = Configuration()


#: The file: ``load(path)`` reads and checks one, ``dump(config)`` writes one.
FILE = cc.ConfigFile(Configuration, KIND)
load = FILE.load
dump = FILE.dump
