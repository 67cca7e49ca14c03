"""The fleet as data, no I/O: what a Node object says (ready, schedulable, GPUs, flavor),
schedulable GPU capacity per ResourceFlavor, Kueue quota shares and the
quota policy that sizes each ClusterQueue from them, and the catalog of GPU models
(how each appears on a node).

Roles (rendering ClusterQueues), quota sync, node health and ``invoke status``
all import these from below; nothing here talks to the API server.
"""
