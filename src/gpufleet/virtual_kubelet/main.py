"""``gpufleet virtual-kubelet --pool NAME``: one virtual node for one external capacity pool.

Wiring (:class:`VirtualKubelet`): the pool's provider
(:func:`gpufleet.virtual_kubelet.providers.build`), the node side
(:class:`~gpufleet.virtual_kubelet.node.NodeController` and
:class:`~gpufleet.virtual_kubelet.lease.LeaseHeartbeat`), the pod side
(:class:`~gpufleet.virtual_kubelet.pods.PodController`), and ``/metrics`` + ``/healthz``
(:mod:`gpufleet.controllers.runtime`).
A node has one kubelet: the role runs one replica with ``Recreate``, so
there is no leader election.

Exit codes: 0 on SIGTERM/SIGINT; 2 for bad input (flag values outside their
range, unknown environment or pool, provider configuration errors: the
message says what to fix); 1 when the metrics port is in use or the cluster
or the provider cannot be reached at start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import Any

from gpufleet import cliargs
from gpufleet.controllers import runtime
from gpufleet.controllers.serve import Liveness
from gpufleet.kube import ConfigError, Kube, KubeError

from .endpoint_health import HealthSettings
from .lease import LeaseHeartbeat
from .node import NodeController, node_name_for
from .pods import PodController
from .provider import Provider, ProviderError

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
    """

    def __init__(self, kube: Kube, pool: str, provider_kind: str, providers: dict[str, Provider], *,
                 host_ip: str = "127.0.0.1", workers: int = 8, resync_seconds: float = 10.0,
                 status_interval: float = 60.0, lease_seconds: int = 40,
                 register_taints: list[dict[str, str]] | tuple = (), **pod_kwargs: Any):
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

        self.node = NodeController(kube, pool, provider_kind, capacity, internal_ip=host_ip,
                                   status_interval=status_interval, register_taints=register_taints)
        self.lease = LeaseHeartbeat(kube, self.node_name, lambda: self.node.uid, duration=lease_seconds)
        self.pods = PodController(kube, self.node_name, providers, host_ip=host_ip, workers=workers,
                                  resync_seconds=resync_seconds, **pod_kwargs)

    def start(self) -> "VirtualKubelet":
        """Register the Node, start the Lease, the status loop and the pod loop.

        Raises:
            KubeError: the API server refused or is unreachable.
            TimeoutError: the node's pods could not be listed.
        """
        self.node.register()
        self.lease.renew()
        self.lease.start()
        self.node.start()
        self.pods.start()
        return self

    def stop(self) -> None:
        """Stop every loop (remote pods stay; a restarted virtual kubelet adopts them)."""
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
    """Flags of ``gpufleet virtual-kubelet`` (the shared ones from :mod:`gpufleet.controllers.flags`)."""
    from gpufleet.controllers import flags

    parser.add_argument("--pool", required=True, help="pool name from virtual_kubelet_pools in the inventory")
    parser.add_argument("--env", default="local", help="inventory environment (default local)")
    flags.add_kube(parser, what=" of the cluster the node joins")
    parser.add_argument("--remote-kubeconfig", default=None,
                        help="kubernetes pools: kubeconfig of the other cluster (default: the mounted Secret, "
                             "else the pool's kubeconfig_secret read from the API)")
    parser.add_argument("--namespace-prefix", default="", help="kubernetes pools: remote namespace prefix")
    flags.add_metrics_port(parser)
    parser.add_argument("--workers", type=cliargs.integer_type(1), default=8, help="pod reconcile threads, >= 1 (default 8)")
    parser.add_argument("--host-ip", default=os.environ.get("POD_IP", "127.0.0.1"),
                        help="the node's InternalIP (default $POD_IP)")
    parser.add_argument("--endpoint-health-interval", type=cliargs.nonnegative_seconds, default=None,
                        help="seconds (>= 0) between TCP checks of the published endpoints; 0: off (default "
                             "virtual_kubelet_endpoint_health_interval_seconds, 2; off for a pool with "
                             "endpoint_health_check false)")
    parser.add_argument("--endpoint-health-timeout", type=cliargs.positive_seconds, default=None,
                        help="seconds (> 0, at most the interval) a check's connect may take (default "
                             "virtual_kubelet_endpoint_health_timeout_seconds, 1)")
    parser.add_argument("--endpoint-health-threshold", type=cliargs.integer_type(1), default=None,
                        help="consecutive failed checks (>= 1) that publish an endpoint not ready (default "
                             "virtual_kubelet_endpoint_health_unhealthy_threshold, 2)")
    parser.add_argument("--register-with-taints", type=cliargs.taints, default=[], metavar="KEY[=VALUE]:EFFECT,...",
                        help="taints the Node is created with, as the kubelet's flag (an existing Node keeps its "
                             "own); the virtual_kubelet role passes the taint controller's free-GPU taint")
    flags.add_log_level(parser)


def health_settings(v: Any, pool: Any, args: argparse.Namespace) -> HealthSettings | None:
    """The endpoint health check of ``pool`` from the role's variables ``v`` and the flags; None when off.

    Raises:
        ValueError: the timeout exceeds the interval (naming the flag).
    """
    interval = args.endpoint_health_interval
    if interval is None:
        interval = v.virtual_kubelet_endpoint_health_interval_seconds if pool.endpoint_health_check else 0
    if not interval:
        return None
    timeout = args.endpoint_health_timeout or v.virtual_kubelet_endpoint_health_timeout_seconds
    threshold = args.endpoint_health_threshold or v.virtual_kubelet_endpoint_health_unhealthy_threshold
    return HealthSettings(interval, min(timeout, interval) if args.endpoint_health_timeout is None else timeout,
                          threshold)


def build(args: argparse.Namespace) -> VirtualKubelet:
    """A :class:`VirtualKubelet` from parsed flags (not started).

    Raises:
        ValueError: unknown environment or pool, provider configuration error (bad input).
        ConfigError: unusable kubeconfig.
        ProviderError: the remote side did not answer.
    """
    from gpufleet_admin.inventory import InventoryError, environments
    from gpufleet.virtual_kubelet.providers import build as build_provider
    from roles.registry import load

    if args.env not in environments():
        raise ValueError(f"--env {args.env!r}: expected one of {', '.join(environments())}")
    try:
        inv = load(args.env)
    except InventoryError as exc:
        raise ValueError(str(exc)) from None
    v = inv.role("virtual_kubelet")
    pools = {p.name: p for p in v.virtual_kubelet_pools}
    if args.pool not in pools:
        raise ValueError(f"--pool {args.pool!r}: no such pool in inventories/{args.env} "
                         f"(known: {', '.join(pools) or 'none'})")
    pool = pools[args.pool]
    health = health_settings(v, pool, args)
    kube = runtime.kube_from_args(args, user_agent=f"gpufleet-vk/{pool.name}")
    overrides = {"namespace_prefix": args.namespace_prefix} if pool.provider == "kubernetes" and args.namespace_prefix else {}
    provider = build_provider(pool, node_name=node_name_for(pool.name), kube=kube, namespace=v.virtual_kubelet_namespace,
                              remote_kubeconfig=args.remote_kubeconfig, **overrides)
    return VirtualKubelet(kube, pool.name, pool.provider, {pool.name: provider}, host_ip=args.host_ip,
                          workers=args.workers, endpoint_health=health, register_taints=args.register_with_taints)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (see the module docstring for exit codes)."""
    from gpufleet.virtual_kubelet.providers import ProviderConfigError

    runtime.setup_logging(args.log_level)
    if runtime.port_in_use("virtual-kubelet", args.metrics_port):  # before the Node is registered
        return 1
    try:
        vk = build(args)
    except (ValueError, ConfigError, ProviderConfigError) as exc:
        print(f"gpufleet virtual-kubelet: {exc}", file=sys.stderr)
        return 2
    except ProviderError as exc:
        print(f"gpufleet virtual-kubelet: {exc}", file=sys.stderr)
        return 1
    try:
        vk.start()
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
