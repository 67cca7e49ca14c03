"""The goodput role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class Goodput(RoleComponent):
    """The goodput accountant, one per team namespace."""

    TOKEN = "gpufleet:training:Goodput"
    ROLE = "goodput"
