"""roles/registry.py: every role declared once, in an order the stack can compose, without Pulumi."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufleet.paths import ROLES as ROLES_DIR
from roles.registry import ROLE_MODELS, ROLES, Role, _check


def test_every_role_folder_is_declared_once_with_its_own_variables():
    folders = sorted(p.name for p in ROLES_DIR.iterdir() if (p / "vars.py").is_file())
    assert sorted(ROLE_MODELS) == folders
    for role in ROLES:
        assert f"{role.name}_enabled" in role.vars.model_fields
        assert role.token.startswith("gpufleet:") and role.token.count(":") == 2


def test_a_role_waits_only_for_roles_declared_before_it():
    kueue, metrics = ROLES[0], ROLES[1]
    with pytest.raises(ValueError, match="'gpu_metrics' waits for 'kueue'"):
        _check((metrics, kueue))
    with pytest.raises(ValueError, match="declared twice"):
        _check((kueue, kueue))
    with pytest.raises(ValueError, match="waits for 'nope'"):
        _check((Role("x", kueue.vars, kueue.objects, token="gpufleet:x:X", after=("nope",)),))


def test_the_registry_loads_without_pulumi():
    # Controllers in gpufleet's image (no Pulumi) load their environment through the registry.
    code = ("import sys\nfor m in ('pulumi', 'pulumi_kubernetes'): sys.modules[m] = None\n"
            "from roles.registry import load\nprint(len(load('prod').hosts))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) == 128
