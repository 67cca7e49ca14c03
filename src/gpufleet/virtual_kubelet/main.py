"""``gpufleet virtual-kubelet --pool NAME``: one virtual node for one external capacity pool.

Wiring (:class:`VirtualKubelet`): the pool's provider
(:func:`gpufleet.virtual_kubelet.providers.build`), the node side
(:class:`~gpufleet.virtual_kubelet.node.NodeController` and
:class:`~gpufleet.virtual_kubelet.lease.LeaseHeartbeat`), the pod side
(:class:`~gpufleet.virtual_kubelet.pods.PodController`), the kubelet API
for what the pods use (:mod:`gpufleet.virtual_kubelet.kubelet_api`, on
``kubelet_port``; the Node registers it as its kubelet endpoint), and
``/metrics`` + ``/healthz`` (:mod:`gpufleet.controllers.runtime`).
A node has one kubelet: the role runs one replica with ``Recreate``, so
there is no leader election.

Settings come from ``--config FILE`` (:mod:`gpufleet.virtual_kubelet.config`,
rendered by the virtual_kubelet role for one pool of the inventory: the
pool, the endpoint health check, the taints the node registers with); a
flag given overrides the file. Nothing else of the inventory is read.

Exit codes: 0 on SIGTERM/SIGINT; 2 for bad input (a bad file or flag value,
provider configuration errors: the message says what to fix); 1 when the
metrics port is in use or the cluster or the provider cannot be reached at
start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import Any

from gpufleet import cliargs
from gpufleet import componentconfig as cc
from gpufleet.controllers import runtime
from gpufleet.controllers.serve import Liveness
from gpufleet.kube import ConfigError, Kube, KubeError

from .config import Configuration, HealthSettings, load
from .kubelet_api import KubeletApi, KubeletApiError
from .lease import LeaseHeartbeat
from .node import NodeController, node_name_for
from .pods import PodController
from .provider import Provider, ProviderError, supports_stats
from .stats import PodStats

log = logging.getLogger("gpufleet.virtual_kubelet")


class VirtualKubelet:
    """A running virtual node: provider(s), Node, Lease, pod loop.

    Args:
        kube: client of the cluster the node joins.
        pool: the pool's name; provider_kind: its provider kind (for labels and taint).
        providers: ``{name: Provider}`` behind the node (usually one: the pool's).
        host_ip: the node's InternalIP.
        workers / resync_seconds / status_interval / lease_seconds: loop settings.
        register_taints: taints the Node is created with (:class:`~gpufleet.virtual_kubelet.node.NodeController`).
        kubelet_port: the kubelet API's port (0: not served; the Node registers port 0).
    """

    def __init__(self, kube: Kube, pool: str, provider_kind: str, providers: dict[str, Provider], *,
                 host_ip: str = "127.0.0.1", workers: int = 8, resync_seconds: float = 10.0,
                 status_interval: float = 60.0, lease_seconds: int = 40,
                 register_taints: list[dict[str, str]] | tuple = (), kubelet_port: int = 0, **pod_kwargs: Any):
        self.kube = kube
        self.pool = pool
        self.providers = providers
        self.node_name = node_name_for(pool)

        def capacity():
            caps = [p.capacity() for p in providers.values()]
            first = caps[0]
            from .provider import Capacity

            return Capacity(gpus=sum(c.gpus for c in caps), cpu=sum(c.cpu for c in caps),
                            memory_bytes=sum(c.memory_bytes for c in caps), pods=sum(c.pods for c in caps),
                            gpu_product=first.gpu_product, price_per_gpu_hour=min(c.price_per_gpu_hour for c in caps))

        self._stats_errors: dict[str, str] = {}
        self.kubelet_api = KubeletApi(kube, self.node_name, self.pod_stats, port=kubelet_port,
                                      host_ip=host_ip) if kubelet_port else None
        self.node = NodeController(kube, pool, provider_kind, capacity, internal_ip=host_ip,
                                   status_interval=status_interval, register_taints=register_taints,
                                   kubelet_port=kubelet_port)
        self.lease = LeaseHeartbeat(kube, self.node_name, lambda: self.node.uid, duration=lease_seconds)
        self.pods = PodController(kube, self.node_name, providers, host_ip=host_ip, workers=workers,
                                  resync_seconds=resync_seconds, **pod_kwargs)

    def pod_stats(self) -> tuple[list[PodStats], bool]:
        """What the node's pods use, from every provider that reports it, and whether one failed to."""
        out, failed = [], False
        for name, p in self.providers.items():
            if not supports_stats(p):
                continue
            try:
                out += p.pod_stats()
            except Exception as exc:  # noqa: BLE001 - a provider's failure is a scrape error, never a dead page
                failed = True
                # Every scrape (15 s) would repeat it: said when it starts or changes, and when it ends.
                if self._stats_errors.get(name) != str(exc):
                    log.warning("kubelet API: provider %s: usage: %s", name, exc)
                self._stats_errors[name] = str(exc)
            else:
                if self._stats_errors.pop(name, None) is not None:
                    log.info("kubelet API: provider %s reports usage again", name)
        return out, failed

    def start(self) -> "VirtualKubelet":
        """Start the kubelet API, register the Node, start the Lease, the status loop and the pod loop.

        Raises:
            KubeError: the API server refused or is unreachable.
            TimeoutError: the node's pods could not be listed.
            KubeletApiError: the kubelet API could not serve (its port in use).
        """
        if self.kubelet_api is not None:
            self.kubelet_api.start()
        self.node.register()
        self.lease.renew()
        self.lease.start()
        self.node.start()
        self.pods.start()
        return self

    def stop(self) -> None:
        """Stop every loop (remote pods stay; a restarted virtual kubelet adopts them)."""
        if self.kubelet_api is not None:
            self.kubelet_api.stop()
        self.pods.stop()
        self.node.stop()
        self.lease.stop()

    def close(self) -> None:
        """Stop, then close the providers' connections."""
        self.stop()
        for p in self.providers.values():
            closer = getattr(p, "close", None)
            if callable(closer):
                closer()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpufleet virtual-kubelet`` (the shared ones from :mod:`gpufleet.controllers.flags`).

    A setting's flag is checked by its field's own kind (:func:`gpufleet.componentconfig.flag_type`).
    """
    from gpufleet.controllers import flags

    def kind(field: str):
        return cc.flag_type(Configuration, field)

    flags.add_config(parser, role="virtual_kubelet", command="virtual-kubelet --pool NAME", required=True)
    parser.add_argument("--pool", default=None,
                        help="the pool of --config FILE (a check: the file holds one pool, this must name it)")
    flags.add_kube(parser, what=" of the cluster the node joins")
    parser.add_argument("--remote-kubeconfig", default=None,
                        help="kubernetes pools: kubeconfig of the other cluster (default: the mounted Secret, "
                             "else the pool's kubeconfig_secret read from the API)")
    parser.add_argument("--namespace-prefix", default="", help="kubernetes pools: remote namespace prefix")
    flags.add_metrics_port(parser)
    parser.add_argument("--kubelet-port", type=kind("kubelet_port"), default=None,
                        help="the kubelet API's port (/metrics/resource, /stats/summary; HTTPS, webhook "
                             "authentication and authorization); 0: not served (default: the file's kubelet_port)")
    parser.add_argument("--workers", type=cliargs.integer_type(1), default=8, help="pod reconcile threads, >= 1 (default 8)")
    parser.add_argument("--host-ip", default=os.environ.get("POD_IP", "127.0.0.1"),
                        help="the node's InternalIP (default $POD_IP)")
    parser.add_argument("--endpoint-health-interval", type=kind("endpoint_health.interval_seconds"), default=None,
                        help="seconds (>= 0) between TCP checks of the published endpoints; 0: off (default: the "
                             "file's endpoint_health.interval_seconds; off for a pool with endpoint_health_check false)")
    parser.add_argument("--endpoint-health-timeout", type=kind("endpoint_health.timeout_seconds"), default=None,
                        help="seconds (> 0, at most the interval) a check's connect may take (default: the file's "
                             "endpoint_health.timeout_seconds, at most the interval)")
    parser.add_argument("--endpoint-health-threshold", type=kind("endpoint_health.unhealthy_threshold"), default=None,
                        help="consecutive failed checks (>= 1) that publish an endpoint not ready (default: the "
                             "file's endpoint_health.unhealthy_threshold)")
    parser.add_argument("--register-with-taints", type=cliargs.taints, default=None, metavar="KEY[=VALUE]:EFFECT,...",
                        help="taints the Node is created with, as the kubelet's flag (an existing Node keeps its "
                             "own; '' for none); default: the file's register_with_taints, the taint controller's "
                             "free-GPU taint where the taint controller runs")
    flags.add_log_level(parser)


def configuration(args: argparse.Namespace) -> Configuration:
    """The configuration of ``--config FILE`` with the flags given applied over it.

    ``--endpoint-health-interval`` given turns the check on (or off, 0) even
    for a pool with ``endpoint_health_check`` false, and the file's timeout
    is held within it unless ``--endpoint-health-timeout`` is given too.

    Raises:
        gpufleet.componentconfig.ConfigFileError: a bad file or flag, or ``--pool`` naming another pool.
    """
    base = load(args.config)
    if args.pool is not None and args.pool != base.pool.name:
        raise cc.ConfigFileError([f"--pool {args.pool!r}: expected the pool of {args.config} ({base.pool.name!r}): "
                                  "a virtual kubelet's file holds its one pool"])
    interval, timeout = args.endpoint_health_interval, args.endpoint_health_timeout
    if interval is not None and timeout is None and interval:
        timeout = min(base.endpoint_health.timeout_seconds, interval)
    return cc.override(base, {
        "endpoint_health.interval_seconds": ("--endpoint-health-interval", interval),
        "endpoint_health.timeout_seconds": ("--endpoint-health-timeout", timeout),
        "endpoint_health.unhealthy_threshold": ("--endpoint-health-threshold", args.endpoint_health_threshold),
        "pool.endpoint_health_check": ("--endpoint-health-interval", True if interval else None),
        "register_with_taints": ("--register-with-taints", args.register_with_taints),
        "kubelet_port": ("--kubelet-port", args.kubelet_port),
    }, source=args.config)


def health_settings(config: Configuration) -> HealthSettings | None:
    """The endpoint health check the virtual kubelet runs: None when off (interval 0, or the pool's check off)."""
    if not config.pool.endpoint_health_check or not config.endpoint_health.interval_seconds:
        return None
    return config.endpoint_health


def build(args: argparse.Namespace) -> VirtualKubelet:
    """A :class:`VirtualKubelet` from parsed flags (not started).

    Raises:
        gpufleet.componentconfig.ConfigFileError: a bad file or flag value.
        ValueError: provider configuration error (bad input).
        ConfigError: unusable kubeconfig.
        ProviderError: the remote side did not answer.
    """
    from gpufleet.virtual_kubelet.providers import build as build_provider

    config = configuration(args)
    pool = config.pool
    kube = runtime.kube_from_args(args, user_agent=f"gpufleet-vk/{pool.name}")
    overrides = {"namespace_prefix": args.namespace_prefix} if pool.provider == "kubernetes" and args.namespace_prefix else {}
    provider = build_provider(pool, node_name=node_name_for(pool.name), kube=kube, namespace=config.namespace,
                              remote_kubeconfig=args.remote_kubeconfig, **overrides)
    return VirtualKubelet(kube, pool.name, pool.provider, {pool.name: provider}, host_ip=args.host_ip,
                          workers=args.workers, endpoint_health=health_settings(config),
                          register_taints=[t.api() for t in config.register_with_taints],
                          kubelet_port=config.kubelet_port)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (see the module docstring for exit codes)."""
    from gpufleet.virtual_kubelet.providers import ProviderConfigError

    runtime.setup_logging(args.log_level)
    if runtime.port_in_use("virtual-kubelet", args.metrics_port):  # before the Node is registered
        return 1
    try:
        vk = build(args)
    except (cc.ConfigFileError, ValueError, ConfigError, ProviderConfigError) as exc:
        print(f"gpufleet virtual-kubelet: {exc}", file=sys.stderr)
        return 2
    except ProviderError as exc:
        print(f"gpufleet virtual-kubelet: {exc}", file=sys.stderr)
        return 1
    try:
        vk.start()
    except KubeletApiError as exc:
        print(f"gpufleet virtual-kubelet: {exc} (--kubelet-port)", file=sys.stderr)
        return 1
    except (KubeError, TimeoutError, OSError) as exc:
        print(f"gpufleet virtual-kubelet: cannot start on {vk.kube.server}: {exc}", file=sys.stderr)
        return 1
    liveness = Liveness(max_age=120)
    log.info("virtual node %s up (pool %s)", vk.node_name, vk.pool)

    def loop(stop: threading.Event) -> None:
        while not stop.wait(5):
            if vk.lease.last_error is None:  # healthy while the node Lease renews
                liveness.beat()

    try:
        return runtime.run("virtual-kubelet", loop, metrics_port=args.metrics_port, liveness=liveness)
    finally:
        vk.close()
