"""The descheduler as a local process, driven by a policy file.

The policy normally comes from ``roles.descheduler``; until the caller
passes one, :func:`default_policy` evicts pods that do not tolerate the
taint the taint controller puts on virtual nodes (NoSchedule only).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.local.certs import Pki
from gpufleet.local.components import component

#: Taint on virtual nodes while the cluster has free GPUs (DESIGN.md).
FREE_GPUS_TAINT = "gpufleet.io/cluster-has-free-gpus"
#: Seconds between descheduling runs locally (production uses minutes).
INTERVAL = "10s"


def default_policy() -> dict:
    """A ``descheduler/v1alpha2`` DeschedulerPolicy with RemovePodsViolatingNodeTaints for :data:`FREE_GPUS_TAINT`."""
    return {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerPolicy",
        "profiles": [
            {
                "name": "gpufleet-local",
                "pluginConfig": [
                    {"name": "DefaultEvictor", "args": {}},
                    {"name": "RemovePodsViolatingNodeTaints", "args": {"includedTaints": [FREE_GPUS_TAINT]}},
                ],
                "plugins": {"deschedule": {"enabled": ["RemovePodsViolatingNodeTaints"]}},
            }
        ],
    }


def descheduler_argv(policy_file: Path, kubeconfig: Path, pki: Pki, port: int, interval: str = INTERVAL) -> list[str]:
    """Command line of the descheduler (metrics and /healthz on ``https://127.0.0.1:<port>``).

    Args:
        policy_file: DeschedulerPolicy YAML.
        kubeconfig: admin kubeconfig.
        pki: cluster PKI (serving certificate for the metrics endpoint).
        port: secure port.
        interval: ``--descheduling-interval`` (Go duration).
    """
    return [
        str(component("descheduler").binary()),
        f"--policy-config-file={policy_file}",
        f"--kubeconfig={kubeconfig}",
        f"--descheduling-interval={interval}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        "--v=2",
    ]
