"""The node checks' parsers against real tool output shapes, and the stand-ins that produce them."""

from __future__ import annotations

import pytest

from gpufleet_workshop.fixtures import tools as standin
from gpufleet_workshop.fixtures.node import gpu_faults_node, healthy_node
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


# --------------------------------------------------------------------------- commands over SSH


def test_wrapped_commands_carry_their_own_exit_status():
    import subprocess

    from nodecheck import unwrap_output, wrap_command

    for command, rc, out in (("echo hi; exit 255", 255, "hi\n"), ("printf 'a\\nb'", 0, "a\nb"), ("true", 0, ""),
                             ("exit 9", 9, "")):
        done = subprocess.run(wrap_command(command), shell=True, capture_output=True, text=True)
        assert done.returncode == 0
        assert unwrap_output(done.stdout, done.returncode) == (out, rc), command


def test_nvidia_smi_exiting_255_over_ssh_is_a_named_failure_not_an_unreachable_host(tmp_path):
    """testinfra's ssh backend raises on exit 255 (it cannot tell ssh's own failure from the command's):
    the checks' commands must come back with nvidia-smi's 255 and output instead.

    The transport is the one thing replaced: the backend's ``ssh HOST CMD`` runs ``sh -c CMD`` here,
    through testinfra's own SshBackend.run_ssh (exit 255 handling included).
    """
    from testinfra.backend.ssh import SshBackend
    from testinfra.host import Host

    from gpufleet_workshop.fixtures.node import nvml_errors_node, write_node
    from nodecheck import Node

    class LoopbackSsh(SshBackend):
        def _build_ssh_command(self, command):
            return ["sh", "-c", "%s"], [command]

    paths = write_node(nvml_errors_node(), tmp_path / "n")
    host = Host(LoopbackSsh("ssh://gpu-x"))
    raw = host.backend
    import pytest as _pytest

    with _pytest.raises(RuntimeError):  # what a bare host.run does with nvidia-smi's 255
        raw.run(f"{paths.nvidia_smi} -L")
    node = Node("gpu-x", host, {"node_nvidia_smi": str(paths.nvidia_smi), "node_sysfs_root": str(paths.sysfs_root)})
    q = node.query_gpu
    assert q.rc == 255 and "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error" in q.stdout
    assert [g.lost for g in node.gpus] == [False, True, False, False]
    assert node.pci_gpus[:2] == ["0000:18:00.0", "0000:2a:00.0"] and len(node.nvswitches) == 4


def test_an_unreachable_host_is_a_result_not_an_exception():
    from testinfra.backend.ssh import SshBackend
    from testinfra.host import Host

    from nodecheck import Node

    class DownSsh(SshBackend):
        def _build_ssh_command(self, command):
            return ["sh", "-c", "%s"], ["echo 'ssh: connect to host gpu-y port 22: No route to host' >&2; exit 255"]

    node = Node("gpu-y", Host(DownSsh("ssh://gpu-y")), {})
    out = node.run("nvidia-smi -L")
    assert out.rc == 255 and "cannot run on gpu-y" in out.stderr and "No route to host" in out.stderr
    assert node.smi_failure() is not None and "rc 255" in node.smi_failure()


def test_pci_listing_finds_gpus_and_nvswitches():
    from nodecheck import nvidia_gpus, nvidia_nvswitches, parse_pci_devices

    out = ("/sys/bus/pci/devices/0000:18:00.0/vendor:0x10de\n/sys/bus/pci/devices/0000:18:00.0/class:0x030200\n"
           "/sys/bus/pci/devices/0000:05:00.0/vendor:0x10de\n/sys/bus/pci/devices/0000:05:00.0/class:0x068000\n"
           "/sys/bus/pci/devices/0000:1a:00.0/vendor:0x15b3\n/sys/bus/pci/devices/0000:1a:00.0/class:0x020700\n"
           "/sys/bus/pci/devices/0000:02:00.0/vendor:0x10de\n/sys/bus/pci/devices/0000:02:00.0/class:0x030000\n")
    devices = parse_pci_devices(out)
    assert nvidia_gpus(devices) == ["0000:02:00.0", "0000:18:00.0"]
    assert nvidia_nvswitches(devices) == ["0000:05:00.0"]


def test_standin_nvidia_smi_speaks_every_failure_shape():
    from gpufleet_workshop.fixtures.node import no_driver_node, nvml_errors_node

    out: list[str] = []
    assert standin.nvidia_smi(no_driver_node(), ["-L"], out) == 9
    assert out == ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
                   "latest NVIDIA driver is installed and running."]
    out = []
    rc = standin.nvidia_smi(nvml_errors_node(), ["--query-gpu=index,pci.bus_id,temperature.gpu", "--format=csv,noheader,nounits"], out)
    assert rc == standin.EXIT_OTHER == 255
    assert out == ["0, 00000000:18:00.0, 78",
                   "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error",
                   "2, 00000000:3A:00.0, [Unknown Error]",
                   "3, 00000000:5D:00.0, 79"]
    out = []
    assert standin.systemctl(nvml_errors_node(), ["is-active", "nvidia-fabricmanager"], out) == 3 and out == ["failed"]
