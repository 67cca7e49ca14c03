"""The inference role's Pulumi component."""

from gpufleet.stack.role import RoleComponent


class Inference(RoleComponent):
    """Inference Deployments with Service, HPA and PodDisruptionBudget."""

    TOKEN = "gpufleet:workloads:Inference"
    ROLE = "inference"
