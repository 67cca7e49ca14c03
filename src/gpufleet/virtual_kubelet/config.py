"""A virtual kubelet's configuration: its pool, how it registers, how it checks endpoints; defaults and checks.

``gpufleet virtual-kubelet --config FILE`` reads it (:func:`load`); the
virtual_kubelet role builds one per pool of ``virtual_kubelet_pools`` from
the inventory and stack config (``roles/virtual_kubelet/config.py`` says
which variable feeds each field) and renders it into that virtual kubelet's
ConfigMap. :class:`Pool` is also the element type of the role's
``virtual_kubelet_pools`` variable: a pool is described, defaulted and
checked once. Flags set a field by hand and win over the file. The
defaults are written here only (the role's ``defaults.yaml`` documents
them, ``tests/roles/test_component_config.py`` keeps the two equal).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from gpufleet import componentconfig as cc
from gpufleet.cliargs import TAINT_EFFECTS
from gpufleet.fleet.catalog import KnownGpuModel
from gpufleet.names import FREE_GPUS_EFFECT, FREE_GPUS_TAINT, SYSTEM_NAMESPACE

#: ``kind`` of the file.
KIND = "VirtualKubeletConfiguration"


class Pool(BaseModel):
    """One external capacity pool behind a virtual node (an element of ``virtual_kubelet_pools``).

    Attributes:
        name: the pool (a DNS label); its node is ``vk-<name>``.
        provider: ``kubernetes`` (another cluster, through a kubeconfig Secret) or ``simulated``
            (a GPU rental API stand-in with start latency and failures).
        gpu_model: the GPU model the pool rents (a catalog name, :mod:`gpufleet.fleet.catalog`).
        capacity_gpus: GPUs the pool gives at most.
        price_per_gpu_hour: USD per GPU-hour (the provider choice prefers cheaper).
        kubeconfig_secret: Secret (key ``kubeconfig``) of the other cluster (provider kubernetes).
        start_latency_seconds, failure_rate: the simulated provider's pod start latency and failure share.
        max_pods: pods the virtual node takes at most.
        address_mode: kubernetes pools: how the main cluster reaches their pods (``pod_ip``, the default:
            the clusters share a pod network; ``load_balancer``: a remote LoadBalancer Service per workload).
        instances: simulated pools: how a rental's instance serves (``none``: an endpoint in 198.18.0.0/15
            that nothing routes; ``local_process``: a local process beside the virtual kubelet).
        endpoint_health_check: check the pool's published addresses (off where they cannot be reached).
    """

    model_config = cc.STRICT

    name: cc.DnsLabel
    provider: Literal["kubernetes", "simulated"]
    gpu_model: KnownGpuModel
    capacity_gpus: cc.PositiveInt
    price_per_gpu_hour: float = Field(gt=0)
    kubeconfig_secret: cc.DnsLabel | None = None
    start_latency_seconds: float = Field(default=0, ge=0)
    failure_rate: float = Field(default=0, ge=0, le=1)
    max_pods: cc.NonNegativeInt = 1000
    address_mode: Literal["pod_ip", "load_balancer"] | None = None
    instances: Literal["none", "local_process"] = "none"
    endpoint_health_check: bool = True

    @model_validator(mode="after")
    def _per_provider(self) -> "Pool":
        if self.address_mode is not None and self.provider != "kubernetes":
            raise ValueError(f"address_mode {self.address_mode!r} applies to provider kubernetes only "
                             f"(pool {self.name!r} has provider {self.provider!r}, whose pods are reached at "
                             "the endpoints the provider reports)")
        if self.instances != "none" and self.provider != "simulated":
            raise ValueError(f"instances {self.instances!r} applies to provider simulated only (pool {self.name!r} "
                             f"has provider {self.provider!r})")
        return self


class HealthSettings(BaseModel):
    """How published endpoints are checked (:mod:`gpufleet.virtual_kubelet.endpoint_health`).

    A TCP connect to every address published for pods running outside, as a
    cloud load balancer checks its targets; ``unhealthy_threshold``
    consecutive failures publish the address not ready, one success ready
    again. Google Cloud's load-balancer checks default to 5 s / 5 s / 2
    failures; requests must leave a dead endpoint within seconds here, hence
    shorter.

    Attributes:
        interval_seconds: seconds between rounds; 0 turns the check off.
        timeout_seconds: seconds a connect may take (> 0, at most the interval).
        unhealthy_threshold: consecutive failures that mark an address unreachable (>= 1).
    """

    model_config = cc.STRICT

    interval_seconds: cc.Seconds = 2.0
    timeout_seconds: cc.PositiveSeconds = 1.0
    unhealthy_threshold: cc.PositiveCount = 2

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> "HealthSettings":
        if self.interval_seconds and self.timeout_seconds > self.interval_seconds:
            raise ValueError("timeout_seconds at most interval_seconds")
        return self


class Taint(BaseModel):
    """A taint as the API writes it (``key``, ``value`` when there is one, ``effect``)."""

    model_config = cc.STRICT

    key: str = Field(min_length=1)
    value: str | None = None
    effect: Literal[TAINT_EFFECTS]

    def api(self) -> dict[str, str]:
        """The taint as a Node's ``spec.taints`` entry."""
        return self.model_dump(exclude_none=True)


#: The taint the taint controller manages: a node registered with it is closed until the controller opens it.
FREE_GPUS = Taint(key=FREE_GPUS_TAINT, effect=FREE_GPUS_EFFECT)


class Configuration(BaseModel):
    """Everything ``gpufleet virtual-kubelet`` is configured with.

    Attributes:
        pool: the pool this virtual kubelet runs (required: nothing to default it from).
        namespace: where the pool's kubeconfig Secret is (``virtual_kubelet_namespace``).
        endpoint_health: the check of the published endpoints (off for a pool with
            ``endpoint_health_check`` false).
        register_with_taints: taints the Node is created with (the kubelet's ``registerWithTaints``;
            an existing Node keeps its own): closed with the free-GPU taint, so no inference goes
            outside before the taint controller has decided the cluster is short of GPUs; none where
            no taint controller runs (nothing would open it).
        kubelet_port: the port of the kubelet API the node registers as its kubelet endpoint
            (``/metrics/resource``, ``/stats/summary`` for metrics-server; the kubelet's 10250); 0: not served.
    """

    model_config = cc.STRICT

    pool: Pool
    namespace: cc.DnsLabel = SYSTEM_NAMESPACE
    endpoint_health: HealthSettings = HealthSettings()
    register_with_taints: tuple[Taint, ...] = (FREE_GPUS,)
    kubelet_port: cc.Port0 = 10250


#: The file: ``load(path)`` reads and checks one, ``dump(config)`` writes one.
FILE = cc.ConfigFile(Configuration, KIND)
load = FILE.load
dump = FILE.dump
