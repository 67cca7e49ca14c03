"""Simulations on the local cluster: :mod:`gpufleet.sim.flip` (``invoke sim.flip``)."""
