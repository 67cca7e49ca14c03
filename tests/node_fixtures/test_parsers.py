"""The node checks' parsers against real tool output shapes, and the stand-ins that produce them."""

from __future__ import annotations

import pytest

from gpufleet.sim import standin
from gpufleet.sim.node import gpu_faults_node, healthy_node
from nodecheck import (
    GPU_FIELDS,
    bus_key,
    nvlinks_for_model,
    parse_dd,
    parse_fabric_manager_version,
    parse_mounts,
    parse_nvlink,
    parse_nvlink_errors,
    parse_query_gpu,
    parse_rate_gbps,
    parse_xids,
)


@pytest.mark.parametrize("text", ["00000000:18:00.0", "0000:18:00.0", "0000:18:00", "00000000:18:00.0 "])
def test_bus_ids_in_every_form_compare_equal(text):
    assert bus_key(text) == (0, 0x18, 0)


def test_query_gpu_keeps_lost_gpus_in_index_order():
    out = (
        "0, 00000000:18:00.0, GPU-a, NVIDIA H100 80GB HBM3, 550.54.15, 41, 47, 0, [N/A], [N/A], [N/A]\n"
        "Unable to determine the device handle for GPU0000:2A:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
        "2, 00000000:3A:00.0, GPU-c, NVIDIA H100 80GB HBM3, 550.54.15, 91, [N/A], 2, [N/A], [N/A], [N/A]\n"
        "WARNING: infoROM is corrupted at gpu 0000:3A:00.0\n"
    )
    gpus = parse_query_gpu(out, GPU_FIELDS)
    assert [(g.position, g.lost) for g in gpus] == [(0, False), (1, True), (2, False)]
    assert gpus[1].bus_id == "0000:2A:00.0" and "GPU is lost" in gpus[1].error
    assert gpus[2].value("temperature.gpu") == "91" and gpus[2].value("temperature.memory") == "[N/A]"


def test_nvlink_status_and_error_counters():
    status = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)\n\t Link 0: 26.562 GB/s\n"
    assert parse_nvlink(status) == {0: {0: "26.562 GB/s", 1: "<inactive>"}, 1: {0: "26.562 GB/s"}}
    errors = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\n\t Link 0: Replay Errors: 0\n\t Link 0: Recovery Errors: 2\n\t Link 0: CRC Errors: 5\n\n"
    parsed = parse_nvlink(errors)
    assert parse_nvlink_errors(parsed[0][0]) == {"Replay Errors": 0, "Recovery Errors": 2, "CRC Errors": 5}


def test_xid_lines_with_and_without_mig_suffix():
    log = (
        "Jan 01 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "Jan 01 kernel: NVRM: Xid (PCI:0000:3a:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9).\n"
        "Jan 01 kernel: mlx5_core 0000:1a:00.0: link up\n"
    )
    assert [(bus, xid) for bus, xid, _ in parse_xids(log)] == [((0, 0x18, 0), 79), ((0, 0x3A, 0), 94)]


def test_mounts_decode_octal_escapes():
    mounts = parse_mounts("weka /mnt/check\\040points wekafs rw 0 0\nproc /proc proc rw 0 0\n")
    assert mounts["/mnt/check points"] == ("weka", "wekafs")


@pytest.mark.parametrize(
    ("output", "mib_per_second"),
    [
        ("256+0 records in\n256+0 records out\n268435456 bytes (268 MB, 256 MiB) copied, 0.5 s, 537 MB/s\n", 512.0),
        ("4194304 bytes (4.2 MB, 4.0 MiB) copied, 0.25 s, 16.8 MB/s", 16.0),
        ("dd: error writing: No space left on device", None),
    ],
)
def test_dd_summary(output, mib_per_second):
    assert parse_dd(output) == mib_per_second


def test_small_parsers():
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400
    assert parse_rate_gbps("garbage") is None
    assert parse_fabric_manager_version("Fabric Manager version is : 550.54.15") == "550.54.15"
    assert nvlinks_for_model("H100-SXM-80GB") == 18
    assert nvlinks_for_model("A100-SXM-80GB") == 12
    assert nvlinks_for_model("L40S-PCIe-48GB") == 0


def test_standin_speaks_nvidia_smi_csv():
    node = gpu_faults_node()
    node["epoch"], node["clock"] = 100.0, 110.0
    out: list[str] = []
    rc = standin.nvidia_smi(node, ["--query-gpu=index,temperature.gpu,temperature.memory,power.draw", "--format=csv,noheader,nounits"], out)
    assert rc == standin.EXIT_GPU_LOST
    assert out[:3] == ["0, 41, 97, 312.50", "1, 91, 47, 312.50", "2, 41, [N/A], [Not Supported]"]
    assert out[3].startswith("Unable to determine the device handle for GPU0000:5D:00.0: GPU is lost")
    out = []
    assert standin.nvidia_smi(node, ["nvlink", "-e", "-i", "1"], out) == 0
    assert "\t Link 2: CRC Errors: 517" in out  # 17 + 50/s x 10 s of frozen clock


def test_standin_rejects_what_it_does_not_emulate():
    out: list[str] = []
    assert standin.nvidia_smi(healthy_node(gpus=1), ["--query-gpu=bogus.field", "--format=csv"], out) == standin.EXIT_INVALID
    assert out == ['Field "bogus.field" is not a valid field to query.']
    assert standin.nvidia_smi(healthy_node(gpus=1), ["-q"], []) == standin.EXIT_INVALID
    assert standin.nv_fabricmanager({"fabric_manager_version": None}, ["--version"], []) == 127
