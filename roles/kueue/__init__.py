"""Role kueue."""
