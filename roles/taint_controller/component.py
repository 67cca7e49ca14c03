"""The taint_controller role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class TaintController(RoleComponent):
    """The taint controller on virtual nodes."""

    TOKEN = "gpufleet:flip:TaintController"
    ROLE = "taint_controller"
