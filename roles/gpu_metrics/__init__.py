"""Role gpu_metrics."""
