"""Checks across variables: what no single field can know on its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import MISSING, Problem

if TYPE_CHECKING:
    from .inventory import Inventory


def cross_checks(inv: "Inventory", origin: dict[str, str]) -> list[Problem]:
    """Problems between variables: references, names used twice, quota above capacity."""
    problems: list[Problem] = []
    kueue = inv.roles["kueue"]
    flavors = inv.flavors()
    file = lambda key: origin.get(key, f"roles/{key.split('_')[0]}/defaults.yaml")  # noqa: E731

    # Queue names unique and pins naming a flavor of the inventory: the quota policy's own checks
    # (gpufleet.fleet.quota_policy, run on the inventory by roles/kueue/config.py).
    queues = [q.name for q in kueue.kueue_cluster_queues]
    for i, lq in enumerate(kueue.kueue_local_queues):
        if lq.cluster_queue not in queues:
            problems.append(Problem(file("kueue_local_queues"), f"kueue_local_queues[{i}].cluster_queue", lq.cluster_queue,
                                    f"a ClusterQueue of kueue_cluster_queues ({', '.join(queues)})"))
    pinned: dict[str, int] = {}
    for i, q in enumerate(kueue.kueue_cluster_queues):
        for flavor, gpus in (q.nominal_gpus or {}).items():
            key = f"kueue_cluster_queues[{i}].nominal_gpus.{flavor}"
            if flavor not in flavors:
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

    problems += topology_checks(inv, file)
    problems += allocation_checks(inv)

    pools = inv.roles["virtual_kubelet"].virtual_kubelet_pools
    names = [p.name for p in pools]
    for i, p in enumerate(pools):
        if p.name in names[:i]:
            problems.append(Problem(file("virtual_kubelet_pools"), f"virtual_kubelet_pools[{i}].name", p.name, "unique pool names"))
        if p.provider == "kubernetes" and not p.kubeconfig_secret:
            problems.append(Problem(file("virtual_kubelet_pools"), f"virtual_kubelet_pools[{i}].kubeconfig_secret", None,
                                    "a Secret name holding the other cluster's kubeconfig (provider kubernetes)"))
    return problems


def allocation_checks(inv: "Inventory") -> list[Problem]:
    """All hosts of one GPU model (one ResourceFlavor) allocate their GPUs one way (``gpu_allocation``).

    A job asks for a flavor's GPUs one way (extended resource or ResourceClaim);
    a flavor split between the device plugin and DRA would leave part of its
    capacity where its jobs cannot land.
    """
    problems: list[Problem] = []
    hosts_file = f"{inv.root.parent.name}/{inv.root.name}/hosts.yml"
    seen: dict[str, tuple[str, str]] = {}
    for h in inv.hosts.values():
        if not h.vars.gpu_count:
            continue
        flavor, how = h.gpu.flavor, h.vars.gpu_allocation
        first = seen.setdefault(flavor, (h.name, how))
        if first[1] != how:
            problems.append(Problem(hosts_file, f"{h.name}.gpu_allocation", how,
                                    f"{first[1]!r} like {first[0]}: every host of flavor {flavor} allocates its GPUs "
                                    "one way (set gpu_allocation in the group_vars of the whole GPU model)"))
    return problems


def topology_checks(inv: "Inventory", file) -> list[Problem]:
    """The fabric's topology must be a tree: blocks on all GPU hosts or none, each rack in one block.

    Kueue's Topology levels are node labels (block, rack, hostname); a node
    without a level's label is left out of topology-aware scheduling, and a
    rack split over two blocks would be two domains of the same name. The
    training role's default ``training_topology`` must be a level the hosts carry.
    """
    problems: list[Problem] = []
    hosts_file = f"{inv.root.parent.name}/{inv.root.name}/hosts.yml"
    gpu_hosts = [h for h in inv.hosts.values() if h.vars.gpu_count]
    with_block = [h for h in gpu_hosts if h.vars.node_block]
    if with_block and len(with_block) < len(gpu_hosts):
        blocks = sorted({h.vars.node_block for h in with_block})
        unplaced: dict[str, list[str]] = {}
        for h in gpu_hosts:
            if not h.vars.node_block:
                unplaced.setdefault(h.vars.node_rack, []).append(h.name)
        for rack, names in unplaced.items():
            shown = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}, {len(names)} hosts"
            problems.append(Problem(hosts_file, f"rack {rack} ({shown}): node_block", MISSING,
                                    f"a block like every other GPU node ({', '.join(blocks)}): put the rack's group "
                                    "under a block group whose group_vars set node_block, or set none anywhere"))
    racks: dict[str, dict[str, str]] = {}  # rack -> block -> its first host
    for h in with_block:
        racks.setdefault(h.vars.node_rack, {}).setdefault(h.vars.node_block, h.name)
    for rack, blocks in racks.items():
        (first_block, first_host), *others = blocks.items()
        for block, host in others:
            problems.append(Problem(hosts_file, f"{host}: node_block", block,
                                    f"{first_block}: rack {rack} is in block {first_block} ({first_host}), "
                                    "a rack belongs to one block"))
    training, kueue = inv.roles.get("training"), inv.roles.get("kueue")
    level = getattr(training, "training_topology", "none")
    if level == "block" and not (with_block and len(with_block) == len(gpu_hosts)):
        problems.append(Problem(file("training_topology"), "training_topology", level,
                                f"'rack' or 'none': {hosts_file} gives no node_block, so there is no block level"))
    if level != "none" and kueue is not None and not kueue.kueue_topology_enabled:
        problems.append(Problem(file("training_topology"), "training_topology", level,
                                "'none' while kueue_topology_enabled is false (Kueue places a gang in a "
                                f"{level} only with a Topology)"))
    return problems
