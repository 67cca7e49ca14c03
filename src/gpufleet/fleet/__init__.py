"""The fleet as data, no I/O: what a Node object says (ready, schedulable, GPUs, flavor),
schedulable GPU capacity per ResourceFlavor, and Kueue quota shares.

Roles (rendering ClusterQueues), quota sync, node health and ``invoke status``
all import these from below; nothing here talks to the API server.
"""
