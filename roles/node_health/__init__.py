"""Role node_health."""
