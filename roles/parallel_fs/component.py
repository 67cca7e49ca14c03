"""The parallel_fs role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class ParallelFs(RoleComponent):
    """The checkpoint filesystem: StorageClass and shared volumes."""

    TOKEN = "gpufleet:storage:ParallelFs"
    ROLE = "parallel_fs"
