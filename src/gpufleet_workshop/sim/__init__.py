"""Simulations on the local cluster: :mod:`gpufleet_workshop.sim.flip` (``invoke sim.flip``)."""
