"""Values of a simulated node's description: numbers, unsupported markers, errors, growing counters.

Standard library only: :func:`gpufleet_workshop.fixtures.node.write_node` inlines this
module into the fixture nodes' tool stand-ins, and
:class:`gpufleet.exporter.nvml_fake.FakeNvmlBackend` reads the same values.
A value is a number, ``"[N/A]"``/``"[Not Supported]"``, ``{"nvml_error":
name}`` or ``{"base": n, "per_second": r}`` (a counter growing since the
description's ``epoch``).
"""

from __future__ import annotations

import time
from typing import Any

NOT_AVAILABLE = ("[N/A]", "[Not Supported]")


def evaluate(spec: Any, epoch: float, now: float | None = None) -> Any:
    """Resolve a description value at ``now`` (seconds since the Unix epoch).

    Growth specs ``{"base": b, "per_second": r}`` give ``b + int(r * (now - epoch))``;
    everything else is returned unchanged (strings, error dicts, numbers).
    """
    if isinstance(spec, dict) and "base" in spec:
        now = time.time() if now is None else now
        return int(spec["base"]) + int(float(spec.get("per_second", 0)) * max(0.0, now - epoch))
    return spec


def node_now(node: dict[str, Any]) -> float:
    """The instant growth specs are evaluated at: the node's frozen ``clock``, else now."""
    clock = node.get("clock")
    return float(clock) if clock is not None else time.time()
