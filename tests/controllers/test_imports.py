"""What a controller process loads: the product alone, nothing of the inventory, the roles or provisioning.

Each component reads ``--config FILE`` and nothing else of the inventory:
in a fresh interpreter, the command reads the file its role renders for the
``local`` inventory (its own ``configuration(args)``, the road ``run`` takes),
every module of its package is imported, and ``sys.modules`` is listed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from roles.registry import COMPONENTS, load

#: Top-level packages no gpufleet component may load: provisioning, the workshop, the roles, their tools.
FORBIDDEN = {"gpufleet_admin", "gpufleet_workshop", "roles", "pulumi", "pulumi_kubernetes", "invoke", "jinja2",
             "ansible", "testinfra", "matplotlib"}
#: The command's package (``gpufleet.<package>``).
PACKAGES = {"taint-controller": "taint_controller", "quota-sync": "quota_sync", "node-health": "node_health",
            "virtual-kubelet": "virtual_kubelet", "goodput": "goodput"}

_PROBE = """
import importlib, json, pkgutil, sys
from gpufleet import cli
command, path, package = sys.argv[1:4]
module = importlib.import_module(cli.COMMANDS[command][0])
args = cli.build_parser(command).parse_args([command, "--config", path])
config = module.configuration(args)
pkg = importlib.import_module("gpufleet." + package)
for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    importlib.import_module(info.name)
print(json.dumps({"modules": sorted(sys.modules), "config": config.model_dump(mode="json")}))
"""


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.command)
def test_a_controller_reads_its_file_and_loads_nothing_of_the_inventory_or_the_roles(component, tmp_path):
    inv = load("local")
    instance = component.instances(inv)[0]
    path = tmp_path / "config.yaml"
    expected = component.build(inv, instance)
    path.write_text(component.dump(expected))
    done = subprocess.run([sys.executable, "-c", _PROBE, component.command, str(path), PACKAGES[component.command]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["config"] == expected.model_dump(mode="json")
    loaded = {m.split(".")[0] for m in out["modules"]}
    assert loaded & FORBIDDEN == set(), sorted(m for m in out["modules"] if m.split(".")[0] in FORBIDDEN)[:20]
