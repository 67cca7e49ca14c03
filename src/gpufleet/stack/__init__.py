"""The Pulumi side of gpufleet: manifest builders shared by roles, the role
component base, the stack program, and rendering it without an engine."""
