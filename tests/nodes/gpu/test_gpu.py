"""GPU checks through ``nvidia-smi``: count, reachability, temperatures, ECC, retired memory, XIDs.

Thresholds come from the inventory: ``gpu_metrics_gpu_temp_threshold_celsius``
(78 C: the fleet's operating rule; "above 78 C" is strictly greater, exactly
as the gpu_metrics alert and node health read the same variable),
``gpu_metrics_memory_temp_threshold_celsius`` (85 C),
``node_health_max_retired_pages`` (0) and ``node_health_xid_lookback_minutes`` (60).
"""

from __future__ import annotations

import warnings

import pytest

from nodecheck import GpuRef, Node, bus_key, number, yes_no


def _reachable(gpu: GpuRef):
    """The nvidia-smi row of a reachable GPU, or skip pointing at test_gpu_reachable."""
    row = gpu.node.gpu(gpu.index)
    if row is None or row.lost or row.erroring:
        pytest.skip(f"{gpu.node.name} GPU {gpu.index} is not reachable: see test_gpu_reachable")
    return row


def test_gpu_count(node: Node):
    """nvidia-smi enumerates as many GPUs as the inventory's ``gpu_count`` (lost ones count as present)."""
    gpus = node.gpus
    failure = node.smi_failure()
    if failure:
        pytest.fail(f"{node.name}: {failure}")
    listed = ", ".join(g.bus_id for g in gpus) or "none"
    assert len(gpus) == node.expected_gpu_count, (
        f"{node.name}: nvidia-smi lists {len(gpus)} GPUs ({listed}), inventory gpu_count is "
        f"{node.expected_gpu_count} ({node.var('gpu_model')})"
    )


def test_gpu_reachable(gpu: GpuRef):
    """The GPU is listed and NVML can talk to it: not lost, its handle works, its values read.

    When nvidia-smi fails as a whole (any exit code: driver not loaded, 255
    "other error"...), every GPU fails here with its bus id (from the PCI bus)
    and what the tool printed.
    """
    node = gpu.node
    bus = node.gpu_bus(gpu.index) or "bus id unknown"
    failure = node.smi_failure()
    if failure:
        pytest.fail(f"{node.name} GPU {gpu.index} ({bus}): {failure}")
    row = node.gpu(gpu.index)
    if row is None:
        on_pci = " (on the PCI bus, but the driver no longer lists it)" if gpu.index < len(node.pci_gpus) else ""
        pytest.fail(f"{node.name} GPU {gpu.index} ({bus}): missing{on_pci}, nvidia-smi lists only {len(node.gpus)} GPUs")
    assert not row.lost, f"{node.name} GPU {gpu.index} ({row.bus_id}): {row.error or 'GPU is lost'}"
    assert not row.erroring, (f"{node.name} GPU {gpu.index} ({row.bus_id}): every value nvidia-smi reads is an error: "
                              + ", ".join(sorted(set(row.value_errors.values()))))


def test_gpu_temperature(gpu: GpuRef):
    """GPU die temperature is not above ``gpu_metrics_gpu_temp_threshold_celsius`` (78 C passes, 79 C fails)."""
    row = _reachable(gpu)
    threshold = float(gpu.node.var("gpu_metrics_gpu_temp_threshold_celsius"))
    temp = number(row.value("temperature.gpu"))
    assert temp is not None, f"{gpu.node.name} GPU {gpu.index} ({row.bus_id}): temperature not reported ({row.value('temperature.gpu')})"
    assert not temp > threshold, f"{gpu.node.name} GPU {gpu.index} ({row.bus_id}): temperature {temp:g} C > threshold {threshold:g} C"


def test_gpu_memory_temperature(gpu: GpuRef):
    """HBM temperature is not above ``gpu_metrics_memory_temp_threshold_celsius`` (skipped where not reported)."""
    row = _reachable(gpu)
    threshold = float(gpu.node.var("gpu_metrics_memory_temp_threshold_celsius"))
    temp = number(row.value("temperature.memory"))
    if temp is None:
        pytest.skip(f"{gpu.node.name} GPU {gpu.index}: memory temperature not reported ({row.value('temperature.memory')})")
    assert not temp > threshold, (f"{gpu.node.name} GPU {gpu.index} ({row.bus_id}): memory temperature {temp:g} C > "
                                  f"threshold {threshold:g} C")


def test_gpu_no_uncorrectable_ecc(gpu: GpuRef):
    """No uncorrectable (double-bit) ECC error over the GPU's lifetime (aggregate counter)."""
    row = _reachable(gpu)
    errors = number(row.value("ecc.errors.uncorrected.aggregate.total"))
    if errors is None:
        pytest.skip(f"{gpu.node.name} GPU {gpu.index}: ECC counters not reported (ECC disabled?)")
    assert errors == 0, f"{gpu.node.name} GPU {gpu.index} ({row.bus_id}): {errors:g} uncorrectable ECC errors (aggregate)"


def test_gpu_retired_memory(gpu: GpuRef):
    """Retired memory within ``node_health_max_retired_pages`` and nothing waiting for a reset.

    Pre-Ampere GPUs retire pages (``retired_pages.*``); Ampere and later remap
    rows instead (``--query-remapped-rows``; NVIDIA "GPU Memory Error
    Management"): whichever the GPU reports is checked, a failed row remap
    always fails.
    """
    row = _reachable(gpu)
    limit = int(gpu.node.var("node_health_max_retired_pages"))
    problems: list[str] = []
    reported = False
    sbe, dbe = number(row.value("retired_pages.sbe")), number(row.value("retired_pages.dbe"))
    pending = yes_no(row.value("retired_pages.pending"))
    if sbe is not None or dbe is not None or pending is not None:
        reported = True
        retired = (sbe or 0) + (dbe or 0)
        if retired > limit:
            problems.append(f"{retired:g} retired pages (single-bit {sbe}, double-bit {dbe}) > limit {limit}")
        if pending:
            problems.append("page retirement pending (needs a GPU reset)")
    remap = gpu.node.remapped_rows.get(bus_key(row.bus_id))
    if remap is not None and number(remap.get("remapped_rows.uncorrectable")) is not None:
        reported = True
        uncorrectable = number(remap["remapped_rows.uncorrectable"]) or 0
        if yes_no(remap.get("remapped_rows.failure")):
            problems.append("row remapping failed (no spare rows left)")
        if yes_no(remap.get("remapped_rows.pending")):
            problems.append("row remap pending (needs a GPU reset)")
        if uncorrectable > limit:
            problems.append(f"{uncorrectable:g} rows remapped for uncorrectable errors > limit {limit}")
    if not reported:
        pytest.skip(f"{gpu.node.name} GPU {gpu.index}: neither retired pages nor remapped rows reported")
    assert not problems, f"{gpu.node.name} GPU {gpu.index} ({row.bus_id}): " + "; ".join(problems)


def test_gpu_no_recent_xid(gpu: GpuRef):
    """No hardware XID for the GPU in the kernel log of the last ``node_health_xid_lookback_minutes``.

    XIDs listed in ``node_health_fatal_xids`` (the node_health role's list:
    ECC, row remap, fallen off the bus, NVLink ...) fail; others (13, 31, 43:
    usually the application's fault) only warn. Without that list every XID
    fails. The kernel logs XIDs by PCI address, so a GPU the driver no longer
    lists is still checked by its address on the PCI bus.
    """
    node = gpu.node
    bus = node.gpu_bus(gpu.index)
    if bus is None:
        pytest.skip(f"{node.name} GPU {gpu.index}: neither nvidia-smi nor the PCI bus names it: see test_gpu_reachable")
    log = node.kernel_log
    if log.rc != 0:
        pytest.fail(f"{node.name}: cannot read the kernel log (`{log.command}` rc {log.rc}): {log.stderr.strip()}")
    key = bus_key(bus)
    fatal_list = node.var("node_health_fatal_xids")
    fatal_set = None if fatal_list is None else {int(x) for x in fatal_list}
    xids = [(xid, line) for where, xid, line in node.xids if where == key]
    fatal = [(x, line) for x, line in xids if fatal_set is None or x in fatal_set]
    other = [(x, line) for x, line in xids if (x, line) not in fatal]
    lookback = node.var("node_health_xid_lookback_minutes")
    if other:
        warnings.warn(f"{node.name} GPU {gpu.index} ({bus}): non-fatal XID {', '.join(str(x) for x, _ in other)} in the last {lookback} min")
    assert not fatal, (
        f"{node.name} GPU {gpu.index} ({bus}): XID {', '.join(str(x) for x, _ in fatal)} in the last "
        f"{lookback} min: {fatal[-1][1]}"
    )


def test_no_recent_xid_on_an_unknown_gpu(node: Node):
    """No fatal XID in the kernel log for a PCI address that is none of the node's known GPUs.

    A GPU gone from both nvidia-smi and the PCI bus still leaves its XIDs
    (79, "fallen off the bus") under its address: they are reported here.
    """
    log = node.kernel_log
    if log.rc != 0:
        pytest.skip(f"{node.name}: kernel log unreadable: see test_gpu_no_recent_xid")
    known = set()
    for bus in [g.bus_id for g in node.gpus] + node.pci_gpus:
        try:
            known.add(bus_key(bus))
        except ValueError:
            continue
    fatal_list = node.var("node_health_fatal_xids")
    fatal_set = None if fatal_list is None else {int(x) for x in fatal_list}
    stray = [(b, x, line) for b, x, line in node.xids if b not in known and (fatal_set is None or x in fatal_set)]
    assert not stray, f"{node.name}: XID for a GPU the node does not list: " + "; ".join(
        f"PCI {b[0]:04x}:{b[1]:02x}:{b[2]:02x} XID {x}: {line}" for b, x, line in stray[:3])
