"""The controller meter: PromQL's histogram_quantile over a tick histogram, pages read, figures per Deployment."""

from __future__ import annotations

import math

import pytest

from gpufleet_workshop.sim.meter import CPU, RSS, TICK_CPU, TICK_PROCESS_CPU, ControllerMeter, histogram_quantile, read

PAGE = """# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.048576e+08
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total {cpu}
# HELP gpufleet_taint_controller_tick_cpu_seconds CPU seconds of one tick.
# TYPE gpufleet_taint_controller_tick_cpu_seconds histogram
gpufleet_taint_controller_tick_cpu_seconds_bucket{{le="0.01"}} {a}
gpufleet_taint_controller_tick_cpu_seconds_bucket{{le="0.05"}} {b}
gpufleet_taint_controller_tick_cpu_seconds_bucket{{le="+Inf"}} {b}
gpufleet_taint_controller_tick_cpu_seconds_count {b}
gpufleet_taint_controller_tick_cpu_seconds_sum 0.5
# HELP gpufleet_taint_controller_tick_process_cpu_seconds CPU seconds of the process during one tick.
# TYPE gpufleet_taint_controller_tick_process_cpu_seconds histogram
gpufleet_taint_controller_tick_process_cpu_seconds_bucket{{le="0.01"}} 0
gpufleet_taint_controller_tick_process_cpu_seconds_bucket{{le="0.05"}} {a}
gpufleet_taint_controller_tick_process_cpu_seconds_bucket{{le="+Inf"}} {b}
gpufleet_taint_controller_tick_process_cpu_seconds_count {b}
gpufleet_taint_controller_tick_process_cpu_seconds_sum 5.0
# HELP gpufleet_flip_out_surges_total Make-before-break replacements, by event.
# TYPE gpufleet_flip_out_surges_total counter
gpufleet_flip_out_surges_total{{event="created"}} {a}
gpufleet_flip_out_surges_total{{event="handed over"}} {b}
"""


def test_quantile_interpolates_inside_its_bucket_as_promql_does():
    buckets = [(0.01, 50.0), (0.05, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.01)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.01 + 0.04 * 49 / 50)
    # In +Inf: the highest finite bound; no observations: no figure.
    assert histogram_quantile(0.99, [(0.01, 1.0), (math.inf, 10.0)]) == pytest.approx(0.01)
    assert histogram_quantile(0.5, [(0.01, 0.0), (math.inf, 0.0)]) is None
    with pytest.raises(ValueError, match="quantile 1.5"):
        histogram_quantile(1.5, buckets)


def test_a_page_is_read_into_the_metered_values():
    values = read(PAGE.format(cpu=3.5, a=10, b=20))
    assert values[RSS] == 104857600 and values[CPU] == 3.5
    assert values[TICK_CPU] == {0.01: 10.0, 0.05: 20.0, math.inf: 20.0}
    assert values[TICK_PROCESS_CPU] == {0.01: 0.0, 0.05: 10.0, math.inf: 20.0}


class PagesKube:
    """A double of the client layer's two calls the meter makes: one Running pod, pages served in turn."""

    def __init__(self, pages):
        self.pages = iter(pages)

    def list(self, api_version, plural, namespace=None, **params):
        assert params["labelSelector"] == "app.kubernetes.io/name=taint-controller"
        return {"items": [{"metadata": {"name": "taint-controller-1"},
                           "status": {"phase": "Running", "containerStatuses": [{"restartCount": 1}]}},
                          {"metadata": {"name": "taint-controller-2"}, "status": {"phase": "Pending"}}]}

    def pod_proxy_text(self, namespace, name, port, path="metrics", *, timeout=None):
        return next(self.pages)


def test_figures_count_what_happened_while_metered_only():
    kube = PagesKube([PAGE.format(cpu=10.0, a=1000, b=1000), PAGE.format(cpu=12.5, a=1090, b=1100)])
    meter = ControllerMeter(kube, [("gpufleet-system", "taint-controller")])
    meter.sample()
    meter.sample()
    fig = meter.figures()["taint-controller"]
    # 100 ticks while metered: 90 under 10 ms, 10 between 10 and 50 ms.
    assert fig["ticks"] == 100 and fig["cpu_seconds"] == 2.5 and fig["rss_max_mib"] == 100.0 and fig["restarts"] == 1
    assert fig["tick_cpu_ms_p50"] == pytest.approx(10 * 50 / 90, abs=0.1)
    assert fig["tick_cpu_ms_p99"] == pytest.approx(10 + 40 * 9 / 10, abs=0.1)
    # The process's CPU during the same ticks: 90 between 10 and 50 ms, 10 above (the highest finite bound).
    assert fig["tick_process_cpu_ms_p50"] == pytest.approx(10 + 40 * 50 / 90, abs=0.1)
    assert fig["tick_process_cpu_ms_p99"] == 50.0
    assert fig["surges"] == {"created": 90, "handed over": 100}, "the counters' increase while metered"


def test_a_deployment_whose_pods_never_answered_has_no_figures():
    class Silent(PagesKube):
        def pod_proxy_text(self, *args, **kwargs):
            from gpufleet.kube import Unreachable
            raise Unreachable("no route")

    meter = ControllerMeter(Silent([]), [("gpufleet-system", "taint-controller")])
    meter.sample()
    assert meter.figures()["taint-controller"] == {"rss_max_mib": None, "cpu_seconds": None, "restarts": 1}
