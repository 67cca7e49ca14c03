"""Typed variables of the kueue role (defaults and documentation: defaults.yaml).

A ClusterQueue is the quota policy's (:mod:`gpufleet.fleet.quota_policy`: its
share's default and its checks are there) with what only its object carries;
what spans queues (unique names, pins naming a flavor of the inventory) is
checked by the policy when the inventory is loaded (``roles/kueue/config.py``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gpufleet.fleet.quota_policy import ClusterQueue
from gpufleet.kube.validation import HIGHEST_USER_PRIORITY
from gpufleet_admin.inventory.types import STRICT, DnsLabel, NonNegativeInt, PositiveInt


class ClusterQueueVars(ClusterQueue):
    """One ClusterQueue: its share of every flavor's capacity, or pinned GPUs per flavor (the quota policy's
    :class:`~gpufleet.fleet.quota_policy.ClusterQueue`), and what it may borrow from the cohort."""

    borrowing_limit_gpus: NonNegativeInt | None = None

    def policy(self) -> ClusterQueue:
        """The queue as the quota policy takes it (without what only the ClusterQueue object carries)."""
        return ClusterQueue.model_validate(self.model_dump(exclude={"borrowing_limit_gpus"}))


class LocalQueueVars(BaseModel):
    """A team's LocalQueue: ``namespace/name`` submitting to ``cluster_queue``."""

    model_config = STRICT

    namespace: DnsLabel
    name: DnsLabel
    cluster_queue: DnsLabel


class PriorityVars(BaseModel):
    """A PriorityClass or WorkloadPriorityClass: name and integer value (higher wins)."""

    model_config = STRICT

    name: DnsLabel
    value: int = Field(ge=-2_147_483_648, le=HIGHEST_USER_PRIORITY)
    description: str = ""
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"


class Vars(BaseModel):
    """Variables of the kueue role."""

    model_config = STRICT

    kueue_enabled: bool
    kueue_install: bool
    kueue_namespace: DnsLabel
    kueue_wait_for_pods_ready_timeout_seconds: PositiveInt
    kueue_cohort: DnsLabel
    kueue_reserve_gpus: NonNegativeInt
    kueue_quota_sync_enabled: bool
    kueue_quota_sync_namespace: DnsLabel
    kueue_partial_gpu_nodes_count: bool
    kueue_quota_subtract_unmanaged_gpus: bool
    kueue_cluster_queues: list[ClusterQueueVars]
    kueue_local_queues: list[LocalQueueVars]
    kueue_priority_classes: list[PriorityVars] = Field(min_length=2)
    kueue_workload_priority_classes: list[PriorityVars]
    kueue_topology_enabled: bool
    kueue_topology_name: DnsLabel
