"""Host range patterns mean to gpufleet exactly what they mean to Ansible."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleError
from ansible.plugins.inventory import expand_hostname_range

from gpufleet_admin.inventory.hostranges import HostRangeError, expand

PATTERNS = [
    "gpu-a-[001:032]", "stg-h100-[1:2]", "db[01:10:3]node-[01:10]", "web[a:f]", "web[a:F]", "x[:3]",
    "rack[1:2]-gpu[08:10]", "n[0:10:5].example.com", "plain-host", "h[9:10]", "h[a:C]", "h[ab:cd]",
]
BAD = ["h[A:c]", "h[1]", "h[1:]", "h[01:100]", "h[c:a]", "h[1:2:x]", "h[1:2:3:4]", "h[a:10]"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_expansion_matches_ansible(pattern):
    theirs = expand_hostname_range(pattern) if "[" in pattern else [pattern]
    assert expand(pattern) == theirs


@pytest.mark.parametrize("pattern", BAD)
def test_bad_ranges_are_refused_as_ansible_refuses_them(pattern):
    with pytest.raises((AnsibleError, ValueError)):
        expand_hostname_range(pattern)
    with pytest.raises(HostRangeError, match="expected"):
        expand(pattern)


def test_inventory_loading_does_not_need_ansible():
    """The controllers load inventories inside gpufleet's image, which has no Ansible."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['ansible'] = None\n"
            "from roles.registry import load\n"
            "inv = load('prod'); print(len(inv.hosts))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 128
