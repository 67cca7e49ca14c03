"""The kueue role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class Kueue(RoleComponent):
    """Kueue install and configuration: flavors, queues in one cohort, priorities."""

    TOKEN = "gpufleet:scheduling:Kueue"
    ROLE = "kueue"
