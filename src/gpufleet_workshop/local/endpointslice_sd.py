"""Service discovery through EndpointSlices for the local Prometheus, written as file_sd target groups.

Why our own: Prometheus finds a Service's endpoints with
``kubernetes_sd_configs`` role ``endpointslice``, but Debian's package, the
local environment's Prometheus (2.42), is built without Kubernetes
discovery (its NEWS.Debian, 1.5.0: "Kubernetes support has been completely
removed"; a configuration that names ``kubernetes_sd_configs`` is refused
whole). This process stands in for that discovery and nothing more: it
watches Services and EndpointSlices (:class:`gpufleet.kube.informer.Informer`)
and writes, on every change, one target group per endpoint address and
slice port into a file_sd file, labelled with the ``__meta_kubernetes_*``
labels role ``endpointslice`` gives (the subset the scrape's relabeling
reads: :func:`gpufleet_workshop.local.prometheus.service_endpoints_relabeling`).
So the same relabeling serves a Prometheus with Kubernetes discovery and
this one, and a pod outside, published by a virtual kubelet in slices of
its own, is found as a pod inside is.

Labels per target (Prometheus' ``discovery/kubernetes/endpointslice.go``):
``__meta_kubernetes_namespace``, ``__meta_kubernetes_service_name``,
``__meta_kubernetes_service_annotation_<name>`` and
``__meta_kubernetes_service_annotationpresent_<name>`` (names sanitized to
``[a-zA-Z0-9_]``), ``__meta_kubernetes_endpointslice_name``,
``__meta_kubernetes_endpointslice_port``, ``..._port_name``,
``..._port_protocol``, ``..._endpoint_conditions_ready``,
``..._endpoint_node_name`` (when set), and ``__meta_kubernetes_pod_name``
for an endpoint whose targetRef is a Pod. One difference: an endpoint
without a ready condition is labelled ready, as ``discovery.k8s.io/v1``
says to read it (Prometheus leaves the label out, and the relabeling's
ready-only rule then drops it).

Addresses in ``--exclude`` ranges are left out: kwok's simulated pods get
addresses from a range no host answers (``kwok.POD_CIDR``), and a scrape
of one would leave the machine by its default route.

Run: ``python -m gpufleet_workshop.local.endpointslice_sd --kubeconfig K --out FILE``
(the local cluster runs it beside Prometheus). Errors: a refused list or
watch is retried by the informer; the file is replaced atomically.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import re
import signal
import threading
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

#: The label EndpointSlices carry naming their Service (``discovery.k8s.io``).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def sanitize(name: str) -> str:
    """A label name part as Prometheus' ``strutil.SanitizeLabelName`` makes it: ``[^a-zA-Z0-9_]`` -> ``_``."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def target_groups(services: Iterable[dict], slices: Iterable[dict],
                  exclude: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network] = ()) -> list[dict]:
    """file_sd target groups (``[{"targets": ["addr:port"], "labels": {...}}]``) for ``slices`` (EndpointSlice
    objects) of ``services`` (Service objects): one per endpoint address and slice port, in a stable order.
    A slice whose Service is not in ``services`` is left out (it is being deleted, or not yet seen), and so is
    an address in one of the ``exclude`` networks or one that is not an IP address."""
    exclude = tuple(exclude)

    def wanted(addr: str) -> bool:
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            return False
        return not any(ip in net for net in exclude)

    by_key = {(s["metadata"].get("namespace"), s["metadata"]["name"]): s for s in services}
    out = []
    for sl in sorted(slices, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])):
        md = sl["metadata"]
        ns, svc_name = md.get("namespace"), (md.get("labels") or {}).get(SERVICE_NAME_LABEL)
        svc = by_key.get((ns, svc_name))
        if svc is None:
            continue
        common = {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_service_name": svc_name,
                  "__meta_kubernetes_endpointslice_name": md["name"]}
        for k, v in ((svc["metadata"].get("annotations")) or {}).items():
            common[f"__meta_kubernetes_service_annotation_{sanitize(k)}"] = v
            common[f"__meta_kubernetes_service_annotationpresent_{sanitize(k)}"] = "true"
        for ep in sl.get("endpoints") or []:
            labels = dict(common)
            ready = (ep.get("conditions") or {}).get("ready")
            labels["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] = "false" if ready is False else "true"
            if ep.get("nodeName"):
                labels["__meta_kubernetes_endpointslice_endpoint_node_name"] = ep["nodeName"]
            ref = ep.get("targetRef") or {}
            if ref.get("kind") == "Pod" and ref.get("name"):
                labels["__meta_kubernetes_pod_name"] = ref["name"]
            for port in sl.get("ports") or []:
                if port.get("port") is None:
                    continue
                plabels = {**labels, "__meta_kubernetes_endpointslice_port": str(port["port"]),
                           "__meta_kubernetes_endpointslice_port_name": port.get("name") or "",
                           "__meta_kubernetes_endpointslice_port_protocol": port.get("protocol") or "TCP"}
                for addr in filter(wanted, ep.get("addresses") or []):
                    host = f"[{addr}]" if ":" in addr else addr
                    out.append({"targets": [f"{host}:{port['port']}"], "labels": plabels})
    return out


def write_atomic(path: Path, groups: list[dict]) -> bool:
    """Write ``groups`` to ``path`` as JSON (file_sd) unless it holds them already; True when written."""
    text = json.dumps(groups, indent=1, sort_keys=True)
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def run(kubeconfig: Path, out: Path, stop: threading.Event,
        exclude: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network] = ()) -> None:
    """Keep ``out`` current with every Service's and EndpointSlice's change until ``stop`` is set (addresses in
    ``exclude`` left out). Nothing is written before both collections are listed: a slow API server does not
    empty a good file.

    Raises:
        gpufleet.kube.KubeError: the kubeconfig is unusable.
    """
    from gpufleet.kube import Kube
    from gpufleet.kube.client import api_path
    from gpufleet.kube.informer import Informer

    kube = Kube.from_kubeconfig(kubeconfig, user_agent="gpufleet-endpointslice-sd")
    changed = threading.Event()
    handler = lambda *_: changed.set()  # noqa: E731
    services = Informer(kube, api_path("v1", "services"), handlers=[handler], name="services")
    slices = Informer(kube, api_path("discovery.k8s.io/v1", "endpointslices"), handlers=[handler], name="endpointslices")
    out.parent.mkdir(parents=True, exist_ok=True)
    services.start()
    slices.start()
    try:
        while not stop.is_set() and not (services.wait_synced(5.0) and slices.wait_synced(5.0)):
            log.warning("waiting for Services and EndpointSlices to be listed")
        changed.set()
        while not stop.is_set():
            if changed.wait(1.0):
                changed.clear()
                if write_atomic(out, target_groups(services.items(), slices.items(), exclude)):
                    log.info("%s: %d targets", out, len(json.loads(out.read_text())))
    finally:
        services.stop()
        slices.stop()
        kube.close()


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); runs until SIGTERM or SIGINT; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig of the cluster to watch")
    parser.add_argument("--out", type=Path, required=True, help="file_sd file to write (JSON)")
    parser.add_argument("--exclude", type=ipaddress.ip_network, action="append", default=[],
                        help="leave out endpoint addresses in this network (CIDR; repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(args.kubeconfig, args.out, stop, args.exclude)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
