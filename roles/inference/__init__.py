"""Role inference."""
