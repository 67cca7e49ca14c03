"""HCA port checks from sysfs (``<node_sysfs_root>/class/infiniband/<hca>/ports/<port>/``).

Every port in the inventory's ``node_hcas`` must be ``4: ACTIVE`` /
``5: LinkUp`` at ``rate_gbps`` with the expected ``link_layer``
(kernel Documentation/ABI/stable/sysfs-class-infiniband).
"""

from __future__ import annotations

from nodecheck import PortRef, parse_rate_gbps


def _read(hca_port: PortRef, name: str) -> str:
    f = hca_port.file(name)
    assert f.exists, f"{hca_port.node.name} {hca_port.label}: {f.path} does not exist (HCA or port missing?)"
    return f.content_string.strip()


def test_port_active(hca_port: PortRef):
    """Logical state is ACTIVE (IBA PortState 4)."""
    state = _read(hca_port, "state")
    assert state.split(":")[0].strip() == "4", f"{hca_port.node.name} {hca_port.label}: state {state!r}, expected '4: ACTIVE'"


def test_port_link_up(hca_port: PortRef):
    """Physical state is LinkUp (IBA PortPhysicalState 5)."""
    phys = _read(hca_port, "phys_state")
    assert phys.split(":")[0].strip() == "5", f"{hca_port.node.name} {hca_port.label}: phys_state {phys!r}, expected '5: LinkUp'"


def test_port_rate(hca_port: PortRef):
    """The link trained at the inventory's ``rate_gbps``."""
    if hca_port.rate_gbps is None:
        return
    rate = _read(hca_port, "rate")
    gbps = parse_rate_gbps(rate)
    assert gbps == hca_port.rate_gbps, f"{hca_port.node.name} {hca_port.label}: rate {rate!r}, expected {hca_port.rate_gbps:g} Gb/sec"


def test_port_link_layer(hca_port: PortRef):
    """Link layer as the inventory says (InfiniBand, or Ethernet for RoCE)."""
    layer = _read(hca_port, "link_layer")
    assert layer == hca_port.link_layer, f"{hca_port.node.name} {hca_port.label}: link_layer {layer!r}, expected {hca_port.link_layer!r}"
