"""The local cluster: a real Kubernetes control plane on loopback with simulated GPU nodes.

Modules, one job each:

* :mod:`~gpufleet.build.components` what to build, from ``versions.yaml`` (built by :mod:`gpufleet.build`)
* :mod:`~gpufleet.local.certs` the cluster PKI
* :mod:`~gpufleet.local.ports` loopback port blocks per cluster name
* :mod:`~gpufleet.local.layout` the state folder of one cluster
* :mod:`~gpufleet.local.processes` start, health-check, stop processes
* :mod:`~gpufleet.local.controlplane` etcd and Kubernetes command lines
* :mod:`~gpufleet.local.kwok` simulated nodes and kwok Stages
* :mod:`~gpufleet.local.kueue` Kueue and JobSet configuration, CRDs, webhooks
* :mod:`~gpufleet.local.webhooks` upstream webhook manifests pointed at loopback
* :mod:`~gpufleet.local.descheduler` descheduler command line and default policy
* :mod:`~gpufleet.local.prometheus` Prometheus configuration and file_sd targets
* :mod:`~gpufleet.local.apply` apply only what changed, wait for what must be served (client: :mod:`gpufleet.kube`)
* :mod:`~gpufleet.local.cluster` up / down / status

See ``README.md`` in this folder.
"""

from gpufleet.local.cluster import Cluster, down, get, status, up

__all__ = ["Cluster", "down", "get", "status", "up"]
