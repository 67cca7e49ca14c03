"""The taint controller's configuration: one typed, frozen model, its defaults and its checks.

``gpufleet taint-controller --config FILE`` reads it (:func:`load`); the
taint_controller role builds it from the inventory and stack config
(``roles/taint_controller/config.py`` says which variable feeds each field)
and renders it into the controller's ConfigMap. Flags set a field by hand
and win over the file (``main.py``). This module is the one place the
defaults are written (``roles/*/defaults.yaml`` document them for the
inventory, and ``tests/roles/test_component_config.py`` keeps the two
equal) and the one place the values are checked: the flags and the
inventory variables take the same kinds (:mod:`gpufleet.componentconfig`).

Units: GPUs for the marks, seconds for times, pods per minute for the
flip-back budget.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from gpufleet import componentconfig as cc
from gpufleet.names import FLIP_MODES, SURGE_PRIORITY_CLASS

from .constants import TICK_SECONDS

#: ``kind`` of the file.
KIND = "TaintControllerConfiguration"

#: Where the free-GPU signal comes from: a watch cache of Nodes and Pods, or a PromQL query.
Signal = Literal["apiserver", "prometheus"]
#: How the flip-out moves an inference pod off a node training needs (:data:`gpufleet.names.FLIP_MODES`).
FlipMode = Literal[FLIP_MODES]
#: How the flip-back moves pods back: label them for the descheduler, evict them here, or not at all.
FlipBackMode = Literal["release", "evict", "off"]

#: A PromQL expression (not empty).
PromQL = Annotated[str, Field(min_length=1)]

#: The free-GPU PromQL of ``signal: prometheus``: allocatable GPUs of real nodes minus what pods request there.
PROMQL = ('sum(kube_node_status_allocatable{resource="nvidia_com_gpu",node!~"vk-.*"}) '
          '- sum(kube_pod_container_resource_requests{resource="nvidia_com_gpu",node!~"vk-.*"})')


#: The most reservations worked on at once: the client's pool holds 32 connections, of which each watch
#: (nodes, pods, Services, EndpointSlices, gpufleet's slices, node Leases, the Deployments of each
#: inference namespace) holds one for as long as it lasts.
MAX_CONCURRENT_SYNCS = 16


class Configuration(BaseModel):
    """Everything ``gpufleet taint-controller`` is configured with.

    Attributes:
        high_water_gpus: free GPUs above which, for the add hold time, every virtual node is tainted.
        low_water_gpus: free GPUs below which, for the remove hold time, the taint is removed; below
            ``high_water_gpus`` (hysteresis: no flapping).
        hold_seconds: how long a mark must be crossed before acting, both ways.
        add_hold_seconds, remove_hold_seconds: the two hold times apart (None: ``hold_seconds``, the
            rule of :class:`gpufleet.taint_controller.decision.Hysteresis`).
        signal: ``apiserver`` (watch caches) or ``prometheus`` (``promql`` at ``prometheus_url``).
        promql: PromQL giving the free GPUs (signal prometheus).
        prometheus_url: Prometheus base URL (signal prometheus).
        flip_mode: ``make_before_break`` (a replacement outside is Ready and published before each
            flip-out eviction) or ``evict_first``.
        surge_max_wait_seconds: make before break: after a node's reservation, past this a pod is
            evicted without a Ready replacement (training always wins).
        surge_priority_class: make before break: the PriorityClass of the replacements outside
            (:data:`gpufleet.names.SURGE_PRIORITY_CLASS`, which the taint_controller role declares with the
            controller: it must exist, or kube-apiserver refuses the surges' pods); None: the workload's own
            (they then wait in kube-scheduler's queue behind the training they make room for).
        pools: the pools whose virtual nodes are managed (empty: every virtual node).
        flip_out: make room for pending training pods (reserve a node, evict inference there).
        flip_out_priority_classes: PriorityClasses of the pods the flip-out makes room for.
        flip_out_max_wait_seconds: seconds of PDB refusals after which the flip-out deletes victims.
        flip_out_concurrent_syncs: reservations the flip-out works on at once (their requests in parallel;
            kube-controller-manager's ``--concurrent-*-syncs``), within the client's connection pool.
        flip_back: ``release`` (label pods for the descheduler), ``evict`` (the Eviction API here) or ``off``.
        flip_back_pods_per_minute: the flip-back budget per workload
            (:class:`gpufleet.taint_controller.budget.MigrationBudget`).
        flip_back_max_in_flight: released pods per workload not yet gone, at most.
        tick_seconds: seconds between ticks (signal sample, decision, reconcile).
    """

    model_config = cc.STRICT

    high_water_gpus: cc.Count = 16
    low_water_gpus: cc.Count = 8
    hold_seconds: cc.Seconds = 60.0
    add_hold_seconds: cc.Seconds | None = None
    remove_hold_seconds: cc.Seconds | None = None
    signal: Signal = "apiserver"
    promql: PromQL = PROMQL
    prometheus_url: cc.HttpUrl = "http://prometheus.monitoring:9090"
    flip_mode: FlipMode = "make_before_break"
    surge_max_wait_seconds: cc.Seconds = 180.0
    surge_priority_class: cc.DnsLabel | None = SURGE_PRIORITY_CLASS
    pools: tuple[cc.DnsLabel, ...] = ()
    flip_out: bool = True
    flip_out_priority_classes: tuple[cc.DnsLabel, ...] = Field(default=("gpufleet-training",), min_length=1)
    flip_out_max_wait_seconds: cc.Seconds = 300.0
    flip_out_concurrent_syncs: cc.PositiveCount = Field(default=8, le=MAX_CONCURRENT_SYNCS)
    flip_back: FlipBackMode = "release"
    flip_back_pods_per_minute: cc.PositiveNumber = 10.0
    flip_back_max_in_flight: cc.PositiveCount = 2
    tick_seconds: cc.PositiveSeconds = TICK_SECONDS

    @model_validator(mode="after")
    def _hysteresis(self) -> "Configuration":
        if self.low_water_gpus >= self.high_water_gpus:
            raise ValueError("low_water_gpus below high_water_gpus (hysteresis)")
        return self


#: The defaults: what a controller started without ``--config`` runs with (the pure parts' keyword defaults).
DEFAULTS = Configuration()


#: The file: ``load(path)`` reads and checks one, ``dump(config)`` writes one.
FILE = cc.ConfigFile(Configuration, KIND)
load = FILE.load
dump = FILE.dump
