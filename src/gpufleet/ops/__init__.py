"""Day-2 operations on nodes: swap out, return, degrade, drain, status.

Pure reading of Nodes in :mod:`~gpufleet.ops.nodes`, the names every part
shares in :mod:`~gpufleet.ops.names`, API helpers in :mod:`~gpufleet.ops.kube`,
the drain in :mod:`~gpufleet.ops.drain`, swap/return/degrade in
:mod:`~gpufleet.ops.swap`, the status screen in :mod:`~gpufleet.ops.status`.
"""
