"""The checkpoint interval advisor against worked examples computed by hand.

Formulas, written out here independently of gpufleet_admin.training.checkpoint:

    Young (1974):  tau = sqrt(2 C M)
    Daly (2006):   tau = sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C   (C < 2M; else M)
    first order:   checkpoints C/(tau+C), rework (tau+C)/(2M), restarts R/M
    Daly exact:    1 - tau / (M e^(R/M) (e^((tau+C)/M) - 1))
    default MTTF:  M = 54 days * 24 h * 16,384 GPUs / 419 interruptions / GPUs   (Llama 3 report)
"""

from __future__ import annotations

import math

import pytest

from gpufleet_admin.training import checkpoint as ck


def test_round_numbers_by_hand():
    # C = 300 s, M = 24 h = 86,400 s: 2CM = 51,840,000 = 7,200^2, C/2M = 1/576 = (1/24)^2.
    a = ck.advise(0, 300, mttf_hours=24, restart_seconds=0)
    assert a.young_seconds == pytest.approx(7200.0)
    # 7200 * (1 + 1/72 + 1/5184) - 300 = 7200 + 100 + 1.3889 - 300
    assert a.daly_seconds == pytest.approx(7001.3889, abs=1e-3)
    period = 7001.3889 + 300
    assert a.waste.checkpoints == pytest.approx(300 / period, rel=1e-6)        # 4.109 %
    assert a.waste.rework == pytest.approx(period / (2 * 86400), rel=1e-6)     # 4.225 %
    assert a.waste.restarts == 0
    assert a.waste.total == pytest.approx(0.08334, abs=1e-5)
    assert a.waste.exact == pytest.approx(1 - 7001.3889 / (86400 * math.expm1(period / 86400)), rel=1e-6)


def test_doubled_checkpoint_time_by_hand():
    # C = 600 s, M = 86,400 s: sqrt(2CM) = sqrt(103,680,000) = 10,182.34; sqrt(C/2M) = 0.0589256
    a = ck.advise(0, 300, mttf_hours=24, restart_seconds=0)
    young2 = math.sqrt(2 * 600 * 86400)
    assert young2 == pytest.approx(10182.34, abs=0.01)
    daly2 = young2 * (1 + math.sqrt(600 / 172800) / 3 + (600 / 172800) / 9) - 600
    assert a.doubled_daly_seconds == pytest.approx(daly2, rel=1e-9)
    assert a.doubled_daly_seconds == pytest.approx(9786.3, abs=0.1)
    # Keeping the old interval with slower checkpoints costs more than re-optimising.
    assert a.doubled_kept_waste.total > a.doubled_waste.total > a.waste.total
    kept_period = a.daly_seconds + 600
    assert a.doubled_kept_waste.total == pytest.approx(600 / kept_period + kept_period / 172800, rel=1e-9)


@pytest.mark.parametrize(
    ("gpus", "mttf_hours", "young", "daly"),
    [
        # M = 20,736 / 419 h = 49.4893 h = 178,161.3 s; sqrt(2*60*M) = 4,623.8 s
        (1024, 49.4893, 4623.8, 4583.9),
        # M = 1,296 / 419 h = 3.09308 h = 11,135.1 s; sqrt(2*60*M) = 1,155.9 s
        (16384, 3.09308, 1155.9, 1116.2),
    ],
)
def test_default_failure_model_by_hand(gpus, mttf_hours, young, daly):
    a = ck.advise(gpus, 60)
    assert a.mttf_from_model
    assert a.mttf_hours == pytest.approx(54 * 24 * 16384 / 419 / gpus)
    assert a.mttf_hours == pytest.approx(mttf_hours, abs=1e-4)
    m = mttf_hours * 3600
    assert a.young_seconds == pytest.approx(math.sqrt(2 * 60 * m), rel=1e-5)
    assert a.young_seconds == pytest.approx(young, abs=0.1)
    assert a.daly_seconds == pytest.approx(daly, abs=0.1)
    w = a.waste
    period = a.daly_seconds + 60
    assert (w.checkpoints, w.rework, w.restarts) == pytest.approx((60 / period, period / (2 * m), 600 / m), rel=1e-5)


def test_llama3_scale_losses():
    # 16,384 GPUs, C = 60 s, R = 600 s: 5.1 % checkpoints + 5.3 % rework + 5.4 % restarts.
    w = ck.advise(16384, 60).waste
    assert w.total == pytest.approx(0.1577, abs=5e-4)
    assert w.checkpoints == pytest.approx(0.0510, abs=5e-4)
    assert w.restarts == pytest.approx(600 / 11135.1, abs=5e-4)


def test_checkpoint_longer_than_twice_the_mttf():
    # Daly: tau = M when C >= 2M.
    assert ck.daly_interval_seconds(100, 40) == 40


def test_template_default_is_dalys_interval():
    assert ck.default_interval_seconds(16, 60) == round(ck.advise(16, 60).daly_seconds)
    assert ck.default_interval_seconds(16384, 60) == 1116


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda: ck.advise(0, 60), "gpus: 0: expected an integer > 0"),
        (lambda: ck.advise(8, 0), "checkpoint_seconds: 0: expected a number > 0"),
        (lambda: ck.advise(8, 60, mttf_hours=-1), "mttf_hours: -1: expected a number > 0"),
        (lambda: ck.advise(8, 60, restart_seconds=-5), "restart_seconds: -5: expected a number >= 0"),
        (lambda: ck.young_interval_seconds(60, float("nan")), "mttf_seconds"),
    ],
)
def test_bad_values(call, text):
    with pytest.raises(ValueError, match=text.replace("+", r"\+")):
        call()
