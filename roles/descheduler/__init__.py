"""Role descheduler."""
