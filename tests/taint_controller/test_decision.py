"""The taint decision state machine: hysteresis, hold times, no flapping under a noisy signal."""

from __future__ import annotations

import random

import pytest

from gpufleet.taint_controller.decision import Hysteresis


def feed(m: Hysteresis, samples, dt: float = 1.0, t0: float = 0.0):
    """Feed samples one per ``dt`` seconds; returns the list of (time, new state) transitions."""
    out = []
    for i, v in enumerate(samples):
        d = m.observe(v, t0 + i * dt)
        if d.changed:
            out.append((t0 + i * dt, d.tainted))
    return out


def test_taints_only_after_the_hold_time_above_high():
    m = Hysteresis(high=16, low=8, hold=5, tainted=False)
    assert feed(m, [20] * 5) == []  # 0..4 s: 4 s above, not yet 5
    assert m.observe(20, 5.0).changed and m.tainted is True


def test_untaints_only_after_the_hold_time_below_low():
    m = Hysteresis(high=16, low=8, hold=5, tainted=True)
    assert feed(m, [2, 2, 2, 2, 2, 2]) == [(5.0, False)]


def test_a_dip_shorter_than_the_hold_restarts_the_streak():
    m = Hysteresis(high=16, low=8, hold=5, tainted=True)
    # 4 s below, one sample back in the band, 4 s below again: never 5 s in a row.
    assert feed(m, [2, 2, 2, 2, 2, 10, 2, 2, 2, 2, 2]) == []


def test_band_between_marks_changes_nothing():
    for start in (True, False):
        m = Hysteresis(high=16, low=8, hold=0, tainted=start)
        assert feed(m, [8, 12, 16, 9, 15]) == []
        assert m.tainted is start


def test_missing_signal_never_decides_and_restarts_streaks():
    m = Hysteresis(high=16, low=8, hold=3, tainted=False)
    assert feed(m, [20, 20, None, 20, 20, None, 20, 20]) == []
    assert m.observe(None, 100).tainted is False


def test_unknown_initial_state_is_settled_by_the_first_sustained_excursion():
    m = Hysteresis(high=16, low=8, hold=2)
    assert feed(m, [12, 12, 12]) == [] and m.tainted is None
    assert feed(m, [3, 3, 3], t0=10) == [(12.0, False)]


def test_hold_zero_acts_on_the_first_sample():
    m = Hysteresis(high=16, low=8, hold=0, tainted=False)
    assert m.observe(17, 0).changed


def test_the_configuration_refuses_low_not_below_high_and_negative_holds():
    # The state machine takes checked values: the configuration is where marks and holds are validated, once.
    from gpufleet.taint_controller.config import Configuration

    with pytest.raises(ValueError, match="low_water_gpus below high_water_gpus"):
        Configuration(high_water_gpus=8, low_water_gpus=8)
    for field in ("hold_seconds", "add_hold_seconds", "remove_hold_seconds"):
        with pytest.raises(ValueError, match="a finite number of seconds >= 0"):
            Configuration(**{field: -1})


@pytest.mark.parametrize("seed", range(20))
def test_noisy_signal_around_either_mark_never_flaps(seed):
    """Noise of +-6 GPUs around a mark: samples cross it constantly, yet the state never changes."""
    rng = random.Random(seed)
    high, low, hold = 16, 8, 5
    # Around the high mark while untainted: values cross 16 often, but never stay above for 5 s... unless they do;
    # the noise is shaped so runs above the mark are shorter than the hold.
    m = Hysteresis(high, low, hold, tainted=False)
    samples, run = [], 0
    for _ in range(600):
        v = high + rng.uniform(-6, 6)
        run = run + 1 if v > high else 0
        if run >= hold:  # break long runs: this test is about short excursions
            v, run = high - 1, 0
        samples.append(v)
    assert feed(m, samples) == []
    # Around the low mark while untainted: crossing low only confirms the state; no transition either.
    m = Hysteresis(high, low, hold, tainted=False)
    assert feed(m, [low + rng.uniform(-6, 6) for _ in range(600)]) == []
    # Around the high mark while tainted: nothing dips below low, so it stays tainted.
    m = Hysteresis(high, low, hold, tainted=True)
    assert feed(m, [high + rng.uniform(-6, 6) for _ in range(600)]) == []


def test_sustained_regime_changes_through_noise_cause_exactly_one_transition_each():
    rng = random.Random(7)
    m = Hysteresis(high=16, low=8, hold=5, tainted=True)
    # 60 s well below (training holds the cluster), then 60 s well above (training ended), noise +-3.
    samples = [2 + rng.uniform(-3, 3) for _ in range(60)] + [40 + rng.uniform(-3, 3) for _ in range(60)]
    transitions = feed(m, samples)
    assert [s for _, s in transitions] == [False, True]
    assert transitions[0][0] == 5.0 and transitions[1][0] == 65.0


def test_adding_and_removing_the_taint_have_their_own_hold_times():
    m = Hysteresis(high=16, low=8, hold=5, tainted=False, add_hold=2, remove_hold=10)
    assert [m.observe(20, t).tainted for t in (0, 1, 2)] == [False, False, True]  # 2 s above: tainted
    assert [m.observe(1, t).tainted for t in (3, 8, 12)] == [True, True, True]  # 9 s below: not yet
    assert m.observe(1, 13).tainted is False  # 10 s below: untainted
    plain = Hysteresis(high=16, low=8, hold=5)
    assert plain.add_hold == plain.remove_hold == 5


def test_below_low_while_inference_comes_back_is_no_evidence_until_nothing_is_returning():
    m = Hysteresis(high=8, low=2, hold=10, tainted=True)
    assert not m.observe(0, 0.0, returning=3).changed
    assert not m.observe(0, 20.0, returning=1).changed and m.below_since is None
    assert not m.observe(0, 21.0).changed, "the streak starts when nothing returns"
    d = m.observe(0, 31.0)
    assert d.changed and d.tainted is False and d.since == 21.0
    # Untainted, nothing comes back: the argument is ignored.
    assert not Hysteresis(high=8, low=2, hold=0, tainted=False).observe(0, 0.0, returning=2).changed


def test_inference_displaced_for_training_untaints_at_once_and_keeps_the_virtual_nodes_open():
    m = Hysteresis(high=8, low=2, hold=10, tainted=True)
    d = m.observe(500, 0.0, displaced=3)
    assert d.changed and d.tainted is False and d.since == 0.0, "no hold: the flip-out already decided"
    assert "3 inference pods must leave nodes reserved for training" in d.reason
    assert not m.observe(500, 30.0, displaced=1).changed, "free GPUs above high do not close them meanwhile"
    assert m.above_since is None
    # Nothing left to move: the free GPUs decide again, from a fresh streak.
    assert not m.observe(500, 31.0).changed
    assert m.observe(500, 41.0).tainted is True
    # An unknown state (no signal yet) is decided the same way.
    assert Hysteresis(high=8, low=2, hold=10).observe(None, 0.0, displaced=1).tainted is False


def test_training_pods_still_to_be_placed_make_free_gpus_above_high_no_evidence():
    m = Hysteresis(high=8, low=2, hold=5, tainted=False)
    for t in range(0, 60, 5):
        d = m.observe(4000, float(t), arriving=40)
        assert not d.changed and m.above_since is None
    assert "40 training pods are still to be placed" in d.reason
    assert not m.observe(4000, 60.0).changed, "the streak starts once every training pod is placed"
    assert m.observe(4000, 65.0).tainted is True
    # Below low, pods arriving take nothing away from the shortage.
    m = Hysteresis(high=8, low=2, hold=0, tainted=True)
    assert m.observe(0, 0.0, arriving=5).tainted is False
