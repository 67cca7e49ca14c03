"""The node_health role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class NodeHealth(RoleComponent):
    """The remediation controller."""

    TOKEN = "gpufleet:health:NodeHealth"
    ROLE = "node_health"
