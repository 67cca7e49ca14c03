"""Role training."""
