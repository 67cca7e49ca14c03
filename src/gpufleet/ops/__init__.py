"""Day-2 operations on nodes: swap out, return, degrade, drain.

Pure reading of Nodes in :mod:`~gpufleet.fleet.nodes`, the names every part
shares in :mod:`~gpufleet.names`, API helpers in :mod:`~gpufleet.ops.reads`,
the drain in :mod:`~gpufleet.ops.drain`, swap/return/degrade in
:mod:`~gpufleet.ops.swap`, the status screen lives with the tasks (:mod:`~gpufleet_workshop.tasks.fleet_status`).
"""
