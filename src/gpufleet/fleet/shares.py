"""Splitting a whole number of units (GPUs, cores, bytes) by integer shares.

The largest-remainder method (Hamilton's apportionment): each queue gets the
floor of its exact share, then the units left over go one each to the
queues with the largest fractional remainders (ties: the queue listed
first). The parts always add up to the total: no GPU is lost or invented
by rounding.
"""

from __future__ import annotations

from typing import Mapping


def split(total: int, shares: Mapping[str, int]) -> dict[str, int]:
    """Split ``total`` units over ``shares`` (name -> weight > 0) by largest remainder.

    Returns name -> units, summing to ``total`` (0 for every name when
    ``total`` is 0). Raises ValueError for a negative total, no shares, or a
    weight that is not a positive integer.
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    if not shares:
        raise ValueError("no shares to split over")
    bad = {k: w for k, w in shares.items() if not isinstance(w, int) or w <= 0}
    if bad:
        raise ValueError(f"shares must be positive integers, got {bad}")
    weight = sum(shares.values())
    floors = {k: total * w // weight for k, w in shares.items()}
    left = total - sum(floors.values())
    order = sorted(shares, key=lambda k: (-(total * shares[k] % weight), list(shares).index(k)))
    for k in order[:left]:
        floors[k] += 1
    return floors


def gpu_quotas(capacity_gpus: int, reserve: int, shares: Mapping[str, int],
               pinned: Mapping[str, int] | None = None) -> dict[str, int]:
    """GPU nominalQuota per ClusterQueue for one flavor.

    ``capacity_gpus - reserve`` (never below 0) is shared: queues in
    ``pinned`` get their pinned GPUs (scaled down proportionally if capacity
    fell below the pins), the rest is split over the others by ``shares``.
    """
    pinned = dict(pinned or {})
    available = max(capacity_gpus - reserve, 0)
    pinned_total = sum(pinned.values())
    if pinned_total > available:
        pinned = split(available, pinned) if available else {k: 0 for k in pinned}
        pinned_total = available
    free = {k: w for k, w in shares.items() if k not in pinned}
    out = dict(pinned)
    if free:
        out.update(split(available - pinned_total, free))
    return {k: out[k] for k in shares}
