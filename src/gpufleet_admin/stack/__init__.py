"""The Pulumi side of gpufleet: the role component, the stack program that
composes the roles of ``roles.registry``, and rendering it without an engine.
The builders roles share live below both, in ``gpufleet_admin.manifests``."""
