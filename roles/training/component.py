"""The training role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class Training(RoleComponent):
    """Defaults that training job templates use."""

    TOKEN = "gpufleet:workloads:Training"
    ROLE = "training"
