"""Checks across variables: what no single field can know on its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import Problem

if TYPE_CHECKING:
    from .inventory import Inventory


def cross_checks(inv: "Inventory", origin: dict[str, str]) -> list[Problem]:
    """Problems between variables: references, names used twice, quota above capacity."""
    problems: list[Problem] = []
    kueue = inv.roles["kueue"]
    flavors = inv.flavors()
    file = lambda key: origin.get(key, f"roles/{key.split('_')[0]}/defaults.yaml")  # noqa: E731

    queues = [q.name for q in kueue.kueue_cluster_queues]
    for i, name in enumerate(queues):
        if name in queues[:i]:
            problems.append(Problem(file("kueue_cluster_queues"), f"kueue_cluster_queues[{i}].name", name, "unique ClusterQueue names"))
    for i, lq in enumerate(kueue.kueue_local_queues):
        if lq.cluster_queue not in queues:
            problems.append(Problem(file("kueue_local_queues"), f"kueue_local_queues[{i}].cluster_queue", lq.cluster_queue,
                                    f"a ClusterQueue of kueue_cluster_queues ({', '.join(queues)})"))
    pinned: dict[str, int] = {}
    for i, q in enumerate(kueue.kueue_cluster_queues):
        for flavor, gpus in (q.nominal_gpus or {}).items():
            key = f"kueue_cluster_queues[{i}].nominal_gpus.{flavor}"
            if flavor not in flavors:
                problems.append(Problem(file("kueue_cluster_queues"), key, flavor,
                                        f"a ResourceFlavor of this inventory ({', '.join(flavors) or 'none'})"))
                continue
            pinned[flavor] = pinned.get(flavor, 0) + gpus
            cap = flavors[flavor].gpus - kueue.kueue_reserve_gpus
            if pinned[flavor] > cap:
                problems.append(Problem(file("kueue_cluster_queues"), key, gpus,
                                        f"at most {cap} GPUs in all queues of flavor {flavor} (inventory capacity "
                                        f"{flavors[flavor].gpus} minus kueue_reserve_gpus {kueue.kueue_reserve_gpus})"))
    for key, items in (("kueue_priority_classes", kueue.kueue_priority_classes),
                       ("kueue_workload_priority_classes", kueue.kueue_workload_priority_classes)):
        names = [p.name for p in items]
        for i, n in enumerate(names):
            if n in names[:i]:
                problems.append(Problem(file(key), f"{key}[{i}].name", n, "unique names"))

    pools = inv.roles["virtual_kubelet"].virtual_kubelet_pools
    names = [p.name for p in pools]
    for i, p in enumerate(pools):
        if p.name in names[:i]:
            problems.append(Problem(file("virtual_kubelet_pools"), f"virtual_kubelet_pools[{i}].name", p.name, "unique pool names"))
        if p.provider == "kubernetes" and not p.kubeconfig_secret:
            problems.append(Problem(file("virtual_kubelet_pools"), f"virtual_kubelet_pools[{i}].kubeconfig_secret", None,
                                    "a Secret name holding the other cluster's kubeconfig (provider kubernetes)"))
    return problems
