"""Helpers around a real Prometheus server (Debian's ``prometheus`` package) for tests and local runs."""
