"""The descheduler role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class Descheduler(RoleComponent):
    """The descheduler and its flip-back policy."""

    TOKEN = "gpufleet:scheduling:Descheduler"
    ROLE = "descheduler"
