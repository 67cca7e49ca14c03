"""The virtual_kubelet role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class VirtualKubelet(RoleComponent):
    """One virtual kubelet per external capacity pool."""

    TOKEN = "gpufleet:flip:VirtualKubelet"
    ROLE = "virtual_kubelet"
