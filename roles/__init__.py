"""gpufleet roles: one add-on per package (defaults.yaml, templates/, the Pulumi ComponentResource, README)."""
