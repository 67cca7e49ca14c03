"""Goodput of training jobs: effective training time ratio (ETTR) and lost time by cause.

ETTR (Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
Research Clusters", arXiv:2410.21680, HPCA 2025) is the share of a job's
wall-clock time that turned into training progress. The time lost
("badput", after Google's ml-goodput-measurement) falls into the buckets of
:data:`BUCKETS`, the same in the accountant (:mod:`gpufleet.goodput.account`,
from what the cluster records) and in the long-horizon simulation
(:mod:`gpufleet_workshop.sim.goodput`).

What the accountant assumes (each one is what a wrong account would
otherwise rest on; :mod:`gpufleet.goodput.account` has the rules):

* **A job's pods run only while its Workload is admitted**: Kueue keeps the
  job suspended otherwise; a gang restart replaces the whole gang, the old
  pods gone before the new ones start (JobSet's ``BlockingRecreate``).
* **A checkpoint is the job's only if its own pods can have written it**:
  it completed during one of the job's runs (every pod of the gang
  running), or, for a run whose pods are gone from the record, while the
  Workload was admitted and no known pod of the job existed. Where the
  directory says who wrote it, that decides first: the writer pod its
  marker names (``"pod"``), else the last start record written before it
  (:mod:`gpufleet.goodput.checkpoints`; the training templates' pods write
  one at every trainer start), compared by the filesystem's own clock, so
  by order, not absolute time. A checkpoint from before the job's
  submission, copied in while it was queued or waiting for nodes, or
  written by another job counts for nothing but the step a run resumed
  from (the highest step below the run's first own one).
* **One job writes a directory at a time**: two jobs writing into one
  directory at once are told apart only by the writer their markers name;
  otherwise a checkpoint completed while both ran counts for both.
* **A checkpoint is its directory, its marker's modification time and
  inode**: a step written again (by a later run that resumed from an older
  step or started over) is a new checkpoint, and the old one still counts
  for the run that wrote it; a copy that keeps the original times (``cp
  -a``) is dated by them.
* **The pods' clocks are the API server's** (NTP): pod start times come
  from the kubelet, the marker's ``started`` and the start records' ``time``
  from the trainer's node.
* **The checkpoint filesystem's clock may be off**, and every time read
  from it (marker and file modification times) is moved onto the API
  server's clock first. The offset is measured from the start records
  (the median of modification time minus the pod's clock, written in the
  same instant): an account then moves by no more than the timestamps'
  resolution, whatever the offset. Without start records (a job not
  rendered from the templates) it is fitted by order, and only when some
  checkpoint does not fit the job's runs as dated: the offset within 60 s
  that puts the most checkpoints back into runs that can have written
  them, the nearest to 0 among those; and a run whose first save is dated
  before its gang can have computed the steps keeps its checkpoints that
  much later. That knows the offset only as closely as the runs' edges and
  the job's pace bound it: productive time moves by at most the offset,
  while a run's start-up and its lost time may each move by up to it, and
  no run is made up or lost (the tests hold this at 15, 45 and 60 s either
  way); a trainer whose pace is very uneven can make it see an offset that
  is not there. The start records make it exact. The account says which
  it used (``clock_offset_source``) and exports the offset
  (``gpufleet_job_checkpoint_clock_offset_seconds``).
* **Without readable checkpoints the whole run counts as productive** (an
  upper bound, ``checkpoints_known`` false).
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
