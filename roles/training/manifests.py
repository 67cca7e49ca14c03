"""What the training role declares: the defaults training jobs read in-cluster.

The PriorityClasses live in the kueue role (both tiers together); the
checkpoint volumes in parallel_fs. This role publishes the job defaults as
a ConfigMap per team namespace so in-cluster tooling uses the same values
as ``invoke train.render``.
"""

from __future__ import annotations

import yaml

from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import Obj, config_map

from ..parallel_fs.manifests import team_namespaces


def objects(inv: Inventory) -> list[Obj]:
    """One ``gpufleet-training-defaults`` ConfigMap per team namespace."""
    v = inv.role("training")
    if not v.training_enabled:
        return []
    defaults = yaml.safe_dump(v.model_dump(exclude={"training_enabled"}), sort_keys=True)
    return [config_map("gpufleet-training-defaults", ns, {"defaults.yaml": defaults}, "training")
            for ns in team_namespaces(inv)]
