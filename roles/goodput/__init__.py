"""Role goodput."""
