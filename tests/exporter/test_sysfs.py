"""The pure sysfs reader: parsing, widths, saturation, missing and bad files."""

from __future__ import annotations

import pytest

from gpufleet.exporter import sysfs
from gpufleet_workshop.fixtures.node import build_sysfs, hca, healthy_node, ib_counters, ib_port, node, roce_port


@pytest.mark.parametrize(
    ("text", "bytes_per_second"),
    [
        ("400 Gb/sec (4X NDR)", 50e9),
        ("200 Gb/sec (4X HDR)", 25e9),
        ("2.5 Gb/sec (1X SDR)", 312.5e6),
        ("56 Gb/sec (4X FDR)", 7e9),
        ("10 Gb/sec (4X)", 1.25e9),
    ],
)
def test_parse_rate_gives_bytes_per_second(text, bytes_per_second):
    assert sysfs.parse_rate(text) == pytest.approx(bytes_per_second)


@pytest.mark.parametrize("text", ["", "fast", "Gb/sec 400", "400 Mb/sec"])
def test_parse_rate_rejects_garbage(text):
    with pytest.raises(ValueError):
        sysfs.parse_rate(text)


@pytest.mark.parametrize(
    ("text", "code", "name"),
    [("4: ACTIVE", 4, "ACTIVE"), ("1: DOWN", 1, "DOWN"), ("5: LinkUp", 5, "LinkUp"), ("2: Polling", 2, "Polling")],
)
def test_parse_enum(text, code, name):
    assert sysfs.parse_enum(text) == sysfs.EnumValue(code, name)


@pytest.mark.parametrize("text", ["ACTIVE", "x: ACTIVE", "4:", "-1: DOWN"])
def test_parse_enum_rejects_garbage(text):
    with pytest.raises(ValueError):
        sysfs.parse_enum(text)


@pytest.mark.parametrize("text", ["N/A (no PMA)", "-3", "12abc", ""])
def test_parse_counter_rejects_garbage(text):
    with pytest.raises(ValueError):
        sysfs.parse_counter(text)


NARROW = sysfs.InfiniBandPort(port=1, counters=ib_counters(extended=False))
EXTENDED = sysfs.InfiniBandPort(port=1, counters=ib_counters(extended=True))


@pytest.mark.parametrize(
    ("name", "value", "port", "expected"),
    [
        ("local_link_integrity_errors", 15, NARROW, True),  # 4-bit
        ("local_link_integrity_errors", 14, NARROW, False),
        ("excessive_buffer_overrun_errors", 15, NARROW, True),  # 4-bit
        ("link_downed", 255, NARROW, True),  # 8-bit
        ("link_error_recovery", 255, NARROW, True),  # 8-bit
        ("link_error_recovery", 254, NARROW, False),
        ("symbol_error", 65535, NARROW, True),  # 16-bit
        ("port_rcv_errors", 65535, NARROW, True),  # 16-bit
        ("symbol_error", 65534, NARROW, False),
        ("port_xmit_wait", 2**32 - 1, EXTENDED, True),  # 32-bit in both tables
        ("port_xmit_data", 2**32 - 1, NARROW, True),  # 32-bit without extended counters
        ("port_xmit_data", 2**32 - 1, EXTENDED, False),  # 64-bit with them
        ("port_xmit_data", 2**64 - 1, EXTENDED, True),
        ("port_rcv_data", 2**40, NARROW, False),  # above 32 bits: really 64-bit ("no IETF" table)
        ("port_rcv_data", 2**64 - 1, NARROW, True),
        ("unicast_xmit_packets", 2**64 - 1, EXTENDED, True),
        ("some_vendor_counter", 2**16 - 1, NARROW, None),  # unknown width: no verdict
    ],
)
def test_saturation_uses_each_counters_width(name, value, port, expected):
    assert sysfs.is_saturated(name, value, port) is expected


def test_reads_healthy_hcas_sorted_with_raw_units(tmp_path):
    build_sysfs(healthy_node(gpus=0, hcas=2), tmp_path)
    data = sysfs.read_infiniband(tmp_path)
    assert data.errors == []
    assert [d.name for d in data.devices] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    port = data.devices[0].ports[0]
    assert port.state == sysfs.EnumValue(4, "ACTIVE")
    assert port.phys_state == sysfs.EnumValue(5, "LinkUp")
    assert port.rate_text == "400 Gb/sec (4X NDR)"
    assert port.rate_bytes_per_second == 50e9
    assert port.link_layer == "InfiniBand"
    assert port.counters["port_xmit_data"] == 2345678901234  # raw 4-octet units
    assert port.extended_counters
    assert "lifespan" not in port.hw_counters
    assert data.devices[2].ports[0].link_layer == "Ethernet"


def test_missing_files_are_absent_not_errors(tmp_path):
    port = ib_port(hw_counters=None, counters=ib_counters())
    del port["counters"]["symbol_error"]
    port["rate"] = None
    build_sysfs(node("n", [], [hca("mlx5_0", [port])]), tmp_path)
    data = sysfs.read_infiniband(tmp_path)
    got = data.devices[0].ports[0]
    assert data.errors == []
    assert got.hw_counters is None
    assert "symbol_error" not in got.counters
    assert got.rate_text is None and got.rate_bytes_per_second is None


def test_malformed_and_unreadable_files_are_recorded_not_raised(tmp_path):
    port = roce_port(
        state="garbage",
        counters=ib_counters(symbol_error="N/A (no PMA)\n"),
        unreadable=["counters/link_downed", "rate"],
    )
    build_sysfs(node("n", [], [hca("mlx5_0", [port])]), tmp_path)
    (tmp_path / "class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer").write_bytes(b"\xff\xfe")
    data = sysfs.read_infiniband(tmp_path)
    prefix = "class/infiniband/mlx5_0/ports/1/"
    assert sorted((e.path.removeprefix(prefix), e.reason) for e in data.errors) == [
        ("counters/link_downed", "is_a_directory"),
        ("hw_counters/out_of_buffer", "malformed"),
        ("rate", "is_a_directory"),
        ("state", "malformed"),
    ]
    got = data.devices[0].ports[0]
    assert got.unsupported == ["counters/symbol_error"]  # N/A (no PMA): no value, and no error
    assert got.state is None and got.rate_text is None
    assert "symbol_error" not in got.counters and "link_downed" not in got.counters
    assert got.counters["port_rcv_errors"] == 0  # the rest of the port still reads


def test_no_infiniband_class_means_no_devices(tmp_path):
    data = sysfs.read_infiniband(tmp_path)
    assert data.devices == [] and data.errors == []


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("400 Gb/sec (4X NDR)", sysfs.Rate(50e9, 4, "NDR")),
        ("800 Gb/sec (4X XDR)", sysfs.Rate(100e9, 4, "XDR")),
        ("2.5 Gb/sec (1X SDR)", sysfs.Rate(312.5e6, 1, "SDR")),
        ("300 Gb/sec (12X EDR)", sysfs.Rate(37.5e9, 12, "EDR")),
        ("10 Gb/sec (4X)", sysfs.Rate(1.25e9, 4, None)),
        ("0 GB/sec", sysfs.Rate(0.0, None, None)),  # MLNX OFED, empty cage or no link
        ("0 Gb/sec", sysfs.Rate(0.0, None, None)),
    ],
)
def test_rate_forms_give_bytes_width_and_speed(text, rate):
    assert sysfs.parse_rate_full(text) == rate


def test_a_read_the_kernel_refuses_as_unsupported_is_not_a_read_error(tmp_path, monkeypatch):
    """EINVAL (rate of a port without a valid width), EOPNOTSUPP, ENOSYS: unsupported; EACCES: an error."""
    import errno
    import os

    build_sysfs(node("n", [], [hca("mlx5_0", [ib_port()])]), tmp_path)
    refusals = {"rate": errno.EINVAL, "counters/symbol_error": errno.EOPNOTSUPP,
                "counters/link_downed": errno.ENOSYS, "counters/VL15_dropped": errno.EACCES}
    real_open = os.open

    def fake_open(path, flags, *args):
        rel = os.fspath(path).split("/ports/1/", 1)[-1]
        if rel in refusals:
            raise OSError(refusals[rel], os.strerror(refusals[rel]), os.fspath(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(sysfs.os, "open", fake_open)
    data = sysfs.read_infiniband(tmp_path)
    got = data.devices[0].ports[0]
    assert sorted(got.unsupported) == ["counters/link_downed", "counters/symbol_error", "rate"]
    assert [(e.path.rsplit("/", 1)[-1], e.reason) for e in data.errors] == [("VL15_dropped", "eacces")]
    assert got.rate_bytes_per_second is None and "symbol_error" not in got.counters
    assert got.counters["port_rcv_errors"] == 0


def test_64_bit_files_replace_the_32_bit_counter_and_say_where_the_value_came_from(tmp_path):
    from gpufleet_workshop.fixtures.node import ib_counters_ext

    clamped = (1 << 32) - 1
    ext = ib_port(counters=ib_counters(extended=False, port_xmit_data=clamped), counters_ext=ib_counters_ext())
    twins = ib_port(counters=ib_counters(extended=False, port_xmit_data=clamped, port_xmit_data_64=7 << 33))
    build_sysfs(node("n", [], [hca("mlx5_0", [ext]), hca("mlx5_1", [twins])]), tmp_path)
    data = sysfs.read_infiniband(tmp_path)
    a, b = data.devices[0].ports[0], data.devices[1].ports[0]
    assert a.counters["port_xmit_data"] == 2345678901234 and a.sources["port_xmit_data"] == "counters_ext/port_xmit_data_64"
    assert a.counters["unicast_rcv_packets"] == 9876543198 and "port_unicast_rcv_packets" not in a.counters
    assert sysfs.counter_width("port_xmit_data", a) == 64
    assert b.counters["port_xmit_data"] == 7 << 33 and b.sources["port_xmit_data"] == "counters/port_xmit_data_64"
    assert "port_xmit_data_64" not in b.counters
    assert sysfs.counter_width("port_rcv_data", b) == 32  # no 64-bit twin for this one
    assert sysfs.is_saturated("port_xmit_data", b.counters["port_xmit_data"], b) is False
    assert data.errors == []


#: ib-tables node: hca -> (what counters/ is, source of port_xmit_data, source of unicast_xmit_packets).
TABLE_CHOICES = {
    "mlx4_0": ("basic", "counters/port_xmit_data", None),
    "mlx4_1": ("extended", "counters/port_xmit_data", "counters/unicast_xmit_packets"),
    "mlx4_2": ("basic", "counters_ext/port_xmit_data_64", "counters_ext/port_unicast_xmit_packets"),
    "mlx5_0": ("extended", "counters/port_xmit_data", "counters/unicast_xmit_packets"),
    "mlx5_1": ("basic", "counters/port_xmit_data", None),
    "mlx5_2": ("absent", "counters_ext/port_xmit_data_64", "counters_ext/port_unicast_xmit_packets"),
    "mlx5_3": ("absent", None, None),
}


@pytest.fixture(scope="module")
def ib_tables(tmp_path_factory):
    from gpufleet_workshop.fixtures.node import ib_tables_node

    root = tmp_path_factory.mktemp("ib-tables")
    build_sysfs(ib_tables_node(), root)
    data = sysfs.read_infiniband(root)
    assert data.errors == []
    return {d.name: d.ports[0] for d in data.devices}


@pytest.mark.parametrize("hca_name", sorted(TABLE_CHOICES))
def test_each_counter_comes_from_the_directory_the_kernel_abi_says(hca_name, ib_tables):
    """counters/ with unicast_* is the kernel's 64-bit PortCountersExtended and wins over a
    counters_ext/ beside it; counters_ext/ is used only beside a basic table or alone."""
    table, data_source, unicast_source = TABLE_CHOICES[hca_name]
    port = ib_tables[hca_name]
    assert port.table == table
    assert port.sources.get("port_xmit_data") == data_source
    assert port.sources.get("unicast_xmit_packets") == unicast_source
    # Nothing from a directory that was not chosen leaks in under another name.
    assert not any(name.startswith("counters_ext/") for name in port.counters)


def test_a_stale_counters_ext_beside_the_extended_table_is_ignored(ib_tables):
    """mlx5 under MLNX OFED: counters_ext/ reads 0, the kernel's 64-bit counters/ billions."""
    port = ib_tables["mlx5_0"]
    assert port.counters["port_xmit_packets"] == 8765432109
    assert port.counters["unicast_rcv_packets"] == 9876543198
    assert sysfs.counter_width("port_xmit_data", port) == 64
    assert port.extended_counters


def test_widths_follow_the_chosen_source(ib_tables):
    assert sysfs.counter_width("port_xmit_data", ib_tables["mlx4_0"]) == 32  # PortCounters
    assert sysfs.counter_width("port_xmit_data", ib_tables["mlx4_2"]) == 64  # counters_ext/
    assert sysfs.counter_width("port_rcv_packets", ib_tables["mlx5_2"]) == 64  # counters_ext/ alone
    clamped = ib_tables["mlx5_1"]
    assert sysfs.is_saturated("port_xmit_data", clamped.counters["port_xmit_data"], clamped) is True


def test_the_table_is_read_from_the_listing_not_the_values(tmp_path):
    """Extended counters/ whose unicast files read N/A is still the 64-bit table: counters_ext/ stays unused."""
    from gpufleet_workshop.fixtures.node import ib_counters_ext

    port = ib_port(counters=ib_counters(unicast_xmit_packets="N/A (no PMA)\n", unicast_rcv_packets="N/A (no PMA)\n",
                                        multicast_xmit_packets="N/A (no PMA)\n", multicast_rcv_packets="N/A (no PMA)\n"),
                   counters_ext=ib_counters_ext(port_xmit_data_64=0))
    build_sysfs(node("n", [], [hca("mlx5_0", [port])]), tmp_path)
    got = sysfs.read_infiniband(tmp_path).devices[0].ports[0]
    assert got.table == "extended"
    assert got.sources["port_xmit_data"] == "counters/port_xmit_data" and got.counters["port_xmit_data"] == 2345678901234
    assert "unicast_xmit_packets" not in got.counters


@pytest.mark.parametrize(
    ("names", "table"),
    [(None, "absent"), ([], "basic"), (["port_xmit_data", "symbol_error"], "basic"),
     (["multicast_rcv_packets", "port_xmit_data"], "extended"), (["unicast_xmit_packets"], "extended")],
)
def test_counters_table_from_a_listing(names, table):
    assert sysfs.counters_table(names) == table
