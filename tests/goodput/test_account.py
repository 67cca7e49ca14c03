"""The accountant's pure core on constructed job histories: buckets, ETTR, interruptions (no cluster)."""

from __future__ import annotations

import random

import pytest

from gpufleet.goodput import BUCKETS
from gpufleet.goodput.account import account

from .builders import T0, cp, pod, wl

# One job, two pods, rate 1 step/s, start-up 30 s, saves of 10 s every 100 steps:
#   queued 0-10, starting 10-20 (admitted, pods starting), run 1 20-450 (start-up 20-50,
#   saves 150-160, 260-270, 370-380), a pod fails at 450 (70 s since the last checkpoint lost),
#   JobSet recreates the gang: starting 450-452, unschedulable 452-500, starting 500-505,
#   run 2 505-800 (start-up 505-535, saves 635-645, 745-755), pods succeed at 800, Finished at 801.
CHECKPOINTS = [cp(100, 150, 160), cp(200, 260, 270), cp(300, 370, 380), cp(400, 635, 645), cp(500, 745, 755)]


def two_runs(finished: float | None = 801):
    pods = [
        pod("w-0", 11, [(20, 450)], scheduled=12, ended=450),
        pod("w-1", 11, [(19, 452)], scheduled=12, ended=452),
        pod("w-0b", 452, [(505, 800)], unschedulable=452, scheduled=500, ended=800, succeeded=True),
        pod("w-1b", 452, [(503, 800)], scheduled=460, ended=800, succeeded=True),
    ]
    return wl(finished=finished), pods


def test_two_runs_with_an_interruption():
    w, pods = two_runs()
    a = account(w, pods, CHECKPOINTS, now=T0 + 10_000)
    assert a.wall_seconds == 801 and a.finished
    assert a.badput == pytest.approx({"queued": 10, "starting": 77, "checkpoint_saving": 50, "progress_lost": 70,
                                      "waiting_for_hardware": 48, "other": 1})
    assert a.productive_seconds == pytest.approx(545)  # 3 x 100 + 100 + 100 + 45 s of kept compute
    assert a.ettr == pytest.approx(545 / 801)
    assert a.step_rate == pytest.approx(1.0)
    (i,) = a.interruptions
    assert (i.time, i.lost_seconds, i.resumed) == (T0 + 450, pytest.approx(70), T0 + 505)
    # the timeline covers the window without gaps, in order
    assert a.phases[0].start == a.start and a.phases[-1].end == a.end
    assert all(p.end == q.start for p, q in zip(a.phases, a.phases[1:]))
    assert sum(p.end - p.start for p in a.phases if p.state == "productive") == pytest.approx(545)


def test_while_running_work_since_the_last_checkpoint_is_not_lost_yet():
    w, pods = two_runs(finished=None)
    pods = pods[:2] + [pod("w-0b", 452, [(505, None)], unschedulable=452, scheduled=500),
                       pod("w-1b", 452, [(503, None)], scheduled=460)]
    a = account(w, pods, CHECKPOINTS[:4], now=T0 + 700)
    assert a.wall_seconds == 700 and not a.finished
    assert a.badput["progress_lost"] == pytest.approx(70)
    assert a.productive_seconds == pytest.approx(700 - sum(a.badput.values()))
    assert a.productive_seconds == pytest.approx(300 + 100 + 55)


def test_eviction_by_kueue_counts_as_queued_until_readmitted():
    w = wl(admissions=((10, True), (300, False), (400, True)), finished=1000)
    pods = [pod("a", 11, [(20, 300)], ended=300), pod("b", 11, [(20, 300)], ended=300),
            pod("c", 401, [(420, 1000)], ended=1000, succeeded=True),
            pod("d", 401, [(420, 1000)], ended=1000, succeeded=True)]
    a = account(w, pods, None, now=T0 + 2000)
    assert a.badput["queued"] == pytest.approx(10 + 100)
    assert a.badput["starting"] == pytest.approx(10 + 20)
    # checkpoints unknown: the whole run counts as productive (upper bound), nothing lost
    assert a.badput["progress_lost"] == 0 and a.productive_seconds == pytest.approx(280 + 580)
    assert len(a.interruptions) == 1 and not a.checkpoints_known
    # known, but none written: the interrupted run is lost entirely
    a = account(w, pods, [], now=T0 + 2000)
    assert a.badput["progress_lost"] == pytest.approx(280) and a.productive_seconds == pytest.approx(580)


def test_a_run_without_its_own_checkpoint_gets_the_typical_start_up_and_loses_the_rest():
    w = wl(finished=None)
    pods = [pod("a", 11, [(20, 500)], ended=500), pod("b", 11, [(20, 500)], ended=500),
            pod("c", 500, [(510, 560)], ended=560), pod("d", 500, [(510, 560)], ended=560),
            pod("e", 560, [(570, None)]), pod("f", 560, [(570, None)])]
    cps = [cp(100, 150, 160), cp(200, 260, 270)]  # rate 1 step/s, start-up 30 s in run 1
    a = account(w, pods, cps, now=T0 + 600)
    assert a.badput["progress_lost"] == pytest.approx((500 - 270) + (560 - 540))
    assert a.badput["starting"] == pytest.approx(10 + 30 + 10 + 30 + 10 + 30)
    assert [i.time for i in a.interruptions] == [T0 + 500, T0 + 560]


def test_never_admitted_is_all_queued():
    a = account(wl(admissions=()), [], [], now=T0 + 60)
    assert a.badput["queued"] == 60 and a.productive_seconds == 0 and a.ettr == 0


def test_in_place_container_restart_breaks_the_gang():
    w = wl(finished=None)
    pods = [pod("m", 11, [(20, 200), (230, None)]), pod("w", 11, [(20, None)])]
    a = account(w, pods, [cp(100, 90, 100)], now=T0 + 300)
    assert a.badput["progress_lost"] == pytest.approx(100)  # 100-200 since the checkpoint
    assert a.badput["starting"] == pytest.approx(10 + 30)   # admission 10-20, restart 200-230
    assert len(a.interruptions) == 1 and a.interruptions[0].resumed == T0 + 230


@pytest.mark.parametrize("seed", range(20))
def test_buckets_always_sum_to_wall_minus_productive(seed):
    rng = random.Random(seed)
    t, pods, cps, admissions = 0.0, [], [], [(rng.uniform(0, 50), True)]
    step = 0
    for k in range(rng.randint(1, 5)):
        start = t + rng.uniform(1, 100)
        end = start + rng.uniform(10, 2000)
        pods += [pod(f"p{k}-{i}", t, [(start + rng.uniform(0, 3), end - rng.uniform(0, 3))],
                     unschedulable=t if rng.random() < 0.3 else None, scheduled=start - 1,
                     ended=end, succeeded=rng.random() < 0.2) for i in range(3)]
        c = start + rng.uniform(5, 50)
        while c < end:
            step += rng.randint(1, 100)
            cps.append(cp(step, c - rng.uniform(0, 5), c))
            c += rng.uniform(20, 400)
        if rng.random() < 0.3:
            admissions += [(end + 1, False), (end + rng.uniform(2, 50), True)]
        t = end
    w = wl(pods=3, admissions=sorted(admissions), finished=t + 5 if rng.random() < 0.5 else None)
    a = account(w, pods, cps, now=T0 + t + rng.uniform(0, 100))
    assert set(a.badput) == set(BUCKETS)
    assert all(v >= -1e-9 for v in a.badput.values()), a.badput
    assert a.productive_seconds >= -1e-9
    assert a.productive_seconds + sum(a.badput.values()) == pytest.approx(a.wall_seconds)
    assert sum(p.end - p.start for p in a.phases) == pytest.approx(a.wall_seconds)


def test_a_run_whose_pods_are_gone_is_rebuilt_from_its_checkpoints():
    """The one-shot view: the first gang's pods were deleted by its restart; its checkpoints remain."""
    w, pods = two_runs()
    a = account(w, pods[2:], CHECKPOINTS, now=T0 + 10_000)
    assert a.reconstructed_runs == 1
    assert a.productive_seconds == pytest.approx(545)  # the same kept work as the full record
    (i, *_) = a.interruptions
    assert i.time == pytest.approx(T0 + 452) and i.lost_seconds == pytest.approx(72, abs=0.01)  # at the new pods' creation
    assert a.badput["waiting_for_hardware"] == pytest.approx(48)
    full = account(w, pods, CHECKPOINTS, now=T0 + 10_000)
    assert full.reconstructed_runs == 0 and abs(a.ettr - full.ettr) < 1e-9


def test_restarts_hidden_in_one_stretch_of_checkpoints_are_found_by_their_gaps():
    """Three gangs, only the last one's pods known: the 210 s between steps 300 and 400 (100 s of compute)
    is a hidden restart; the kept work is still exact."""
    w = wl(finished=1001)
    last = [pod(f"c{k}", 752, [(760, 1000)], ended=1000, succeeded=True) for k in range(2)]
    cps = [cp(100, 150, 160), cp(200, 260, 270), cp(300, 370, 380),   # run 1 (training from 50), lost 380-450
           cp(400, 590, 600), cp(500, 700, 710),                      # run 2 (pods 460, training 490), lost 710-750
           cp(600, 890, 900)]                                         # run 3 (pods 760, training 790), done 1000
    a = account(w, last, cps, now=T0 + 5000)
    assert a.reconstructed_runs == 2 and len(a.interruptions) == 2
    assert a.productive_seconds == pytest.approx(300 + 200 + 200)
    assert [round(i.time - T0) for i in a.interruptions] == [460, 752]
    assert a.badput["progress_lost"] == pytest.approx(80 + 42, abs=0.01)  # each absorbs its restart time


def test_a_rebuilt_run_stays_apart_from_pods_that_run_the_second_they_are_created():
    w = wl(finished=1001)
    last = [pod(f"c{k}", 760, [(760, 1000)], ended=1000, succeeded=True) for k in range(2)]  # kwok: created = running
    cps = [cp(100, 150, 160), cp(200, 260, 270), cp(300, 370, 380), cp(400, 890, 900)]
    a = account(w, last, cps, now=T0 + 5000)
    assert a.reconstructed_runs == 1 and len(a.interruptions) == 1
    assert a.productive_seconds == pytest.approx(300 + 200, abs=0.01)
