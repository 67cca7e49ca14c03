"""What the descheduler role declares: its policy and (optionally) the Helm install.

Policy API ``descheduler/v1alpha2``. Only RemovePodsViolatingNodeTaints,
restricted by ``includedTaints`` to the taint the taint controller manages
on virtual nodes, so the descheduler moves inference back in-cluster when
the taint returns and touches nothing else. The taint is NoSchedule (never
NoExecute): pods keep serving until evicted one budget at a time, and the
Eviction API makes every eviction respect PodDisruptionBudgets.
"""

from __future__ import annotations

import yaml

from gpufleet.names import FREE_GPUS_TAINT, RELEASE_LABEL
from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import HelmRelease, Obj, config_map
from gpufleet_admin.versions import pin



def policy(inv: Inventory) -> Obj:
    """The DeschedulerPolicy: evict pods on virtual nodes that do not tolerate the free-GPU taint."""
    v = inv.role("descheduler")
    return {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerPolicy",
        "maxNoOfPodsToEvictPerNode": v.descheduler_max_evictions_per_node,
        "maxNoOfPodsToEvictTotal": v.descheduler_max_evictions_per_cycle,
        "profiles": [{
            "name": "gpufleet-flip-back",
            "pluginConfig": [
                # Only pods gpufleet's flip-back budget released (lowest priority first, pods
                # per minute per workload) are evictable: the descheduler has no budget over time.
                {"name": "DefaultEvictor", "args": {"evictLocalStoragePods": True, "nodeFit": True,
                                                    "labelSelector": {"matchLabels": dict([RELEASE_LABEL])}}},
                {"name": "RemovePodsViolatingNodeTaints", "args": {"includedTaints": [FREE_GPUS_TAINT]}},
            ],
            "plugins": {"deschedule": {"enabled": ["RemovePodsViolatingNodeTaints"]}},
        }],
    }


def objects(inv: Inventory) -> list[Obj]:
    """The policy as a ConfigMap (what the chart or a local process reads)."""
    v = inv.role("descheduler")
    if not v.descheduler_enabled:
        return []
    return [config_map("gpufleet-descheduler-policy", v.descheduler_namespace,
                       {"policy.yaml": yaml.safe_dump(policy(inv), sort_keys=False)}, "descheduler")]


def releases(inv: Inventory) -> list[HelmRelease]:
    """The descheduler chart (pinned) as a Deployment running every interval with our policy."""
    v = inv.role("descheduler")
    if not (v.descheduler_enabled and v.descheduler_install):
        return []
    return [HelmRelease(
        name="descheduler", namespace=v.descheduler_namespace, chart="descheduler",
        repo=pin("descheduler", "helm_repo"), version=pin("descheduler", "helm_chart_version"),
        values={"kind": "Deployment", "deschedulingInterval": f"{v.descheduler_interval_seconds}s",
                "deschedulerPolicyAPIVersion": "descheduler/v1alpha2", "deschedulerPolicy": policy(inv),
                "leaderElection": {"enabled": True}},
    )]
