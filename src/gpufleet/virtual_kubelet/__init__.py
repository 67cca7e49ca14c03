"""gpufleet's virtual kubelet: external GPU capacity as a Node of the cluster.

Seams as in virtual-kubelet/virtual-kubelet: the node side
(:mod:`~gpufleet.virtual_kubelet.node` for the Node and its status,
:mod:`~gpufleet.virtual_kubelet.lease` for the Lease heartbeat), the pod side
(:mod:`~gpufleet.virtual_kubelet.pods`, one reconcile loop), and the provider protocol
(:mod:`~gpufleet.virtual_kubelet.provider`) that the two sides alone see. Providers live
in :mod:`gpufleet.virtual_kubelet.providers` (``kubernetes``, ``simulated``);
:mod:`~gpufleet.virtual_kubelet.translate` says what of a pod is kept, dropped or
refused remotely; :mod:`~gpufleet.virtual_kubelet.endpoints` publishes the node's pods
into the Services that select them, at the addresses the providers report;
:mod:`~gpufleet.virtual_kubelet.reflect` takes the ConfigMaps and Secrets pods reference
to their provider. It talks to the API server through :mod:`gpufleet.kube` (client, watch
cache, work queue). Entry point: ``gpufleet virtual-kubelet``
(:mod:`~gpufleet.virtual_kubelet.main`). See README.md.
"""
