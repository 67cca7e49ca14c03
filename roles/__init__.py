"""gpufleet roles: one add-on per package (defaults.yaml, vars.py, manifests.py, README); ``roles.registry`` declares them all."""
