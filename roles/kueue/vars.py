"""Typed variables of the kueue role (defaults and documentation: defaults.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gpufleet_admin.inventory.types import STRICT, DnsLabel, NonNegativeInt, PositiveInt


class ClusterQueueVars(BaseModel):
    """One ClusterQueue: its share of every flavor's capacity, or pinned GPUs per flavor."""

    model_config = STRICT

    name: DnsLabel
    share: PositiveInt = 1
    nominal_gpus: dict[str, NonNegativeInt] | None = None
    borrowing_limit_gpus: NonNegativeInt | None = None


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
    value: int = Field(ge=-2_147_483_648, le=1_000_000_000)
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
    kueue_cluster_queues: list[ClusterQueueVars] = Field(min_length=1)
    kueue_local_queues: list[LocalQueueVars]
    kueue_priority_classes: list[PriorityVars] = Field(min_length=2)
    kueue_workload_priority_classes: list[PriorityVars]
    kueue_topology_enabled: bool
    kueue_topology_name: DnsLabel
