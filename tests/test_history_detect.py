"""tbench.history.detect: step changes in a series of nightly values (seeded simulated series; no server)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tbench.history.detect import MIN_SIZE, detect_changes, judge, run_to_run_cv, series_noise

SEEDS = range(5)


def noisy(n: int, cv: float, seed: int, level: float = 1000.0) -> np.ndarray:
    return level * (1 + np.random.default_rng(seed).normal(0.0, cv, n))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("step", [0.10, -0.10])
def test_a_clean_step_is_found_where_it_is_with_its_sign(seed, step):
    values = noisy(30, 0.02, seed)
    values[18:] *= 1 + step
    changes = detect_changes(values, [0.02] * 30)
    assert len(changes) == 1
    c = changes[0]
    assert c.index == 18 and np.sign(c.relative) == np.sign(step)
    assert c.relative == pytest.approx(step, abs=0.02) and c.p_value <= 0.001
    assert c.before == pytest.approx(values[:18].mean()) and c.after == pytest.approx(values[18:].mean())
    told = [runs for runs in range(19, 31) if judge(values[:runs], [0.02] * runs).new]
    assert len(told) == 1 and told[0] <= 18 + 2 * MIN_SIZE  # confirmed, and told, once


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("where", [0, 12, 29])
def test_a_single_outlier_is_not_a_change(seed, where):
    values = noisy(30, 0.02, seed)
    values[where] *= 1.4
    assert detect_changes(values, 0.02) == []
    values[where] /= 1.4 * 1.4  # and the other way
    assert detect_changes(values, 0.02) == []


def test_a_step_with_two_runs_after_it_is_not_confirmed_one_run_early():
    """Seen on the stack: five nights at 400/s, then the queue delay raised and two nights at 112/s. The third value
    from the end must not be dropped as an outlier of the two after it to make a segment of three."""
    before, after = [400.1, 399.4, 401.0, 400.3, 399.8], [112.7, 112.4]
    cv = [0.01] * 7
    assert detect_changes(before + after, cv) == []
    (change,) = detect_changes([*before, *after, 112.5], [*cv, 0.01])
    assert change.index == 5 and change.relative == pytest.approx(-0.72, abs=0.01)
    judged = judge(before + after, cv)
    assert judged.new == [] and judged.candidate is not None  # shown as a candidate, not gated
    assert not judged.candidate.confirmed and judged.candidate.index == 5


def test_a_night_within_its_own_noise_is_no_outlier_in_a_steady_series():
    """Night to night steadier than each run's windows (0.2% against 3% window CV): the third night after the step,
    4% off the other two but within its own noise, is no outlier of its segment, and confirms the change."""
    before, after = [400.1, 399.4, 401.0, 400.3, 399.8], [112.5, 112.4, 107.5]
    (change,) = detect_changes(before + after, [0.03] * 8)
    assert change.index == 5 and change.confirmed
    assert change.after == pytest.approx(sum(after) / 3)  # all three nights count
    assert detect_changes(before + after) == []  # no noise known: by the series' sigma alone, it is an outlier


@pytest.mark.parametrize("seed", range(20))
def test_a_flat_noisy_series_gives_nothing(seed):
    values = noisy(40, 0.04, seed)
    assert detect_changes(values, np.full(40, 0.04)) == []
    assert detect_changes(values) == []  # no noise known: the series' own spread alone


@pytest.mark.parametrize("seed", SEEDS)
def test_two_steps_are_both_found(seed):
    values = noisy(40, 0.02, seed)
    values[12:] *= 0.85  # a regression
    values[27:] *= 1.20  # then a recovery past where it was
    changes = detect_changes(values, 0.02)
    assert [c.index for c in changes] == [12, 27]
    assert changes[0].relative < 0 < changes[1].relative
    assert changes[0].after == pytest.approx(changes[1].before)  # segments run change to change


@pytest.mark.parametrize("seed", SEEDS)
def test_the_points_own_noise_widens_the_threshold(seed):
    values = noisy(30, 0.01, seed)
    values[15:] *= 1.06
    quiet = detect_changes(values, np.full(30, 0.01))
    assert [c.index for c in quiet] == [15] and quiet[0].relative == pytest.approx(0.06, abs=0.01)
    assert detect_changes(values, np.full(30, 0.10)) == []  # runs whose windows scatter by 10% cannot show 6%


def test_the_minimum_effect_is_a_floor():
    values = noisy(40, 0.005, 1)
    values[20:] *= 1.03  # clearly significant in 0.5% noise, but under 5%
    assert detect_changes(values, 0.005) == []
    assert [c.index for c in detect_changes(values, 0.005, min_effect=0.02)] == [20]


def test_nan_values_are_skipped_and_indexes_count_them():
    values = noisy(30, 0.02, 3)
    values[18:] *= 0.9
    values[[4, 17]] = np.nan
    noise = np.full(30, 0.02)
    noise[7] = np.nan  # unknown noise for one point
    changes = detect_changes(values, noise)
    assert [c.index for c in changes] == [18] and changes[0].relative < 0


def test_short_series_and_noise_free_series():
    assert detect_changes([]) == [] and detect_changes([1.0, 2.0, 3.0]) == []
    flat = np.full(20, 5.0)
    assert detect_changes(flat) == [] and judge(flat).new == [] and judge(flat).candidate is None
    stepped = np.r_[np.full(10, 5.0), np.full(10, 6.0)]
    (c,) = detect_changes(stepped)
    assert c.index == 10 and c.relative == pytest.approx(0.2)
    assert series_noise(np.array([1.0, 1.0])) == 0.0


def test_judge_a_flat_series_and_an_unknown_newest_value_say_nothing():
    values = noisy(25, 0.03, 4)
    for series in (values, np.r_[values, np.nan]):
        judged = judge(series, 0.03)
        assert judged.changes == [] and judged.new == [] and judged.candidate is None


@pytest.mark.parametrize("seed", SEEDS)
def test_judge_a_single_newest_run_is_a_candidate_only_far_outside(seed):
    history = noisy(20, 0.02, seed)
    assert judge(np.r_[history, 1000 * 1.06], 0.02).candidate is None  # 3 sigma: could be a noisy night
    far = judge(np.r_[history, 1000 * 0.70], 0.02)  # 15 sigma
    assert far.new == [] and far.candidate is not None
    assert not far.candidate.confirmed and far.candidate.index == 20 and far.candidate.relative < -0.2


@pytest.mark.parametrize("seed", SEEDS)
def test_judge_confirms_a_step_once_night_by_night(seed):
    values = noisy(30, 0.02, seed)
    values[20:] *= 0.88
    verdicts = {t: judge(values[:t], 0.02) for t in range(12, 31)}
    assert all(not v.new and v.candidate is None for t, v in verdicts.items() if t <= 20)  # nothing before the step
    confirmed = [t for t, v in verdicts.items() if v.new]
    assert len(confirmed) == 1 and confirmed[0] <= 23  # by the third run after it, and told once
    for v in verdicts.values():
        for change in [*v.new, *([v.candidate] if v.candidate else [])]:
            assert abs(change.index - 20) <= 1 and change.relative < 0
    assert [c.index for c in detect_changes(values, 0.02)] == [20]


def test_run_to_run_cv_is_the_robust_spread_of_successive_nights():
    assert math.isnan(run_to_run_cv([])) and math.isnan(run_to_run_cv([1000.0, np.nan, 1010.0]))
    assert run_to_run_cv([1000.0, 1000.0, 1000.0]) == 0.0
    values = noisy(400, 0.04, 7)
    assert run_to_run_cv(values) == pytest.approx(0.04, rel=0.15)
    stepped = values.copy()
    stepped[200:] *= 0.8  # a step moves one successive difference: the spread stays the nights'
    stepped[[50, 300]] *= 1.5  # and odd nights two each
    assert run_to_run_cv(stepped) == pytest.approx(run_to_run_cv(values), rel=0.1)
    assert run_to_run_cv(values) == pytest.approx(series_noise(values / np.median(values)))


def alternating(n: int, spread: float) -> np.ndarray:
    """Nights alternately `spread` above and below 1000: a night-to-night spread with no randomness."""
    return 1000 * (1 + spread * np.where(np.arange(n) % 2, 1.0, -1.0))


def test_the_series_spread_sets_the_floor_not_the_runs_window_cv():
    """Runs whose windows are steady (1% CV) in a series that moves 4% either way night to night (a spread of about
    8.4%): a 7% step is within one night's spread, whatever the windows say, even where 100 nights on each side make
    it significant; in a steady series it is a change."""
    for spread, found in ((0.04, False), (0.002, True)):
        values = alternating(200, spread)
        values[100:] *= 1.07
        assert (run_to_run_cv(values[:100]) > 0.07) != found  # one night's spread against the step
        assert bool(detect_changes(values, np.full(200, 0.01))) == found
        nightly = alternating(30, spread)
        nightly[15:] *= 1.07
        assert bool([c for t in range(16, 31) for c in judge(nightly[:t], np.full(t, 0.01)).new]) == found


# eight steady nights, a 10% drop, and two odd nights among the five after it: the third run after the step is not
# enough, the change is confirmed by the fifth (before, a change was news only while its start was among the newest
# 3 runs, so this one was never told)
LATE = [1000, 1004, 996, 1002, 998, 1001, 999, 1003] + [901, 700, 899, 1150, 902, 898, 903]
LATE_STEP = 8


def test_a_change_confirmed_on_the_fifth_run_after_its_step_is_new_once_on_that_run():
    news = {runs: judge(LATE[:runs], 0.01).new for runs in range(1, len(LATE) + 1)}
    confirming = [runs for runs, new in news.items() if new]
    assert confirming == [LATE_STEP + 5]
    (change,) = news[LATE_STEP + 5]
    assert abs(change.index - LATE_STEP) <= 1 and change.relative == pytest.approx(-0.10, abs=0.01)
    for runs in range(LATE_STEP + 6, len(LATE) + 1):  # still a change on the runs after, and no longer news
        judged = judge(LATE[:runs], 0.01)
        assert [c.index for c in judged.changes] == [LATE_STEP] and judged.new == [] and judged.candidate is None


@pytest.mark.parametrize("seed", SEEDS)
def test_judge_tells_each_change_once_night_by_night(seed):
    values = noisy(30, 0.02, seed)
    values[10:] *= 0.88
    values[20:] /= 0.88  # and back
    told = [(runs, c) for runs in range(1, 31) for c in judge(values[:runs], 0.02).new]
    assert [np.sign(c.relative) for _, c in told] == [-1, 1]  # the drop once, then the recovery once
    assert [abs(c.index - at) < MIN_SIZE for (_, c), at in zip(told, (10, 20))] == [True, True]


def test_judge_a_short_series_cannot_decide():
    assert not judge([1000.0, 900.0, 905.0, 898.0, 902.0], 0.01).decidable
    assert judge(LATE[:6], 0.01).decidable
