"""The local cluster: a real Kubernetes control plane on loopback with simulated GPU nodes.

Modules, one job each:

* :mod:`~gpufleet_workshop.local.components` what to build, from ``versions.yaml`` (built by :mod:`gpufleet.build`)
* :mod:`~gpufleet_workshop.local.certs` the cluster PKI
* :mod:`~gpufleet_workshop.local.ports` loopback port blocks per cluster name
* :mod:`~gpufleet_workshop.local.layout` the state folder of one cluster
* :mod:`~gpufleet_workshop.local.processes` start, health-check, stop processes
* :mod:`~gpufleet_workshop.local.controlplane` etcd and Kubernetes command lines
* :mod:`~gpufleet_workshop.local.kwok` simulated nodes and kwok Stages
* :mod:`~gpufleet_workshop.local.kueue` Kueue and JobSet configuration, CRDs, webhooks
* :mod:`~gpufleet_workshop.local.webhooks` upstream webhook manifests pointed at loopback
* :mod:`~gpufleet_workshop.local.descheduler` descheduler command line and default policy
* :mod:`~gpufleet_workshop.local.prometheus` Prometheus configuration and file_sd targets
* :mod:`~gpufleet_workshop.local.apply` apply only what changed, wait for what must be served (client: :mod:`gpufleet.kube`)
* :mod:`~gpufleet_workshop.local.cluster` up / down / status

See ``README.md`` in this folder.
"""

from gpufleet_workshop.local.cluster import Cluster, down, get, status, up

__all__ = ["Cluster", "down", "get", "status", "up"]
