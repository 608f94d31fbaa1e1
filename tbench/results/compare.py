"""Compare two runs (or a run and a stored baseline) with a regression verdict that accounts for measurement noise.

A *baseline* is just a run folder: any folder (local path or fsspec URL, e.g. ``s3://bucket/runs/<run id>``) that
holds a ``results.parquet`` (or ``results.csv``) with the tidy result columns of `tbench.metrics.RESULT_COLUMNS` and,
for the noise, the perf_analyzer logs of its points under ``logs/perf_analyzer/`` (`tbench.layout.RunLayout`).
To keep a baseline, copy a run folder (or only those files) somewhere stable; nothing else is needed.

Noise of a point: perf_analyzer (count_windows mode, ``-v``) logs one "Pass [i] throughput: X infer/sec. Avg latency:
Y usec" line per measurement window and reports the average of the last 3 windows once they agree. The coefficient of
variation (sample standard deviation / mean) of throughput and of avg latency across those 3 windows, read from the log
of the attempt that counted (``source_file`` perf/X.csv -> logs/perf_analyzer/X.log), is the point's noise of
throughput and of mean latency. perf_analyzer logs no per-window p99, and a tail moves far more than a mean, so p99's
noise is the larger of that CV and the p99's own standard error from its sample size (`p99_standard_error`: the order
statistics' rank interval mapped through the exponential tail that the point's p95..p99 imply). A p99 from fewer than
`MIN_P99_REQUESTS` requests is near the sample maximum: its change is "undetermined". Where a run's table holds several
rows of the same point (repeats), the spread (CV) of their throughput, p99 and avg latency is the noise where it is
larger. A missing or unreadable log is not an error: the point gets `DEFAULT_NOISE` and is flagged ``noise_assumed``.

Rule: a point's figure is the geometric mean of its trials (`tbench run --trials N`: each trial a server process of its
own). Each matched point's change of throughput, p99 latency (``p99_ms``) and mean latency (``avg_ms``), taken as the
log of its ratio (a slow process multiplies every figure; the same distance up as down), is significant when it exceeds
``max(min_effect, k * sqrt(noise_baseline^2 + noise_candidate^2), run-to-run threshold)`` (each on the log scale;
``min_effect_p99`` for the p99 where given) with each metric's own noise; the run-to-run threshold comes from the spread
between trials, or a spread stated for the machine (``--run-cv``), by Welch's test (tbench.results.run_noise). Windows
agree far better than runs do, so where neither gives the spread no change is decided ("undetermined", exit 2), and a
change inside a threshold wider than ``min_effect`` is undetermined too, never "within noise": the line says how many
trials would resolve it. A run whose manifest shows other processes busy during its sweeps (over `HOST_BUSY_PCT` of a
CPU) is never called a regression or an improvement: the comparison is undetermined and names the neighbour. Where
the machine's own CPU speed (a probe before and after each run's sweeps, tbench.node.cpu_speed) moved by more than
`MACHINE_MOVED` between the runs, the line says so beside whatever verdict the points gave (said, not judged). A point
with no perf_analyzer log or no request count is never passed. A point is *worse* when its throughput is significantly
lower or its p99 or mean latency significantly higher, *better* when it is not worse and its throughput is significantly
higher or both its latencies significantly lower. The comparison is a "regression" when the best-throughput point of any
format x scenario (the baseline's best point) is worse or *lost* (ok in the baseline; error, behind, unstable or any
other status but ok in the candidate), or when more than half the points judged are worse or lost; "improvement"
symmetrically with better (a regression wins when both hold); "not comparable" when no point matches, when any other
point is lost or was not measured by the candidate, or when a best point's p99 is undetermined (a run that lost a point
never passes); else "no significant change". Latency counts in every scenario: in the rate scenario throughput is the
offered rate whenever the server keeps up, so latency is what shows a slower server. Points match on `MATCH_KEYS`;
constant and Poisson arrivals at the same rate are different points.

Plain functions, pandas and matplotlib (Agg); no Prefect. `verdict_exit_code` gives CI/nightly jobs a status to gate on;
``tbench compare BASELINE CANDIDATE`` prints the summary, writes the section and plot, and exits with it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from tbench.loadgen.perf_analyzer import DEFAULT_NOISE, cv  # DEFAULT_NOISE: a log-less point's, re-exported
from tbench.results.compare_report import (
    _summary,
    _undecided_reason,
    comparison_markdown,
    plot_comparison,
    rule_sentence,
)
from tbench.results.comparison import (  # the vocabulary, re-exported: `tbench compare`'s names import from here
    AVG_MS,
    EXIT_CODES,
    FASTER,
    HIGHER_LATENCY,
    HOST_BUSY_PCT,
    IMPROVEMENT,
    LATENCY_MOVES,
    LOWER_LATENCY,
    MACHINE_MOVED,
    MATCH_KEYS,
    MIN_P99_REQUESTS,
    NO_CHANGE,
    NOT_COMPARABLE,
    NUMERIC_KEYS,
    P99,
    POINT_COLUMNS,
    RECENT_KEYS,
    REGRESSION,
    SLOWER,
    TPUT,
    UNDETERMINED,
    UNMATCHED_COLUMNS,
    WITHIN,
    Comparison,
    _missing,
    too_few_p99_requests,
)
from tbench.results.run_noise import MAX_TRIALS, TRIAL, RunSpread, paired_spread, run_spread, trial_rows
from tbench.results.run_results import RunResults, _largest, load_run, p99_requests, p99_standard_error, with_noise
from tbench.results.session import Pairing, load_side

# --- matching and verdicts --------------------------------------------------------------------------------------------


def _norm(col: str, v):
    """A match key value that compares equal across parquet/CSV (None == NaN == missing, 1 == 1.0,
    ' FP32' == 'FP32')."""
    if _missing(v):
        return None
    if col in NUMERIC_KEYS:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v).strip() or None
        return None if math.isnan(f) else f
    s = str(v).strip()
    return s or None


def point_key(row) -> tuple:
    key = {c: _norm(c, row[c] if c in row else None) for c in MATCH_KEYS}
    if key["request_rate"] is None:  # arrivals mean nothing without a rate: '', NaN, absent and 'constant' all match
        key["request_distribution"] = None
    elif key["request_distribution"]:
        key["request_distribution"] = key["request_distribution"].lower()
    return tuple(key[c] for c in MATCH_KEYS)


def _recorded(results: pd.DataFrame, column: str) -> bool:
    return column in results and bool(results[column].notna().any())


def _keyed(results: pd.DataFrame, ignored: set[str] = frozenset()) -> dict[tuple, list[int]]:
    keys: dict[tuple, list[int]] = {}
    columns = {
        c: results[c].tolist() if c in results and c not in ignored else [None] * len(results) for c in MATCH_KEYS
    }
    for pos, i in enumerate(results.index):
        keys.setdefault(point_key({c: v[pos] for c, v in columns.items()}), []).append(i)
    return keys


def _rel(new: float, old: float) -> float:
    if _missing(new) or _missing(old) or old == 0:
        return math.nan
    return float(new) / float(old) - 1.0


def _noise(results: pd.DataFrame, idx: list[int], cv_column: str, *metrics: str) -> float:
    """One run's noise of a point: its windows' CV (`cv_column` of the row compared, the last), or the spread of the
    run's repeats of the point (its ok rows) where that is larger: repeats show what windows of one call cannot."""
    own = results.at[idx[-1], cv_column]
    if len(idx) < 2:  # one row: no repeats to spread
        return _largest(own)
    ok = results.loc[idx]
    ok = ok[ok["status"] == "ok"]
    return _largest(own, *(cv(ok[m].dropna()) for m in metrics))


def _latency_verdict(p99: str, avg: str) -> str:
    """Higher when p99 or the mean rose; lower only when both fell (a lone p99 dip is one tail, not a faster server)."""
    if HIGHER_LATENCY in (p99, avg):
        return HIGHER_LATENCY
    measured = {p99, avg} - {"n/a"}
    if not measured:
        return "n/a"
    if UNDETERMINED in measured:
        return UNDETERMINED
    return LOWER_LATENCY if measured == {LOWER_LATENCY} else WITHIN


def _status(results: pd.DataFrame, idx: list[int] | None) -> str:
    """A point's status: its last row's; over trials, ok where most of its trials were (the others are left out of its
    mean), else the last status that was not ok: a point most server processes failed is lost."""
    if not idx:
        return "absent"
    statuses = results.loc[idx, "status"].astype(str)
    if _trial_count(results, idx) > 1:
        if (statuses == "ok").mean() > 0.5:
            return "ok"
        return statuses[statuses != "ok"].iloc[-1]
    return statuses.iloc[-1]


def _not_comparable_reason(base: pd.DataFrame, cand: pd.DataFrame) -> str:
    if base.empty or cand.empty:
        which = [n for n, r in (("baseline", base), ("candidate", cand)) if r.empty]
        return f"no ok point in the {' and the '.join(which)}"
    diffs = []
    for col in ("model", "model_size", "gpu", "precision", "format", "scenario"):
        a = sorted({_norm(col, v) or "?" for v in base[col]})
        b = sorted({_norm(col, v) or "?" for v in cand[col]})
        if not set(a) & set(b):
            diffs.append(f"different {col} (baseline {', '.join(a)}; candidate {', '.join(b)})")
    return (
        "; ".join(diffs)
        if diffs
        else "no point measured in both runs (different batch sizes, concurrency, rates or arrival distributions)"
    )


def _why_not_compared(b_status: str, c_status: str, b_res, bi, c_res, ci) -> str:
    if bi is None:
        return "only in the candidate" + ("" if c_status == "ok" else f" ({c_status})")
    if ci is None:
        return "only in the baseline" + ("" if b_status == "ok" else f" ({b_status})")
    bad = [
        f"{c_status} in the candidate" if c_status != "ok" else "",
        f"{b_status} in the baseline" if b_status != "ok" else "",
    ]
    reason = ", ".join(x for x in bad if x)
    errors = [
        str(r.loc[i[-1], "error"])
        for r, i in ((c_res, ci), (b_res, bi))
        if str(r.loc[i[-1], "status"]) != "ok" and not _missing(r.loc[i[-1], "error"]) and str(r.loc[i[-1], "error"])
    ]
    return reason + (f": {errors[0]}" if errors else "")


def _verdict(delta: float, threshold: float, up: str, down: str, resolved: bool = True) -> str:
    """Beyond the threshold (the log of the ratio against `threshold`, as far up as down): up or down; inside it:
    within noise where the data resolves the smallest effect asked for, else undetermined (a change it could not have
    seen)."""
    if _missing(delta) or delta <= -1:
        return "n/a"
    if _missing(threshold):  # the run-to-run spread is unknown: no move can be put on the model
        return UNDETERMINED
    if math.log1p(delta) < -threshold:
        return down
    if math.log1p(delta) > threshold:
        return up
    return WITHIN if resolved else UNDETERMINED


def _threshold(window_noise: float, spread: RunSpread, metric: str, n: tuple[int, int], min_effect: float, k: float):
    """(threshold, resolved), the threshold on the log of the ratio: the larger of min_effect, k x the windows' noise
    and the run-to-run threshold; resolved when the spread lets min_effect be seen. With the spread unknown the
    threshold is NaN: the windows alone say nothing of how far a fresh run moves."""
    if not spread.known(metric):
        return math.nan, False
    windows = min_effect if _missing(window_noise) else max(min_effect, k * window_noise)
    between = spread.threshold(metric, *n)
    return max(math.log1p(windows), between), between <= math.log1p(min_effect)


def _judged(
    b: pd.Series,
    c: pd.Series,
    noises: tuple[float, float, float],
    min_effect: float | dict[str, float],
    k: float,
    spread: RunSpread = RunSpread(),
    trials: tuple[int, int] = (1, 1),
) -> dict:
    """One matched point's deltas, thresholds and verdicts; `noises`: the combined windows' noise of throughput, mean
    latency and p99; `min_effect`: one for every metric or per metric; `spread`: the run-to-run spread, `trials`: each
    side's trials of the point (b, c: their means). A threshold is kept as the relative rise it allows."""
    t_noise, l_noise, p_noise = noises
    effects = min_effect if isinstance(min_effect, dict) else dict.fromkeys((TPUT, AVG_MS, P99), min_effect)
    t_delta, p_delta, a_delta = _rel(c[TPUT], b[TPUT]), _rel(c[P99], b[P99]), _rel(c[AVG_MS], b[AVG_MS])
    (t_thr, t_ok), (l_thr, l_ok), (p_thr, p_ok) = (
        _threshold(noise, spread, metric, trials, effects[metric], k)
        for noise, metric in ((t_noise, TPUT), (l_noise, AVG_MS), (p_noise, P99))
    )
    requests = min(p99_requests(b["window_requests"]), p99_requests(c["window_requests"]))
    tv = _verdict(t_delta, t_thr, FASTER, SLOWER, t_ok)
    av = _verdict(a_delta, l_thr, HIGHER_LATENCY, LOWER_LATENCY, l_ok)
    few = _missing(requests) or requests < MIN_P99_REQUESTS  # an unknown count is not enough either
    pv = UNDETERMINED if few else _verdict(p_delta, p_thr, HIGHER_LATENCY, LOWER_LATENCY, p_ok)
    assumed = bool(b["noise_assumed"] or c["noise_assumed"])
    if assumed and not (tv == SLOWER or HIGHER_LATENCY in (pv, av)):  # no windows: only a move past the floor counts
        tv, av, pv = (UNDETERMINED if v != "n/a" else v for v in (tv, av, pv))
    moved = [tv] if tv not in (WITHIN, "n/a", UNDETERMINED) else []
    moved += [f"{v.split()[0]} {name} latency" for name, v in (("p99", pv), ("mean", av)) if v in LATENCY_MOVES]
    named = (("throughput", tv), ("p99", pv), ("mean", av))
    moved += [f"{name} undetermined" for name, v in named if v == UNDETERMINED]
    return {
        "baseline_throughput": float(b[TPUT]),
        "candidate_throughput": float(c[TPUT]),
        "throughput_delta": t_delta,
        "throughput_noise": t_noise,
        "throughput_threshold": math.expm1(t_thr),
        "throughput_verdict": tv,
        "baseline_p99_ms": float(b[P99]),
        "candidate_p99_ms": float(c[P99]),
        "p99_delta": p_delta,
        "p99_noise": p_noise,
        "p99_threshold": math.expm1(p_thr),
        "p99_verdict": pv,
        "p99_requests": requests,
        "baseline_avg_ms": float(b[AVG_MS]),
        "candidate_avg_ms": float(c[AVG_MS]),
        "avg_delta": a_delta,
        "avg_verdict": av,
        "latency_noise": l_noise,
        "latency_threshold": math.expm1(l_thr),
        "latency_verdict": _latency_verdict(pv, av),
        "noise_assumed": assumed,
        "trials": f"{trials[0]}/{trials[1]}",
        "verdict": ", ".join(moved) if moved else WITHIN,
    }


def _best_keys(entries: list[tuple[tuple, float]]) -> set[tuple]:
    """Of (point key, baseline throughput) pairs, the key of the highest throughput per format x scenario."""
    fmt, scen = MATCH_KEYS.index("format"), MATCH_KEYS.index("scenario")
    best: dict[tuple, tuple[tuple, float]] = {}
    for key, throughput in entries:
        group = (key[fmt] or "", key[scen] or "")
        if not _missing(throughput) and (group not in best or throughput > best[group][1]):
            best[group] = (key, float(throughput))
    return {key for key, _ in best.values()}


def compare_runs(
    baseline: RunResults | str | Path | list,
    candidate: RunResults | str | Path | list,
    min_effect: float = 0.05,
    k: float = 3.0,
    run_cv: float | None = None,
    run_cv_p99: float | None = None,
    min_effect_p99: float | None = None,
) -> Comparison:
    """Match the two runs' points on `MATCH_KEYS` and judge each against its noise and the run-to-run spread (from
    the runs' trials, else as stated: `run_cv` for throughput and mean latency, `run_cv_p99` for the p99, else unknown:
    tbench.results.run_noise); `min_effect_p99`: the p99's smallest effect where not `min_effect`; see the module
    docstring. A side may be several runs (a list, or folders joined by commas), each a trial; the two sides of one
    A/B session (`tbench run --against`) are judged round by round (tbench.results.session)."""
    base, cand = load_side(baseline), load_side(candidate)
    pairing = Pairing.of(base, cand)
    b_res, c_res = base.results, cand.results
    if pairing:  # two model files of one plan: their points match whatever the files are called
        b_res = b_res.assign(model=c_res["model"].iloc[0]) if len(c_res) else b_res
    older = {k for k in RECENT_KEYS if not (_recorded(b_res, k) and _recorded(c_res, k))}
    b_keys, c_keys = _keyed(b_res, older), _keyed(c_res, older)

    matched, unmatched = [], []
    for key in list(b_keys) + [key for key in c_keys if key not in b_keys]:
        bi, ci = b_keys.get(key), c_keys.get(key)
        b_status, c_status = _status(b_res, bi), _status(c_res, ci)
        kd = dict(zip(MATCH_KEYS, key))
        for name, res, idx in (("baseline", b_res, bi), ("candidate", c_res, ci)):
            if idx and len(idx) > _trial_count(res, idx):  # the last row of a trial counts; the others are listed
                unmatched.append(
                    {
                        **kd,
                        "baseline_status": b_status,
                        "candidate_status": c_status,
                        "reason": f"{len(idx)} rows for this point in the {name}; the last one of a trial compared",
                        "compared": True,
                        "lost": False,
                        "measured": True,
                        "best": False,
                    }
                )
        if b_status != "ok" or c_status != "ok":
            lost = b_status == "ok"  # the baseline served it; the candidate did not, or did not try
            unmatched.append(
                {
                    **kd,
                    "baseline_status": b_status,
                    "candidate_status": c_status,
                    "reason": _why_not_compared(b_status, c_status, b_res, bi, c_res, ci),
                    "compared": False,
                    "lost": lost,
                    "measured": ci is not None,
                    "best": False,
                    "baseline_throughput": float(b_res.loc[bi[-1], TPUT]) if lost else math.nan,
                }
            )
            continue
        b_rows, c_rows = trial_rows(b_res, bi), trial_rows(c_res, ci)
        if pairing:  # the rounds both sides measured: a round one side lost pairs with nothing
            b_rows, c_rows = b_rows[b_rows[TRIAL].isin(c_rows[TRIAL])], c_rows[c_rows[TRIAL].isin(b_rows[TRIAL])]
        matched.append((key, bi, ci, b_rows, c_rows))

    metrics = [TPUT, AVG_MS, P99]
    if pairing:
        spread = paired_spread([(b_rows, c_rows) for _, _, _, b_rows, c_rows in matched], metrics)
    else:
        groups = [g for _, _, _, b_rows, c_rows in matched for g in (b_rows, c_rows)]
        spread = run_spread(groups, metrics, stated={TPUT: run_cv, AVG_MS: run_cv, P99: run_cv_p99})
    comparison = Comparison(base.source, cand.source, min_effect, k, NO_CHANGE, "", pd.DataFrame(), pd.DataFrame())
    comparison.min_effect_p99 = min_effect_p99
    rows, keys = [], []
    for key, bi, ci, b_rows, c_rows in matched:
        noises = tuple(
            math.hypot(_window_noise(b_res, bi, b_rows, col, metric), _window_noise(c_res, ci, c_rows, col, metric))
            for col, metric in (("throughput_cv", TPUT), ("latency_cv", AVG_MS), ("p99_cv", P99))
        )
        b, c = _mean_row(b_rows), _mean_row(c_rows)
        judged = _judged(b, c, noises, comparison.effects, k, spread, (len(b_rows), len(c_rows)))
        rows.append({**dict(zip(MATCH_KEYS, key)), **judged})
        keys.append(key)
    # the baseline's best per format x scenario, among the points judged: matched, or measured and lost
    failed = [u for u in unmatched if u["lost"] and u["measured"]]
    best = _best_keys(
        [(key, r["baseline_throughput"]) for key, r in zip(keys, rows)]
        + [(point_key(u), u["baseline_throughput"]) for u in failed]
    )
    for key, r in zip(keys, rows):
        r["best"] = key in best
    for u in failed:
        u["best"] = point_key(u) in best
    comparison.unmatched = pd.DataFrame(unmatched, columns=UNMATCHED_COLUMNS)
    comparison.points = points = pd.DataFrame(rows, columns=POINT_COLUMNS)
    comparison.spread = spread.describe(TPUT)
    if points.empty and not failed:
        comparison.verdict = NOT_COMPARABLE
        comparison.reason = _not_comparable_reason(base.ok, cand.ok)
        comparison.summary = f"not comparable: {comparison.reason}"
        return comparison
    comparison.best = points[points["best"].astype(bool)]
    return _decide(comparison, spread, _neighbours(base, cand), _machine_moved(base, cand))


def _trial_count(results: pd.DataFrame, idx: list[int]) -> int:
    if TRIAL not in results:
        return 1
    return max(1, int(results.loc[idx, TRIAL].nunique(dropna=True)))


def _window_noise(results: pd.DataFrame, idx: list[int], rows: pd.DataFrame, cv_column: str, metric: str) -> float:
    """One side's windows' noise of a point's figure: one trial's (or its repeats' spread, where larger); over
    several trials, that of their mean (the root mean square of their CVs over sqrt(trials))."""
    if len(rows) < 2:
        return _noise(results, idx, cv_column, metric)
    values = rows[cv_column].dropna().to_numpy(dtype=float)
    return math.sqrt(float(np.mean(values**2)) / len(rows)) if len(values) else math.nan


def _mean_row(rows: pd.DataFrame) -> pd.Series:
    """The point as its trials measured it: the last trial's row with the trials' geometric mean throughput and
    latencies (changes are judged on the log scale: tbench.results.run_noise)."""
    row = rows.iloc[-1].copy()
    for metric in (TPUT, AVG_MS, P99, "p95_ms"):
        if metric in rows:
            values = rows[metric].dropna().astype(float)
            geometric = len(values) > 1 and (values > 0).all()
            row[metric] = float(np.exp(np.log(values).mean())) if geometric else values.mean()
    row["window_requests"] = rows["window_requests"].min()  # the p99 that rests on the fewest requests
    row["noise_assumed"] = bool(rows["noise_assumed"].any())
    return row


def _neighbours(*runs: RunResults) -> str:
    """Which run had other processes busy during its sweeps (tbench.node.host_load), in words; '' for none."""
    busy = [
        f"other processes used {run.neighbour_cpu_pct:.0f}% CPU during the {side}'s sweeps"
        for side, run in zip(("baseline", "candidate"), runs)
        if run.neighbour_cpu_pct > HOST_BUSY_PCT
    ]
    return "; ".join(busy)


def _machine_moved(base: RunResults, cand: RunResults) -> str:
    """How much faster or slower the machine's CPU ran during the candidate than during the baseline (the CPU probe,
    tbench.node.cpu_speed), in words, where beyond MACHINE_MOVED; '' otherwise or where either run has no probe."""
    b, c = base.cpu_speed, cand.cpu_speed
    if math.isnan(b) or math.isnan(c) or abs(c / b - 1) <= MACHINE_MOVED:
        return ""
    way = "faster" if c > b else "slower"
    # a fact about the machine, not a share of the change: in benchmarks/results/cpu_probe.json a model's throughput
    # followed the probe in neither of the pairs said here, and moved by over 10% where the probe did not
    return (
        f"the machine's CPU ran {abs(c / b - 1):.0%} {way} during the candidate's run than the baseline's (CPU probe "
        f"{b:.1f} vs {c:.1f} M steps/s): the machine was not the same for both runs, though a model need not follow "
        "the probe"
    )


def _decide(c: Comparison, spread: RunSpread = RunSpread(), neighbours: str = "", machine: str = "") -> Comparison:
    """The verdict from the judged points and the lost ones (module docstring), and its summary."""
    points, lost = c.points, c.lost
    failed = lost.loc[lost["measured"].astype(bool)]
    tv, lv, pv = points["throughput_verdict"], points["latency_verdict"], points["p99_verdict"]
    worse = (tv == SLOWER) | (lv == HIGHER_LATENCY)
    better = ~worse & ((tv == FASTER) | (lv == LOWER_LATENCY))
    is_best = points["best"].astype(bool)
    judged = len(points) + len(failed)
    undecided = (tv == UNDETERMINED) | (lv == UNDETERMINED) | (pv == UNDETERMINED)
    undetermined_best = points[is_best & undecided & ~worse]
    if (worse & is_best).any() or failed["best"].astype(bool).any() or worse.sum() + len(failed) > judged / 2:
        c.verdict = REGRESSION
    elif not lost.empty:
        c.verdict = NOT_COMPARABLE
        c.reason = _undecided_reason(lost, undetermined_best)
    elif not undetermined_best.empty:
        c.verdict = UNDETERMINED
        c.reason = _unresolved_reason(undetermined_best, spread, c.effects)
    elif (better & is_best).any() or better.sum() > judged / 2:
        c.verdict = IMPROVEMENT
    if neighbours and c.verdict in (REGRESSION, IMPROVEMENT):  # a move a neighbour may have made is not the model's
        c.verdict, c.reason = UNDETERMINED, f"{neighbours}: a change cannot be put on the model"
    elif neighbours and c.verdict == UNDETERMINED:  # undecided anyway: a busy machine is part of why, and its fix
        c.reason = f"{c.reason}; {neighbours}"
    c.summary = _summary(c, worse if c.verdict == REGRESSION else better)
    if machine:  # said, not judged: the verdict's error rates are measured without it (benchmarks/real_aa.py)
        c.summary = f"{c.summary}; {machine}"
    return c


def _unresolved_reason(undetermined_best: pd.DataFrame, spread: RunSpread, effects: dict[str, float]) -> str:
    """Why a best point's change cannot be decided, and what would decide it."""
    if not spread.known(TPUT):
        fix = "measure both runs with --trials 3 (or more), or state the machine's run-to-run spread with --run-cv"
        return f"the run-to-run spread is unknown (one trial per run): {fix}"
    few = too_few_p99_requests(undetermined_best)
    if not spread.known(P99) and not few.all():
        fix = "measure both runs with --trials 3 (or more), or state its run-to-run spread with --run-cv-p99"
        return f"the p99's run-to-run spread is unknown (one trial per run, only --run-cv stated): {fix}"
    requests_only = undetermined_best["p99_verdict"].eq(UNDETERMINED) & few
    if requests_only.all() and not undetermined_best["throughput_verdict"].eq(UNDETERMINED).any():
        return _undecided_reason(pd.DataFrame(columns=UNMATCHED_COLUMNS), undetermined_best)
    asks = {m: spread.trials_needed(m, effects[m]) for m in (TPUT, AVG_MS, P99) if spread.known(m)}
    needed = None if None in asks.values() else max(asks.values())  # the metric that needs most: the p99's tail, often
    hardest = next((m for m, n in asks.items() if n is None or n == needed), TPUT)
    effect = f"{100 * effects[hardest]:g}%" + (" of the p99" if hardest == P99 else "")
    if needed:
        advice = f"--trials {needed} " + ("rounds" if spread.paired else "per run") + f" would resolve {effect}"
    else:
        advice = f"no --trials up to {MAX_TRIALS} resolves {effect} (a quieter machine would"
        advice += ", or a larger --min-effect-p99)" if hardest == P99 else ")"
    return f"{spread.describe(hardest)} hides a change of {effect}: {advice}"


def verdict_exit_code(comparison: Comparison) -> int:
    """0: no significant change or improvement; 1: regression; 2: not comparable."""
    return EXIT_CODES[comparison.verdict]


__all__ = [
    "DEFAULT_NOISE",
    "EXIT_CODES",
    "FASTER",
    "HIGHER_LATENCY",
    "IMPROVEMENT",
    "LOWER_LATENCY",
    "MACHINE_MOVED",
    "MATCH_KEYS",
    "MIN_P99_REQUESTS",
    "NO_CHANGE",
    "NOT_COMPARABLE",
    "REGRESSION",
    "SLOWER",
    "UNDETERMINED",
    "WITHIN",
    "Comparison",
    "RunResults",
    "compare_runs",
    "comparison_markdown",
    "load_run",
    "p99_standard_error",
    "plot_comparison",
    "rule_sentence",
    "verdict_exit_code",
    "with_noise",
]
