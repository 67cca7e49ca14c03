"""The descheduler as a local process, driven by a policy file.

The policy normally comes from ``roles.descheduler``; until the caller
passes one, :func:`default_policy` evicts pods that do not tolerate the
taint the taint controller puts on virtual nodes (NoSchedule only).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.names import FREE_GPUS_TAINT
from gpufleet.componentconfig import yaml_problem
from gpufleet_workshop.local.certs import Pki
from gpufleet_workshop.local.components import component

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


def check_policy(path: Path) -> None:
    """Refuse a policy file the descheduler would exit on, before the running descheduler is replaced.

    Checks the shape of a ``descheduler/v1alpha2`` DeschedulerPolicy
    (https://github.com/kubernetes-sigs/descheduler#policy-default-evictor-and-strategy-plugins):
    a mapping with that apiVersion and kind, and a non-empty ``profiles``
    list whose entries have a ``name``, a ``plugins`` mapping and a
    ``pluginConfig`` list of ``{name, args}``. Plugin arguments are left to
    the descheduler.

    Raises:
        ValueError: naming the file, the key and what was expected.
    """
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--descheduler-policy {path}: cannot read it: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--descheduler-policy {path}: not valid YAML ({yaml_problem(exc)})") from None
    problems = []
    if not isinstance(doc, dict):
        problems.append(f"expected a mapping, got {type(doc).__name__}")
        doc = {}
    for key, want in (("apiVersion", "descheduler/v1alpha2"), ("kind", "DeschedulerPolicy")):
        if doc and doc.get(key) != want:
            problems.append(f"{key}: {doc.get(key)!r}: expected {want!r}")
    profiles = doc.get("profiles")
    if doc and (not isinstance(profiles, list) or not profiles):
        problems.append(f"profiles: {profiles!r}: expected a non-empty list of profiles")
    for i, prof in enumerate(profiles if isinstance(profiles, list) else []):
        if not isinstance(prof, dict) or not prof.get("name") or not isinstance(prof.get("plugins"), dict):
            problems.append(f"profiles[{i}]: expected a mapping with name and plugins")
        elif not all(isinstance(c, dict) and c.get("name") for c in prof.get("pluginConfig") or []):
            problems.append(f"profiles[{i}].pluginConfig: expected a list of {{name, args}}")
    if problems:
        raise ValueError(f"--descheduler-policy {path}: " + "; ".join(problems))


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
