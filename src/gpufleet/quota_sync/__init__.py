"""Kueue quota: sharing real capacity over ClusterQueues, and keeping it in sync."""
