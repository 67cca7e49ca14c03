"""What the exporter process loads: its own modules and their few dependencies, nothing of the cluster side.

The exporter runs on every node; the Kubernetes client, pydantic models and
the inventory (what the controllers use) would double its memory for no use.
The test runs ``gpufleet exporter`` serving ``/metrics`` in a fresh
interpreter, scrapes it once, and lists ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from gpufleet.prom.server import free_port
from gpufleet_workshop.fixtures.node import healthy_node, write_node

#: Every gpufleet module a serving exporter (fake NVML included) has loaded after a scrape.
EXPECTED_GPUFLEET_MODULES = {
    "gpufleet", "gpufleet.cli", "gpufleet.cliargs",
    "gpufleet.controllers", "gpufleet.controllers.exposition", "gpufleet.controllers.flags",
    "gpufleet.controllers.runtime", "gpufleet.controllers.serve",
    "gpufleet.exporter", "gpufleet.exporter.collector", "gpufleet.exporter.main", "gpufleet.exporter.nodedesc",
    "gpufleet.exporter.nvml", "gpufleet.exporter.nvml_fake", "gpufleet.exporter.sysfs",
}
#: Top-level packages the exporter must never load (the cluster side's dependencies).
FORBIDDEN_PACKAGES = {"kubernetes", "pydantic", "pydantic_core", "yaml", "jinja2", "httpx", "rich", "pulumi",
                      "invoke", "urllib3", "google", "requests", "websocket", "oauthlib"}

_PROBE = """
import json, sys, threading, time, urllib.request
from gpufleet import cli
argv = json.loads(sys.argv[1])
threading.Thread(target=cli.main, args=(argv,), daemon=True).start()
url = "http://127.0.0.1:%d/metrics" % int(argv[argv.index("--metrics-port") + 1])
for _ in range(400):
    try:
        body = urllib.request.urlopen(url, timeout=5).read()
        break
    except OSError:
        time.sleep(0.05)
else:
    raise SystemExit("exporter did not answer")
assert b"gpufleet_infiniband_port_state_id" in body and b"gpufleet_gpu_temperature_celsius" in body
print(json.dumps(sorted(sys.modules)))
"""


def test_a_serving_exporter_loads_no_kubernetes_client_pydantic_or_inventory(tmp_path):
    paths = write_node(healthy_node(gpus=2, hcas=2, nvlinks=2, roce=False), tmp_path / "n")
    argv = ["exporter", "--listen-address", "127.0.0.1", "--metrics-port", str(free_port()),
            "--sysfs-root", str(paths.sysfs_root), "--nvml-fake", str(paths.description), "--log-level", "WARNING"]
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv)], capture_output=True, text=True,
                          timeout=60, check=True)
    modules = set(json.loads(done.stdout))
    assert {m for m in modules if m.split(".")[0] == "gpufleet"} == EXPECTED_GPUFLEET_MODULES
    assert {m.split(".")[0] for m in modules} & FORBIDDEN_PACKAGES == set()
    assert not any(m.startswith(("gpufleet.kube", "gpufleet_admin.inventory")) for m in modules)
