"""Stand-ins for ``nvidia-smi``, ``nv-fabricmanager``, ``systemctl`` and the kernel log on fixture nodes.

Standard library only: :func:`gpufleet.sim.node.write_node` copies
this file's source into a fixture's ``bin/`` as self-contained scripts (run
with ``python -S``), each driven by the node description JSON. The stand-ins
emulate only the invocations the node checks use, in the output format of
the real tools (R535-R550 drivers); anything else exits 2 with a message, so
a check that drifts to an unsupported flag fails loudly instead of passing.

Description values (see :mod:`gpufleet.sim.node`) may be a number,
``"[N/A]"`` / ``"[Not Supported]"`` (printed as-is), ``{"nvml_error": name}``
(printed as ``[Unknown Error]``) or ``{"base": n, "per_second": r}``: a
counter that grows by ``r`` per second since the description's ``epoch``.
A description with a ``clock`` (seconds since the Unix epoch) is frozen at
that instant, for deterministic expected output.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gpufleet.exporter.nodedesc import evaluate, node_now  # inlined when written as a script

#: nvidia-smi's exit code for "GPU is lost" (nvidia-smi(1), RETURN VALUE 15).
EXIT_GPU_LOST = 15
#: nvidia-smi's exit code for an invalid argument/field.
EXIT_INVALID = 2
#: nvidia-smi's exit code for "other error or internal driver error" (nvidia-smi(1), RETURN VALUE 255).
EXIT_OTHER = 255

#: NVML error name (as in node descriptions) -> (``nvmlErrorString`` text, nvidia-smi exit code per
#: nvidia-smi(1) RETURN VALUE; 255 "other error or internal driver error" for the rest).
NVML_ERRORS: dict[str, tuple[str, int]] = {
    "gpu_is_lost": ("GPU is lost", EXIT_GPU_LOST),
    "unknown": ("Unknown Error", EXIT_OTHER),
    "insufficient_power": ("Insufficient External Power", 8),
    "no_permission": ("Insufficient Permissions", 4),
    "driver_not_loaded": ("Driver Not Loaded", 9),
    "library_not_found": ("NVML Shared Library Not Found", 12),
    "corrupted_inforom": ("Corrupted infoROM", 14),
    "timeout": ("Timeout", EXIT_OTHER),
    "irq_issue": ("Interrupt Request Issue", 10),
    "reset_required": ("GPU requires restart", EXIT_OTHER),
    "lib_rm_version_mismatch": ("RM has detected an NVML/RM version mismatch.", 18),
}

#: What nvidia-smi prints when NVML cannot start, by the description's ``nvml`` error (the texts of
#: R535-R550 drivers); anything else prints ``Failed to initialize NVML: <error text>``.
NVML_INIT_FAILURES: dict[str, str] = {
    "driver_not_loaded": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                         "Make sure that the latest NVIDIA driver is installed and running.",
    "library_not_found": "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that "
                         "the NVIDIA Display Driver is properly installed and present in your system.",
    "lib_rm_version_mismatch": "Failed to initialize NVML: Driver/library version mismatch",
}


def error_text(name: str) -> tuple[str, int]:
    """``(text, nvidia-smi exit code)`` of an NVML error name (``unknown`` -> ``("Unknown Error", 255)``)."""
    return NVML_ERRORS.get(name, (name.replace("_", " ").capitalize(), EXIT_OTHER))


def listed(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs the driver lists (``listed`` not false), in NVML index order, ``index`` renumbered as NVML does."""
    return [{**g, "index": i} for i, g in enumerate(g for g in node.get("gpus", []) if g.get("listed", True))]

def _fmt(value: Any, unit: str = "", nounits: bool = True) -> str:
    if isinstance(value, dict):
        return f"[{error_text(value.get('nvml_error', 'unknown'))[0]}]"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "Yes" if value else "No"
    if isinstance(value, float):
        text = f"{value:.2f}"
    else:
        text = str(value)
    return text if nounits or not unit else f"{text} {unit}"


def short_bus_id(bus_id: str) -> str:
    """``00000000:18:00.0`` -> ``0000:18:00.0`` (the form nvidia-smi uses in error lines)."""
    domain, rest = bus_id.split(":", 1)
    return f"{domain[-4:]}:{rest}"


def handle_error(gpu: dict[str, Any]) -> str | None:
    """The NVML error name of the GPU's device handle (``gpu_is_lost`` for a lost GPU), None when it works."""
    if gpu.get("lost"):
        return "gpu_is_lost"
    return gpu.get("handle_error") or None


def lost_line(gpu: dict[str, Any]) -> str:
    """The line nvidia-smi prints for a GPU whose device handle NVML refuses (lost, or another error)."""
    name = handle_error(gpu) or "gpu_is_lost"
    text = error_text(name)[0]
    if name == "gpu_is_lost":
        text += ".  Reboot the system to recover this GPU"
    return f"Unable to determine the device handle for GPU{short_bus_id(gpu['pci_bus_id'])}: {text}"


def nvml_init_failure(node: dict[str, Any]) -> tuple[str, int] | None:
    """``(message, exit code)`` nvidia-smi gives when NVML cannot initialise on ``node``; None when it can."""
    status = node.get("nvml", "ok")
    if status == "ok":
        return None
    code = error_text(status)[1]
    return NVML_INIT_FAILURES.get(status, f"Failed to initialize NVML: {error_text(status)[0]}"), code


def _gpu_field(node: dict[str, Any], gpu: dict[str, Any], field: str, now: float) -> tuple[Any, str]:
    epoch = float(node.get("epoch", 0))
    ecc = gpu.get("ecc", {})
    retired = gpu.get("retired_pages", {})
    rows = gpu.get("remapped_rows", {})
    identity = {"index", "count", "pci.bus_id", "gpu_bus_id", "uuid", "gpu_uuid", "name", "gpu_name", "driver_version"}
    table: dict[str, tuple[Any, str]] = {
        "index": (gpu["index"], ""),
        "count": (len(listed(node)), ""),
        "pci.bus_id": (gpu["pci_bus_id"], ""),
        "gpu_bus_id": (gpu["pci_bus_id"], ""),
        "uuid": (gpu["uuid"], ""),
        "gpu_uuid": (gpu["uuid"], ""),
        "name": (gpu["name"], ""),
        "gpu_name": (gpu["name"], ""),
        "driver_version": (node["driver_version"], ""),
        "temperature.gpu": (gpu.get("temperature", "[N/A]"), ""),
        "temperature.memory": (gpu.get("memory_temperature", "[N/A]"), ""),
        "power.draw": (gpu.get("power_watts", "[N/A]"), "W"),
        "ecc.errors.corrected.aggregate.total": (ecc.get("corrected", "[N/A]"), ""),
        "ecc.errors.uncorrected.aggregate.total": (ecc.get("uncorrected", "[N/A]"), ""),
        "retired_pages.sbe": (retired.get("single_bit_ecc", "[N/A]"), ""),
        "retired_pages.single_bit_ecc.count": (retired.get("single_bit_ecc", "[N/A]"), ""),
        "retired_pages.dbe": (retired.get("double_bit_ecc", "[N/A]"), ""),
        "retired_pages.double_bit.count": (retired.get("double_bit_ecc", "[N/A]"), ""),
        "retired_pages.pending": (retired.get("pending", "[N/A]"), ""),
        "remapped_rows.correctable": (rows.get("correctable", "[N/A]"), ""),
        "remapped_rows.uncorrectable": (rows.get("uncorrectable", "[N/A]"), ""),
        "remapped_rows.pending": (rows.get("pending", "[N/A]"), ""),
        "remapped_rows.failure": (rows.get("failure", "[N/A]"), ""),
    }
    if field not in table:
        raise KeyError(field)
    value, unit = table[field]
    if gpu.get("read_error") and field not in identity:
        return {"nvml_error": gpu["read_error"]}, unit  # every value read fails: nvidia-smi prints the error
    return evaluate(value, epoch, now), unit


def _csv_query(node: dict[str, Any], fields: list[str], fmt: set[str], out: list[str], now: float) -> int:
    rc = 0
    if "noheader" not in fmt:
        out.append(", ".join(fields))
    for gpu in listed(node):
        if handle_error(gpu):
            out.append(lost_line(gpu))
            rc = rc or error_text(handle_error(gpu))[1]
            continue
        values = []
        for field in fields:
            value, unit = _gpu_field(node, gpu, field, now)
            values.append(_fmt(value, unit, "nounits" in fmt))
        out.append(", ".join(values))
    return rc


def _selected(node: dict[str, Any], index: str | None) -> list[dict[str, Any]]:
    gpus = listed(node)
    if index is None:
        return gpus
    return [g for g in gpus if str(g["index"]) == index]


def _nvlink(node: dict[str, Any], args: list[str], out: list[str], now: float) -> int:
    epoch = float(node.get("epoch", 0))
    index = None
    if "-i" in args:
        index = args[args.index("-i") + 1]
    status = "-s" in args or "--status" in args
    errors = "-e" in args or "--errorcounters" in args
    if status == errors:
        out.append("nvidia-smi nvlink stand-in: use exactly one of -s/--status or -e/--errorcounters")
        return EXIT_INVALID
    rc = 0
    for gpu in _selected(node, index):
        if handle_error(gpu):
            out.append(lost_line(gpu))
            rc = rc or error_text(handle_error(gpu))[1]
            continue
        out.append(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        for link, spec in enumerate(gpu.get("nvlinks", [])):
            if status:
                speed = spec.get("speed", "26.562 GB/s") if spec.get("up", True) else "<inactive>"
                out.append(f"\t Link {link}: {speed}")
                continue
            replay = evaluate(spec.get("replay", 0), epoch, now)
            recovery = evaluate(spec.get("recovery", 0), epoch, now)
            crc = evaluate(spec.get("crc_flit", 0), epoch, now) + evaluate(spec.get("crc_data", 0), epoch, now)
            out.append(f"\t Link {link}: Replay Errors: {replay}")
            out.append(f"\t Link {link}: Recovery Errors: {recovery}")
            out.append(f"\t Link {link}: CRC Errors: {crc}")
    return rc


def nvidia_smi(node: dict[str, Any], args: list[str], out: list[str], now: float | None = None) -> int:
    """Emulate ``nvidia-smi ARGS`` for ``node``, appending output lines to ``out``; returns the exit code."""
    now = node_now(node) if now is None else now
    failure = nvml_init_failure(node)
    if failure is not None and args != ["--version"]:
        out.append(failure[0])
        return failure[1]
    if args and args[0] == "nvlink":
        return _nvlink(node, args[1:], out, now)
    if args == ["-L"] or args == ["--list-gpus"]:
        rc = 0
        for gpu in listed(node):
            if handle_error(gpu):
                out.append(lost_line(gpu))
                rc = rc or error_text(handle_error(gpu))[1]
                continue
            out.append(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        return rc
    if args == ["--version"]:
        out.append(f"DRIVER version                      : {node['driver_version']}")
        return 0
    query = next((a for a in args if a.startswith(("--query-gpu=", "--query-remapped-rows="))), None)
    fmt_arg = next((a for a in args if a.startswith("--format=")), None)
    if query is None or fmt_arg is None or len(args) != 2:
        out.append(f"nvidia-smi stand-in: unsupported arguments {args!r}")
        return EXIT_INVALID
    fmt = set(fmt_arg.split("=", 1)[1].split(","))
    if "csv" not in fmt:
        out.append("nvidia-smi stand-in: only --format=csv[,noheader][,nounits]")
        return EXIT_INVALID
    fields = [f.strip() for f in query.split("=", 1)[1].split(",")]
    try:
        return _csv_query(node, fields, fmt, out, now)
    except KeyError as exc:
        del out[:]
        out.append(f'Field "{exc.args[0]}" is not a valid field to query.')
        return EXIT_INVALID


def nv_fabricmanager(node: dict[str, Any], args: list[str], out: list[str]) -> int:
    """Emulate ``nv-fabricmanager --version`` (exit 127, like a missing binary, when the node has none)."""
    version = node.get("fabric_manager_version")
    if version is None:
        out.append("nv-fabricmanager: command not found")
        return 127
    if args not in (["--version"], ["-v"]):
        out.append(f"nv-fabricmanager stand-in: unsupported arguments {args!r}")
        return EXIT_INVALID
    out.append(f"Fabric Manager version is : {version}")
    return 0


def systemctl(node: dict[str, Any], args: list[str], out: list[str]) -> int:
    """Emulate ``systemctl is-active UNIT``: prints the description's ``services[UNIT]`` state.

    Exit codes as systemctl(1): 0 active; 3 inactive, failed, activating...;
    4 (with ``inactive``) for a unit the node does not have.
    """
    if len(args) != 2 or args[0] != "is-active":
        out.append(f"systemctl stand-in: unsupported arguments {args!r}")
        return EXIT_INVALID
    unit = args[1].removesuffix(".service")
    services = node.get("services") or {}
    if unit not in services:
        out.append("inactive")
        return 4
    state = str(services[unit])
    out.append(state)
    return 0 if state == "active" else 3


def kernel_log(node: dict[str, Any], args: list[str], out: list[str]) -> int:
    """Print the node's kernel log lines (XID reports and the description's ``kernel_log`` extras).

    Arguments (e.g. ``--since``) are accepted and ignored: the fixture's log
    is already "recent". GPUs the driver no longer lists still have their
    XIDs logged under their PCI address, as the kernel does.
    """
    for gpu in node.get("gpus", []):
        pci = short_bus_id(gpu["pci_bus_id"]).rsplit(".", 1)[0]
        for xid in gpu.get("xids", []):
            out.append(f"2025-01-01T00:00:00+0000 node kernel: NVRM: Xid (PCI:{pci}): {xid}, pid=4242, name=python3, Ch 00000008")
        if gpu.get("lost"):
            out.append(f"2025-01-01T00:00:00+0000 node kernel: NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    out.extend(node.get("kernel_log", []))
    return 0


TOOLS = {"nvidia-smi": nvidia_smi, "nv-fabricmanager": nv_fabricmanager, "systemctl": systemctl, "kernel-log": kernel_log}


def main(tool: str, args: list[str], description_path: str) -> int:
    """Run stand-in ``tool`` with ``args`` against the JSON node description; print output, return exit code."""
    with open(description_path, encoding="utf-8") as fh:
        node = json.load(fh)
    out: list[str] = []
    rc = TOOLS[tool](node, args, out)
    if out:
        sys.stdout.write("\n".join(out) + "\n")
    return rc
