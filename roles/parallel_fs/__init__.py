"""Role parallel_fs."""
