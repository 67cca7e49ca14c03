"""Helpers of the node checks: one :class:`Node` per host, its variables and cached readings.

The checks read a node the way an operator would: ``nvidia-smi`` for GPUs
and NVLinks, sysfs files for HCA ports and the PCI bus (GPUs and NVSwitches
the driver may no longer list), ``systemctl`` for the fabric manager,
``/proc/mounts`` and ``dd`` for the checkpoint filesystem, the kernel log
for XIDs.

Commands never make a check crash: every command runs wrapped so that its
own exit status comes back in the output and the transport sees 0 (over SSH
a remote exit 255, which ``nvidia-smi`` uses for "other error", is otherwise
indistinguishable from a lost connection and testinfra raises); a host that
cannot be reached at all gives a result with rc 255 and the transport's
message, which the checks report as a failure naming the host. Every path and command comes
from a variable (see :data:`DEFAULTS`) so fixture nodes can stand in for real
ones. Each reading is taken once per host and shared by all tests of that
host (parametrized per GPU, link or port), so a node with 8 GPUs x 18 links
costs one ``nvidia-smi nvlink -e`` pair, not 144.

Variable precedence (lowest first): :data:`DEFAULTS`, role defaults files
(``roles/*/defaults.yaml``), the Ansible inventory (``host.ansible.get_variables()``),
``--node-vars-file``, ``--node-var KEY=VALUE``.
"""

from __future__ import annotations

import csv
import re
import shlex
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Defaults of every variable the checks read (documented role defaults; the
#: inventory overrides them).
DEFAULTS: dict[str, Any] = {
    "gpu_model": None,
    "gpu_count": None,
    "gpu_nvlink_count": None,  # None: derived from gpu_model, see nvlinks_for_model()
    "node_hcas": [],
    "nvidia_driver_version": None,
    "nvidia_fabric_manager_version": None,
    # "Above the threshold" is strictly greater, as the gpu_metrics alert (``> 78``) and
    # node health (every sample ``> 78``) read the same variable.
    "gpu_metrics_gpu_temp_threshold_celsius": 78,
    "gpu_metrics_memory_temp_threshold_celsius": 85,
    "node_health_max_retired_pages": 0,
    "node_health_nvlink_window_seconds": 5,
    "node_health_xid_lookback_minutes": 60,
    "node_health_fatal_xids": None,  # None: every XID fails the check
    "parallel_fs_mount_path": "/mnt/checkpoints",
    "parallel_fs_type": "wekafs",
    "parallel_fs_min_write_mib_per_second": None,
    "parallel_fs_probe_mib": 256,
    # Overrides for fixture nodes (and odd hosts).
    "node_sysfs_root": "/sys",
    "node_proc_root": "/proc",
    "node_nvidia_smi": "nvidia-smi",
    "node_nv_fabricmanager": "nv-fabricmanager",
    "node_systemctl": "systemctl",
    "nvidia_fabric_manager_service": "nvidia-fabricmanager",
    "node_kernel_log_command": None,  # None: journalctl -k, else dmesg
}

#: NVLinks per GPU by model prefix (NVIDIA datasheets: H100/H200/B200 SXM 18
#: NVLink4/5 links, A100 SXM 12 NVLink3 links; PCIe boards none through NVML's view).
NVLINKS_BY_MODEL: list[tuple[str, int]] = [
    ("GB200", 18),
    ("B200", 18),
    ("H200-SXM", 18),
    ("H100-SXM", 18),
    ("A100-SXM", 12),
    ("V100-SXM", 6),
]

#: Fields read with ``nvidia-smi --query-gpu`` (names from ``nvidia-smi --help-query-gpu``).
GPU_FIELDS = [
    "index",
    "pci.bus_id",
    "uuid",
    "name",
    "driver_version",
    "temperature.gpu",
    "temperature.memory",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.sbe",
    "retired_pages.dbe",
    "retired_pages.pending",
]
#: Fields read with ``nvidia-smi --query-remapped-rows``.
REMAP_FIELDS = ["gpu_bus_id", "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure"]

#: nvidia-smi's "no value" markers in CSV output: unsupported, or an error (``[Unknown Error]``,
#: ``[GPU is lost]``, ``ERR!``...).
NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", ""}
#: Markers that only mean "this GPU does not offer the value" (not an error).
UNSUPPORTED = {"[N/A]", "N/A", "[Not Supported]", ""}
#: Fields that identify a GPU rather than read a value from it.
IDENTITY_FIELDS = {"index", "pci.bus_id", "gpu_bus_id", "uuid", "name", "driver_version"}
#: PCI ids under ``bus/pci/devices``: NVIDIA; GPUs are class 0x0302 (3D) or 0x0300 (VGA);
#: NVSwitches 0x0680 ("Bridge: other").
PCI_VENDOR_NVIDIA = "0x10de"
PCI_GPU_CLASSES = ("0x0302", "0x0300")
PCI_NVSWITCH_CLASS = "0x0680"
#: Marker line the command wrapper appends to stdout with the command's exit status.
_RC_MARKER = "__gpufleet_rc="

_LOST_RE = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.?[0-9A-Fa-f]*)\s*:\s*(.*)")
_NVLINK_GPU_RE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?\s*$")
_NVLINK_LINK_RE = re.compile(r"^\s*Link (\d+): (.*?)\s*$")
_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)[^)]*\): (\d+)")
_DD_RE = re.compile(r"(\d+) bytes .*copied, ([0-9.]+) s")
_FM_VERSION_RE = re.compile(r"version\s+is\s*:\s*(\S+)", re.IGNORECASE)


# --------------------------------------------------------------------------- pure parsers


def bus_key(bus_id: str) -> tuple[int, int, int]:
    """Normalise a PCI bus id to ``(domain, bus, device)``.

    Accepts nvidia-smi's ``00000000:18:00.0``, its error-line form
    ``0000:18:00.0`` and the kernel XID form ``0000:18:00``.

    Raises:
        ValueError: when it is not ``domain:bus:device[.function]`` in hex.
    """
    parts = bus_id.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)


def is_error_cell(text: str | None) -> bool:
    """An nvidia-smi cell that reports an error rather than a value or "not supported"."""
    if text is None:
        return False
    t = text.strip()
    return t not in UNSUPPORTED and (t.startswith("[") and t.endswith("]") or t.upper().startswith("ERR"))


def wrap_command(command: str) -> str:
    """``command`` run in a subshell, its exit status printed after its output, the whole exiting 0.

    Over SSH, exit status 255 means "ssh failed" to testinfra, which raises;
    nvidia-smi exits 255 for "other error". The status travels in the output
    instead (:func:`unwrap_output`).
    """
    return f"( {command} ); printf '\\n{_RC_MARKER}%d\\n' $?"


def unwrap_output(stdout: str, rc: int) -> tuple[str, int]:
    """``(stdout without the marker, the command's own exit status)`` of a :func:`wrap_command` run."""
    head, sep, tail = stdout.rpartition(f"\n{_RC_MARKER}")
    if not sep:
        return stdout, rc
    try:
        return head, int(tail.strip())
    except ValueError:
        return stdout, rc


def parse_pci_devices(output: str) -> dict[str, dict[str, str]]:
    """``grep -H . .../bus/pci/devices/*/{vendor,class}`` output -> ``{address: {"vendor": ..., "class": ...}}``."""
    devices: dict[str, dict[str, str]] = {}
    for line in output.splitlines():
        # ".../devices/0000:18:00.0/vendor:0x10de": the address has colons, so split at the slashes.
        parts = line.rsplit("/", 2)
        if len(parts) != 3:
            continue
        address, (name, sep, value) = parts[1], parts[2].partition(":")
        if sep and name in ("vendor", "class", "device"):
            devices.setdefault(address, {})[name] = value.strip().lower()
    return devices


def nvidia_gpus(devices: dict[str, dict[str, str]]) -> list[str]:
    """PCI addresses of NVIDIA GPUs, sorted (the order NVML numbers them in)."""
    return sorted(a for a, d in devices.items()
                  if d.get("vendor") == PCI_VENDOR_NVIDIA and d.get("class", "").startswith(PCI_GPU_CLASSES))


def nvidia_nvswitches(devices: dict[str, dict[str, str]]) -> list[str]:
    """PCI addresses of NVSwitches (NVIDIA, class 0x0680: the HGX baseboard's switches), sorted."""
    return sorted(a for a, d in devices.items()
                  if d.get("vendor") == PCI_VENDOR_NVIDIA and d.get("class", "").startswith(PCI_NVSWITCH_CLASS))


def number(text: str | None) -> float | None:
    """A numeric CSV cell, ``None`` for nvidia-smi's ``[N/A]``/``[Not Supported]``."""
    if text is None or text.strip() in NOT_AVAILABLE:
        return None
    return float(text.strip())


def yes_no(text: str | None) -> bool | None:
    """``Yes``/``No`` cell to bool, ``None`` when not available."""
    if text is None or text.strip() in NOT_AVAILABLE:
        return None
    return text.strip().lower() in {"yes", "true", "1", "enabled"}


@dataclass
class SmiGpu:
    """One GPU as ``nvidia-smi --query-gpu`` printed it.

    Attributes:
        position: order in the output (= NVML index; lost GPUs keep their place).
        lost: nvidia-smi could not get a handle ("Unable to determine the device handle").
        bus_id: PCI bus id as printed.
        fields: query field -> raw cell text (empty for lost GPUs).
        error: the error text for lost GPUs.
    """

    position: int
    lost: bool
    bus_id: str
    fields: dict[str, str] = field(default_factory=dict)
    error: str = ""

    def value(self, name: str) -> str | None:
        """Raw cell of ``name`` or ``None``."""
        return self.fields.get(name)

    @property
    def value_errors(self) -> dict[str, str]:
        """Value cells (not identity) that hold an error marker (``[Unknown Error]``, ``ERR!``...)."""
        return {k: v for k, v in self.fields.items() if k not in IDENTITY_FIELDS and is_error_cell(v)}

    @property
    def erroring(self) -> bool:
        """Every value cell is an error: nvidia-smi reaches the GPU but NVML answers nothing but errors."""
        values = {k: v for k, v in self.fields.items() if k not in IDENTITY_FIELDS}
        return bool(values) and all(is_error_cell(v) for v in values.values())


def parse_query_gpu(output: str, fields: list[str]) -> list[SmiGpu]:
    """Parse ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` output.

    Lines that are neither CSV rows of ``len(fields)`` cells nor "Unable to
    determine the device handle" lines are ignored (warnings some drivers print).
    """
    gpus: list[SmiGpu] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        lost = _LOST_RE.search(line)
        if lost:
            gpus.append(SmiGpu(position=len(gpus), lost=True, bus_id=lost.group(1), error=lost.group(2).strip()))
            continue
        cells = next(csv.reader([line], skipinitialspace=True))
        if len(cells) != len(fields):
            continue
        row = dict(zip(fields, (c.strip() for c in cells)))
        gpus.append(SmiGpu(position=len(gpus), lost=False, bus_id=row.get("pci.bus_id") or row.get("gpu_bus_id", ""), fields=row))
    return gpus


def parse_nvlink(output: str) -> dict[int, dict[int, str]]:
    """Parse ``nvidia-smi nvlink -s`` or ``-e`` into ``{gpu: {link: rest-of-line}}``.

    For ``-e`` a link has several lines ("Replay Errors: 0", ...): they are
    joined with ``"; "``.
    """
    result: dict[int, dict[int, str]] = {}
    gpu: int | None = None
    for line in output.splitlines():
        head = _NVLINK_GPU_RE.match(line)
        if head:
            gpu = int(head.group(1))
            result.setdefault(gpu, {})
            continue
        link = _NVLINK_LINK_RE.match(line)
        if link and gpu is not None:
            n = int(link.group(1))
            prev = result[gpu].get(n)
            result[gpu][n] = link.group(2) if prev is None else f"{prev}; {link.group(2)}"
    return result


def parse_nvlink_errors(text: str) -> dict[str, int]:
    """``"Replay Errors: 0; Recovery Errors: 2; CRC Errors: 5"`` -> ``{"Replay Errors": 0, ...}``."""
    counters: dict[str, int] = {}
    for part in text.split(";"):
        name, _, value = part.partition(":")
        value = value.strip()
        if value.isdigit():
            counters[name.strip()] = int(value)
    return counters


def parse_xids(log: str) -> list[tuple[tuple[int, int, int], int, str]]:
    """XID reports in kernel log text: ``[(bus_key, xid, line), ...]`` (``NVRM: Xid (PCI:0000:18:00): 79, ...``)."""
    found = []
    for line in log.splitlines():
        m = _XID_RE.search(line)
        if m:
            found.append((bus_key(m.group(1)), int(m.group(2)), line.strip()))
    return found


def parse_mounts(text: str) -> dict[str, tuple[str, str]]:
    """``/proc/mounts`` content -> ``{mount point: (source, fstype)}`` (octal escapes decoded; last mount wins)."""
    mounts: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
            mounts[point] = (parts[0], parts[2])
    return mounts


def parse_dd(output: str) -> float | None:
    """MiB/s from GNU dd's summary (``N bytes (...) copied, S s, ...``); ``None`` if absent."""
    m = _DD_RE.search(output)
    if not m or float(m.group(2)) <= 0:
        return None
    return int(m.group(1)) / (1 << 20) / float(m.group(2))


def parse_rate_gbps(text: str) -> float | None:
    """``400 Gb/sec (4X NDR)`` -> ``400.0`` (sysfs ``rate``)."""
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


def parse_fabric_manager_version(output: str) -> str | None:
    """``Fabric Manager version is : 550.54.15`` -> ``550.54.15``."""
    m = _FM_VERSION_RE.search(output)
    return m.group(1) if m else None


def nvlinks_for_model(model: str | None) -> int:
    """NVLinks per GPU for an inventory ``gpu_model`` (``H100-SXM-80GB`` -> 18); 0 when unknown or PCIe."""
    for prefix, links in NVLINKS_BY_MODEL:
        if model and model.upper().startswith(prefix):
            return links
    return 0


def coerce(value: str) -> Any:
    """A ``--node-var`` value as YAML would read it (``8`` -> 8, ``[a]`` -> list)."""
    return yaml.safe_load(value)


def role_defaults(roles_dir: Path = REPO_ROOT / "roles") -> dict[str, Any]:
    """The role defaults (``roles/*/defaults.yaml``) for the variables in :data:`DEFAULTS`.

    Values that are Jinja expressions are left out; absent files are fine
    (users may run the checks from a bare copy of ``tests/nodes``).
    """
    found: dict[str, Any] = {}
    for path in sorted(roles_dir.glob("*/defaults.yaml")):
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        for key, value in data.items():
            if key in DEFAULTS and not (isinstance(value, str) and "{{" in value):
                found[key] = value
    return found


# --------------------------------------------------------------------------- a node


@dataclass
class CommandOutput:
    """What a command on the node returned."""

    command: str
    rc: int
    stdout: str
    stderr: str


class Node:
    """One host under test: its testinfra ``host``, merged variables and cached readings.

    Args:
        name: inventory host name (or testinfra id) used in test ids and messages.
        host: the testinfra host.
        variables: merged variables (see module docs).
    """

    def __init__(self, name: str, host: Any, variables: dict[str, Any]) -> None:
        self.name = name
        self.host = host
        self.vars = variables
        self._nvlink_first: tuple[dict[int, dict[int, str]], float] | None = None

    def __repr__(self) -> str:
        return f"Node({self.name})"

    def var(self, key: str) -> Any:
        """A variable (``DEFAULTS`` apply)."""
        return self.vars.get(key, DEFAULTS.get(key))

    def run(self, command: str) -> CommandOutput:
        """Run a shell command on the node; never raises (see the module docstring).

        Returns the command's own exit status, whatever the transport; a host
        that cannot be reached gives rc 255 and the transport's message in stderr.
        """
        try:
            result = self.host.run(wrap_command(command))
        except Exception as exc:  # noqa: BLE001 - testinfra raises RuntimeError for ssh failures
            return CommandOutput(command, 255, "", f"cannot run on {self.name}: {type(exc).__name__}: {exc}"[:2000])
        stdout, rc = unwrap_output(result.stdout, result.rc)
        return CommandOutput(command, rc, stdout, result.stderr)

    # ---------------------------------------------------------------- expectations

    @property
    def expected_gpu_count(self) -> int:
        """Inventory ``gpu_count`` (0 when unset)."""
        return int(self.var("gpu_count") or 0)

    @property
    def expected_nvlinks(self) -> int:
        """``gpu_nvlink_count`` or derived from ``gpu_model``."""
        explicit = self.var("gpu_nvlink_count")
        return int(explicit) if explicit is not None else nvlinks_for_model(self.var("gpu_model"))

    @property
    def expected_ports(self) -> list[dict[str, Any]]:
        """Inventory ``node_hcas`` entries (``link_layer`` defaults to InfiniBand)."""
        return [{"link_layer": "InfiniBand", "port": 1, **entry} for entry in (self.var("node_hcas") or [])]

    # ---------------------------------------------------------------- GPU readings

    def smi(self, args: str) -> CommandOutput:
        """Run ``<node_nvidia_smi> ARGS``."""
        return self.run(f"{self.var('node_nvidia_smi')} {args}")

    @cached_property
    def query_gpu(self) -> CommandOutput:
        """The raw ``--query-gpu`` run (exit 15 when a GPU is lost)."""
        return self.smi(f"--query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits")

    @cached_property
    def gpus(self) -> list[SmiGpu]:
        """GPUs in NVML index order, lost ones included."""
        return parse_query_gpu(self.query_gpu.stdout, GPU_FIELDS)

    @cached_property
    def pci_devices(self) -> dict[str, dict[str, str]]:
        """NVIDIA-relevant ids of every PCI device (one command: ``grep -H`` over sysfs)."""
        root = f"{str(self.var('node_sysfs_root')).rstrip('/')}/bus/pci/devices"
        out = self.run(f"grep -s -H . {root}/*/vendor {root}/*/class")
        return parse_pci_devices(out.stdout)

    @cached_property
    def pci_gpus(self) -> list[str]:
        """PCI addresses of the NVIDIA GPUs on the bus, in NVML order (empty when sysfs shows none)."""
        return nvidia_gpus(self.pci_devices)

    @cached_property
    def nvswitches(self) -> list[str]:
        """PCI addresses of the NVSwitches on the bus (HGX boards; none on PCIe servers)."""
        return nvidia_nvswitches(self.pci_devices)

    def gpu(self, index: int) -> SmiGpu | None:
        """nvidia-smi's row of expected GPU ``index``, ``None`` when nvidia-smi does not list it.

        With the GPUs visible on the PCI bus, expected GPU ``index`` is the
        ``index``-th of them and its row is found by bus id (a GPU the driver
        no longer lists shifts NVML's numbering, not ours); otherwise by position.
        """
        if self.pci_gpus:
            if index >= len(self.pci_gpus):
                return None
            key = bus_key(self.pci_gpus[index])
            return next((g for g in self.gpus if _same_bus(g.bus_id, key)), None)
        return self.gpus[index] if index < len(self.gpus) else None

    def gpu_bus(self, index: int) -> str | None:
        """The PCI bus id of expected GPU ``index`` (nvidia-smi's, else the PCI bus's), ``None`` if unknown."""
        row = self.gpu(index)
        if row is not None and row.bus_id:
            return row.bus_id
        if index < len(self.pci_gpus):
            return self.pci_gpus[index]
        return None

    def smi_failure(self) -> str | None:
        """What nvidia-smi printed when its GPU query failed as a whole (non-zero exit, no GPU rows), else None."""
        q = self.query_gpu
        if q.rc == 0 or self.gpus:
            return None
        text = " ".join((q.stdout + " " + q.stderr).split())
        return f"`{q.command}` failed (rc {q.rc}): {text[:300] or 'no output'}"

    @cached_property
    def fabric_manager_state(self) -> CommandOutput:
        """``systemctl is-active <nvidia_fabric_manager_service>`` (stdout ``active``, ``inactive``, ``failed``...)."""
        return self.run(f"{self.var('node_systemctl')} is-active {shlex.quote(str(self.var('nvidia_fabric_manager_service')))}")

    @cached_property
    def remapped_rows(self) -> dict[tuple[int, int, int], dict[str, str]]:
        """``--query-remapped-rows`` by bus id (empty when unsupported)."""
        out = self.smi(f"--query-remapped-rows={','.join(REMAP_FIELDS)} --format=csv,noheader")
        rows = {}
        for gpu in parse_query_gpu(out.stdout, REMAP_FIELDS):
            if not gpu.lost:
                try:
                    rows[bus_key(gpu.bus_id)] = gpu.fields
                except ValueError:
                    continue
        return rows

    @cached_property
    def nvlink_status(self) -> dict[int, dict[int, str]]:
        """``nvidia-smi nvlink -s``: ``{gpu: {link: "26.562 GB/s" | "<inactive>"}}``."""
        return parse_nvlink(self.smi("nvlink -s").stdout)

    def start_nvlink_window(self) -> None:
        """Take the first ``nvidia-smi nvlink -e`` reading now (idempotent).

        The conftest starts every node's window when the session starts, so
        the windows of all hosts overlap instead of adding up.
        """
        if self._nvlink_first is None:
            self._nvlink_first = (parse_nvlink(self.smi("nvlink -e").stdout), time.monotonic())

    @cached_property
    def nvlink_error_window(self) -> tuple[dict[int, dict[int, str]], dict[int, dict[int, str]], float]:
        """``nvidia-smi nvlink -e`` twice, at least ``node_health_nvlink_window_seconds`` apart: (before, after, seconds)."""
        window = float(self.var("node_health_nvlink_window_seconds"))
        self.start_nvlink_window()
        assert self._nvlink_first is not None
        before, started = self._nvlink_first
        remaining = window - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
        after = parse_nvlink(self.smi("nvlink -e").stdout)
        return before, after, time.monotonic() - started

    # ---------------------------------------------------------------- kernel log

    @cached_property
    def kernel_log(self) -> CommandOutput:
        """Kernel log of the last ``node_health_xid_lookback_minutes`` minutes.

        ``node_kernel_log_command`` (``{minutes}`` substituted) if set; else
        ``journalctl -k``; else ``dmesg --time-format iso`` filtered by time
        here. Raises nothing: a failure is an rc != 0 result.
        """
        minutes = int(self.var("node_health_xid_lookback_minutes"))
        command = self.var("node_kernel_log_command")
        if command:
            return self.run(str(command).replace("{minutes}", str(minutes)))
        journal = self.run(f"journalctl -k --no-pager -o short-iso --since {shlex.quote(f'{minutes} min ago')}")
        if journal.rc == 0 and "No journal files" not in journal.stdout + journal.stderr:
            return journal
        dmesg = self.run("dmesg --time-format iso")
        if dmesg.rc != 0:
            return CommandOutput(f"{journal.command} || {dmesg.command}", dmesg.rc, "", journal.stderr + dmesg.stderr)
        now = self.run("date +%s")
        cutoff = datetime.fromtimestamp(int(now.stdout.strip() or time.time()), timezone.utc) - timedelta(minutes=minutes)
        recent = [line for line in dmesg.stdout.splitlines() if _dmesg_time(line) is None or _dmesg_time(line) >= cutoff]
        return CommandOutput(dmesg.command, 0, "\n".join(recent), "")

    @cached_property
    def xids(self) -> list[tuple[tuple[int, int, int], int, str]]:
        """XID reports in :attr:`kernel_log`."""
        return parse_xids(self.kernel_log.stdout)

    # ---------------------------------------------------------------- files

    def sysfs(self, relative: str) -> Any:
        """``host.file`` of ``<node_sysfs_root>/<relative>``."""
        return self.host.file(f"{str(self.var('node_sysfs_root')).rstrip('/')}/{relative}")

    @cached_property
    def mounts(self) -> dict[str, tuple[str, str]]:
        """Parsed ``<node_proc_root>/mounts``."""
        return parse_mounts(self.host.file(f"{str(self.var('node_proc_root')).rstrip('/')}/mounts").content_string)


def _same_bus(bus_id: str, key: tuple[int, int, int]) -> bool:
    try:
        return bus_key(bus_id) == key
    except ValueError:
        return False


def _dmesg_time(line: str) -> datetime | None:
    stamp = line.split(" ", 1)[0].replace(",", ".")
    try:
        parsed = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


# --------------------------------------------------------------------------- parametrization targets


@dataclass(frozen=True)
class GpuRef:
    """One GPU of one node (test id ``<host>-gpu<index>``)."""

    node: Node
    index: int

    @property
    def id(self) -> str:
        """pytest id."""
        return f"{self.node.name}-gpu{self.index}"


@dataclass(frozen=True)
class NvLinkRef:
    """One NVLink of one GPU (test id ``<host>-gpu<g>-nvlink<l>``)."""

    node: Node
    gpu: int
    link: int

    @property
    def id(self) -> str:
        """pytest id."""
        return f"{self.node.name}-gpu{self.gpu}-nvlink{self.link}"


@dataclass(frozen=True)
class PortRef:
    """One HCA port the inventory expects (test id ``<host>-<hca>-p<port>``)."""

    node: Node
    hca: str
    port: int
    rate_gbps: float | None
    link_layer: str

    @property
    def id(self) -> str:
        """pytest id."""
        return f"{self.node.name}-{self.hca}-p{self.port}"

    def file(self, name: str) -> Any:
        """``host.file`` of ``class/infiniband/<hca>/ports/<port>/<name>``."""
        return self.node.sysfs(f"class/infiniband/{self.hca}/ports/{self.port}/{name}")

    @property
    def label(self) -> str:
        """``mlx5_0 port 1`` for messages."""
        return f"{self.hca} port {self.port}"


def gpu_refs(node: Node) -> list[GpuRef]:
    """One ref per GPU the inventory expects."""
    return [GpuRef(node, i) for i in range(node.expected_gpu_count)]


def nvlink_refs(node: Node) -> list[NvLinkRef]:
    """One ref per expected GPU x expected NVLink."""
    return [NvLinkRef(node, g, link) for g in range(node.expected_gpu_count) for link in range(node.expected_nvlinks)]


def port_refs(node: Node) -> list[PortRef]:
    """One ref per inventory ``node_hcas`` entry."""
    return [
        PortRef(node, str(e["name"]), int(e["port"]), float(e["rate_gbps"]) if e.get("rate_gbps") is not None else None, str(e["link_layer"]))
        for e in node.expected_ports
    ]
