"""Step changes in one series of nightly results (pure functions: numpy, scipy and ruptures; no Prefect, no I/O).

A series is one measured thing in time order (e.g. the throughput of one point of one model on one GPU, one value a
run) and, for each value, its own relative measurement noise: the CV of the perf_analyzer windows it averages
(tbench.loadgen.perf_analyzer.noise_from_log), NaN where unknown.

The rule
--------
1. **Noise.** Two estimates, and the larger one counts:
   - the series' night-to-night spread, robustly: sigma = 1.4826 * median(|successive differences|) / sqrt(2) of the
     values over their median (the MAD of first differences; a step moves one difference, an outlier two, so neither
     inflates it). This is the between-run (night-to-night) variance, which holds more than a run's own windows
     show (server start, clocks, neighbours): the noise used is never below it (in the penalty, the t-test's
     variance, the outlier test and the effect threshold alike), so steady windows cannot call a step that the
     series' own nights scatter by. `run_to_run_cv` gives it for any point's values;
   - each value's own standard error: its window CV / sqrt(`noise_windows`) (perf_analyzer reports the mean of its
     last 3 stable windows, tbench.loadgen.perf_analyzer.STABLE_WINDOWS). Taking the CV itself would overstate it:
     our logs' window CVs are 3.7-4.9% (throughput) while repeated runs of one point spread by 0.8-4.9%, and 10%
     steps were then found about 80% of the time instead of 96% (benchmarks/change_detection.py).
2. **Candidates** from a penalised piecewise-constant fit, as asv does (asv fits steps with a penalised
   piecewise-constant model and reports regressions above a 5% threshold by default): ruptures' exact PELT search
   (Killick, Fearnhead and Eckley, JASA 2012) on the l2 (change-in-mean) cost, run through
   ``KernelCPD(kernel="linear")`` (the same cost and the same optimum as ``Pelt(model="l2")``, in C: ~15 us instead
   of ~6 ms for 30 points), with every segment at least `min_size` values long and penalty `penalty` * sigma^2 *
   log(n) per change (2 sigma^2 log n is BIC for a change in mean of known variance: a step has to explain more
   variance than the noise would by chance). This pass is deliberately permissive; step 3 decides.
3. **Confirmation**, as Hunter / Apache Otava does (Daly et al., ICPE 2020: E-Divisive means at MongoDB; Fleming et
   al., ICPE 2023: Hunter at DataStax, window 50, p <= 0.001): each candidate is tested against its neighbours,
   the values back to the previous change against the values up to the next one, with Student's two-sample t-test
   (pooled variance, as Hunter's TTestSignificanceTester; the variance is floored by the noise of step 1, so a
   segment that happens to be quiet, or runs whose own windows were noisy, cannot make a small shift look
   significant; a value more than `outlier_z` (5) sigmas from its segment's median is left out of that segment's
   mean and variance, so one wild night neither hides a step nor makes one (each value's sigma is the larger of the
   series' night-to-night sigma and its own standard error: a series steadier than its runs' windows would
   otherwise make outliers of values within their own noise); but a change needs
   `min_size` values on each side that are not outliers, else a step one run before the true one would pass, its
   first run dropped as an outlier of the two after it). The weakest candidate
   (largest p, then smallest effect) that fails is dropped, its neighbours are re-tested over the merged segments,
   until every change left has
   - p <= `alpha` (0.001, Hunter's default), and
   - |relative| >= max(`min_effect`, `noise_factor` * noise of one run), where the noise of one run is the larger of
     the series' night-to-night sigma and the median window CV of the values tested: 5% is asv's default threshold,
     and a step smaller than what a single run scatters by is not worth an alert even when many runs make it
     significant. A step in runs with 10% window CV has to be 10%; in runs with 1% it has to be 5%.
   With `min_size` 3, a change is confirmed by at least three runs after it, and a single outlier (or two) cannot
   be a segment of its own, so it is never a change.
4. **The newest run** (`judge`): a change is news on the run that
   confirms it (the run that makes step 3 find it, whenever that is: 3 runs after the step, or more in a noisy
   series or one with an odd night among them) and on no other: a change that no judgement of the series without
   its newest run had (nor, for one that came and went, of the `RECONFIRM_LOOKBACK` runs before). Before that, the
   newest 1 or 2 runs (fewer than `min_size`) are a *candidate* (``confirmed=False``) when they lie far outside the
   current segment: two runs, each beyond the effect threshold on the same side, with
   t-test p <= `alpha` against it, or a single run beyond the threshold and at least `candidate_z` (5) standard
   deviations from it, a lookback z-score as Conbench's (which scores a result against the distribution of earlier
   results on the same hardware, up to 100 commits back) but against the runs since the last change only. A single
   run cannot tell a step from an outlier night: candidates are for a "watch this" mark, a confirmed change is what
   should page someone.

Why not a threshold rule alone: thresholds on single comparisons flood people with false alarms (a study of
Mozilla's t-test alerts found 12.5% of alert groups false), which is why MongoDB and DataStax moved to change-point
detection; a step confirmed by several runs is what this reports.

Why ruptures: it is small and well kept, needs only numpy and scipy, and has exact PELT (and Binseg, KernelCPD).
MongoDB's `signal-processing-algorithms` 2.1.6 (E-Divisive) pins setuptools and gevent back and pulls structlog;
`apache-otava` 0.8.0 requires NumPy 2 and protobuf 7 (this project pins numpy<2 and protobuf<5 for tritonclient and
pytriton) and brings BigQuery, Postgres and Slack clients. Hunter's merge step (3) is a few lines, written here.

Measured on simulated series with our runs' noise: benchmarks/change_detection.py ->
benchmarks/results/change_detection.json.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr  # Student's t CDF: scipy.stats takes a second of CPU to import, and every run judges

MIN_EFFECT = 0.05  # asv's default regression threshold
ALPHA = 0.001  # Hunter's default p-value
MIN_SIZE = 3  # runs on each side of a change: one or two odd runs are never a segment
NOISE_FACTOR = 1.0  # a change must be at least one run's noise
PENALTY = 2.0  # PELT's penalty per change, in sigma^2 * log(n) (BIC)
NOISE_WINDOWS = 3  # perf_analyzer's value is the mean of this many windows (STABLE_WINDOWS)
CANDIDATE_Z = 5.0  # a single newest run is a candidate this many standard deviations out
OUTLIER_Z = 5.0  # a value this many robust sigmas from its segment's median is left out of its t-test
# a change confirmed, lost to a later odd night and confirmed again within this many runs is not news again (judge)
RECONFIRM_LOOKBACK = 30
_TINY = 1e-9  # a noise floor (relative), so that a noise-free series has a finite penalty and t


@dataclass(frozen=True)
class Change:
    index: int  # position of the first value after the change (in the values given, NaNs included)
    before: float  # mean of the segment before it (back to the previous change; outlier nights left out)
    after: float  # mean of the segment after it (up to the next change; outlier nights left out)
    relative: float  # (after - before) / before
    p_value: float  # the t-test that confirmed it (single newest run: the lookback t / z-score's)
    confirmed: bool = True  # False: the newest run(s) only, fewer than min_size (judge's candidate)


@dataclass(frozen=True)
class _Prepared:
    y: np.ndarray  # the finite values over their median (close to 1: noise in y is relative noise)
    scale: float
    positions: np.ndarray  # position of each y in the values given
    cv: np.ndarray  # each value's window CV, NaN where unknown
    sigma: float  # the series' robust night-to-night sigma, in units of y


def series_noise(y: np.ndarray) -> float:
    """Robust night-to-night sigma: 1.4826 * median |successive differences| / sqrt(2) (0 for fewer than 2)."""
    if len(y) < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(np.diff(y))) / math.sqrt(2))


def run_to_run_cv(values: Sequence[float] | np.ndarray) -> float:
    """The between-run spread of one point, relative to its level: `series_noise` of its finite values over their
    median (a step or an odd night moves one or two successive differences, so neither inflates it). NaN for fewer
    than 3 finite values (two give one difference: a spread of one pair says nothing robust) or a zero median."""
    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v)]
    if len(v) < 3:
        return math.nan
    level = float(np.median(np.abs(v)))
    return series_noise(v / level) if level > 0 else math.nan


def _prepare(values, noise) -> _Prepared:
    v = np.asarray(values, dtype=float).ravel()
    if noise is None:
        cv = np.full(len(v), np.nan)
    else:
        cv = np.broadcast_to(np.asarray(noise, dtype=float), v.shape).astype(float)
    ok = np.isfinite(v)
    positions = np.flatnonzero(ok)
    v, cv = v[ok], np.abs(cv[ok])
    scale = float(np.median(np.abs(v))) if len(v) else 1.0
    scale = scale if scale > 0 else 1.0
    y = v / scale
    return _Prepared(y=y, scale=scale, positions=positions, cv=cv, sigma=series_noise(y))


def _own_se(p: _Prepared, lo: int, hi: int, noise_windows: int) -> np.ndarray:
    """Each value's own standard error (window CV / sqrt(windows), in units of y) for lo:hi; NaN where unknown."""
    return p.cv[lo:hi] / math.sqrt(noise_windows) * np.abs(p.y[lo:hi])


def _own_var(p: _Prepared, lo: int, hi: int, noise_windows: int) -> float:
    """Mean squared standard error of the values lo:hi; 0 if unknown."""
    se = _own_se(p, lo, hi, noise_windows)
    se = se[np.isfinite(se)]
    return float(np.mean(se**2)) if len(se) else 0.0


def _median_cv(p: _Prepared, lo: int, hi: int) -> float:
    cv = p.cv[lo:hi]
    cv = cv[np.isfinite(cv)]
    return float(np.median(cv)) if len(cv) else 0.0


def _threshold(p: _Prepared, lo: int, hi: int, level: float, min_effect: float, noise_factor: float) -> float:
    one_run = max(p.sigma / abs(level) if level else 0.0, _median_cv(p, lo, hi))
    return max(min_effect, noise_factor * one_run)


def _p_value(t: float, df: int) -> float:
    return float(2 * stdtr(df, -abs(t))) if df > 0 else 1.0


@dataclass
class _Test:
    index: int
    before: float
    after: float
    relative: float
    p_value: float
    threshold: float
    alpha: float = ALPHA
    supported: bool = True  # at least min_size values on each side are not outliers of their segment

    @property
    def significant(self) -> bool:
        return self.p_value <= self.alpha

    def passes(self) -> bool:
        return self.supported and self.significant and abs(self.relative) >= self.threshold


def _inliers(p: _Prepared, lo: int, hi: int, opts: dict) -> np.ndarray:
    """The values lo:hi without those more than `outlier_z` sigmas from their median (at least 2 kept), each value's
    sigma the larger of the series' night-to-night sigma and its own standard error: in a series steadier than its
    runs' own windows, a value within its own noise is no outlier."""
    seg = p.y[lo:hi]
    z = opts.get("outlier_z")
    if not z or len(seg) < 3:
        return seg
    sigma = np.maximum(p.sigma, np.nan_to_num(_own_se(p, lo, hi, opts["noise_windows"])))
    if not (sigma > 0).all():
        return seg
    keep = np.abs(seg - np.median(seg)) <= z * sigma
    return seg[keep] if keep.sum() >= 2 else seg


def _test(p: _Prepared, lo: int, idx: int, hi: int, opts: dict) -> _Test:
    """Student's t-test of y[lo:idx] against y[idx:hi], the variance floored by the series' and the runs' noise."""
    left, right = _inliers(p, lo, idx, opts), _inliers(p, idx, hi, opts)
    n1, n2 = len(left), len(right)
    m1, m2 = float(left.mean()), float(right.mean())
    df = n1 + n2 - 2
    pooled = (float(((left - m1) ** 2).sum() + ((right - m2) ** 2).sum()) / df) if df > 0 else 0.0
    var = max(pooled, p.sigma**2, _own_var(p, lo, hi, opts["noise_windows"]), _TINY**2)
    t = (m2 - m1) / math.sqrt(var * (1 / n1 + 1 / n2))
    relative = (m2 - m1) / m1 if m1 else math.copysign(math.inf, m2 - m1)
    threshold = _threshold(p, lo, hi, m1, opts["min_effect"], opts["noise_factor"])
    supported = min(n1, n2) >= opts["min_size"]
    return _Test(idx, m1, m2, relative, _p_value(t, df), threshold, opts["alpha"], supported)


def _candidates(p: _Prepared, opts: dict) -> list[int]:
    """ruptures' PELT (l2 cost, via KernelCPD's linear kernel) with a penalty scaled by the noise."""
    n, min_size = len(p.y), opts["min_size"]
    if n < 2 * min_size:
        return []
    import ruptures as rpt  # here: it imports scipy.stats (a second of CPU), and most series are too short for it

    sigma = max(p.sigma, math.sqrt(_own_var(p, 0, n, opts["noise_windows"])), _TINY)
    algo = rpt.KernelCPD(kernel="linear", min_size=min_size, jump=1).fit(p.y.reshape(-1, 1))
    return [int(b) for b in algo.predict(pen=opts["penalty"] * sigma**2 * math.log(n))[:-1]]


def _merge(p: _Prepared, indexes: list[int], opts: dict) -> list[_Test]:
    """Hunter's merge: drop the weakest failing candidate, re-test its neighbours over the merged segments, until
    every change left passes (p <= alpha and an effect above the threshold)."""
    indexes = sorted(indexes)
    while indexes:
        ends = [0, *indexes, len(p.y)]
        tests = [_test(p, ends[i], ends[i + 1], ends[i + 2], opts) for i in range(len(indexes))]
        failing = [t for t in tests if not t.passes()]
        if not failing:
            return tests
        insignificant = [t for t in failing if not (t.significant and t.supported)]
        if insignificant:
            weakest = max(insignificant, key=lambda t: t.p_value)
        else:
            weakest = min(failing, key=lambda t: abs(t.relative) / t.threshold)
        indexes.remove(weakest.index)
    return []


def _options(min_effect, alpha, min_size, noise_factor, penalty, noise_windows, outlier_z) -> dict:
    if min_size < 1:
        raise ValueError("min_size must be at least 1")
    return {
        "min_effect": float(min_effect),
        "alpha": float(alpha),
        "min_size": int(min_size),
        "noise_factor": float(noise_factor),
        "penalty": float(penalty),
        "noise_windows": max(1, int(noise_windows)),
        "outlier_z": float(outlier_z) if outlier_z else None,
    }


def _change(p: _Prepared, t: _Test, confirmed: bool = True) -> Change:
    return Change(
        index=int(p.positions[t.index]),
        before=t.before * p.scale,
        after=t.after * p.scale,
        relative=float(t.relative),
        p_value=float(t.p_value),
        confirmed=confirmed,
    )


def _detect(p: _Prepared, opts: dict) -> list[_Test]:
    return _merge(p, _candidates(p, opts), opts)


def detect_changes(
    values: Sequence[float] | np.ndarray,
    noise: Sequence[float] | np.ndarray | float | None = None,
    *,
    min_effect: float = MIN_EFFECT,
    alpha: float = ALPHA,
    min_size: int = MIN_SIZE,
    noise_factor: float = NOISE_FACTOR,
    penalty: float = PENALTY,
    noise_windows: int = NOISE_WINDOWS,
    outlier_z: float | None = OUTLIER_Z,
) -> list[Change]:
    """The confirmed step changes of one series, in time order (the rule is in the module docstring).

    values: one series in time order (e.g. nightly throughput of one point); NaN values are skipped (an index still
    counts them). noise: each value's own relative measurement noise (the CV of its perf_analyzer windows, e.g.
    0.02), one for all, or None/NaN where unknown.
    """
    opts = _options(min_effect, alpha, min_size, noise_factor, penalty, noise_windows, outlier_z)
    p = _prepare(values, noise)
    return [_change(p, t) for t in _detect(p, opts)]


@dataclass(frozen=True)
class Judgement:
    """A series judged as of its newest value (`judge`)."""

    changes: list[Change]  # every confirmed change, in time order (detect_changes)
    new: list[Change]  # those the newest value confirmed: no run before it had them (what to alert on, once)
    candidate: Change | None  # the newest 1 or 2 runs far off the current segment, not yet confirmed
    finite_values: int  # how many values were judged (NaNs left out)
    min_size: int = MIN_SIZE

    @property
    def decidable(self) -> bool:
        """False while the series is too short for any change to be confirmed (fewer than 2 x min_size values)."""
        return self.finite_values >= 2 * self.min_size


def judge(
    values: Sequence[float] | np.ndarray,
    noise: Sequence[float] | np.ndarray | float | None = None,
    *,
    min_effect: float = MIN_EFFECT,
    alpha: float = ALPHA,
    min_size: int = MIN_SIZE,
    noise_factor: float = NOISE_FACTOR,
    penalty: float = PENALTY,
    noise_windows: int = NOISE_WINDOWS,
    outlier_z: float | None = OUTLIER_Z,
    candidate_z: float = CANDIDATE_Z,
    lookback: int = RECONFIRM_LOOKBACK,
) -> Judgement:
    """The series' confirmed changes, the ones its newest value confirmed, and a candidate (the rule's step 4).

    A change is new when no earlier run's judgement had it: not the series without its newest value, and, for a
    change that came and went (confirmed, then lost to a later odd night, then confirmed again), none of the
    `lookback` runs before either. So each change is news exactly once, on the run that confirms it, however many
    runs after the step that takes (more in noisy series), and never again on the runs after."""
    opts = _options(min_effect, alpha, min_size, noise_factor, penalty, noise_windows, outlier_z)
    v, nz = _arrays(values, noise)
    p = _prepare(v, nz)
    tests = _detect(p, opts)
    changes = [_change(p, t) for t in tests]
    extra = {"finite_values": len(p.y), "min_size": opts["min_size"]}
    if len(v) == 0 or not np.isfinite(v[-1]):  # a run that measured nothing here confirms nothing
        return Judgement(changes, [], None, **extra)
    new = _not_seen_before(v, nz, changes, opts, lookback)
    candidate = None if new else _candidate(p, tests, opts, candidate_z)
    return Judgement(changes, new, candidate, **extra)


def _arrays(values, noise) -> tuple[np.ndarray, np.ndarray | None]:
    v = np.asarray(values, dtype=float).ravel()
    return v, None if noise is None else np.broadcast_to(np.asarray(noise, dtype=float), v.shape)


def _same_change(a: Change, b: Change, min_size: int) -> bool:
    """One change seen by two runs' judgements: the same way, its index moved by at most a segment (a change is first
    placed up to min_size runs late, then moves as runs after it come in; `_seen` pairs each earlier change with one
    change at most, so two confirmed changes a segment apart are not merged)."""
    return np.sign(a.relative) == np.sign(b.relative) and abs(a.index - b.index) <= min_size


def _seen(changes: list[Change], earlier: list[Change], min_size: int) -> list[Change]:
    """The changes an earlier judgement had: each earlier change paired with the nearest change it can be, once."""
    seen: list[Change] = []
    for e in earlier:
        same = [c for c in changes if c not in seen and _same_change(c, e, min_size)]
        if same:
            seen.append(min(same, key=lambda c: abs(c.index - e.index)))
    return seen


def _not_seen_before(v, nz, changes: list[Change], opts: dict, lookback: int) -> list[Change]:
    """The changes that no judgement of the series cut 1..lookback runs short had (it stops once every change left
    is too late for the cut series to hold, even moved by min_size - 1)."""
    fresh = list(changes)
    for cut in range(1, lookback + 1):
        end = len(v) - cut
        checkable = [c for c in fresh if c.index + 1 <= end]
        if not checkable:
            break
        cut_series = _prepare(v[:end], None if nz is None else nz[:end])
        earlier = [_change(cut_series, t) for t in _detect(cut_series, opts)]
        seen = _seen(checkable, earlier, opts["min_size"])
        fresh = [c for c in fresh if c not in seen]
    return fresh


def _candidate(p: _Prepared, tests: list[_Test], opts: dict, candidate_z: float) -> Change | None:
    """The newest k < min_size values far off the runs since the last confirmed change (judge's candidate)."""
    n = len(p.y)
    start = tests[-1].index if tests else 0
    for k in range(min(opts["min_size"] - 1, n - 1), 0, -1):
        hist, new = _inliers(p, start, n - k, opts), p.y[n - k :]
        if len(hist) < max(opts["min_size"], 2):
            continue
        m_h, m_new = float(hist.mean()), float(new.mean())
        if not m_h:
            continue
        threshold = _threshold(p, start, n, m_h, opts["min_effect"], opts["noise_factor"])
        each = (new - m_h) / m_h * np.sign(m_new - m_h)
        if not np.all(each >= threshold):  # every one of the newest runs beyond the threshold, the same way
            continue
        var = max(float(hist.var(ddof=1)), p.sigma**2, _own_var(p, start, n, opts["noise_windows"]), _TINY**2)
        z = (m_new - m_h) / math.sqrt(var * (1 / k + 1 / len(hist)))
        relative = (m_new - m_h) / m_h
        p_value = _p_value(z, len(hist) - 1)
        if p_value <= opts["alpha"] and (k > 1 or abs(z) >= candidate_z):
            return _change(p, _Test(n - k, m_h, m_new, relative, p_value, threshold, opts["alpha"]), confirmed=False)
    return None
