"""Intervals and object names of the taint controller (shared names live in :mod:`gpufleet.names`)."""

from __future__ import annotations

#: Seconds between controller ticks (signal sample, decision, reconcile).
TICK_SECONDS = 1.0
#: Lease of the taint controller (leader election).
LEASE_NAME = "gpufleet-taint-controller"
