"""A load step the inference HPA must follow, in-cluster and outside: ``sim.flip --load-step``.

The step is a second open-loop request stream beside the run's own
(:mod:`gpufleet_workshop.sim.traffic`), so the Service gets ``--load-step``
requests per second in all. It is measured as an autoscaler is: from the
step's start to the HPA deciding to scale up (``status.desiredReplicas``
above ``minReplicas``), then, the extra stream stopped, from the step's end
to the HPA deciding to scale back (``desiredReplicas`` at ``minReplicas``
again). The run does it twice: with every replica in-cluster (before the
training is submitted) and with every replica outside (while the training
runs). What differs between the two is where the HPA's figures come from:
in-cluster, metrics-server scrapes the real node's kubelet; outside, it
scrapes the virtual kubelet's kubelet API, which reads the provider (the
rental's instances, or the other cluster's metrics API, itself a scrape
behind).

Both steps start from the same state: the HPA settled (``ScalingActive``, a
current figure, ``desiredReplicas`` at the floor) and every Ready replica
counted (:func:`target_state`). What counted means depends on what the HPA
scales on:

* requests in flight (the inference role's default: KEDA's ScaledObject,
  an ``External`` metric, a Prometheus sum over the pods the Service's
  EndpointSlices list): every Ready replica is a target Prometheus scrapes
  (``up == 1`` with its ``pod`` label, :func:`scraped`), in-cluster or
  outside alike; a replica not yet scraped would leave its requests out of
  the sum;
* CPU (``scale_on: cpu``): a PodMetrics sample taken at least one window
  after the pod became Ready (:func:`counted`). The HPA takes a CPU sample
  older than that as the pod's start-up and counts it as 0% on the way up
  (``replica_calculator.go``, ``groupPods``), so a step started right after
  the replicas moved outside would measure their youth, not where they run;
  and outside the figures come from the virtual kubelet's kubelet API, which
  reads the provider (the rental's instances, or the other cluster's metrics
  API, itself a scrape behind).

The HPA acts at most once per sync period (kube-controller-manager's
``--horizontal-pod-autoscaler-sync-period``, 15 s by default), so the
figures have that grain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.kube import Kube, KubeError
from gpufleet.kube.quantity import number
from gpufleet.prom.client import PromClient, PromError
from gpufleet.kube.times import parse_duration, parse_time
from gpufleet.wait import PollTimeout, poll_until

#: The HPA's scale-down stabilization window in a run with a load step (seconds), unless the inventory sets one:
#: Kubernetes' default (300) would make each step's way down five minutes of waiting that tell nothing.
STABILIZATION_SECONDS = 15
#: The stand-in's milliseconds per request in a run with a load step, unless given: requests in flight are rate x
#: latency (Little's law), and at 20 ms 80 requests/s keep 1.6 in flight over all replicas, under one a pod: the
#: HPA would follow the noise of a few requests, not the step.
LATENCY_MS = 200.0
#: Where the two steps run (the keys of :func:`summary_keys`' input).
WHERE = ("in_cluster", "outside")


def target_in_flight(rate: float, step: float, latency_ms: float, replicas: int) -> float:
    """The requests in flight per replica the HPA aims at in a run with a load step: halfway between the run's
    own stream and the step's, spread over ``replicas`` (``rate`` and ``step`` in requests per second, latency
    in milliseconds; Little's law: in flight = rate x latency). At the run's rate the HPA then wants about half
    its floor (it stays at the floor); under the step, more than the floor.

    Raises:
        ValueError: a step not above the rate, a latency or replicas not above 0.
    """
    if step <= rate or latency_ms <= 0 or replicas < 1:
        raise ValueError(f"load step {step:g}/s over rate {rate:g}/s at {latency_ms:g} ms on {replicas} replicas: "
                         "expected a step above the rate, a latency above 0 and at least one replica")
    target = round((rate + step) / 2 * latency_ms / 1000 / replicas, 3)
    if target <= 0:
        raise ValueError(f"load step {step:g}/s over rate {rate:g}/s at {latency_ms:g} ms on {replicas} replicas: "
                         "under 0.001 requests in flight a replica; expected a longer --latency-ms or fewer replicas")
    return target


class LoadStepError(TimeoutError):
    """The HPA did not settle or did not follow the step within the run's timeout (the message says which)."""


@dataclass(frozen=True)
class Step:
    """One load step as the HPA followed it (seconds; replicas).

    Attributes:
        where: ``in_cluster`` or ``outside``.
        seconds_scale_up: from the step's start to ``desiredReplicas`` above the floor.
        seconds_scale_down: from the step's end to ``desiredReplicas`` at the floor again.
        replicas_peak: the most ``desiredReplicas`` seen during the step.
        started_at: the step's start, seconds on the run's timeline.
        trace: what the HPA reported at each read from the step's start: ``[t, desiredReplicas, figure]``
            (seconds on the run's timeline; its first metric's current figure, :func:`utilization`, or None),
            to see where the time went.
        metric: the type of the HPA's first metric (``External`` for the inference role's KEDA trigger,
            ``Resource`` for CPU; None when unreadable): what the HPA followed.
    """

    where: str
    seconds_scale_up: float
    seconds_scale_down: float
    replicas_peak: int
    started_at: float
    trace: tuple[tuple[float, int | None, float | None], ...] = ()
    metric: str | None = None


def hpa_status(kube: Kube, namespace: str, name: str) -> dict:
    """The HPA's ``status`` (``{}`` when it has none yet).

    Raises:
        KubeError: the read was refused (NotFound: no such HPA).
    """
    return kube.get("autoscaling/v2", "horizontalpodautoscalers", name, namespace).get("status") or {}


def utilization(status: dict) -> float | None:
    """The current figure of an HPA ``status``'s first metric, or None: a resource metric's
    ``averageUtilization`` (percent of the request); an external or pods metric's ``averageValue`` (else
    ``value``), a quantity read as a number (requests in flight per replica for the inference role's trigger).

    Raises:
        ValueError: a quantity that is not one.
    """
    for m in status.get("currentMetrics") or []:
        resource = m.get("resource") or m.get("containerResource")
        if resource is not None:
            return (resource.get("current") or {}).get("averageUtilization")
        current = (m.get("external") or m.get("pods") or m.get("object") or {}).get("current") or {}
        figure = current.get("averageValue", current.get("value"))
        return None if figure is None else round(number(figure), 3)
    return None


def settled(status: dict, floor: int) -> bool:
    """Whether an HPA ``status`` has a current figure, ``ScalingActive`` True, and wants ``floor`` replicas."""
    active = any(c.get("type") == "ScalingActive" and c.get("status") == "True" for c in status.get("conditions") or [])
    return active and bool(status.get("currentMetrics")) and status.get("desiredReplicas") == floor


def counted(pods: list[dict], metrics: list[dict]) -> tuple[int, list[str]]:
    """How many of ``pods`` (Pod objects) the HPA counts at their figure; the names of the Ready ones it does not.

    A Running, Ready pod is counted once its PodMetrics (``metrics``, ``metrics.k8s.io`` objects) has a
    ``timestamp`` at least one ``window`` after the Ready condition's ``lastTransitionTime``: the HPA
    controller's test for a CPU sample in a pod's initialization period (``replica_calculator.go``).
    Pods not Running, not Ready or being deleted are neither counted nor listed.

    Raises:
        ValueError: a PodMetrics' ``timestamp`` or ``window`` is not an API time or a Go duration.
    """
    samples = {m["metadata"]["name"]: m for m in metrics}
    n, waiting = 0, []
    for p in pods:
        status = p.get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if status.get("phase") != "Running" or p["metadata"].get("deletionTimestamp") or not ready \
                or ready.get("status") != "True":
            continue
        m = samples.get(p["metadata"]["name"])
        since = parse_time(ready.get("lastTransitionTime"))
        if m is not None and since is not None and parse_time(m["timestamp"]) >= since + parse_duration(m["window"]):
            n += 1
        else:
            waiting.append(p["metadata"]["name"])
    return n, waiting


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def scraped(pods: list[dict], up: list[dict]) -> tuple[int, list[str]]:
    """How many of ``pods`` (Pod objects) Prometheus scrapes; the names of the Ready ones it does not.

    ``up``: the vector of a query ``up{namespace=..., service=...}`` (``[{"metric": {...}, "value": [t, v]}]``);
    a pod is scraped when a series with its ``pod`` label has value 1. Pods not Running, not Ready or being
    deleted are neither counted nor listed.
    """
    live = {s["metric"].get("pod") for s in up if s.get("value") and float(s["value"][1]) == 1.0}
    n, waiting = 0, []
    for p in pods:
        if not _ready(p):
            continue
        if p["metadata"]["name"] in live:
            n += 1
        else:
            waiting.append(p["metadata"]["name"])
    return n, waiting


def target_state(kube: Kube, namespace: str, name: str, prometheus: str | None = None) -> tuple[int, list[str]]:
    """How many replicas of HPA ``namespace/name``'s target it counts at their figure, and the Ready ones it does
    not (module docstring): :func:`scraped` by Prometheus at ``prometheus`` (a base URL) for an HPA on an
    ``External`` metric (the Service of the Deployment's name), else :func:`counted` by their PodMetrics. The
    pods are those its target's scale subresource's selector lists, as the HPA controller lists them.

    Raises:
        KubeError: a read was refused (the HPA, its target's scale, the pods or the PodMetrics).
        ValueError: the target is not a Deployment; an External metric and no ``prometheus``.
        gpufleet.prom.client.PromError: Prometheus did not answer.
    """
    hpa = kube.get("autoscaling/v2", "horizontalpodautoscalers", name, namespace)["spec"]
    ref = hpa["scaleTargetRef"]
    if ref.get("kind") != "Deployment":
        raise ValueError(f"HPA {namespace}/{name}: scaleTargetRef kind {ref.get('kind')!r}; expected Deployment")
    selector = (kube.get("apps/v1", "deployments", ref["name"], namespace, subresource="scale").get("status")
                or {}).get("selector") or ""
    pods = kube.list("v1", "pods", namespace, labelSelector=selector)["items"]
    if any(m.get("type") == "External" for m in hpa.get("metrics") or []):
        if not prometheus:
            raise ValueError(f"HPA {namespace}/{name} scales on an External metric: expected the URL of the "
                             "Prometheus that scrapes its pods")
        client = PromClient(prometheus)
        try:
            up = client.query(f'up{{namespace="{namespace}",service="{ref["name"]}"}}')
        finally:
            client.close()
        return scraped(pods, up)
    metrics = kube.list("metrics.k8s.io/v1beta1", "pods", namespace, labelSelector=selector)["items"]
    return counted(pods, metrics)


def run_step(kube: Kube, namespace: str, name: str, floor: int, *, where: str, start: Callable[[], object],
             stop: Callable[[object], None], timeout: float, now: Callable[[], float],
             say: Callable[[str], None] = lambda _: None, interval: float = 1.0,
             replicas_counted: Callable[[], tuple[int, list[str]]] | None = None,
             prometheus: str | None = None) -> Step:
    """Run one load step against HPA ``namespace/name`` whose ``minReplicas`` is ``floor``.

    Args:
        start: starts the extra load; what it returns is given to ``stop``, which stops it (also on error).
        timeout: seconds each of the three waits (settled, up, down) may take.
        now: the run's timeline clock (seconds since the run began).
        say: progress lines.
        replicas_counted: what :func:`target_state` answers for the HPA (the default).
        prometheus: the base URL of the Prometheus that scrapes the pods (an HPA on an External metric).

    Raises:
        LoadStepError: the HPA did not settle, scale up or scale back within ``timeout`` (its last status).
        KubeError: reading the HPA was refused.
    """
    last: dict = {}
    trace: list[tuple[float, int | None, float | None]] = []
    tracing = False

    def status() -> dict:
        last.clear()
        last.update(hpa_status(kube, namespace, name))
        if tracing:
            trace.append((round(now(), 1), last.get("desiredReplicas"), utilization(last)))
        return last

    def wait(what: str, check: Callable[[dict], bool]) -> None:
        try:
            poll_until(lambda: check(status()), what=what, timeout=timeout, interval=interval, ignore=(KubeError,))
        except PollTimeout:
            raise LoadStepError(f"load step {where}: the HPA {namespace}/{name} did not {what} within {timeout:.0f}s; "
                                f"its status: desiredReplicas {last.get('desiredReplicas')}, currentMetrics "
                                f"{last.get('currentMetrics')}, conditions "
                                f"{[(c.get('type'), c.get('status'), c.get('reason')) for c in last.get('conditions') or []]}"
                                ) from None

    wait(f"settle at {floor} replicas with a current figure", lambda s: settled(s, floor))
    state: tuple[int, list[str]] = (0, [])
    replicas_counted = replicas_counted or (lambda: target_state(kube, namespace, name, prometheus))

    def every_replica_counted() -> bool:
        nonlocal state
        state = replicas_counted()
        return state[0] >= floor and not state[1]

    try:
        poll_until(every_replica_counted, what="every replica counted", timeout=timeout, interval=interval,
                   ignore=(KubeError, PromError))
    except PollTimeout:
        raise LoadStepError(f"load step {where}: the HPA {namespace}/{name} counts {state[0]} of {floor} replicas "
                            f"after {timeout:.0f}s; Ready but not counted yet (no sample a window after Ready, or not scraped): "
                            f"{', '.join(state[1]) or 'none'}") from None
    peak = floor
    tracing = True
    try:
        metric = ((kube.get("autoscaling/v2", "horizontalpodautoscalers", name, namespace).get("spec") or {})
                  .get("metrics") or [{}])[0].get("type")
    except KubeError:
        metric = None
    began = now()
    say(f"t={began:.0f}s load step {where}: extra requests on; the HPA wants {floor}")
    load = start()
    try:
        def up(s: dict) -> bool:
            nonlocal peak
            peak = max(peak, s.get("desiredReplicas") or 0)
            return (s.get("desiredReplicas") or 0) > floor

        wait(f"scale up from {floor} under the step", up)
        scaled_up = now()
    finally:
        stop(load)
    say(f"t={scaled_up:.0f}s load step {where}: the HPA wants {peak} after {scaled_up - began:.1f}s; extra requests off")

    def down(s: dict) -> bool:
        nonlocal peak
        peak = max(peak, s.get("desiredReplicas") or 0)
        return s.get("desiredReplicas") == floor

    wait(f"scale back to {floor} after the step", down)
    back = now()
    say(f"t={back:.0f}s load step {where}: the HPA wants {floor} again after {back - scaled_up:.1f}s")
    return Step(where, round(scaled_up - began, 1), round(back - scaled_up, 1), peak, round(began, 1), tuple(trace),
                metric)


def summary_keys(steps: dict[str, Step]) -> dict[str, float | None]:
    """The summary's load-step keys from the steps run (``where`` -> :class:`Step`; empty: no step).

    ``seconds_hpa_scale_up_lag_outside`` and ``seconds_hpa_scale_down_lag_outside``: how many seconds
    longer the HPA took to follow the step (up; down) with every replica outside than with every
    replica in-cluster (negative: quicker); None without both steps.
    """
    inside, outside = steps.get("in_cluster"), steps.get("outside")
    if inside is None or outside is None:
        return {"seconds_hpa_scale_up_lag_outside": None, "seconds_hpa_scale_down_lag_outside": None}
    return {"seconds_hpa_scale_up_lag_outside": round(outside.seconds_scale_up - inside.seconds_scale_up, 1),
            "seconds_hpa_scale_down_lag_outside": round(outside.seconds_scale_down - inside.seconds_scale_down, 1)}

