"""Role taint_controller."""
