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

Rule: each matched point's change of throughput, p99 latency (``p99_ms``) and mean latency (``avg_ms``) is significant
when it exceeds ``max(min_effect, k * sqrt(noise_baseline^2 + noise_candidate^2))`` with each metric's own noise. A
point is *worse* when its throughput is significantly lower or its p99 or mean latency significantly higher, *better*
when it is not worse and its throughput is significantly higher or both its latencies significantly lower. The
comparison is a "regression" when the best-throughput point of any format x scenario (the baseline's best point) is
worse or *lost* (ok in the baseline; error, behind, unstable or any other status but ok in the candidate), or when more
than half the points judged are worse or lost; "improvement" symmetrically with better (a regression wins when both
hold); "not comparable" when no point matches, when any other point is lost or was not measured by the candidate, or
when a best point's p99 is undetermined (a run that lost a point never passes); else "no significant change". Latency
counts in every
scenario: in the rate scenario throughput is the offered rate whenever the server keeps up, so latency is what shows a
slower server. Points match on `MATCH_KEYS`; constant and Poisson arrivals at the same rate are different points.

Plain functions, pandas and matplotlib (Agg); no Prefect. `verdict_exit_code` gives CI/nightly jobs a status to gate on;
``tbench compare BASELINE CANDIDATE`` prints the summary, writes the section and plot, and exits with it.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tbench.core.layout import perf_log_for
from tbench.core.metrics import RESULT_COLUMNS
from tbench.core.storage import url_to_fs
from tbench.loadgen.perf_analyzer import DEFAULT_NOISE, STABLE_WINDOWS, Noise, cv, noise_from_log
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
    IMPROVEMENT,
    LATENCY_MOVES,
    LOWER_LATENCY,
    MATCH_KEYS,
    MIN_P99_REQUESTS,
    NO_CHANGE,
    NOT_COMPARABLE,
    NUMERIC_KEYS,
    P99,
    P99_Z,
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
)

# --- noise from the perf_analyzer log ---------------------------------------------------------------------------------


# --- loading a run ----------------------------------------------------------------------------------------------------


@dataclass
class RunResults:
    """A run's tidy results plus, per ok point, its noise columns: throughput_cv, latency_cv, noise_windows,
    noise_assumed, noise_note."""

    source: str  # the folder, as given
    name: str  # the folder's name (the run id for a run folder)
    results: pd.DataFrame

    @property
    def ok(self) -> pd.DataFrame:
        return self.results[self.results["status"] == "ok"]


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel


def _read_text(fs, path: str) -> str | None:
    try:
        with fs.open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:  # FileNotFoundError, PermissionError, ...: the noise is assumed
        return None


def load_run(path_or_url: str | Path, default_noise: float = DEFAULT_NOISE) -> RunResults:
    """A run folder (local path or fsspec URL; or its results.parquet / results.csv itself) -> its results and noise.

    Reads ``results.parquet`` (else ``results.csv``); for each ok point the log of its counting attempt gives the noise;
    a point whose log is missing gets `default_noise` with ``noise_assumed`` set."""
    source = str(path_or_url)
    fs, root = url_to_fs(source)
    if root.endswith((".parquet", ".csv")) and fs.isfile(root):
        candidates, root = [root], posixpath.dirname(root)
    else:
        candidates = [_join(root, "results.parquet"), _join(root, "results.csv")]
    found = next((p for p in candidates if fs.exists(p)), None)
    if found is None:
        raise FileNotFoundError(f"{source}: no results.parquet or results.csv (a baseline is a run folder)")
    with fs.open(found, "rb") as f:
        results = pd.read_parquet(f) if found.endswith(".parquet") else pd.read_csv(f, keep_default_na=True)
    for col in RESULT_COLUMNS:
        if col not in results.columns:
            results[col] = np.nan
    if results["status"].isna().all():  # results written before the status column: a number is a measured point
        results["status"] = np.where(results[TPUT].notna(), "ok", "error")
    results = results.reset_index(drop=True)

    noise = []
    for _, row in results.iterrows():
        if row["status"] != "ok":
            noise.append(Noise(math.nan, math.nan, 0, False))
            continue
        src = row["source_file"]
        text = None if _missing(src) or str(src) == "" else _read_text(fs, _join(root, perf_log_for(src)))
        if text is None:
            noise.append(Noise(default_noise, default_noise, 0, True, "no perf_analyzer log"))
        else:
            n = noise_from_log(text, default=default_noise)
            if math.isnan(n.throughput_cv) or math.isnan(n.latency_cv):  # e.g. a zero mean: not a usable noise
                n = Noise(default_noise, default_noise, 0, True, "unusable measurement windows")
            noise.append(n)
    name = posixpath.basename(root.rstrip("/")) or source
    return RunResults(source=source, name=name, results=with_noise(results, noise))


def with_noise(results: pd.DataFrame, noise: list[Noise]) -> pd.DataFrame:
    """The results with each row's noise columns (`noise`: one per row, from its windows): throughput_cv, latency_cv,
    p99_cv (the larger of the windows' latency CV and the p99's standard error), noise_windows, noise_assumed and
    noise_note."""
    results = results.copy()
    results["throughput_cv"] = [n.throughput_cv for n in noise]
    results["latency_cv"] = [n.latency_cv for n in noise]
    p99_se = [
        p99_standard_error(p95, p99, requests)
        for p95, p99, requests in zip(results["p95_ms"], results["p99_ms"], results["window_requests"])
    ]
    results["p99_cv"] = [_largest(n.latency_cv, se) for n, se in zip(noise, p99_se)]
    results["noise_windows"] = [n.windows for n in noise]
    results["noise_assumed"] = [n.assumed for n in noise]
    results["noise_note"] = [n.note for n in noise]
    return results


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


def p99_requests(window_requests: float) -> float:
    """The requests a point's p99 rests on: perf_analyzer's merged stable windows (NaN when not recorded)."""
    return math.nan if _missing(window_requests) else STABLE_WINDOWS * float(window_requests)


def p99_standard_error(p95_ms: float, p99_ms: float, window_requests: float) -> float:
    """The relative standard error of a p99 measured from the merged windows' n requests, from order statistics: the
    p99's rank n*0.99 moves by ± sqrt(n*0.99*0.01) (binomial), i.e. the tail beyond it holds 1% ± s of the requests;
    the point's own p95..p99 give the tail's exponential scale, (p99 - p95) / ln 5, which maps those tail shares to
    latencies: x(u) = p99 + scale * ln(0.01 / u). Half the interval is the standard error. Where the interval's
    upper end lies beyond the sample (u under half a request), it stops there: for n under `MIN_P99_REQUESTS` the
    change is undetermined anyway. (The density at p99 taken as the p95..p99 average understates this ~2.5x.)
    perf_analyzer logs no per-window p99, and the windows' average latency is far steadier than their tail; NaN
    where the point lacks the numbers."""
    values = [p95_ms, p99_ms, window_requests]
    if any(_missing(v) for v in values) or p99_ms <= 0 or window_requests <= 0:
        return math.nan
    n = p99_requests(window_requests)
    scale = max(float(p99_ms) - float(p95_ms), 0.0) / math.log(5.0)
    spread = P99_Z * math.sqrt(0.99 * 0.01 / n)
    beyond_high, beyond_low = 0.01 + spread, max(0.01 - spread, 0.5 / n)
    return scale * math.log(beyond_high / beyond_low) / 2.0 / float(p99_ms)


def _largest(*values: float) -> float:
    """The largest of the values that are not missing (NaN when none is)."""
    return max((float(v) for v in values if not _missing(v)), default=math.nan)


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
    return LOWER_LATENCY if measured == {LOWER_LATENCY} else WITHIN


def _verdict(delta: float, threshold: float, up: str, down: str) -> str:
    if _missing(delta):
        return "n/a"
    if delta < -threshold:
        return down
    if delta > threshold:
        return up
    return WITHIN


def _status(results: pd.DataFrame, idx: list[int] | None) -> str:
    if not idx:
        return "absent"
    return str(results.loc[idx[-1], "status"])


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


def _judged(b: pd.Series, c: pd.Series, noises: tuple[float, float, float], min_effect: float, k: float) -> dict:
    """One matched point's deltas, thresholds and verdicts; `noises`: the combined noise of throughput, mean latency
    and p99."""
    t_noise, l_noise, p_noise = noises
    t_thr, l_thr, p_thr = (max(min_effect, k * x) for x in noises)
    t_delta, p_delta, a_delta = _rel(c[TPUT], b[TPUT]), _rel(c[P99], b[P99]), _rel(c[AVG_MS], b[AVG_MS])
    requests = min(p99_requests(b["window_requests"]), p99_requests(c["window_requests"]))
    tv = _verdict(t_delta, t_thr, FASTER, SLOWER)
    pv = UNDETERMINED if requests < MIN_P99_REQUESTS else _verdict(p_delta, p_thr, HIGHER_LATENCY, LOWER_LATENCY)
    av = _verdict(a_delta, l_thr, HIGHER_LATENCY, LOWER_LATENCY)
    moved = [tv] if tv not in (WITHIN, "n/a") else []
    moved += [f"{v.split()[0]} {name} latency" for name, v in (("p99", pv), ("mean", av)) if v in LATENCY_MOVES]
    moved += ["p99 undetermined"] if pv == UNDETERMINED else []
    return {
        "baseline_throughput": float(b[TPUT]),
        "candidate_throughput": float(c[TPUT]),
        "throughput_delta": t_delta,
        "throughput_noise": t_noise,
        "throughput_threshold": t_thr,
        "throughput_verdict": tv,
        "baseline_p99_ms": float(b[P99]),
        "candidate_p99_ms": float(c[P99]),
        "p99_delta": p_delta,
        "p99_noise": p_noise,
        "p99_threshold": p_thr,
        "p99_verdict": pv,
        "p99_requests": requests,
        "baseline_avg_ms": float(b[AVG_MS]),
        "candidate_avg_ms": float(c[AVG_MS]),
        "avg_delta": a_delta,
        "avg_verdict": av,
        "latency_noise": l_noise,
        "latency_threshold": l_thr,
        "latency_verdict": _latency_verdict(pv, av),
        "noise_assumed": bool(b["noise_assumed"] or c["noise_assumed"]),
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
    baseline: RunResults | str | Path, candidate: RunResults | str | Path, min_effect: float = 0.05, k: float = 3.0
) -> Comparison:
    """Match the two runs' points on `MATCH_KEYS` and judge each against its noise; see the module docstring."""
    base = baseline if isinstance(baseline, RunResults) else load_run(baseline)
    cand = candidate if isinstance(candidate, RunResults) else load_run(candidate)
    b_res, c_res = base.results, cand.results
    older = {k for k in RECENT_KEYS if not (_recorded(b_res, k) and _recorded(c_res, k))}
    b_keys, c_keys = _keyed(b_res, older), _keyed(c_res, older)

    rows, keys, unmatched = [], [], []
    for key in list(b_keys) + [key for key in c_keys if key not in b_keys]:
        bi, ci = b_keys.get(key), c_keys.get(key)
        b_status, c_status = _status(b_res, bi), _status(c_res, ci)
        kd = dict(zip(MATCH_KEYS, key))
        for name, idx in (("baseline", bi), ("candidate", ci)):
            if idx and len(idx) > 1:  # the last row counts; the others are listed, not dropped
                unmatched.append(
                    {
                        **kd,
                        "baseline_status": b_status,
                        "candidate_status": c_status,
                        "reason": f"{len(idx)} rows for this point in the {name}; the last one compared",
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
        b, c = b_res.loc[bi[-1]], c_res.loc[ci[-1]]
        noises = tuple(
            math.hypot(_noise(b_res, bi, col, metric), _noise(c_res, ci, col, metric))
            for col, metric in (("throughput_cv", TPUT), ("latency_cv", AVG_MS), ("p99_cv", P99))
        )
        rows.append({**kd, **_judged(b, c, noises, min_effect, k)})
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
    unmatched_df = pd.DataFrame(unmatched, columns=UNMATCHED_COLUMNS)
    points = pd.DataFrame(rows, columns=POINT_COLUMNS)
    comparison = Comparison(base.source, cand.source, min_effect, k, NO_CHANGE, "", points, unmatched_df)
    if points.empty and not failed:
        comparison.verdict = NOT_COMPARABLE
        comparison.reason = _not_comparable_reason(base.ok, cand.ok)
        comparison.summary = f"not comparable: {comparison.reason}"
        return comparison
    comparison.best = points[points["best"].astype(bool)]
    return _decide(comparison)


def _decide(c: Comparison) -> Comparison:
    """The verdict from the judged points and the lost ones (module docstring), and its summary."""
    points, lost = c.points, c.lost
    failed = lost.loc[lost["measured"].astype(bool)]
    tv, lv = points["throughput_verdict"], points["latency_verdict"]
    worse = (tv == SLOWER) | (lv == HIGHER_LATENCY)
    better = ~worse & ((tv == FASTER) | (lv == LOWER_LATENCY))
    is_best = points["best"].astype(bool)
    judged = len(points) + len(failed)
    undetermined_best = points[is_best & (points["p99_verdict"] == UNDETERMINED)]
    if (worse & is_best).any() or failed["best"].astype(bool).any() or worse.sum() + len(failed) > judged / 2:
        c.verdict = REGRESSION
    elif not lost.empty or not undetermined_best.empty:
        c.verdict = NOT_COMPARABLE
        c.reason = _undecided_reason(lost, undetermined_best)
    elif (better & is_best).any() or better.sum() > judged / 2:
        c.verdict = IMPROVEMENT
    c.summary = _summary(c, worse if c.verdict == REGRESSION else better)
    return c


def verdict_exit_code(comparison: Comparison) -> int:
    """0: no significant change or improvement; 1: regression; 2: not comparable."""
    return EXIT_CODES[comparison.verdict]


__all__ = [
    "EXIT_CODES",
    "FASTER",
    "HIGHER_LATENCY",
    "IMPROVEMENT",
    "LOWER_LATENCY",
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
