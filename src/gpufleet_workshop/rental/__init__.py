"""A simulated GPU rental: the ``simulated`` provider of gpufleet's virtual kubelet, for the local environment and tests.

:mod:`~gpufleet_workshop.rental.provider` is the rental API stand-in
(capacity, start latency, injected failures, endpoints in 198.18.0.0/15);
:mod:`~gpufleet_workshop.rental.instances` runs each rental as a local
inference stand-in process. The virtual kubelet finds it as a plugin
(entry point ``gpufleet.providers``: ``simulated``); it is a fake of what
cannot run here (a GPU rental's API), behind the provider protocol.
"""
