"""Checkpoint interval advisor: how often a training job should checkpoint.

A synchronous training job stops as a whole when any of its GPUs, HCAs or
nodes fails, and restarts from its latest checkpoint. Checkpointing often
costs write time; checkpointing rarely costs rework after a failure. The
optimum balances the two.

Formulas (all times in seconds; ``C`` checkpoint write time, ``M`` the job's
mean time to failure, ``R`` restart time: detection, rescheduling the gang,
loading the checkpoint; ``tau`` compute time between two checkpoints):

* Young's first-order optimum (J. W. Young, "A first order approximation to
  the optimum checkpoint interval", Communications of the ACM 17(9), 1974)::

      tau_young = sqrt(2 * C * M)

* Daly's higher-order refinement (J. T. Daly, "A higher order estimate of the
  optimum checkpoint interval for restart dumps", Future Generation Computer
  Systems 22(3), 2006), for ``C < 2M``::

      tau_daly = sqrt(2*C*M) * (1 + sqrt(C/(2M))/3 + (C/(2M))/9) - C

  and ``tau_daly = M`` when ``C >= 2M``.

* Time lost, first order, as fractions of wall-clock time, with period
  ``T = tau + C`` between checkpoint starts and exponential failures::

      checkpoints = C / T          (writing checkpoints)
      rework      = T / (2M)       (half a period recomputed per failure)
      restarts    = R / M          (one restart per failure)

* Time lost, Daly's exact model for exponential failures (failures may also
  strike during checkpoints and restarts): wall time per unit of work is
  ``M * exp(R/M) * (exp((tau+C)/M) - 1) / tau``, so the lost fraction is
  ``1 - tau / (M * exp(R/M) * (exp((tau+C)/M) - 1))``.

Failure model (default MTTF by job size): job MTTF falls inversely with the
number of GPUs it spans, ``MTTF = k / GPUs``, the series-system model that
Kokolis et al. ("Revisiting Reliability in Large-Scale Machine Learning
Research Clusters", arXiv:2410.21680, HPCA 2025) fit to 11 months and
150 million A100 GPU-hours of Meta's research clusters, projecting job MTTF
to fall to minutes at 131,072 GPUs. We calibrate ``k`` from the H100 figure
of the Llama 3 report (Llama Team, AI @ Meta, "The Llama 3 Herd of Models",
arXiv:2407.21783, 2024, section 3.3.4): 419 unexpected interruptions in a
54-day snapshot of pre-training on 16,384 H100 GPUs, i.e. a job MTTF of
54 * 24 / 419 = 3.09 hours at 16,384 GPUs and::

    k = 54 * 24 * 16384 / 419 = 50,677 GPU-hours (about 5.8 GPU-years)

Measure your own fleet and pass ``mttf_hours`` when you have better data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Llama 3 report: unexpected interruptions, days observed, GPUs (H100).
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
#: ``k`` in ``MTTF = k / GPUs``, in GPU-hours (50,677), calibrated from the Llama 3 report.
MTTF_GPU_HOURS: float = LLAMA3_DAYS * 24 * LLAMA3_GPUS / LLAMA3_INTERRUPTIONS
#: Default restart time (seconds): failure detection (NCCL timeout), gang
#: rescheduling, image start, checkpoint load. An assumption; measure yours.
DEFAULT_RESTART_SECONDS = 600.0


def _positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: {value!r}: expected a number > 0")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: {value!r}: expected a number >= 0")
    return float(value)


def default_mttf_hours(gpus: int) -> float:
    """Job mean time to failure (hours) for a job on ``gpus`` GPUs: ``MTTF_GPU_HOURS / gpus``.

    Example: 1,024 GPUs -> 49.5 hours; 16,384 GPUs -> 3.09 hours (the Llama 3 figure).

    Raises:
        ValueError: ``gpus`` is not an integer > 0.
    """
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus <= 0:
        raise ValueError(f"gpus: {gpus!r}: expected an integer > 0")
    return MTTF_GPU_HOURS / gpus


def young_interval_seconds(checkpoint_seconds: float, mttf_seconds: float) -> float:
    """Young's optimum compute time between checkpoints: ``sqrt(2 * C * M)`` (seconds).

    Raises:
        ValueError: an argument is not a finite number > 0.
    """
    c = _positive("checkpoint_seconds", checkpoint_seconds)
    m = _positive("mttf_seconds", mttf_seconds)
    return math.sqrt(2 * c * m)


def daly_interval_seconds(checkpoint_seconds: float, mttf_seconds: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints (seconds).

    ``sqrt(2CM) * (1 + sqrt(C/2M)/3 + (C/2M)/9) - C`` when ``C < 2M``, else ``M``.

    Raises:
        ValueError: an argument is not a finite number > 0.
    """
    c = _positive("checkpoint_seconds", checkpoint_seconds)
    m = _positive("mttf_seconds", mttf_seconds)
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


@dataclass(frozen=True)
class Waste:
    """Fractions (0..1) of wall-clock time lost at one checkpoint interval.

    ``checkpoints``, ``rework`` and ``restarts`` are the first-order terms and
    ``total`` their sum; ``exact`` is Daly's exponential-failure model, which
    also counts failures during checkpoints and restarts.
    """

    checkpoints: float
    rework: float
    restarts: float
    total: float
    exact: float


def waste(interval_seconds: float, checkpoint_seconds: float, mttf_seconds: float,
          restart_seconds: float = DEFAULT_RESTART_SECONDS) -> Waste:
    """Time lost when computing ``interval_seconds`` between checkpoints (see the module docstring).

    Raises:
        ValueError: ``interval_seconds``, ``checkpoint_seconds`` or
            ``mttf_seconds`` not > 0, or ``restart_seconds`` < 0.
    """
    tau = _positive("interval_seconds", interval_seconds)
    c = _positive("checkpoint_seconds", checkpoint_seconds)
    m = _positive("mttf_seconds", mttf_seconds)
    r = _non_negative("restart_seconds", restart_seconds)
    period = tau + c
    checkpoints, rework, restarts = c / period, period / (2 * m), r / m
    try:
        exact = 1 - tau / (m * math.exp(r / m) * math.expm1(period / m))
    except OverflowError:
        exact = 1.0
    return Waste(checkpoints, rework, restarts, checkpoints + rework + restarts, exact)


@dataclass(frozen=True)
class Advice:
    """The advisor's answer for one job (times in seconds, waste as fractions).

    Attributes:
        gpus: GPUs the job spans (0 when ``mttf_hours`` was given without GPUs).
        checkpoint_seconds: time to write one checkpoint (C).
        mttf_hours: job mean time to failure used (M, hours).
        mttf_from_model: whether M came from ``MTTF_GPU_HOURS / gpus``.
        restart_seconds: time from failure to training again (R).
        young_seconds / daly_seconds: optimum compute time between checkpoints.
        waste: time lost at ``daly_seconds``.
        doubled_daly_seconds: Daly's optimum if checkpoints take ``2C``.
        doubled_waste: time lost at ``doubled_daly_seconds`` with ``2C``.
        doubled_kept_waste: time lost with ``2C`` but the interval kept at ``daly_seconds``.
    """

    gpus: int
    checkpoint_seconds: float
    mttf_hours: float
    mttf_from_model: bool
    restart_seconds: float
    young_seconds: float
    daly_seconds: float
    waste: Waste
    doubled_daly_seconds: float
    doubled_waste: Waste
    doubled_kept_waste: Waste


def advise(gpus: int, checkpoint_seconds: float, mttf_hours: float | None = None,
           restart_seconds: float = DEFAULT_RESTART_SECONDS) -> Advice:
    """Checkpoint interval for a job of ``gpus`` GPUs writing checkpoints in ``checkpoint_seconds``.

    Args:
        gpus: GPUs the job spans (sizes the default MTTF); may be 0 only when
            ``mttf_hours`` is given.
        checkpoint_seconds: seconds one checkpoint write stalls training (C).
        mttf_hours: job mean time to failure in hours (M); default
            ``MTTF_GPU_HOURS / gpus`` (see the module docstring for the source).
        restart_seconds: seconds from a failure to training again (R).

    Returns:
        :class:`Advice` with Young's and Daly's intervals, the time lost, and
        the same for checkpoints taking twice as long.

    Raises:
        ValueError: naming the argument, its value and what was expected.
    """
    c = _positive("checkpoint_seconds", checkpoint_seconds)
    r = _non_negative("restart_seconds", restart_seconds)
    if mttf_hours is None:
        m_hours, from_model = default_mttf_hours(gpus), True
    else:
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            raise ValueError(f"gpus: {gpus!r}: expected an integer >= 0")
        m_hours, from_model = _positive("mttf_hours", mttf_hours), False
    m = m_hours * 3600
    daly = daly_interval_seconds(c, m)
    daly2 = daly_interval_seconds(2 * c, m)
    return Advice(
        gpus=gpus, checkpoint_seconds=c, mttf_hours=m_hours, mttf_from_model=from_model, restart_seconds=r,
        young_seconds=young_interval_seconds(c, m), daly_seconds=daly, waste=waste(daly, c, m, r),
        doubled_daly_seconds=daly2, doubled_waste=waste(daly2, 2 * c, m, r),
        doubled_kept_waste=waste(daly, 2 * c, m, r),
    )


def default_interval_seconds(gpus: int, checkpoint_seconds: float) -> int:
    """The training templates' default ``CHECKPOINT_INTERVAL_SECONDS``: Daly's optimum, whole seconds.

    Uses the default failure model for ``gpus`` GPUs; at least 1 second.

    Raises:
        ValueError: ``gpus`` not an integer > 0 or ``checkpoint_seconds`` not > 0.
    """
    return max(1, round(advise(gpus, checkpoint_seconds).daly_seconds))


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def report_lines(a: Advice, source: str | None = None) -> list[str]:
    """The advice as plain text lines (what ``invoke train.checkpoint-interval`` prints).

    ``source`` says where a given MTTF came from (default ``MTTF given``).
    """
    source = (f"MTTF = {MTTF_GPU_HOURS:,.0f} GPU-hours / {a.gpus:,} GPUs (Llama 3: 419 interruptions, "
              f"54 days, 16,384 GPUs)" if a.mttf_from_model else source or "MTTF given")
    w, d2, k2 = a.waste, a.doubled_waste, a.doubled_kept_waste
    return [
        f"job: {a.gpus:,} GPUs, checkpoint {a.checkpoint_seconds:g} s, restart {a.restart_seconds:g} s",
        f"job MTTF: {a.mttf_hours:.2f} h ({source})",
        f"Young (1974) sqrt(2*C*M): {a.young_seconds:,.0f} s ({_duration(a.young_seconds)})",
        f"Daly (2006) higher order: {a.daly_seconds:,.0f} s ({_duration(a.daly_seconds)})  <- recommended",
        f"time lost at Daly's interval: {w.total:.2%} (checkpoints {w.checkpoints:.2%}, rework {w.rework:.2%}, "
        f"restarts {w.restarts:.2%}); exact exponential model {w.exact:.2%}",
        f"if checkpoints take {2 * a.checkpoint_seconds:g} s: interval {a.doubled_daly_seconds:,.0f} s "
        f"({_duration(a.doubled_daly_seconds)}, x{a.doubled_daly_seconds / a.daly_seconds:.2f}), "
        f"time lost {d2.total:.2%}; keeping {a.daly_seconds:,.0f} s loses {k2.total:.2%}",
    ]
