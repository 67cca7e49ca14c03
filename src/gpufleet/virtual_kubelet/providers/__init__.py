"""Providers behind a virtual node, and how a configured pool (:class:`gpufleet.virtual_kubelet.config.Pool`) becomes one.

* ``kubernetes`` (:class:`~gpufleet.virtual_kubelet.providers.kubernetes.KubernetesProvider`):
  another cluster, reached with the kubeconfig in the pool's Secret
  (``kubeconfig_secret``, key ``kubeconfig``; the role mounts it at
  :data:`MOUNTED_KUBECONFIG`), or a file given on the command line.
* any other kind: a provider another distribution registers under the
  entry-point group :data:`ENTRY_POINTS` (``<kind> = module:factory``), as
  virtual-kubelet's providers are plugins of their own. gpufleet's workshop
  registers ``simulated`` (:mod:`gpufleet_workshop.rental`: a GPU rental
  stand-in, installed where the workshop is: a developer's checkout and
  gpufleet's workshop image, never gpufleet's own image).
"""

from __future__ import annotations

import base64
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from gpufleet.fleet.catalog import GPU_MODELS
from gpufleet.kube import ConfigError, Kube, KubeError
from gpufleet.kube.config import from_kubeconfig, from_text

#: Entry-point group of provider plugins: ``<kind> = module:factory``, where
#: ``factory(pool, *, node_name, start, gpus, gpu_product, price_per_gpu_hour, max_pods, **overrides)``
#: returns the pool's provider (started unless ``start`` is false) and raises :class:`ProviderConfigError`.
ENTRY_POINTS = "gpufleet.providers"
#: Where the virtual_kubelet role mounts a kubernetes pool's kubeconfig Secret.
MOUNTED_KUBECONFIG = Path("/etc/gpufleet/remote/kubeconfig")


class ProviderConfigError(ValueError):
    """A pool's provider cannot be built (missing kubeconfig, bad Secret...); the message says what to fix."""


def remote_kubeconfig_text(pool: Any, kube: Kube | None, namespace: str, path: str | None) -> tuple[str, str]:
    """The kubeconfig YAML of a kubernetes pool and where it came from.

    Order: ``path`` if given, else :data:`MOUNTED_KUBECONFIG` if present,
    else the pool's Secret ``namespace/<kubeconfig_secret>`` key
    ``kubeconfig`` read through ``kube``.

    Raises:
        ProviderConfigError: none of these is available.
    """
    if path:
        p = Path(path)
        if not p.exists():
            raise ProviderConfigError(f"pool {pool.name}: --remote-kubeconfig {path} does not exist")
        return p.read_text(), str(p)
    if MOUNTED_KUBECONFIG.exists():
        return MOUNTED_KUBECONFIG.read_text(), str(MOUNTED_KUBECONFIG)
    if not pool.kubeconfig_secret:
        raise ProviderConfigError(f"pool {pool.name}: provider kubernetes needs kubeconfig_secret in the inventory "
                                  "or --remote-kubeconfig")
    if kube is None:
        raise ProviderConfigError(f"pool {pool.name}: no API client to read Secret {namespace}/{pool.kubeconfig_secret}")
    try:
        secret = kube.get("v1", "secrets", pool.kubeconfig_secret, namespace)
    except KubeError as exc:
        raise ProviderConfigError(f"pool {pool.name}: cannot read Secret {namespace}/{pool.kubeconfig_secret}: "
                                  f"{exc}") from None
    data = (secret.get("data") or {}).get("kubeconfig")
    if not data:
        raise ProviderConfigError(f"pool {pool.name}: Secret {namespace}/{pool.kubeconfig_secret} has no key "
                                  "'kubeconfig'")
    return base64.b64decode(data).decode(), f"Secret {namespace}/{pool.kubeconfig_secret}"


def build(pool: Any, *, node_name: str, kube: Kube | None = None, namespace: str = "gpufleet-system",
          remote_kubeconfig: str | None = None, start: bool = True, **overrides: Any):
    """The provider for pool ``pool`` (:class:`gpufleet.virtual_kubelet.config.Pool`).

    Args:
        pool: the pool's variables (name, provider, gpu_model, capacity_gpus,
            price_per_gpu_hour, kubeconfig_secret, start_latency_seconds,
            failure_rate, max_pods, address_mode).
        node_name: the virtual node's name.
        kube: client of the local cluster (to read the kubeconfig Secret).
        namespace: where the Secret lives (``virtual_kubelet_namespace``).
        remote_kubeconfig: a kubeconfig file overriding the Secret.
        start: start the provider (remote watch / notifier thread).
        overrides: extra keyword arguments for the provider class (tests: clock, seed).

    Raises:
        ProviderConfigError: unknown provider, unknown GPU model or no usable kubeconfig.
        gpufleet.virtual_kubelet.provider.ProviderError: the remote cluster did not answer.
    """
    model = GPU_MODELS.get(pool.gpu_model)
    if model is None:
        raise ProviderConfigError(f"pool {pool.name}: unknown gpu_model {pool.gpu_model!r}")
    common = dict(gpus=pool.capacity_gpus, gpu_product=model.product, price_per_gpu_hour=pool.price_per_gpu_hour,
                  max_pods=pool.max_pods, node_name=node_name)
    if pool.provider == "kubernetes":
        from gpufleet.virtual_kubelet.providers.kubernetes import KubernetesProvider

        text, source = remote_kubeconfig_text(pool, kube, namespace, remote_kubeconfig)
        try:
            cfg = from_text(text, source=source) if source.startswith("Secret") else from_kubeconfig(source)
        except ConfigError as exc:
            raise ProviderConfigError(f"pool {pool.name}: {exc}") from None
        overrides.setdefault("address_mode", pool.address_mode or "pod_ip")
        prov = KubernetesProvider(pool.name, Kube(cfg, user_agent=f"gpufleet-vk/{pool.name}"), **common, **overrides)
        return prov.start() if start else prov
    plugin = plugins().get(pool.provider)
    if plugin is None:
        raise ProviderConfigError(
            f"pool {pool.name}: provider {pool.provider!r} is not installed here (kinds: "
            f"{', '.join(['kubernetes', *sorted(plugins())])}); the simulated rental ships in gpufleet's workshop "
            "(the gpufleet-workshop image, or a checkout's development install), not in gpufleet's image")
    factory = plugin.load()
    common.pop("node_name")
    return factory(pool, node_name=node_name, start=start, **common, **overrides)


def plugins() -> dict:
    """Installed provider plugins: kind -> :class:`importlib.metadata.EntryPoint` (group :data:`ENTRY_POINTS`)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS)}
