"""The runtime every gpufleet process shares: flags, logging, ``/metrics`` + ``/healthz``, signals, leader election.

* :mod:`~gpufleet.controllers.flags`: the common flags, spelled the same everywhere;
* :mod:`~gpufleet.controllers.runtime`: logging, signals, the endpoint and the Lease around a command's loop;
* :mod:`~gpufleet.controllers.serve`: the HTTP endpoint and :class:`~gpufleet.controllers.serve.Liveness`;
* :mod:`~gpufleet.controllers.exposition`: the lean Prometheus text writer it serves.

Leader election itself is :mod:`gpufleet.kube.leader` (a Lease on the command's client).
"""
