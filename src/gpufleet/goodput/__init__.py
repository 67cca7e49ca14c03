"""Goodput of training jobs: effective training time ratio (ETTR) and lost time by cause.

ETTR (Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
Research Clusters", arXiv:2410.21680, HPCA 2025) is the share of a job's
wall-clock time that turned into training progress. The time lost
("badput", after Google's ml-goodput-measurement) falls into the buckets of
:data:`BUCKETS`, the same in the accountant (:mod:`gpufleet.goodput.account`,
from what the cluster records) and in the long-horizon simulation
(:mod:`gpufleet.sim.goodput`).
"""

from __future__ import annotations

#: Badput buckets, in the order tables and charts show them:
#:
#: * ``queued``: the Workload waits for Kueue to admit it (first admission and after an eviction);
#: * ``starting``: from admission (or a gang restart) to all pods running, and the trainer's own
#:   start and checkpoint restore before it trains again;
#: * ``checkpoint_saving``: writing checkpoints (training stalls);
#: * ``progress_lost``: work since the last checkpoint when the job was interrupted (done again);
#: * ``waiting_for_hardware``: the gang cannot run for lack of healthy nodes (pods unschedulable,
#:   or a bad node not yet out of the way);
#: * ``other``: everything else (suspended, finishing).
BUCKETS: tuple[str, ...] = ("queued", "starting", "checkpoint_saving", "progress_lost", "waiting_for_hardware", "other")
