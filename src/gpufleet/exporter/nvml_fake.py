"""The description-driven NVML backend of simulated GPU nodes (``gpufleet exporter --nvml-fake FILE``).

Like the virtual kubelet's simulated provider, it stands behind the real
interface (:class:`~gpufleet.exporter.nvml.NvmlBackend`) so a simulated node
exports exactly what a real one would; the description format is
:mod:`gpufleet_workshop.fixtures.node`'s.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pynvml

from gpufleet.exporter import nodedesc
from gpufleet.exporter.nvml import CLOCKS_EVENT_REASONS, NVLINK_ERROR_COUNTERS, RETIREMENT_CAUSES

Node = dict[str, Any]

_NVLINK_COUNTER_BY_VALUE = {v: k for k, v in NVLINK_ERROR_COUNTERS.items()}
_CAUSE_BY_VALUE = {v: k for k, v in RETIREMENT_CAUSES.items()}
_ERROR_CODES = {
    name.removeprefix("NVML_ERROR_").lower(): value
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


def _nvml_error(name: str) -> pynvml.NVMLError:
    return pynvml.NVMLError(_ERROR_CODES.get(name, pynvml.NVML_ERROR_UNKNOWN))


class FakeNvmlBackend:
    """:class:`~gpufleet.exporter.nvml.NvmlBackend` driven by a node description.

    Args:
        desc: a node description dict, or a path to its JSON file.

    Semantics follow NVML: ``init`` raises the description's ``nvml`` error if
    not ``"ok"``; ``device_handle`` raises GPU_IS_LOST for a lost GPU and the
    GPU's ``handle_error`` (e.g. ``"unknown"``: what nvidia-smi prints as
    "Unknown Error") when set; a GPU's ``read_error`` makes every value read
    (temperature .. NVLink, not the identity calls, which the driver answers
    from its cache) raise that error; values ``"[N/A]"``/``"[Not Supported]"``
    raise NOT_SUPPORTED; ``{"nvml_error": name}`` raises that error; NVLink
    indices past the GPU's last raise INVALID_ARGUMENT (NOT_SUPPORTED on a GPU
    without NVLink). Each GPU's ``xids`` are delivered once, after the GPU is
    registered for events. A GPU with ``listed: false`` is on the PCI bus but
    the driver no longer lists it: NVML neither counts nor indexes it.
    """

    def __init__(self, desc: Node | str | os.PathLike[str]) -> None:
        if not isinstance(desc, dict):
            desc = json.loads(Path(desc).read_text())
        self.desc = desc
        self.epoch = float(desc.get("epoch") or time.time())
        self._gpus = {int(g["index"]): g for g in desc.get("gpus", [])}
        self._pending: list[tuple[int, int]] = []
        self.initialised = False

    def _value(self, spec: Any) -> Any:
        value = nodedesc.evaluate(spec, self.epoch, nodedesc.node_now(self.desc))
        if isinstance(value, str) and value in nodedesc.NOT_AVAILABLE:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if isinstance(value, dict) and "nvml_error" in value:
            raise _nvml_error(value["nvml_error"])
        return value

    def _gpu(self, handle: int, identity: bool = False) -> dict[str, Any]:
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = self._gpus[handle]
        if not identity and gpu.get("read_error"):
            raise _nvml_error(gpu["read_error"])
        return gpu

    def init(self) -> None:
        """Succeeds when the description's ``nvml`` is ``"ok"`` (default)."""
        status = self.desc.get("nvml", "ok")
        if status != "ok":
            raise _nvml_error(status)
        self.initialised = True

    def shutdown(self) -> None:
        """Forget initialisation."""
        self.initialised = False

    def device_count(self) -> int:
        """Number of GPUs in the description."""
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self._gpus)

    def device_handle(self, index: int) -> int:
        """The index itself; GPU_IS_LOST for a lost GPU, INVALID_ARGUMENT past the last."""
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if index not in self._gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._gpus[index].get("lost"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if self._gpus[index].get("handle_error"):
            raise _nvml_error(self._gpus[index]["handle_error"])
        return index

    def device_uuid(self, handle: int) -> str:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return str(self._value(self._gpu(handle, identity=True)["uuid"]))

    def device_name(self, handle: int) -> str:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return str(self._value(self._gpu(handle, identity=True)["name"]))

    def device_pci_bus_id(self, handle: int) -> str:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return str(self._value(self._gpu(handle, identity=True)["pci_bus_id"]))

    def temperature_celsius(self, handle: int) -> float:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return float(self._value(self._gpu(handle).get("temperature", "[N/A]")))

    def memory_temperature_celsius(self, handle: int) -> float:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return float(self._value(self._gpu(handle).get("memory_temperature", "[N/A]")))

    def power_milliwatts(self, handle: int) -> int:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend` (description holds watts)."""
        return int(round(float(self._value(self._gpu(handle).get("power_watts", "[N/A]"))) * 1000))

    def clocks_event_reasons(self, handle: int) -> int:
        """Bitmask from the description's list of reason names."""
        reasons = self._value(self._gpu(handle).get("clocks_event_reasons", []))
        mask = 0
        for reason in reasons:
            mask |= CLOCKS_EVENT_REASONS[reason][0]
        return mask

    def ecc_aggregate(self, handle: int, error_type: int) -> int:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        key = "uncorrected" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        return int(self._value(self._gpu(handle).get("ecc", {}).get(key, "[N/A]")))

    def retired_pages(self, handle: int, cause: int) -> int:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return int(self._value(self._gpu(handle).get("retired_pages", {}).get(_CAUSE_BY_VALUE[cause], "[N/A]")))

    def retired_pages_pending(self, handle: int) -> bool:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return bool(self._value(self._gpu(handle).get("retired_pages", {}).get("pending", "[N/A]")))

    def remapped_rows(self, handle: int) -> tuple[int, int, bool, bool]:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        rows = self._gpu(handle).get("remapped_rows", "[N/A]")
        rows = self._value(rows) if not isinstance(rows, dict) or "nvml_error" in rows else rows
        return (
            int(self._value(rows.get("correctable", "[N/A]"))),
            int(self._value(rows.get("uncorrectable", "[N/A]"))),
            bool(self._value(rows.get("pending", "[N/A]"))),
            bool(self._value(rows.get("failure", "[N/A]"))),
        )

    def _link(self, handle: int, link: int) -> dict[str, Any]:
        links = self._gpu(handle).get("nvlinks", [])
        if not links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvlink_up(self, handle: int, link: int) -> bool:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return bool(self._value(self._link(handle, link).get("up", True)))

    def nvlink_error_counter(self, handle: int, link: int, counter: int) -> int:
        """See :class:`~gpufleet.exporter.nvml.NvmlBackend`."""
        return int(self._value(self._link(handle, link).get(_NVLINK_COUNTER_BY_VALUE[counter], 0)))

    def register_xid_events(self, handle: int, index: int) -> None:
        """Queue the GPU's described XIDs for the next poll."""
        for xid in self._gpu(handle, identity=True).get("xids", []):
            self._pending.append((index, int(xid)))

    def poll_xid_events(self, max_events: int) -> list[tuple[int, int]]:
        """Deliver up to ``max_events`` queued XID events, oldest first."""
        events, self._pending = self._pending[:max_events], self._pending[max_events:]
        return events
