"""Pieces every gpufleet controller shares: leader election, health and metrics endpoint."""
