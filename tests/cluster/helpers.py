"""Helpers shared by the cluster tests (not a test module)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException

#: Kinds of the kueue role that tests need present (not its quota-sync controller).
KUEUE_KINDS = ("Namespace", "PriorityClass", "WorkloadPriorityClass", "Topology", "ResourceFlavor", "ClusterQueue",
               "LocalQueue")


def wait(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25):
    """Poll ``check`` until truthy and return its value; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def ensure_kueue_objects(api_client, inventory) -> None:
    """Create the kueue role's objects of ``inventory`` that are absent, and wait until its ClusterQueues are Active.

    Existing objects are left as they are (another test or ``pulumi up``
    may own them). A namespace still terminating from an earlier test is
    waited for (up to 90 s) and then created again.
    """
    from roles.kueue.manifests import objects

    dyn = dynamic.DynamicClient(api_client)

    def state(res, name: str, ns: str | None) -> str:
        try:
            got = res.get(name=name, namespace=ns)
        except ApiException as exc:
            if exc.status == 404:
                return "absent"
            raise
        return "terminating" if res.kind == "Namespace" and got.status.phase == "Terminating" else "present"

    wanted = [o for o in objects(inventory) if o["kind"] in KUEUE_KINDS]
    for obj in wanted:
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        name, ns = obj["metadata"]["name"], obj["metadata"].get("namespace")
        now = wait(f"{obj['kind']} {name} not terminating",
                   lambda: (st := state(res, name, ns)) != "terminating" and st, timeout=90)
        if now == "absent":
            res.create(body=obj, namespace=ns)
    cqs = dyn.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue")
    for name in (o["metadata"]["name"] for o in wanted if o["kind"] == "ClusterQueue"):
        wait(f"ClusterQueue {name} Active", lambda: any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (cqs.get(name=name).to_dict().get("status") or {}).get("conditions") or []))
