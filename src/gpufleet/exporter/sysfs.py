"""Read InfiniBand/RoCE HCA and port state from sysfs: a pure module, no metrics.

This module is to the exporter what procfs ``sysfs/class_infiniband.go`` is to
node_exporter's ``collector/infiniband_linux.go``: it turns the files under
``<sysfs-root>/class/infiniband/`` into plain dataclasses and knows nothing
about Prometheus. The layout and the meaning of every file come from the
kernel's ``Documentation/ABI/stable/sysfs-class-infiniband`` and the port
counter tables in ``drivers/infiniband/core/sysfs.c``::

    class/infiniband/<hca>/{board_id,fw_ver,hca_type,node_guid}
    class/infiniband/<hca>/ports/<port>/{state,phys_state,rate,link_layer}
    class/infiniband/<hca>/ports/<port>/counters/<name>      (IBA PMA PortCounters or PortCountersExtended)
    class/infiniband/<hca>/ports/<port>/counters/<name>_64   (64-bit twins some drivers add)
    class/infiniband/<hca>/ports/<port>/counters_ext/<name>  (deprecated: 64-bit counters of old out-of-tree drivers)
    class/infiniband/<hca>/ports/<port>/hw_counters/<name>   (driver counters, mlx5 and others)

What ``counters/`` is (``get_counter_table`` in ``drivers/infiniband/core/sysfs.c``,
since Linux 4.5): the kernel asks the port's PMA for its ClassPortInfo and
writes one of three tables under the same directory name:

* ``IB_PMA_CLASS_CAP_EXT_WIDTH``: PortCountersExtended (``pma_group_ext``):
  the 32-bit error counters, ``port_{xmit,rcv}_{data,packets}`` as 64-bit
  counters and the ``{unicast,multicast}_{xmit,rcv}_packets`` only this table
  has: their presence is the signal (:data:`TABLE_EXTENDED`);
* ``IB_PMA_CLASS_CAP_EXT_WIDTH_NOIETF``: the same 64-bit data and packet
  counters without the unicast/multicast ones (``pma_group_noietf``);
* otherwise PortCounters (``pma_group``): data and packet counters 32-bit.

The last two carry the same file names (:data:`TABLE_BASIC`); a value above
``2**32 - 1`` shows the no-IETF table. ``counters_ext/`` is no kernel
directory: old MLNX OFED releases (mlx4/mlx5, from before the kernel had
the extended table) wrote it beside a 32-bit ``counters/``, and some still
write it beside the kernel's extended table, where it is stale. How each counter's source is chosen
(:func:`choose_counters`):

==================================  ===========================================  ==========================
``counters/`` (table)               data and packet counters from                unicast/multicast from
==================================  ===========================================  ==========================
extended (``unicast_*`` present)    ``counters/`` (64-bit); ``counters_ext/``    ``counters/``
                                    and ``*_64`` twins are not used
basic, with ``*_64`` twins          ``counters/<name>_64`` where one exists,     ``counters_ext/`` if any
                                    else as in the rows below
basic, with ``counters_ext/``       ``counters_ext/<name>_64``                   ``counters_ext/``
basic alone                         ``counters/`` (32-bit, or no-IETF 64-bit)    none
absent (no ``counters/``)           ``counters_ext/`` if any                     ``counters_ext/`` if any
==================================  ===========================================  ==========================

Error counters and ``port_xmit_wait`` always come from ``counters/``.

Other shapes real drivers write, all handled (sysfs ABI, ``drivers/infiniband/core/sysfs.c``,
and what mlx4/mlx5, MLNX OFED, irdma, rxe/siw and efa hosts show):

* ``rate``: ``400 Gb/sec (4X NDR)``, ``2.5 Gb/sec (1X SDR)``, ``10 Gb/sec (4X)``
  (no speed name); ``0 GB/sec`` on a port whose cage is empty or link down
  (MLNX OFED: rate 0, no width); a read failing with EINVAL where the
  kernel finds no valid width (a down port on upstream kernels);
* counters that the device cannot answer read ``N/A (no PMA)`` (devices
  without a performance-management agent: iWARP, rxe) or fail with EINVAL,
  EOPNOTSUPP, ENOSYS or ENODATA: these are *unsupported*, not errors;
* no ``counters/`` at all (irdma, efa), no ``hw_counters/`` (older drivers);
* ``link_layer`` ``InfiniBand`` or ``Ethernet`` (RoCE).

Rules the reader keeps (and the exporter relies on):

* a missing file or directory is not an error: the value is ``None`` / the
  key is absent, so the series is absent rather than zero;
* an unsupported value (above) is listed in :attr:`InfiniBandPort.unsupported`:
  no value, no error;
* a file that exists but cannot be read or parsed (permission, I/O error,
  garbage) is recorded as a :class:`ReadError` naming the file and never raises;
* counter values are returned raw under their canonical ``counters/`` name:
  ``port_xmit_data``/``port_rcv_data`` stay in the 4-octet units the IBA PMA
  counts in, whichever file they came from (see :data:`DATA_OCTETS_PER_UNIT`);
  :attr:`InfiniBandPort.sources` names the file of each value.

The reader runs on every scrape (hundreds of files): it joins string paths
and reads with ``os.open``/``os.read`` rather than ``pathlib`` and buffered
files, and parses counters straight from the bytes read.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: ``port_xmit_data`` and ``port_rcv_data`` count 32-bit words: "Total number of
#: data octets, divided by 4 (lanes)" (sysfs-class-infiniband ABI; IBA vol. 1,
#: PortXmitData/PortRcvData). Multiply by this to get bytes.
DATA_OCTETS_PER_UNIT = 4

#: Bit width of each PortCounters field exposed under ``counters/`` (IBA vol. 1
#: table "PortCounters"; kernel ``PORT_PMA_ATTR(name, counter, width, offset)``).
#: IB PMA counters do not wrap: they stop at all-ones (``2**width - 1``).
#: The data and packet counters are 32-bit in PortCounters and 64-bit when the
#: HCA reports extended counters (``PORT_PMA_ATTR_EXT``); see
#: :func:`counter_width`.
PMA_COUNTER_WIDTH_BITS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
    # 32-bit in PortCounters, 64-bit in PortCountersExtended: see counter_width().
    "port_xmit_data": 32,
    "port_rcv_data": 32,
    "port_xmit_packets": 32,
    "port_rcv_packets": 32,
    # Only in the extended (IETF) table, always 64-bit.
    "unicast_xmit_packets": 64,
    "unicast_rcv_packets": 64,
    "multicast_xmit_packets": 64,
    "multicast_rcv_packets": 64,
}

#: Counters that are 64-bit when the port uses PortCountersExtended.
EXTENDABLE_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"})

#: Files in ``hw_counters/`` that are not counters. ``lifespan`` is the cache
#: lifetime of the driver statistics in milliseconds (kernel ``sysfs.c``).
HW_COUNTER_NON_COUNTERS = frozenset({"lifespan"})

#: ``counters_ext/`` files (64-bit PortCountersExtended of old out-of-tree MLNX OFED
#: drivers) -> the canonical ``counters/`` name they stand for.
COUNTERS_EXT_NAMES: dict[str, str] = {
    "port_xmit_data_64": "port_xmit_data",
    "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets",
    "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets",
    "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets",
    "port_multicast_rcv_packets": "multicast_rcv_packets",
}

#: What the kernel's ``counters/`` is (module docstring): PortCountersExtended
#: (``unicast_*``/``multicast_*`` present; data and packet counters 64-bit), PortCounters
#: (or its no-IETF 64-bit variant: same names), or no ``counters/`` directory.
TABLE_EXTENDED = "extended"
TABLE_BASIC = "basic"
TABLE_ABSENT = "absent"
#: Files only PortCountersExtended has (kernel ``pma_attrs_ext``).
EXTENDED_ONLY_COUNTERS = frozenset({"unicast_xmit_packets", "unicast_rcv_packets",
                                    "multicast_xmit_packets", "multicast_rcv_packets"})

#: errno values of a read that mean "the device offers no value here", not a failure:
#: EINVAL (``rate`` of a port without a valid width; counters some drivers refuse),
#: EOPNOTSUPP, ENOSYS (no ``process_mad``: no PMA), ENODATA.
UNSUPPORTED_ERRNOS = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.ENODATA})
#: Contents that mean the same: ``N/A (no PMA)`` (kernels before 4.19 for devices
#: without a PMA), ``N/A``.
_UNSUPPORTED_TEXT = re.compile(r"^N/A\b", re.IGNORECASE)

#: ``rate`` reads e.g. ``400 Gb/sec (4X NDR)``, ``2.5 Gb/sec (1X SDR)``, ``10 Gb/sec (4X)``
#: or ``0 GB/sec`` (MLNX OFED on an empty cage; the unit is Gb/s whatever the case of B).
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*G[bB]/sec\b\s*(?:\(\s*([0-9]+)X\s*([^)]*?)\s*\))?")
#: ``state`` and ``phys_state`` read ``<code>: <name>``, e.g. ``4: ACTIVE``, ``5: LinkUp``.
_ENUM_RE = re.compile(r"^\s*([0-9]+)\s*:\s*(\S.*?)\s*$")


@dataclass(frozen=True)
class ReadError:
    """One file that exists but could not be read or parsed.

    Attributes:
        path: the file, relative to the sysfs root (``class/infiniband/mlx5_0/ports/1/counters/symbol_error``).
        reason: short cause: the OS error name or ``malformed``.
    """

    path: str
    reason: str


@dataclass(frozen=True)
class Rate:
    """A parsed ``rate`` file.

    Attributes:
        bytes_per_second: the data rate, Gb/s * 1e9 / 8 (0 for ``0 GB/sec``).
        width: active link width in lanes (the ``4`` of ``4X``), ``None`` when not printed.
        speed: per-lane speed name (``NDR``, ``HDR``...), ``None`` when not printed.
    """

    bytes_per_second: float
    width: int | None = None
    speed: str | None = None


@dataclass(frozen=True)
class EnumValue:
    """A ``<code>: <name>`` sysfs value such as ``4: ACTIVE``.

    Attributes:
        code: the numeric code (IBA PortState / PortPhysicalState).
        name: the text after the colon, as the kernel prints it.
    """

    code: int
    name: str


@dataclass
class InfiniBandPort:
    """One port of an HCA, values raw as sysfs has them (``None`` = file absent or unreadable).

    Attributes:
        port: port number (1-based, the directory name).
        state: logical port state (``1: DOWN`` .. ``4: ACTIVE``, ``5: ACTIVE_DEFER``).
        phys_state: physical port state (``2: Polling``, ``3: Disabled``, ``5: LinkUp`` ...).
        rate_text: the ``rate`` file stripped, e.g. ``400 Gb/sec (4X NDR)``.
        rate_bytes_per_second: ``rate`` converted: Gb/s * 1e9 / 8 (signalling
            data rate after encoding, as the kernel reports it); 0 for a down port
            reading ``0 GB/sec``.
        width: active link width in lanes from ``rate`` (``4X`` -> 4), ``None`` when not printed.
        speed: per-lane speed from ``rate`` (``NDR``), ``None`` when not printed.
        link_layer: ``InfiniBand`` or ``Ethernet`` (RoCE).
        counters: canonical ``counters/`` name -> raw integer (PMA units; data
            counters in 4-octet words), from the 64-bit file where one exists.
        sources: canonical name -> the file its value came from, relative to the
            port (``counters_ext/port_xmit_data_64``), for every counter in ``counters``.
        wide: canonical names whose value came from a 64-bit file (the
            extended table's data and packet counters, ``*_64``, ``counters_ext/``).
        table: what ``counters/`` is: :data:`TABLE_EXTENDED`, :data:`TABLE_BASIC`
            or :data:`TABLE_ABSENT` (no directory); ``None`` on a port built by
            hand, where :attr:`extended_counters` looks at ``counters``.
        hw_counters: ``hw_counters/<name>`` -> raw integer; ``None`` when the
            directory does not exist (not every driver has it).
        unsupported: files, relative to the port, that exist but offer no value
            (``N/A (no PMA)``, EINVAL, EOPNOTSUPP...): neither a value nor an error.
    """

    port: int
    state: EnumValue | None = None
    phys_state: EnumValue | None = None
    rate_text: str | None = None
    rate_bytes_per_second: float | None = None
    width: int | None = None
    speed: str | None = None
    link_layer: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    wide: frozenset[str] = frozenset()
    table: str | None = None
    hw_counters: dict[str, int] | None = None
    unsupported: list[str] = field(default_factory=list)

    @property
    def extended_counters(self) -> bool:
        """True when the port's ``counters/`` come from PortCountersExtended.

        The kernel picks the extended (IETF) table, whose data and packet
        counters are 64-bit, when the PMA ClassPortInfo has
        ``IB_PMA_CLASS_CAP_EXT_WIDTH``; only that table has the
        ``unicast_*``/``multicast_*`` files, so their presence is the signal.
        (The rare "no IETF" extended table is 64-bit too but indistinguishable
        from the 32-bit one; :func:`is_saturated` handles it conservatively.)
        Read from the directory listing (:attr:`table`), so a port whose
        ``unicast_*`` files read ``N/A`` still counts as extended.
        """
        if self.table is not None:
            return self.table == TABLE_EXTENDED
        return "unicast_xmit_packets" in self.counters or "unicast_rcv_packets" in self.counters


@dataclass
class InfiniBandDevice:
    """One HCA (``class/infiniband/<name>``).

    Attributes:
        name: device name, e.g. ``mlx5_0``.
        board_id, fw_ver, hca_type, node_guid: identification files, ``None`` if absent.
        ports: ports sorted by number.
    """

    name: str
    board_id: str | None = None
    fw_ver: str | None = None
    hca_type: str | None = None
    node_guid: str | None = None
    ports: list[InfiniBandPort] = field(default_factory=list)


@dataclass
class InfiniBandClass:
    """Everything read from ``class/infiniband`` in one pass.

    Attributes:
        devices: HCAs sorted by name (empty when the class directory is absent).
        errors: files that exist but could not be read or parsed.
        unsupported: files (relative to the sysfs root) that exist but offer no value.
        listed: False when ``class/infiniband`` exists but could not be listed
            (the error is in ``errors``); True when listed or absent.
    """

    devices: list[InfiniBandDevice] = field(default_factory=list)
    errors: list[ReadError] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    listed: bool = True


def counter_width(name: str, port: InfiniBandPort) -> int | None:
    """Bit width of ``counters/<name>`` on ``port``, or ``None`` if not an IBA PMA counter.

    Widths follow the IBA PortCounters table (:data:`PMA_COUNTER_WIDTH_BITS`);
    data/packet counters are 64-bit on ports with extended counters.
    """
    width = PMA_COUNTER_WIDTH_BITS.get(name)
    if width is not None and name in EXTENDABLE_COUNTERS and (port.extended_counters or name in port.wide):
        return 64
    return width


def is_saturated(name: str, value: int, port: InfiniBandPort) -> bool | None:
    """Whether a ``counters/`` value sits at its width's maximum (all-ones).

    IB PMA counters clamp at ``2**width - 1`` instead of wrapping (IBA vol. 1,
    PortCounters: "when the counter reaches its maximum value it shall stop"),
    so a saturated counter shows a flat rate while errors keep happening.
    A 32-bit data counter on a port that may be extended (no ``unicast_*``
    files) is flagged at ``2**32 - 1`` too: the chance of a true 64-bit value
    sitting exactly there is negligible, a missed saturation is not; a value
    above ``2**32 - 1`` shows the counter is really 64-bit.

    Returns:
        True/False, or ``None`` when the width is unknown (not a PMA counter).
    """
    width = counter_width(name, port)
    if width is None:
        return None
    if value == (1 << width) - 1:
        return True
    # A "32-bit" data counter above 2**32 - 1 is really a 64-bit one (the
    # no-IETF extended table): it saturates at 2**64 - 1.
    return width == 32 and name in EXTENDABLE_COUNTERS and value == (1 << 64) - 1


def parse_enum(text: str) -> EnumValue:
    """Parse ``"4: ACTIVE"`` into ``EnumValue(4, "ACTIVE")``.

    Raises:
        ValueError: when the text is not ``<integer>: <name>``.
    """
    m = _ENUM_RE.match(text)
    if not m:
        raise ValueError(f"not '<code>: <name>': {text!r}")
    return EnumValue(int(m.group(1)), m.group(2))


def parse_rate_full(text: str) -> Rate:
    """Parse a ``rate`` file: ``"400 Gb/sec (4X NDR)"`` -> ``Rate(5e10, 4, "NDR")``; ``"0 GB/sec"`` -> ``Rate(0.0)``.

    The kernel prints the port's data rate in Gb/s (active width times active
    speed, ``rate_show`` in ``drivers/infiniband/core/sysfs.c``), then the
    width and speed name in parentheses; MLNX OFED prints ``0 GB/sec`` (no
    width) for a port without a link.

    Raises:
        ValueError: when the text does not start with ``<number> Gb/sec``.
    """
    m = _RATE_RE.match(text)
    if not m:
        raise ValueError(f"not '<n> Gb/sec ...': {text!r}")
    width = int(m.group(2)) if m.group(2) else None
    return Rate(float(m.group(1)) * 1e9 / 8, width, (m.group(3) or None) if width is not None else None)


def parse_rate(text: str) -> float:
    """Parse ``"400 Gb/sec (4X NDR)"`` into bytes per second (400e9 / 8 = 5e10); see :func:`parse_rate_full`.

    Raises:
        ValueError: when the text does not start with ``<number> Gb/sec``.
    """
    return parse_rate_full(text).bytes_per_second


def parse_counter(text: str) -> int:
    """Parse a counter file's content (a non-negative decimal integer).

    Raises:
        ValueError: on anything else, e.g. ``N/A (no PMA)`` or a negative number.
    """
    value = int(text.strip(), 10)
    if value < 0:
        raise ValueError(f"negative counter: {text!r}")
    return value


class _Reader:
    """Reads files below one sysfs root, collecting errors and unsupported files instead of raising.

    Paths are plain strings joined with ``/`` (the reader runs on every
    scrape; ``pathlib`` objects cost more than the reads).
    """

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") or "/"
        self._cut = len(self.root) + (0 if self.root == "/" else 1)
        self.errors: list[ReadError] = []
        #: files (relative to the root) that offered no value this pass.
        self.unsupported: list[str] = []

    def rel(self, path: str) -> str:
        """``path`` relative to the sysfs root, for error records."""
        return path[self._cut:]

    def raw(self, path: str) -> bytes | None:
        """The file's bytes; ``None`` when absent (silently), unsupported (listed) or unreadable (recorded)."""
        try:
            # os.open/os.read: no buffered-IO objects per file (hundreds of files per scrape).
            fd = os.open(path, os.O_RDONLY)
            try:
                return os.read(fd, 4096)
            finally:
                os.close(fd)
        except OSError as exc:
            self.os_error(path, exc)
            return None

    def os_error(self, path: str, exc: OSError) -> None:
        """Record a failed read: absent is silent, unsupported is listed, anything else is a :class:`ReadError`."""
        if isinstance(exc, FileNotFoundError):
            return
        if exc.errno in UNSUPPORTED_ERRNOS:
            self.unsupported.append(self.rel(path))
        else:
            self.errors.append(ReadError(self.rel(path), _os_reason(exc)))

    def decode(self, path: str, data: bytes) -> str | None:
        """``data`` read from ``path`` as stripped ASCII; ``None`` when not ASCII (recorded) or ``N/A`` (listed)."""
        try:
            text = data.decode("ascii").strip()
        except UnicodeDecodeError:
            self.errors.append(ReadError(self.rel(path), "malformed"))
            return None
        if _UNSUPPORTED_TEXT.match(text):
            self.unsupported.append(self.rel(path))
            return None
        return text

    def text(self, path: str) -> str | None:
        """File content stripped; ``None`` when absent (silently), unsupported (listed) or unreadable (recorded)."""
        data = self.raw(path)
        return None if data is None else self.decode(path, data)

    def parsed(self, path: str, parse: Any) -> Any:
        """``parse(text)`` of the file; ``None`` when absent, unsupported, unreadable or malformed (recorded)."""
        text = self.text(path)
        if text is None:
            return None
        try:
            return parse(text)
        except ValueError:
            self.errors.append(ReadError(self.rel(path), "malformed"))
            return None

    def counter(self, path: str) -> int | None:
        """One counter file as :func:`parse_counter` reads it; ``None`` as :meth:`parsed` gives it."""
        data = self.raw(path)
        if data is None:
            return None
        try:
            # int() takes the bytes and their surrounding whitespace as they are: the common case.
            value = int(data)
        except ValueError:
            return self._slow_counter(path, data)
        if value < 0:
            self.errors.append(ReadError(self.rel(path), "malformed"))
            return None
        return value

    def _slow_counter(self, path: str, data: bytes) -> int | None:
        text = self.decode(path, data)
        if text is None:
            return None
        try:
            return parse_counter(text)
        except ValueError:
            self.errors.append(ReadError(self.rel(path), "malformed"))
            return None

    def listdir(self, path: str) -> list[str] | None:
        """Sorted entry names; ``None`` when the directory is absent or unreadable (recorded)."""
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            self.errors.append(ReadError(self.rel(path), "malformed"))
            return None
        except OSError as exc:
            self.errors.append(ReadError(self.rel(path), _os_reason(exc)))
            return None
        names.sort()
        return names

    def counters(self, directory: str, names: list[str] | None,
                 skip: frozenset[str] = frozenset()) -> dict[str, int] | None:
        """Every counter file ``names`` of ``directory`` (minus ``skip``), each as :meth:`counter`
        reads it; ``None`` when ``names`` is (no directory). The loop is :meth:`counter` inlined:
        it runs for every counter file on every scrape."""
        if names is None:
            return None
        values: dict[str, int] = {}
        prefix = directory + "/"
        open_, read, close, rdonly = os.open, os.read, os.close, os.O_RDONLY
        for name in names:
            if name in skip:
                continue
            path = prefix + name
            try:
                fd = open_(path, rdonly)
                try:
                    data = read(fd, 4096)
                finally:
                    close(fd)
            except OSError as exc:
                self.os_error(path, exc)
                continue
            try:
                value = int(data)
            except ValueError:
                value = self._slow_counter(path, data)
                if value is None:
                    continue
            if value < 0:
                self.errors.append(ReadError(self.rel(path), "malformed"))
                continue
            values[name] = value
        return values


def _os_reason(exc: OSError) -> str:
    if isinstance(exc, IsADirectoryError):
        return "is_a_directory"
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__).lower()


def _port_sort_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def counters_table(names: list[str] | None) -> str:
    """What a ``counters/`` directory listing is: :data:`TABLE_EXTENDED`, :data:`TABLE_BASIC` or :data:`TABLE_ABSENT` (``None``: no directory).

    Only PortCountersExtended has the ``unicast_*``/``multicast_*`` files
    (kernel ``pma_attrs_ext``; module docstring).
    """
    if names is None:
        return TABLE_ABSENT
    return TABLE_EXTENDED if not EXTENDED_ONLY_COUNTERS.isdisjoint(names) else TABLE_BASIC


def choose_counters(table: str, plain: dict[str, int], ext: dict[str, int] | None,
                    ) -> tuple[dict[str, int], dict[str, str], frozenset[str]]:
    """Pick each counter's source from what each directory is (the table in the module docstring).

    Args:
        table: what ``counters/`` is (:func:`counters_table`).
        plain: values read from ``counters/`` (``*_64`` twins included).
        ext: values read from ``counters_ext/``; ``None`` when it does not exist.

    Returns:
        ``(counters, sources, wide)`` as :class:`InfiniBandPort` keeps them:
        canonical name -> value, canonical name -> file relative to the port,
        and the canonical names whose value is a 64-bit counter.
    """
    counters: dict[str, int] = {}
    sources: dict[str, str] = {}
    wide: set[str] = set()
    extended = table == TABLE_EXTENDED
    for name, value in plain.items():
        if name.endswith("_64"):
            continue
        counters[name] = value
        sources[name] = "counters/" + name
        if extended and name in EXTENDABLE_COUNTERS:
            wide.add(name)
    if extended:
        # The kernel's 64-bit table: counters_ext/ (old drivers, stale beside it) and twins are not used.
        return counters, sources, frozenset(wide)
    # 32-bit (or indistinguishable no-IETF) table, or none: 64-bit twins, then counters_ext/.
    for name, value in plain.items():
        if name.endswith("_64"):
            canonical = name.removesuffix("_64")
            counters[canonical] = value
            sources[canonical] = "counters/" + name
            wide.add(canonical)
    for name, value in (ext or {}).items():
        canonical = COUNTERS_EXT_NAMES.get(name)
        if canonical is None:
            key = "counters_ext/" + name
            counters[key] = value
            sources[key] = key
            continue
        if canonical in wide:  # a counters/<name>_64 twin: the kernel's own file wins
            continue
        counters[canonical] = value
        sources[canonical] = "counters_ext/" + name
        wide.add(canonical)
    return counters, sources, frozenset(wide)


def _read_port(reader: _Reader, pdir: str, number: int) -> InfiniBandPort:
    """One port directory (module docstring for the shapes), never raising."""
    first_unsupported = len(reader.unsupported)
    rate_text = reader.text(pdir + "/rate")
    rate = None
    if rate_text is not None:
        try:
            rate = parse_rate_full(rate_text)
        except ValueError:
            reader.errors.append(ReadError(reader.rel(pdir + "/rate"), "malformed"))
            rate_text = None
    names = reader.listdir(pdir + "/counters")
    table = counters_table(names)
    plain = reader.counters(pdir + "/counters", names) or {}
    if table == TABLE_EXTENDED:
        ext = None  # deprecated beside the kernel's extended table: not read at all
    else:
        ext = reader.counters(pdir + "/counters_ext", reader.listdir(pdir + "/counters_ext"))
    counters, sources, wide = choose_counters(table, plain, ext)
    port = InfiniBandPort(
        port=number,
        state=reader.parsed(pdir + "/state", parse_enum),
        phys_state=reader.parsed(pdir + "/phys_state", parse_enum),
        rate_text=rate_text,
        rate_bytes_per_second=None if rate is None else rate.bytes_per_second,
        width=None if rate is None else rate.width,
        speed=None if rate is None else rate.speed,
        link_layer=reader.text(pdir + "/link_layer"),
        counters=counters,
        sources=sources,
        wide=wide,
        table=table,
        hw_counters=reader.counters(pdir + "/hw_counters", reader.listdir(pdir + "/hw_counters"),
                                    HW_COUNTER_NON_COUNTERS),
    )
    if len(reader.unsupported) > first_unsupported:
        cut = len(reader.rel(pdir)) + 1
        port.unsupported = [p[cut:] for p in reader.unsupported[first_unsupported:]]
    return port


def read_infiniband(sysfs_root: str | os.PathLike[str] = "/sys") -> InfiniBandClass:
    """Read every HCA and port under ``<sysfs_root>/class/infiniband``.

    Args:
        sysfs_root: the sysfs mount point (``/sys`` on a host, a fixture tree in tests).

    Returns:
        An :class:`InfiniBandClass`; devices and ports are sorted so output is
        deterministic. A missing ``class/infiniband`` gives no devices and no errors.

    Never raises for file content or permissions; those become
    :class:`ReadError` entries naming the file.
    """
    reader = _Reader(os.fspath(sysfs_root))
    result = InfiniBandClass(errors=reader.errors)
    class_dir = reader.root.rstrip("/") + "/class/infiniband"
    hcas = reader.listdir(class_dir)
    result.listed = hcas is not None or not reader.errors
    for hca in hcas or []:
        hca_dir = f"{class_dir}/{hca}"
        device = InfiniBandDevice(
            name=hca,
            board_id=reader.text(hca_dir + "/board_id"),
            fw_ver=reader.text(hca_dir + "/fw_ver"),
            hca_type=reader.text(hca_dir + "/hca_type"),
            node_guid=reader.text(hca_dir + "/node_guid"),
        )
        ports_dir = hca_dir + "/ports"
        for port_name in sorted(reader.listdir(ports_dir) or [], key=_port_sort_key):
            if not port_name.isdigit():
                continue
            device.ports.append(_read_port(reader, f"{ports_dir}/{port_name}", int(port_name)))
        result.devices.append(device)
    result.unsupported = reader.unsupported
    return result


#: PCI ids of NVIDIA GPUs in ``bus/pci/devices/*/{vendor,class}``: vendor NVIDIA; class
#: 0x0302 (3D controller: data-centre GPUs) or 0x0300 (VGA: workstation boards).
PCI_VENDOR_NVIDIA = "0x10de"
PCI_GPU_CLASSES = ("0x0302", "0x0300")


def nvidia_gpu_bus_ids(sysfs_root: str | os.PathLike[str] = "/sys") -> list[str]:
    """PCI addresses of the NVIDIA GPUs under ``<sysfs_root>/bus/pci/devices``, in NVML's
    ``busId`` form (``00000000:18:00.0``), sorted: the order NVML numbers GPUs in.

    Never raises: an unreadable or absent tree gives ``[]``.
    """
    devices = Path(sysfs_root) / "bus" / "pci" / "devices"
    found = []
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        return []
    for name in names:
        try:
            vendor = (devices / name / "vendor").read_text().strip().lower()
            klass = (devices / name / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == PCI_VENDOR_NVIDIA and klass.startswith(PCI_GPU_CLASSES):
            domain, _, rest = name.partition(":")
            found.append(f"{int(domain, 16):08x}:{rest}".upper())
    return found

