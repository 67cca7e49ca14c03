"""GPUs per topology domain and gangs across domains, from the Nodes and pods the API server has (pure).

A domain is one value of a topology level's node label (``gpufleet.io/block``,
``gpufleet.io/rack``; see :data:`gpufleet_admin.inventory.inventory.TOPOLOGY_LEVELS`).
Figures are GPU counts (``nvidia.com/gpu``): a node's allocatable GPUs count
as schedulable when it may take new work (:func:`gpufleet.fleet.nodes.schedulable`);
a pod holds the GPUs it requests while it is bound and not finished. Nodes
without a level's label are shown under :data:`UNLABELLED`: Kueue's
topology-aware scheduling leaves them out of every domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.fleet import nodes as nodeutil

Node = nodeutil.Node
#: Domain name shown for nodes that lack the level's label.
UNLABELLED = "(no label)"


@dataclass
class DomainRow:
    """One domain of one level: nodes, schedulable GPUs, GPUs held by training and by everything else, free."""

    level: str
    domain: str
    nodes: int = 0
    schedulable: int = 0
    training: int = 0
    other: int = 0

    @property
    def free(self) -> int:
        """Schedulable GPUs no pod holds (never below 0)."""
        return max(self.schedulable - self.training - self.other, 0)


@dataclass
class GangSpan:
    """A training gang (``namespace/name``) and its pods per domain of each level, ``{level: {domain: pods}}``."""

    gang: str
    pods: int = 0
    domains: dict[str, dict[str, int]] = field(default_factory=dict)

    def spans(self, level: str) -> bool:
        """Whether the gang's pods are in more than one domain of ``level``."""
        return len(self.domains.get(level, {})) > 1


def domain_rows(nodes: Iterable[Node], held: Mapping[str, tuple[int, int]],
                levels: Sequence[tuple[str, str]], training_gpus: Mapping[str, int]) -> list[DomainRow]:
    """GPUs per domain of every level, levels in the order given, domains sorted by name.

    Args:
        nodes: in-cluster Node objects (virtual nodes are skipped).
        held: node name -> (GPUs held by training pods, GPUs held by other pods).
        levels: ``(level name, node label)`` pairs, coarse to fine.
        training_gpus: node name -> GPUs that count for training (the node classifier's answer,
            :mod:`gpufleet.fleet.classify`); nodes absent from it (no GPUs, or a GPU count the
            classifier refused) are left out.
    """
    rows: dict[tuple[str, str], DomainRow] = {}
    for node in nodes:
        if nodeutil.is_virtual(node) or nodeutil.name(node) not in training_gpus:
            continue
        name, labels = nodeutil.name(node), nodeutil.labels(node)
        training, other = held.get(name, (0, 0))
        for level, label in levels:
            domain = labels.get(label, UNLABELLED)
            row = rows.setdefault((level, domain), DomainRow(level, domain))
            row.nodes += 1
            row.schedulable += training_gpus[name]
            row.training += training
            row.other += other
    order = {level: i for i, (level, _) in enumerate(levels)}
    return sorted(rows.values(), key=lambda r: (order[r.level], r.domain == UNLABELLED, r.domain))


def gang_spans(placements: Iterable[tuple[str, str]], node_labels: Mapping[str, Mapping[str, str]],
               levels: Sequence[tuple[str, str]]) -> list[GangSpan]:
    """Where each gang's pods run, per level, sorted by gang.

    Args:
        placements: ``(gang, node name)`` per bound training pod.
        node_labels: node name -> its labels.
        levels: ``(level name, node label)`` pairs.
    """
    spans: dict[str, GangSpan] = {}
    for gang, node in placements:
        span = spans.setdefault(gang, GangSpan(gang))
        span.pods += 1
        labels = node_labels.get(node, {})
        for level, label in levels:
            domain = labels.get(label, UNLABELLED)
            counts = span.domains.setdefault(level, {})
            counts[domain] = counts.get(domain, 0) + 1
    return [spans[g] for g in sorted(spans)]
