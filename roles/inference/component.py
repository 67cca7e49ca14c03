"""The inference role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class Inference(RoleComponent):
    """Inference Deployments with HPA and PodDisruptionBudget."""

    TOKEN = "gpufleet:workloads:Inference"
    ROLE = "inference"
