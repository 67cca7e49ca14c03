"""Fixture GPU nodes built in Python: sysfs trees, a fake NVML, tool stand-ins.

One JSON-able *node description* drives everything a fixture node needs:

* :func:`build_sysfs` writes ``class/infiniband/...`` and the NVIDIA devices
  of ``bus/pci/devices/...`` (GPUs, NVSwitches) under a directory, for
  ``gpufleet exporter --sysfs-root`` and the node checks;
* :class:`~gpufleet.exporter.nvml_fake.FakeNvmlBackend` implements :class:`~gpufleet.exporter.nvml.NvmlBackend`
  from it (``gpufleet exporter --nvml-fake FILE``);
* :func:`write_node` also writes the ``nvidia-smi``, ``nv-fabricmanager``,
  ``systemctl`` and kernel-log stand-ins (:mod:`gpufleet.sim.standin`) and a
  ``proc/mounts`` with the checkpoint filesystem, for the testinfra checks.

Nothing is checked in as a tree or a blob: :data:`FIXTURE_NODES` builds each
named node. Description shape (all keys optional unless noted)::

    {"name": str, "epoch": float,                 # epoch: start of growth specs
     "clock": float,                              # optional: freeze growth at this instant
     "driver_version": str, "fabric_manager_version": str | None,
     "nvml": "ok" | "<nvml error name>",           # e.g. "library_not_found"
     "checkpoint_fs_type": "wekafs",
     "nvswitches": [pci bus id, ...],              # NVSwitch devices on the PCI bus (HGX boards)
     "services": {unit: "active" | "inactive" | "failed" ...},   # systemctl is-active answers
     "gpus": [{"index": int, "uuid": str, "name": str, "pci_bus_id": str, "pci_device_id": str,
               "lost": bool, "handle_error": nvml error name, "read_error": nvml error name,
               "listed": bool,                     # false: on the PCI bus, but the driver no longer lists it
               "on_pci": bool,                     # false: gone from the PCI bus too
               "temperature": V, "memory_temperature": V, "power_watts": V,
               "clocks_event_reasons": [reason, ...],
               "ecc": {"corrected": V, "uncorrected": V},
               "retired_pages": {"single_bit_ecc": V, "double_bit_ecc": V, "pending": V},
               "remapped_rows": {"correctable": V, "uncorrectable": V, "pending": V, "failure": V},
               "xids": [int, ...],
               "nvlinks": [{"up": bool, "replay": V, "recovery": V, "crc_flit": V,
                            "crc_data": V, "ecc_data": V}, ...]}],
     "hcas": [{"name": str, "board_id": str, "fw_ver": str, "hca_type": str, "node_guid": str,
               "ports": [{"port": int, "state": str, "phys_state": str, "rate": str,
                          "link_layer": str, "counters": {file: int | str} | None,
                          "counters_ext": {file: int | str} | None,
                          "hw_counters": {file: int | str} | None,
                          "unreadable": [relative path, ...]}]}],
     "kernel_log": [str, ...],
     "inventory": {host vars the inventory holds for this node}}

where ``V`` is a number, ``"[N/A]"``/``"[Not Supported]"`` (NVML: NOT_SUPPORTED),
``{"nvml_error": "<name>"}`` (NVML raises that error) or
``{"base": n, "per_second": r}`` (a growing counter). A string counter value
is written verbatim (a malformed file); a path in ``unreadable`` becomes a
directory, which no reader can read as a file, root included.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.exporter import nodedesc
from gpufleet.exporter.nvml import NVLINK_ERROR_COUNTERS
from gpufleet.sim import standin

Node = dict[str, Any]

#: PCI bus ids of the 8 GPUs on an HGX H100 board, in NVML index order.
HGX_BUS_IDS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
#: PCI addresses of the 4 third-generation NVSwitches of an HGX H100 board.
HGX_NVSWITCHES = ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
#: PCI ids (``/sys/bus/pci/devices/*/{vendor,device,class}``): NVIDIA, H100 SXM5, NVSwitch gen3,
#: L40S; class 0x030200 is "3D controller" (data-centre GPUs), 0x068000 "Bridge: other" (NVSwitch).
PCI_VENDOR_NVIDIA = "0x10de"
PCI_DEVICE_H100_SXM = "0x2330"
PCI_DEVICE_NVSWITCH = "0x22a3"
PCI_DEVICE_L40S = "0x26b9"
PCI_CLASS_3D = "0x030200"
PCI_CLASS_BRIDGE_OTHER = "0x068000"
#: The systemd unit of NVIDIA's fabric manager.
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"

DRIVER_VERSION = "550.54.15"


# --------------------------------------------------------------------------- builders


def h100_gpu(index: int, nvlinks: int = 18, **overrides: Any) -> dict[str, Any]:
    """A healthy H100 SXM GPU description at ``index`` (bus id from :data:`HGX_BUS_IDS`).

    Defaults: 41 C die, 47 C HBM, 312.5 W, idle clocks reason, no ECC errors,
    retired pages ``[N/A]`` (Hopper uses row remapping instead), no remapped
    rows, ``nvlinks`` active links without errors. ``overrides`` replace keys.
    """
    bus = HGX_BUS_IDS[index % len(HGX_BUS_IDS)]
    gpu: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-8f6c{index:04x}-55aa-4c1e-9d3b-{index:012x}",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{bus.upper()}:00.0",
        "pci_device_id": PCI_DEVICE_H100_SXM,
        "lost": False,
        "temperature": 41,
        "memory_temperature": 47,
        "power_watts": 312.5,
        "clocks_event_reasons": ["gpu_idle"],
        "ecc": {"corrected": 0, "uncorrected": 0},
        "retired_pages": {"single_bit_ecc": "[N/A]", "double_bit_ecc": "[N/A]", "pending": "[N/A]"},
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "xids": [],
        "nvlinks": [nvlink() for _ in range(nvlinks)],
    }
    gpu.update(overrides)
    return gpu


def nvlink(up: bool = True, **counters: Any) -> dict[str, Any]:
    """One NVLink: ``up`` and error counters (default 0) by :data:`NVLINK_ERROR_COUNTERS` name."""
    link: dict[str, Any] = {"up": up, **{name: 0 for name in NVLINK_ERROR_COUNTERS}}
    link.update(counters)
    return link


#: mlx5 port hw_counters with realistic names (values are arbitrary but fixed).
MLX5_HW_COUNTERS = {
    "duplicate_request": 0,
    "implied_nak_seq_err": 0,
    "local_ack_timeout_err": 3,
    "np_cnp_sent": 0,
    "np_ecn_marked_roce_packets": 0,
    "out_of_buffer": 0,
    "out_of_sequence": 0,
    "packet_seq_err": 0,
    "req_cqe_error": 0,
    "req_remote_access_errors": 0,
    "req_remote_invalid_request": 0,
    "resp_cqe_error": 0,
    "resp_local_length_error": 0,
    "rnr_nak_retry_err": 0,
    "rp_cnp_handled": 0,
    "rx_atomic_requests": 0,
    "rx_read_requests": 81920,
    "rx_write_requests": 1048576,
    "lifespan": 10,
}


def ib_counters(extended: bool = True, **values: int | str) -> dict[str, int | str]:
    """A ``counters/`` directory: every IBA PortCounters file, plus the extended-only
    ``unicast_*``/``multicast_*`` ones when ``extended``. ``values`` override."""
    counters: dict[str, int | str] = {
        "VL15_dropped": 0,
        "excessive_buffer_overrun_errors": 0,
        "link_downed": 0,
        "link_error_recovery": 0,
        "local_link_integrity_errors": 0,
        "port_rcv_constraint_errors": 0,
        "port_rcv_data": 1234567890123 if extended else 2147483000,
        "port_rcv_errors": 0,
        "port_rcv_packets": 9876543210 if extended else 123456789,
        "port_rcv_remote_physical_errors": 0,
        "port_rcv_switch_relay_errors": 0,
        "port_xmit_constraint_errors": 0,
        "port_xmit_data": 2345678901234 if extended else 1073741000,
        "port_xmit_discards": 0,
        "port_xmit_packets": 8765432109 if extended else 98765432,
        "port_xmit_wait": 1500,
        "symbol_error": 0,
    }
    if extended:
        counters.update(
            multicast_rcv_packets=12,
            multicast_xmit_packets=0,
            unicast_rcv_packets=9876543198,
            unicast_xmit_packets=8765432109,
        )
    counters.update(values)
    return counters


def ib_counters_ext(**values: int | str) -> dict[str, int | str]:
    """A ``counters_ext/`` directory (64-bit PortCountersExtended of pre-4.5 kernels and old MLNX OFED)."""
    counters: dict[str, int | str] = {
        "port_xmit_data_64": 2345678901234,
        "port_rcv_data_64": 1234567890123,
        "port_xmit_packets_64": 8765432109,
        "port_rcv_packets_64": 9876543210,
        "port_unicast_xmit_packets": 8765432109,
        "port_unicast_rcv_packets": 9876543198,
        "port_multicast_xmit_packets": 0,
        "port_multicast_rcv_packets": 12,
    }
    counters.update(values)
    return counters


def no_pma_counters() -> dict[str, str]:
    """``counters/`` of a device without a performance-management agent (rxe, iWARP): every file reads ``N/A (no PMA)``."""
    return {name: "N/A (no PMA)\n" for name in ib_counters(extended=False)}


def down_port(port: int = 1, **overrides: Any) -> dict[str, Any]:
    """An InfiniBand port whose cage is empty or whose link is down: ``1: DOWN``, ``3: Disabled``, ``0 GB/sec``."""
    return ib_port(port, **{"state": "1: DOWN", "phys_state": "3: Disabled", "rate": "0 GB/sec",
                            "counters": ib_counters(**{name: 0 for name in ib_counters()}), **overrides})


def ib_port(port: int = 1, **overrides: Any) -> dict[str, Any]:
    """An ACTIVE/LinkUp 400 Gb/s NDR InfiniBand port with extended counters and mlx5 hw_counters."""
    desc: dict[str, Any] = {
        "port": port,
        "state": "4: ACTIVE",
        "phys_state": "5: LinkUp",
        "rate": "400 Gb/sec (4X NDR)",
        "link_layer": "InfiniBand",
        "counters": ib_counters(),
        "hw_counters": dict(MLX5_HW_COUNTERS),
        "unreadable": [],
    }
    desc.update(overrides)
    return desc


def roce_port(port: int = 1, **overrides: Any) -> dict[str, Any]:
    """An ACTIVE 200 Gb/s RoCE (Ethernet link layer) port with mlx5 hw_counters."""
    hw = dict(MLX5_HW_COUNTERS, np_cnp_sent=4711, rp_cnp_handled=4700, np_ecn_marked_roce_packets=5120)
    return ib_port(port, **{"rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet", "hw_counters": hw, **overrides})


def hca(name: str, ports: list[dict[str, Any]] | None = None, hca_type: str = "MT4129") -> dict[str, Any]:
    """An mlx5 HCA (ConnectX-7 by default) with the given ports (one NDR IB port if omitted)."""
    n = int(name.rsplit("_", 1)[-1]) if name.rsplit("_", 1)[-1].isdigit() else 0
    return {
        "name": name,
        "board_id": "MT_0000000838",
        "fw_ver": "28.39.1002",
        "hca_type": hca_type,
        "node_guid": f"a088:c203:0045:{0x7a10 + n:04x}",
        "ports": ports if ports is not None else [ib_port()],
    }


def inventory_hcas(node: Node) -> list[dict[str, Any]]:
    """``node_hcas`` inventory entries matching the node's HCA ports as built (the healthy expectation)."""
    entries = []
    for dev in node.get("hcas", []):
        for port in dev["ports"]:
            entries.append(
                {
                    "name": dev["name"],
                    "port": port["port"],
                    "rate_gbps": _gbps(port.get("rate")),
                    "link_layer": port["link_layer"],
                }
            )
    return entries


def _gbps(rate: str | None) -> int:
    try:
        return int(float(str(rate).split()[0]))
    except (ValueError, IndexError):
        return 0


def node(name: str, gpus: list[dict[str, Any]], hcas: list[dict[str, Any]], **extra: Any) -> Node:
    """A node description with driver/fabric manager versions and a matching healthy ``inventory``.

    GPUs with NVLinks make an HGX board: four NVSwitches on the PCI bus and the
    fabric manager running; without NVLinks (PCIe boards) neither.
    """
    hgx = any(g.get("nvlinks") for g in gpus)
    desc: Node = {
        "name": name,
        "epoch": 0.0,
        "driver_version": DRIVER_VERSION,
        "fabric_manager_version": DRIVER_VERSION if hgx else None,
        "nvswitches": list(HGX_NVSWITCHES) if hgx else [],
        "services": {FABRIC_MANAGER_UNIT: "active"} if hgx else {},
        "nvml": "ok",
        "checkpoint_fs_type": "wekafs",
        "gpus": gpus,
        "hcas": hcas,
        "kernel_log": [
            "2025-01-01T00:00:00+0000 node kernel: mlx5_core 0000:1a:00.0: mlx5_pcie_event: PCIe slot power capability was not advertised.",
        ],
    }
    desc.update(extra)
    desc.setdefault(
        "inventory",
        {
            "gpu_model": "H100-SXM-80GB",
            "gpu_count": len(gpus),
            "gpu_nvlink_count": max((len(g.get("nvlinks", [])) for g in gpus), default=0),
            "node_hcas": inventory_hcas(desc),
            "nvidia_driver_version": DRIVER_VERSION,
            "nvidia_fabric_manager_version": DRIVER_VERSION if hgx else None,
        },
    )
    return desc


def healthy_node(name: str = "healthy", gpus: int = 8, hcas: int = 2, nvlinks: int = 18, roce: bool = True) -> Node:
    """A healthy HGX H100 node: ``gpus`` GPUs with ``nvlinks`` links each, ``hcas`` NDR HCAs and a RoCE HCA."""
    devices = [hca(f"mlx5_{i}") for i in range(hcas)]
    if roce:
        devices.append(hca(f"mlx5_{hcas}", [roce_port()], hca_type="MT4125"))
    return node(name, [h100_gpu(i, nvlinks=nvlinks) for i in range(gpus)], devices)


def fabric_faults_node() -> Node:
    """Fabric faults: a port DOWN/Polling, a 200 Gb/s link where 400 is expected, a
    RoCE port where InfiniBand is expected, missing hw_counters, saturated counters
    (32-bit data without extended counters, 16-bit symbol_error, 8-bit link_downed,
    4-bit local_link_integrity_errors), a malformed and an unreadable file; also a
    fabric manager version drift and a GPU that is healthy."""
    down = ib_port(state="1: DOWN", phys_state="2: Polling", counters=ib_counters(link_downed=3))
    saturated = ib_port(
        rate="200 Gb/sec (4X HDR)",
        hw_counters=None,
        counters=ib_counters(
            extended=False,
            port_xmit_data=(1 << 32) - 1,
            symbol_error=65535,
            link_downed=255,
            local_link_integrity_errors=15,
            port_rcv_errors="N/A (no PMA)",
        ),
        unreadable=["counters/port_rcv_remote_physical_errors"],
    )
    roce_where_ib = roce_port()
    desc = node(
        "fabric-faults",
        [h100_gpu(0, nvlinks=4)],
        [hca("mlx5_0", [down]), hca("mlx5_1", [saturated], hca_type="MT4123"), hca("mlx5_2", [roce_where_ib])],
        fabric_manager_version="535.161.08",
    )
    inventory = desc["inventory"]
    for entry in inventory["node_hcas"]:
        entry["rate_gbps"] = 400
        entry["link_layer"] = "InfiniBand"
    return desc


def gpu_faults_node() -> Node:
    """GPU faults on 4 GPUs: GPU 0 memory 97 C and an NVLink down; GPU 1 die 91 C
    with thermal slowdown and a growing NVLink CRC counter; GPU 2 uncorrectable ECC,
    a pending row remap, XID 48, memory temperature ``[N/A]``, power
    ``[Not Supported]`` and an NVML error; GPU 3 fallen off the bus (XID 79).
    The driver version drifts from the inventory pin."""
    gpus = [
        h100_gpu(0, nvlinks=4, memory_temperature=97),
        h100_gpu(
            1,
            nvlinks=4,
            temperature=91,
            clocks_event_reasons=["sw_thermal_slowdown", "hw_thermal_slowdown"],
        ),
        h100_gpu(
            2,
            nvlinks=4,
            memory_temperature="[N/A]",
            power_watts="[Not Supported]",
            clocks_event_reasons={"nvml_error": "unknown"},
            ecc={"corrected": 12, "uncorrected": 2},
            remapped_rows={"correctable": 1, "uncorrectable": 2, "pending": True, "failure": False},
            xids=[48],
        ),
        h100_gpu(3, nvlinks=4, lost=True),
    ]
    gpus[0]["nvlinks"][3] = nvlink(up=False)
    gpus[1]["nvlinks"][2] = nvlink(crc_flit={"base": 17, "per_second": 50}, replay=4)
    desc = node("gpu-faults", gpus, [hca("mlx5_0")])
    desc["driver_version"] = "550.90.07"
    return desc


def missing_gpu_node() -> Node:
    """Eight GPUs in the inventory and on the PCI bus, seven listed by the driver: the eighth
    fell off the bus (XID 79 in the kernel log under its PCI address) and NVML no longer counts it."""
    desc = healthy_node("missing-gpu", gpus=8, hcas=1, nvlinks=18, roce=False)
    desc["gpus"][7].update(listed=False, xids=[79])
    return desc


def pcie_node(name: str = "pcie", gpus: int = 4) -> Node:
    """A PCIe server: ``gpus`` L40S GPUs without NVLink, no NVSwitch, no fabric manager, one RoCE HCA."""
    cards = []
    for i in range(gpus):
        cards.append(h100_gpu(i, nvlinks=0, name="NVIDIA L40S", pci_device_id=PCI_DEVICE_L40S, memory_temperature="[N/A]",
                              uuid=f"GPU-4a0c{i:04x}-1b2c-4d5e-8f90-{i:012x}",
                              pci_bus_id=f"00000000:{0x41 + 0x20 * i:02X}:00.0"))
    desc = node(name, cards, [hca("mlx5_0", [roce_port()], hca_type="MT4125")])
    desc["inventory"]["gpu_model"] = "L40S-48GB"
    return desc


def nvml_errors_node() -> Node:
    """NVML errors other than "GPU is lost", on an HGX board: GPU 0 fine at exactly 78 C (not
    above the threshold); GPU 1's device handle fails with "Unknown Error" (nvidia-smi exits
    255); every value read of GPU 2 fails with "Unknown Error"; GPU 3 at 79 C; the fabric
    manager has stopped (``failed``) although its version matches the pin; and the kernel log
    holds an XID 79 for a PCI address no GPU of the node has any more."""
    gpus = [h100_gpu(0, nvlinks=4, temperature=78), h100_gpu(1, nvlinks=4, handle_error="unknown"),
            h100_gpu(2, nvlinks=4, read_error="unknown"), h100_gpu(3, nvlinks=4, temperature=79)]
    desc = node("nvml-errors", gpus, [hca("mlx5_0")])
    desc["services"][FABRIC_MANAGER_UNIT] = "failed"
    desc["kernel_log"].append("2025-01-01T00:00:00+0000 node kernel: NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', "
                              "name=<unknown>, GPU has fallen off the bus.")
    return desc


def no_driver_node() -> Node:
    """Two GPUs on the PCI bus, the NVIDIA driver not loaded: NVML cannot start and nvidia-smi
    fails as a whole ("couldn't communicate with the NVIDIA driver", exit 9)."""
    desc = healthy_node("no-driver", gpus=2, hcas=1, nvlinks=2, roce=False)
    desc["nvml"] = "driver_not_loaded"
    return desc


def ib_shapes_node() -> Node:
    """Every InfiniBand shape of the kernel ABI and real drivers, on a node without GPUs:

    * ``mlx5_0``: ConnectX-7 NDR with extended counters (64-bit ``counters/``);
    * ``mlx5_1``: an older mlx5 without extended counters: 32-bit ``counters/``, the
      64-bit ones in ``counters_ext/`` (MLNX OFED on pre-4.5 kernels), the 32-bit
      data counter clamped at all-ones;
    * ``mlx5_2``: 32-bit ``counters/`` with ``*_64`` twins beside them;
    * ``mlx5_3``: a down port (empty cage): ``1: DOWN``, ``3: Disabled``, ``0 GB/sec``;
    * ``mlx5_4``: a RoCE port (Ethernet link layer) with congestion counters;
    * ``irdma0``: an Intel RoCE device without ``counters/`` (irdma has only ``hw_counters/``);
    * ``rxe0``: soft RoCE without a PMA: every counter reads ``N/A (no PMA)``, no ``hw_counters/``.
    """
    clamped = (1 << 32) - 1
    hcas = [
        hca("mlx5_0"),
        hca("mlx5_1", [ib_port(rate="100 Gb/sec (4X EDR)", hw_counters=None,
                               counters=ib_counters(extended=False, port_xmit_data=clamped, port_rcv_data=clamped),
                               counters_ext=ib_counters_ext())], hca_type="MT4115"),
        hca("mlx5_2", [ib_port(rate="200 Gb/sec (4X HDR)",
                               counters=ib_counters(extended=False, port_xmit_data=clamped, port_xmit_data_64=5000000000,
                                                    port_rcv_data_64=6000000000))], hca_type="MT4123"),
        hca("mlx5_3", [down_port()]),
        hca("mlx5_4", [roce_port()], hca_type="MT4125"),
        {**hca("irdma0", [roce_port(rate="100 Gb/sec (4X EDR)", counters=None,
                                    hw_counters={"ip4InReceives": 1234, "ip4OutSegRqsts": 4321, "tcpInSegs": 0,
                                                 "cnpHandled": 7, "cnpSent": 3, "RxECNMrkd": 11})]),
         "board_id": None, "hca_type": None},
        {**hca("rxe0", [roce_port(rate="10 Gb/sec (1X QDR)", counters=no_pma_counters(), hw_counters=None)]),
         "board_id": None, "hca_type": None},
    ]
    desc = node("ib-shapes", [], hcas)
    desc["nvml"] = "library_not_found"
    return desc


def ib_tables_node() -> Node:
    """Each shape of a port's counter directories, and the source the exporter must pick for it
    (:func:`gpufleet.exporter.sysfs.choose_counters`), on a node without GPUs:

    * ``mlx4_0``: ConnectX-3 on an upstream kernel, no extended counters: the
      32-bit PortCounters ``counters/`` alone (data counters from it, no unicast);
    * ``mlx4_1``: ConnectX-3 Pro with extended counters: the kernel's 64-bit
      PortCountersExtended ``counters/`` (``unicast_*`` present);
    * ``mlx4_2``: mlx4 under MLNX OFED on an old kernel: 32-bit ``counters/`` and
      the 64-bit ``counters_ext/`` beside it (data and unicast from ``counters_ext/``);
    * ``mlx5_0``: mlx5 with extended counters under MLNX OFED: the kernel's 64-bit
      ``counters/`` and a stale ``counters_ext/`` reading 0 (data from ``counters/``);
    * ``mlx5_1``: mlx5 without extended counters (old firmware): 32-bit ``counters/``
      alone, the data counter clamped at all-ones (saturated);
    * ``mlx5_2``: ``counters_ext/`` alone, no ``counters/`` (data from ``counters_ext/``);
    * ``mlx5_3``: neither directory, only ``hw_counters/`` (no PMA counters at all).
    """
    clamped = (1 << 32) - 1
    basic = ib_counters(extended=False)
    stale = {name: 0 for name in ib_counters_ext()}
    hcas = [
        hca("mlx4_0", [ib_port(rate="56 Gb/sec (4X FDR)", hw_counters=None, counters=dict(basic))], hca_type="MT4099"),
        hca("mlx4_1", [ib_port(rate="56 Gb/sec (4X FDR)", hw_counters=None)], hca_type="MT4103"),
        hca("mlx4_2", [ib_port(rate="56 Gb/sec (4X FDR)", hw_counters=None, counters=dict(basic),
                               counters_ext=ib_counters_ext())], hca_type="MT4099"),
        hca("mlx5_0", [ib_port(counters_ext=stale)]),
        hca("mlx5_1", [ib_port(rate="100 Gb/sec (4X EDR)",
                               counters=ib_counters(extended=False, port_xmit_data=clamped))], hca_type="MT4115"),
        hca("mlx5_2", [ib_port(rate="100 Gb/sec (4X EDR)", counters=None, counters_ext=ib_counters_ext())],
            hca_type="MT4115"),
        hca("mlx5_3", [ib_port(counters=None)]),
    ]
    desc = node("ib-tables", [], hcas)
    desc["nvml"] = "library_not_found"
    return desc


def no_nvml_node() -> Node:
    """A node without the NVIDIA driver: NVML reports LIBRARY_NOT_FOUND, InfiniBand still works."""
    desc = node("no-nvml", [], [hca("mlx5_0"), hca("mlx5_1", [roce_port()], hca_type="MT4125")])
    desc["nvml"] = "library_not_found"
    return desc


#: Named fixture nodes: name -> builder. Exporter expositions and node-check
#: fixtures both come from these.
FIXTURE_NODES: dict[str, Callable[[], Node]] = {
    "healthy": healthy_node,
    "fabric-faults": fabric_faults_node,
    "gpu-faults": gpu_faults_node,
    "missing-gpu": missing_gpu_node,
    "no-nvml": no_nvml_node,
    "nvml-errors": nvml_errors_node,
    "no-driver": no_driver_node,
    "pcie": pcie_node,
    "ib-shapes": ib_shapes_node,
    "ib-tables": ib_tables_node,
}


# --------------------------------------------------------------------------- writers


def pci_address(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as sysfs names the device: ``0000:18:00.0`` (lower case)."""
    domain, rest = bus_id.split(":", 1)
    return f"{domain[-4:]}:{rest}".lower()


def build_pci(desc: Node, sysfs_root: str | os.PathLike[str]) -> Path:
    """Write ``bus/pci/devices/<address>/{vendor,device,class}`` for the node's GPUs (unless
    ``on_pci`` is false) and NVSwitches, as the kernel shows NVIDIA devices; returns the root."""
    root = Path(sysfs_root)
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    entries = [(pci_address(g["pci_bus_id"]), g.get("pci_device_id", PCI_DEVICE_H100_SXM), PCI_CLASS_3D)
               for g in desc.get("gpus", []) if g.get("on_pci", True)]
    entries += [(address, PCI_DEVICE_NVSWITCH, PCI_CLASS_BRIDGE_OTHER) for address in desc.get("nvswitches", [])]
    for address, device, klass in entries:
        ddir = devices / address
        ddir.mkdir(exist_ok=True)
        for key, value in (("vendor", PCI_VENDOR_NVIDIA), ("device", device), ("class", klass)):
            (ddir / key).write_text(f"{value}\n")
    return root


def build_sysfs(desc: Node, sysfs_root: str | os.PathLike[str]) -> Path:
    """Write the node's ``class/infiniband`` tree and its NVIDIA PCI devices under ``sysfs_root``; returns the root.

    Counter values are written as ``"<n>\\n"`` like the kernel; string values
    verbatim; ``counters``/``counters_ext``/``hw_counters: None`` omit the
    directory; ``unreadable`` paths (relative to the port directory) become
    directories.
    """
    root = Path(sysfs_root)
    build_pci(desc, root)
    class_dir = root / "class" / "infiniband"
    class_dir.mkdir(parents=True, exist_ok=True)
    for dev in desc.get("hcas", []):
        ddir = class_dir / dev["name"]
        ddir.mkdir(exist_ok=True)
        for key in ("board_id", "fw_ver", "hca_type", "node_guid"):
            if dev.get(key) is not None:
                (ddir / key).write_text(f"{dev[key]}\n")
        for port in dev.get("ports", []):
            write_port(ddir / "ports" / str(port["port"]), port)
    return root


def write_port(pdir: Path, port: dict[str, Any]) -> None:
    """Write one port directory (``state``, ``phys_state``, ``rate``, ``link_layer``, counters)."""
    pdir.mkdir(parents=True, exist_ok=True)
    for key in ("state", "phys_state", "rate", "link_layer"):
        if port.get(key) is not None:
            (pdir / key).write_text(f"{port[key]}\n")
    for group in ("counters", "counters_ext", "hw_counters"):
        values = port.get(group)
        if values is None:
            continue
        gdir = pdir / group
        gdir.mkdir(exist_ok=True)
        for name, value in values.items():
            (gdir / name).write_text(value if isinstance(value, str) else f"{value}\n")
    for rel in port.get("unreadable", []):
        target = pdir / rel
        if target.is_file():
            target.unlink()
        target.mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class FakeNodePaths:
    """Where :func:`write_node` put a fixture node's pieces.

    Attributes:
        root: the node's directory.
        description: the node description JSON (``--nvml-fake`` takes it).
        sysfs_root: the sysfs tree (``--sysfs-root``, inventory ``node_sysfs_root``).
        proc_root: holds ``mounts`` (inventory ``node_proc_root``).
        checkpoint_dir: a real writable directory listed in ``proc/mounts``
            with the description's ``checkpoint_fs_type``.
        nvidia_smi, nv_fabricmanager, systemctl, kernel_log: stand-in executables.
    """

    root: Path
    description: Path
    sysfs_root: Path
    proc_root: Path
    checkpoint_dir: Path
    nvidia_smi: Path
    nv_fabricmanager: Path
    systemctl: Path
    kernel_log: Path


def write_node(desc: Node, directory: str | os.PathLike[str], python: str = sys.executable) -> FakeNodePaths:
    """Materialise a fixture node under ``directory``.

    Writes ``node.json`` (``epoch`` set to now unless the description has a
    non-zero one), the sysfs tree, ``proc/mounts``, a checkpoint directory and
    the stand-in scripts run by ``python -S`` (standard library only).

    Returns:
        The :class:`FakeNodePaths`.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    desc = copy.deepcopy(desc)
    if not desc.get("epoch"):
        desc["epoch"] = time.time()
    description = root / "node.json"
    description.write_text(json.dumps(desc, indent=1, sort_keys=True))
    sysfs_root = build_sysfs(desc, root / "sys")
    checkpoint_dir = root / "mnt" / "checkpoints"
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    proc_root = root / "proc"
    proc_root.mkdir(exist_ok=True)
    fs_type = desc.get("checkpoint_fs_type", "wekafs")
    mount_lines = [
        "overlay / overlay rw,relatime 0 0",
        "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0",
        "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0",
    ]
    if fs_type:
        mount_lines.append(f"weka-fs01 {_mount_escape(str(checkpoint_dir))} {fs_type} rw,relatime 0 0")
    (proc_root / "mounts").write_text("\n".join(mount_lines) + "\n")
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    # The stand-ins run as scripts without gpufleet installed: inline nodedesc into them.
    own = Path(standin.__file__).read_text()
    for line in ("from __future__ import annotations\n",
                 "from gpufleet.exporter.nodedesc import evaluate, node_now  # inlined when written as a script\n"):
        own = own.replace(line, "")
    source = Path(nodedesc.__file__).read_text() + "\n" + own
    scripts = {}
    for tool in standin.TOOLS:
        path = bin_dir / tool
        path.write_text(
            f"#!{python} -S\n{source}\n\nif __name__ == '__main__':\n"
            f"    sys.exit(main({tool!r}, sys.argv[1:], {str(description)!r}))\n"
        )
        path.chmod(0o755)
        scripts[tool] = path
    return FakeNodePaths(
        root=root,
        description=description,
        sysfs_root=sysfs_root,
        proc_root=proc_root,
        checkpoint_dir=checkpoint_dir,
        nvidia_smi=scripts["nvidia-smi"],
        nv_fabricmanager=scripts["nv-fabricmanager"],
        systemctl=scripts["systemctl"],
        kernel_log=scripts["kernel-log"],
    )


def _mount_escape(path: str) -> str:
    """Escape a path as /proc/mounts does (octal for space, tab, newline, backslash)."""
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
