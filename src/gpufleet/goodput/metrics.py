"""The accountant's Prometheus metrics: a custom collector over the latest accounts.

Per job (labels ``namespace``, ``job``):

* ``gpufleet_job_ettr_ratio``: productive / wall-clock time, 0 to 1;
* ``gpufleet_job_badput_seconds{bucket}``: seconds lost, one series per bucket of
  :data:`gpufleet.goodput.BUCKETS`;
* ``gpufleet_job_productive_seconds`` and ``gpufleet_job_wall_clock_seconds``;
* ``gpufleet_job_interruptions``: runs of the job that ended early;
* ``gpufleet_job_checkpoints_not_counted``: checkpoints in the job's directory during its window that
  are not the job's (copied in, another job's, written while it was queued);
* ``gpufleet_job_checkpoint_clock_offset_seconds``: how far the checkpoint filesystem's clock is
  ahead of the API server's, as the account took it (absent when nothing measured or fitted one).

Of the accountant itself: ``gpufleet_goodput_jobs``,
``gpufleet_goodput_account_duration_seconds`` (the last pass over every
job) and ``gpufleet_goodput_last_success_timestamp_seconds``.
Gauges, not counters: an account is recomputed from the history each time,
and an estimate (a start-up, a step rate) may move down as well as up.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from gpufleet.goodput import BUCKETS
from gpufleet.goodput.account import Account


class GoodputCollector:
    """Yields fresh metric families from the accounts last given to :meth:`update`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accounts: tuple[Account, ...] = ()
        self._duration = 0.0
        self._success: float | None = None

    def update(self, accounts: Sequence[Account], *, duration: float = 0.0, at: float | None = None) -> None:
        """Replace the accounts exported (``duration``: seconds the pass took; ``at``: when it succeeded)."""
        with self._lock:
            self._accounts = tuple(accounts)
            self._duration = duration
            self._success = at if at is not None else self._success

    def collect(self) -> Iterator[Metric]:
        """The metric families (module docstring)."""
        with self._lock:
            accounts, duration, success = self._accounts, self._duration, self._success
        ettr = GaugeMetricFamily("gpufleet_job_ettr_ratio", "Effective training time ratio of a training job: "
                                 "productive time over wall-clock time since its submission (0 to 1).",
                                 labels=["namespace", "job"])
        badput = GaugeMetricFamily("gpufleet_job_badput_seconds", "Seconds of a training job's wall-clock time lost, "
                                   "by bucket: queued, starting, checkpoint_saving, progress_lost, "
                                   "waiting_for_hardware, other.", labels=["namespace", "job", "bucket"])
        productive = GaugeMetricFamily("gpufleet_job_productive_seconds", "Seconds of a training job's wall-clock "
                                       "time that turned into kept training progress.", labels=["namespace", "job"])
        wall = GaugeMetricFamily("gpufleet_job_wall_clock_seconds", "Seconds from a training job's submission to its "
                                 "end or now.", labels=["namespace", "job"])
        interruptions = GaugeMetricFamily("gpufleet_job_interruptions", "Runs of a training job that ended before "
                                          "the job did (a pod failed, was evicted or deleted).",
                                          labels=["namespace", "job"])
        not_counted = GaugeMetricFamily("gpufleet_job_checkpoints_not_counted", "Checkpoints in a training job's "
                                        "directory during its window that are not the job's (copied in, another "
                                        "job's, written while it was queued).", labels=["namespace", "job"])
        offset = GaugeMetricFamily("gpufleet_job_checkpoint_clock_offset_seconds", "Seconds the checkpoint "
                                   "filesystem's clock is ahead of the API server's (negative: behind), as a "
                                   "training job's account took it; source: start records, fitted or given.",
                                   labels=["namespace", "job", "source"])
        for a in accounts:
            ettr.add_metric([a.namespace, a.job], a.ettr)
            for bucket in BUCKETS:
                badput.add_metric([a.namespace, a.job, bucket], a.badput.get(bucket, 0.0))
            productive.add_metric([a.namespace, a.job], a.productive_seconds)
            wall.add_metric([a.namespace, a.job], a.wall_seconds)
            interruptions.add_metric([a.namespace, a.job], len(a.interruptions))
            not_counted.add_metric([a.namespace, a.job], a.checkpoints_not_counted)
            if a.clock_offset_source != "none":
                offset.add_metric([a.namespace, a.job, a.clock_offset_source], a.clock_offset)
        yield from (ettr, badput, productive, wall, interruptions, not_counted, offset)
        yield GaugeMetricFamily("gpufleet_goodput_jobs", "Training jobs the accountant follows.", value=len(accounts))
        yield GaugeMetricFamily("gpufleet_goodput_account_duration_seconds",
                                "Seconds the last pass over every job's account took.", value=duration)
        if success is not None:
            yield GaugeMetricFamily("gpufleet_goodput_last_success_timestamp_seconds",
                                    "Unix time of the last pass over every job.", value=success)


def registry(collector: GoodputCollector) -> CollectorRegistry:
    """A registry holding only ``collector``."""
    reg = CollectorRegistry()
    reg.register(collector)
    return reg
