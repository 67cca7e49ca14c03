"""GPU state through NVML: a small backend protocol, the pynvml backend, and the sampler.

The exporter never calls pynvml directly. It talks to an :class:`NvmlBackend`,
a thin typed subset of the NVML C API (names and semantics from the NVML API
reference, https://docs.nvidia.com/deploy/nvml-api/), whose methods raise
``pynvml.NVMLError`` subclasses exactly as NVML returns codes. Two backends
exist: :class:`PynvmlBackend` (the real library through nvidia-ml-py) and
:class:`gpufleet_workshop.fixtures.node.FakeNvmlBackend` (a node description, for
fixtures and benchmarks). pynvml itself is a pure-Python module, so its error
classes and constants are importable where no driver is installed.

:class:`NvmlSampler` turns one backend into an :class:`NvmlSample` per scrape:
per-GPU readings (``None`` where NVML said no), which GPUs are lost or
erroring, NVLink state and error counters, XID events drained since the
last scrape, and the NVML errors met on the way.

Identity: every GPU keeps the UUID and PCI bus id NVML last gave for its
index (as dcgm-exporter labels its series), so a GPU whose handle fails
later is still named by its bus id. Errors: ``GPU_IS_LOST`` anywhere marks
the GPU lost; any other error on the device handle, or an error on every
value read of a GPU, marks it *erroring* (what ``nvidia-smi`` prints as
"Unknown Error" and the like): node health treats both as a missing GPU.
One failing call, NVML error or not, never fails the sample.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pynvml

log = logging.getLogger(__name__)

T = TypeVar("T")

#: NVLink error counters read per link (``nvmlNvLinkErrorCounter_t``), by the
#: label value the exporter uses.
NVLINK_ERROR_COUNTERS: dict[str, int] = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    "ecc_data": pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA,
}

#: Clocks-event ("throttle") reason bits (``nvmlClocksEventReason*`` in the
#: NVML API reference), by label value, with what each means.
CLOCKS_EVENT_REASONS: dict[str, tuple[int, str]] = {
    "gpu_idle": (0x1, "nothing is running, clocks are dropping to idle"),
    "applications_clocks_setting": (0x2, "clocks limited by the applications clocks setting"),
    "sw_power_cap": (0x4, "software power scaling holds clocks below requested (power cap)"),
    "hw_slowdown": (0x8, "hardware slowdown by factor 2 or more (thermal, power brake, ...)"),
    "sync_boost": (0x10, "clocks held to match other GPUs in a sync-boost group"),
    "sw_thermal_slowdown": (0x20, "software thermal slowdown: GPU or memory above max operating temperature"),
    "hw_thermal_slowdown": (0x40, "hardware thermal slowdown: temperature too high"),
    "hw_power_brake_slowdown": (0x80, "hardware power brake: external power brake assertion"),
    "display_clock_setting": (0x100, "clocks limited by the display clock setting"),
}

#: Page retirement causes (``nvmlPageRetirementCause_t``), by label value.
RETIREMENT_CAUSES: dict[str, int] = {
    "single_bit_ecc": pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    "double_bit_ecc": pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
}

#: NVML return codes that mean "this GPU or driver does not offer the value":
#: expected capability gaps, not counted as errors.
UNSUPPORTED_CODES = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})

_ERROR_NAMES: dict[int, str] = {
    value: name.removeprefix("NVML_ERROR_").lower()
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


def error_name(exc: pynvml.NVMLError) -> str:
    """Short lower-case name of an NVML error code, e.g. ``gpu_is_lost``, ``not_supported``."""
    return _ERROR_NAMES.get(exc.value, f"code_{exc.value}")


class NvmlBackend(Protocol):
    """The subset of NVML the exporter needs.

    Every method raises ``pynvml.NVMLError`` (the subclass for the code)
    where NVML returns an error; ``NVML_ERROR_GPU_IS_LOST`` means the GPU has
    fallen off the bus. Handles are opaque.
    """

    def init(self) -> None:
        """``nvmlInit``; raises e.g. LIBRARY_NOT_FOUND or DRIVER_NOT_LOADED."""

    def shutdown(self) -> None:
        """``nvmlShutdown``."""

    def device_count(self) -> int:
        """``nvmlDeviceGetCount``: GPUs the driver enumerated (lost ones included)."""

    def device_handle(self, index: int) -> Any:
        """``nvmlDeviceGetHandleByIndex``."""

    def device_uuid(self, handle: Any) -> str:
        """``nvmlDeviceGetUUID``, e.g. ``GPU-5c1b...``."""

    def device_name(self, handle: Any) -> str:
        """``nvmlDeviceGetName``, e.g. ``NVIDIA H100 80GB HBM3``."""

    def device_pci_bus_id(self, handle: Any) -> str:
        """``nvmlDeviceGetPciInfo().busId``, e.g. ``00000000:18:00.0``."""

    def temperature_celsius(self, handle: Any) -> float:
        """``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)``: GPU die, Celsius."""

    def memory_temperature_celsius(self, handle: Any) -> float:
        """Field ``NVML_FI_DEV_MEMORY_TEMP``: HBM temperature, Celsius."""

    def power_milliwatts(self, handle: Any) -> int:
        """``nvmlDeviceGetPowerUsage``: board power draw, milliwatts."""

    def clocks_event_reasons(self, handle: Any) -> int:
        """``nvmlDeviceGetCurrentClocksEventReasons``: bitmask of :data:`CLOCKS_EVENT_REASONS`."""

    def ecc_aggregate(self, handle: Any, error_type: int) -> int:
        """``nvmlDeviceGetTotalEccErrors(error_type, NVML_AGGREGATE_ECC)``: lifetime count."""

    def retired_pages(self, handle: Any, cause: int) -> int:
        """Number of pages ``nvmlDeviceGetRetiredPages`` lists for ``cause``."""

    def retired_pages_pending(self, handle: Any) -> bool:
        """``nvmlDeviceGetRetiredPagesPendingStatus``: retirement waits for a reset."""

    def remapped_rows(self, handle: Any) -> tuple[int, int, bool, bool]:
        """``nvmlDeviceGetRemappedRows``: (correctable, uncorrectable, pending, failure)."""

    def nvlink_up(self, handle: Any, link: int) -> bool:
        """``nvmlDeviceGetNvLinkState``; raises INVALID_ARGUMENT/NOT_SUPPORTED past the last link."""

    def nvlink_error_counter(self, handle: Any, link: int, counter: int) -> int:
        """``nvmlDeviceGetNvLinkErrorCounter``: one of :data:`NVLINK_ERROR_COUNTERS`."""

    def register_xid_events(self, handle: Any, index: int) -> None:
        """Register the GPU for ``nvmlEventTypeXidCriticalError`` in the backend's event set."""

    def poll_xid_events(self, max_events: int) -> list[tuple[int, int]]:
        """Drain pending XID events without blocking: ``[(gpu_index, xid), ...]``."""


class PynvmlBackend:
    """:class:`NvmlBackend` over the real NVML through nvidia-ml-py (``pynvml``)."""

    def __init__(self) -> None:
        self._event_set: Any = None
        self._handles: dict[int, int] = {}  # handle address -> GPU index

    def init(self) -> None:
        """``nvmlInit``; see :class:`NvmlBackend`."""
        pynvml.nvmlInit()

    def shutdown(self) -> None:
        """Free the event set and ``nvmlShutdown``."""
        if self._event_set is not None:
            try:
                pynvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError:
                pass
            self._event_set = None
        pynvml.nvmlShutdown()

    def device_count(self) -> int:
        """See :class:`NvmlBackend`."""
        return int(pynvml.nvmlDeviceGetCount())

    def device_handle(self, index: int) -> Any:
        """See :class:`NvmlBackend`."""
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def device_uuid(self, handle: Any) -> str:
        """See :class:`NvmlBackend`."""
        return _text(pynvml.nvmlDeviceGetUUID(handle))

    def device_name(self, handle: Any) -> str:
        """See :class:`NvmlBackend`."""
        return _text(pynvml.nvmlDeviceGetName(handle))

    def device_pci_bus_id(self, handle: Any) -> str:
        """See :class:`NvmlBackend`."""
        return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)

    def temperature_celsius(self, handle: Any) -> float:
        """See :class:`NvmlBackend`."""
        return float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))

    def memory_temperature_celsius(self, handle: Any) -> float:
        """See :class:`NvmlBackend`; the per-field return code is raised as an NVMLError."""
        (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
        if value.nvmlReturn != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(value.nvmlReturn)
        return float(_field_value(value))

    def power_milliwatts(self, handle: Any) -> int:
        """See :class:`NvmlBackend`."""
        return int(pynvml.nvmlDeviceGetPowerUsage(handle))

    def clocks_event_reasons(self, handle: Any) -> int:
        """See :class:`NvmlBackend`; falls back to the pre-R535 "throttle reasons" call."""
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except pynvml.NVMLError_FunctionNotFound:
            return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def ecc_aggregate(self, handle: Any, error_type: int) -> int:
        """See :class:`NvmlBackend`."""
        return int(pynvml.nvmlDeviceGetTotalEccErrors(handle, error_type, pynvml.NVML_AGGREGATE_ECC))

    def retired_pages(self, handle: Any, cause: int) -> int:
        """See :class:`NvmlBackend`."""
        return len(pynvml.nvmlDeviceGetRetiredPages(handle, cause))

    def retired_pages_pending(self, handle: Any) -> bool:
        """See :class:`NvmlBackend`."""
        return pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == pynvml.NVML_FEATURE_ENABLED

    def remapped_rows(self, handle: Any) -> tuple[int, int, bool, bool]:
        """See :class:`NvmlBackend`."""
        corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
        return int(corr), int(unc), bool(pending), bool(failure)

    def nvlink_up(self, handle: Any, link: int) -> bool:
        """See :class:`NvmlBackend`."""
        return pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED

    def nvlink_error_counter(self, handle: Any, link: int, counter: int) -> int:
        """See :class:`NvmlBackend`."""
        return int(pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))

    def register_xid_events(self, handle: Any, index: int) -> None:
        """See :class:`NvmlBackend`; creates the event set on first use."""
        if self._event_set is None:
            self._event_set = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
        self._handles[_address(handle)] = index

    def poll_xid_events(self, max_events: int) -> list[tuple[int, int]]:
        """See :class:`NvmlBackend`: ``nvmlEventSetWait`` with a 0 ms timeout until TIMEOUT."""
        events: list[tuple[int, int]] = []
        if self._event_set is None:
            return events
        for _ in range(max_events):
            try:
                data = pynvml.nvmlEventSetWait(self._event_set, 0)
            except pynvml.NVMLError_Timeout:
                break
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                index = self._handles.get(_address(data.device))
                if index is not None:
                    events.append((index, int(data.eventData)))
        return events


def _any_error_name(exc: BaseException) -> str:
    """:func:`error_name` for NVML errors; ``exception_<type>`` for anything else a backend raised."""
    if isinstance(exc, pynvml.NVMLError):
        return error_name(exc)
    return f"exception_{type(exc).__name__.lower()}"


def _str_or_none(value: Any) -> str | None:
    """An identity string, ``None`` for no or empty value."""
    return str(value) if value not in (None, "") else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _field_value(value: Any) -> float:
    """The number in an ``nvmlFieldValue_t``, read from the union member its ``valueType`` names."""
    member = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }.get(value.valueType, "uiVal")
    return float(getattr(value.value, member))


@dataclass
class NvLinkSample:
    """One NVLink of one GPU.

    Attributes:
        link: link number (0-based).
        up: True when NVML reports the link enabled; ``None`` if unreadable.
        errors: error counter name (:data:`NVLINK_ERROR_COUNTERS`) -> count; absent if unreadable.
    """

    link: int
    up: bool | None = None
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class GpuSample:
    """One GPU at one scrape; ``None`` means NVML gave no value (unsupported or error).

    Attributes:
        index: NVML device index.
        lost: NVML said ``GPU_IS_LOST`` (fallen off the bus); other fields are then ``None``.
        handle_error: name of the NVML error ``nvmlDeviceGetHandleByIndex`` returned
            (other than GPU_IS_LOST), e.g. ``unknown``; other fields are then ``None``.
        reads_ok / reads_failed: value reads (temperature .. NVLink) that answered,
            and that failed with an error other than "not supported".
        uuid, name, pci_bus_id: identification (the last known values when the
            GPU is lost or its handle fails).
        temperature_celsius: GPU die temperature, Celsius.
        memory_temperature_celsius: HBM temperature, Celsius.
        power_watts: board power draw, watts (NVML milliwatts / 1000).
        clocks_event_reasons: bitmask, see :data:`CLOCKS_EVENT_REASONS`.
        ecc_errors: ``{"corrected": n, "uncorrected": n}`` aggregate (lifetime) counts.
        retired_pages: ``{"single_bit_ecc": n, "double_bit_ecc": n}`` retired page counts.
        retired_pages_pending: a retirement waits for the next GPU reset.
        remapped_rows: ``{"correctable": n, "uncorrectable": n}`` (Ampere and later).
        remapped_rows_pending, remapped_rows_failure: row remapping flags.
        nvlinks: one entry per NVLink the GPU has.
    """

    index: int
    lost: bool = False
    handle_error: str | None = None
    reads_ok: int = 0
    reads_failed: int = 0
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    power_watts: float | None = None
    clocks_event_reasons: int | None = None
    ecc_errors: dict[str, int] = field(default_factory=dict)
    retired_pages: dict[str, int] = field(default_factory=dict)
    retired_pages_pending: bool | None = None
    remapped_rows: dict[str, int] = field(default_factory=dict)
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    nvlinks: list[NvLinkSample] = field(default_factory=list)

    @property
    def erroring(self) -> bool:
        """NVML answers this GPU with errors: its handle failed, or every value read failed.

        A GPU whose reads are all "not supported" is not erroring (a capability
        gap); a lost GPU is reported as lost instead.
        """
        if self.lost:
            return False
        return self.handle_error is not None or (self.reads_ok == 0 and self.reads_failed > 0)


@dataclass
class NvmlSample:
    """Everything one scrape read through NVML.

    Attributes:
        available: NVML initialised (library and driver present).
        device_count: GPUs the driver enumerated; ``None`` when unavailable.
        gpus: one :class:`GpuSample` per index, lost ones included.
        errors: ``(gpu_index, call, error_name)`` for every unexpected NVML
            error (not the "not supported" ones).
        xid_events: ``(gpu_index, xid)`` critical XID events since the last sample.
    """

    available: bool
    device_count: int | None = None
    gpus: list[GpuSample] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    xid_events: list[tuple[int, int]] = field(default_factory=list)


class _GpuLost(Exception):
    pass


class NvmlSampler:
    """Reads all GPUs through one :class:`NvmlBackend`; one instance per exporter.

    NVML is initialised lazily and retried on the next sample after a failure
    (the driver may load after the exporter starts). XID registration happens
    once per GPU index; the NVLink count of each GPU is probed once (links
    ``0..max_links-1`` until NVML refuses one) and cached.

    Thread-safe: :meth:`sample` holds a lock (concurrent scrapes serialise).
    """

    #: At most this many XID events are drained per sample.
    MAX_XID_EVENTS_PER_SAMPLE = 256

    def __init__(self, backend: NvmlBackend, max_nvlinks: int = pynvml.NVML_NVLINK_MAX_LINKS,
                 pci_bus_ids: Callable[[], list[str]] | None = None) -> None:
        self.backend = backend
        self.max_nvlinks = max_nvlinks
        #: NVIDIA GPUs on the PCI bus in NVML order (``sysfs.nvidia_gpu_bus_ids``): names a GPU
        #: whose handle fails before NVML ever answered for it, when the counts agree.
        self.pci_bus_ids = pci_bus_ids
        self._initialised = False
        self._init_error: str | None = None
        self._xid_registered: set[int] = set()
        self._nvlink_counts: dict[str, int] = {}
        self._logged: set[tuple[int, str, type]] = set()
        #: index -> (uuid, pci_bus_id) last read: the GPU's identity once its handle fails.
        self._identity: dict[int, tuple[str | None, str | None]] = {}
        self._lock = threading.Lock()

    @property
    def init_error(self) -> str | None:
        """Name of the NVML error that made the last initialisation fail, if any."""
        return self._init_error

    def close(self) -> None:
        """Shut NVML down if it was initialised."""
        with self._lock:
            if self._initialised:
                try:
                    self.backend.shutdown()
                except pynvml.NVMLError:
                    pass
                self._initialised = False

    def sample(self) -> NvmlSample:
        """Read every GPU once.

        Returns:
            An :class:`NvmlSample`; ``available=False`` when NVML cannot be
            initialised (no library, no driver). Never raises NVMLError.
        """
        with self._lock:
            if not self._initialised:
                try:
                    self.backend.init()
                except Exception as exc:  # noqa: BLE001 - NVMLError, or a binding that cannot load
                    if self._init_error != _any_error_name(exc):
                        log.warning("NVML unavailable: %s", exc)
                    self._init_error = _any_error_name(exc)
                    return NvmlSample(available=False)
                self._initialised = True
                self._init_error = None
            sample = NvmlSample(available=True)
            try:
                sample.device_count = int(self.backend.device_count())
            except Exception as exc:  # noqa: BLE001 - NVML or not, the sample goes on
                sample.errors.append(("", "device_count", _any_error_name(exc)))
                return sample
            self._identity_from_pci(sample.device_count)
            for index in range(sample.device_count):
                sample.gpus.append(self._sample_gpu(index, sample.errors))
            try:
                sample.xid_events = self.backend.poll_xid_events(self.MAX_XID_EVENTS_PER_SAMPLE)
            except Exception as exc:  # noqa: BLE001
                sample.errors.append(("", "poll_xid_events", _any_error_name(exc)))
            return sample

    def _identity_from_pci(self, count: int) -> None:
        """Bus ids from the PCI bus for GPUs NVML never named, when the bus has exactly ``count`` GPUs."""
        if self.pci_bus_ids is None or all(i in self._identity for i in range(count)):
            return
        try:
            buses = self.pci_bus_ids()
        except Exception:  # noqa: BLE001 - identity is a nicety, never a failure
            return
        if len(buses) != count:
            return  # a GPU the driver does not list (or an extra board): the order would lie
        for index, bus in enumerate(buses):
            self._identity.setdefault(index, (None, bus))

    def identity(self, index: int) -> tuple[str | None, str | None]:
        """``(uuid, pci_bus_id)`` last read for GPU ``index`` (``(None, None)`` if never read)."""
        return self._identity.get(index, (None, None))

    def _sample_gpu(self, index: int, errors: list[tuple[str, str, str]]) -> GpuSample:
        gpu = GpuSample(index=index)
        label = str(index)
        counting = False  # identity calls do not count as value reads

        def call(name: str, fn: Callable[..., T], *args: Any) -> T | None:
            try:
                value = fn(*args)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost from exc
                if exc.value not in UNSUPPORTED_CODES:
                    errors.append((label, name, error_name(exc)))
                    gpu.reads_failed += counting
                return None
            except Exception as exc:  # noqa: BLE001 - a driver or binding bug must not fail the scrape
                if (index, name, type(exc)) not in self._logged:  # once, not on every scrape
                    self._logged.add((index, name, type(exc)))
                    log.warning("GPU %d: %s raised %s: %s", index, name, type(exc).__name__, exc)
                errors.append((label, name, _any_error_name(exc)))
                gpu.reads_failed += counting
                return None
            gpu.reads_ok += counting
            return value

        b = self.backend
        known_uuid, known_bus = self._identity.get(index, (None, None))
        try:
            try:
                handle = b.device_handle(index)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost from exc
                gpu.handle_error = error_name(exc)
                errors.append((label, "device_handle", gpu.handle_error))
                gpu.uuid, gpu.pci_bus_id = known_uuid, known_bus
                return gpu
            except Exception as exc:  # noqa: BLE001
                gpu.handle_error = _any_error_name(exc)
                errors.append((label, "device_handle", gpu.handle_error))
                gpu.uuid, gpu.pci_bus_id = known_uuid, known_bus
                return gpu
            gpu.uuid = _str_or_none(call("device_uuid", b.device_uuid, handle)) or known_uuid
            gpu.name = _str_or_none(call("device_name", b.device_name, handle))
            gpu.pci_bus_id = _str_or_none(call("device_pci_bus_id", b.device_pci_bus_id, handle)) or known_bus
            self._identity[index] = (gpu.uuid, gpu.pci_bus_id)
            counting = True
            gpu.temperature_celsius = call("temperature", b.temperature_celsius, handle)
            gpu.memory_temperature_celsius = call("memory_temperature", b.memory_temperature_celsius, handle)
            milliwatts = call("power_usage", b.power_milliwatts, handle)
            gpu.power_watts = None if milliwatts is None else milliwatts / 1000.0
            gpu.clocks_event_reasons = call("clocks_event_reasons", b.clocks_event_reasons, handle)
            for type_name, error_type in (
                ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ):
                count = call("total_ecc_errors", b.ecc_aggregate, handle, error_type)
                if count is not None:
                    gpu.ecc_errors[type_name] = count
            for cause_name, cause in RETIREMENT_CAUSES.items():
                count = call("retired_pages", b.retired_pages, handle, cause)
                if count is not None:
                    gpu.retired_pages[cause_name] = count
            gpu.retired_pages_pending = call("retired_pages_pending", b.retired_pages_pending, handle)
            rows = call("remapped_rows", b.remapped_rows, handle)
            if rows is not None:
                gpu.remapped_rows = {"correctable": rows[0], "uncorrectable": rows[1]}
                gpu.remapped_rows_pending, gpu.remapped_rows_failure = rows[2], rows[3]
            gpu.nvlinks = self._sample_nvlinks(gpu, handle, call)
            counting = False
            if index not in self._xid_registered:
                call("register_events", b.register_xid_events, handle, index)
                self._xid_registered.add(index)
        except _GpuLost:
            uuid, bus = self._identity.get(index, (gpu.uuid or known_uuid, gpu.pci_bus_id or known_bus))
            return GpuSample(index=index, lost=True, uuid=uuid, pci_bus_id=bus)
        return gpu

    def _sample_nvlinks(self, gpu: GpuSample, handle: Any, call: Callable[..., Any]) -> list[NvLinkSample]:
        b = self.backend
        key = gpu.uuid or f"index-{gpu.index}"
        count = self._nvlink_counts.get(key)
        links: list[NvLinkSample] = []
        if count is None:
            # Probe: a link index past the GPU's last raises INVALID_ARGUMENT or NOT_SUPPORTED.
            count = 0
            for link in range(self.max_nvlinks):
                try:
                    up = b.nvlink_up(handle, link)
                except pynvml.NVMLError as exc:
                    if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                        raise _GpuLost from exc
                    break
                except Exception:  # noqa: BLE001 - treat like the end of the links
                    break
                links.append(NvLinkSample(link=link, up=up))
                count += 1
            self._nvlink_counts[key] = count
        else:
            for link in range(count):
                links.append(NvLinkSample(link=link, up=call("nvlink_state", b.nvlink_up, handle, link)))
        for sample in links:
            for name, counter in NVLINK_ERROR_COUNTERS.items():
                value = call("nvlink_error_counter", b.nvlink_error_counter, handle, sample.link, counter)
                if value is not None:
                    sample.errors[name] = value
        return links
