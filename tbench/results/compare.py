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
noise is the larger of that CV and the p99's own standard error from its sample size (`p99_standard_error`: a sample
quantile's asymptotic standard error, the tail's density from the point's p95..p99). Where a run's table holds several
rows of the same point (repeats), the spread (CV) of their throughput, p99 and avg latency is the noise where it is
larger. A missing or unreadable log is not an error: the point gets `DEFAULT_NOISE` and is flagged ``noise_assumed``.

Rule: each matched point's change of throughput, p99 latency (``p99_ms``) and mean latency (``avg_ms``) is significant
when it exceeds ``max(min_effect, k * sqrt(noise_baseline^2 + noise_candidate^2))`` with each metric's own noise. A
point is *worse* when its throughput is significantly lower or its p99 or mean latency significantly higher, *better*
when it is not worse and its throughput is significantly higher or both its latencies significantly lower. The
comparison is a "regression" when the best-throughput point of any format x scenario (the baseline's best matched
point) is worse, or more than half the matched points are; "improvement" symmetrically with better (a regression wins
when both hold); "not comparable" when no point matches; else "no significant change". Latency counts in every
scenario: in the rate scenario throughput is the offered rate whenever the server keeps up, so latency is what shows a
slower server. Points match on `MATCH_KEYS`; constant and Poisson arrivals at the same rate are different points.

Plain functions, pandas and matplotlib (Agg); no Prefect. `verdict_exit_code` gives CI/nightly jobs a status to gate on;
``tbench compare BASELINE CANDIDATE`` prints the summary, writes the section and plot, and exits with it.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tbench.core.layout import perf_log_for
from tbench.core.metrics import AVG, RESULT_COLUMNS, THROUGHPUT
from tbench.core.storage import url_to_fs
from tbench.loadgen.perf_analyzer import DEFAULT_NOISE, STABLE_WINDOWS, Noise, cv, noise_from_log

MATCH_KEYS = [
    "model",
    "model_size",
    "format",
    "scenario",
    "precision",
    "gpu",
    "batch_size",
    "concurrency",
    "request_rate",
    "request_distribution",
]
NUMERIC_KEYS = {"batch_size", "concurrency", "request_rate"}
P99 = "p99_ms"
AVG_MS = AVG.column
TPUT = THROUGHPUT.column

REGRESSION, IMPROVEMENT, NO_CHANGE, NOT_COMPARABLE = (
    "regression",
    "improvement",
    "no significant change",
    "not comparable",
)
SLOWER, FASTER, WITHIN = "slower", "faster", "within noise"
HIGHER_LATENCY, LOWER_LATENCY = "higher latency", "lower latency"
LATENCY_MOVES = (HIGHER_LATENCY, LOWER_LATENCY)
EXIT_CODES = {NO_CHANGE: 0, IMPROVEMENT: 0, REGRESSION: 1, NOT_COMPARABLE: 2}


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
    results["throughput_cv"] = [n.throughput_cv for n in noise]
    results["latency_cv"] = [n.latency_cv for n in noise]
    results["p99_cv"] = [
        _largest(n.latency_cv, p99_standard_error(row["p95_ms"], row["p99_ms"], row["window_requests"]))
        for n, (_, row) in zip(noise, results.iterrows())
    ]
    results["noise_windows"] = [n.windows for n in noise]
    results["noise_assumed"] = [n.assumed for n in noise]
    results["noise_note"] = [n.note for n in noise]
    name = posixpath.basename(root.rstrip("/")) or source
    return RunResults(source=source, name=name, results=results)


# --- matching and verdicts --------------------------------------------------------------------------------------------


def _missing(v) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    try:
        return bool(isinstance(v, float) and math.isnan(v)) or (isinstance(v, np.floating) and np.isnan(v))
    except TypeError:
        return False


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


def _keyed(results: pd.DataFrame) -> dict[tuple, list[int]]:
    keys: dict[tuple, list[int]] = {}
    for i, row in results.iterrows():
        keys.setdefault(point_key(row), []).append(i)
    return keys


def _rel(new: float, old: float) -> float:
    if _missing(new) or _missing(old) or old == 0:
        return math.nan
    return float(new) / float(old) - 1.0


def p99_standard_error(p95_ms: float, p99_ms: float, window_requests: float) -> float:
    """The relative standard error of a p99 measured from the merged windows' requests: a sample quantile's
    asymptotic standard error sqrt(p(1-p)/n) / f(x_p), the density at the tail taken from the point's own p95..p99
    (f ~ 0.04 / (p99 - p95)). perf_analyzer logs no per-window p99, and the windows' average latency is far steadier
    than their tail; NaN where the point lacks the numbers."""
    values = [p95_ms, p99_ms, window_requests]
    if any(_missing(v) for v in values) or p99_ms <= 0 or window_requests <= 0:
        return math.nan
    n = STABLE_WINDOWS * float(window_requests)
    return math.sqrt(0.99 * 0.01 / n) * max(float(p99_ms) - float(p95_ms), 0.0) / 0.04 / float(p99_ms)


def _largest(*values: float) -> float:
    """The largest of the values that are not missing (NaN when none is)."""
    return max((float(v) for v in values if not _missing(v)), default=math.nan)


def _noise(results: pd.DataFrame, idx: list[int], cv_column: str, *metrics: str) -> float:
    """One run's noise of a point: its windows' CV (`cv_column` of the row compared, the last), or the spread of the
    run's repeats of the point (its ok rows) where that is larger: repeats show what windows of one call cannot."""
    ok = results.loc[idx]
    ok = ok[ok["status"] == "ok"]
    return _largest(results.loc[idx[-1], cv_column], *(cv(ok[m].dropna()) for m in metrics))


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


def _describe_key(key: tuple, formats: bool = True) -> str:
    k = {c: (None if _missing(v) else v) for c, v in zip(MATCH_KEYS, key)}
    parts = [k["format"]] if formats and k["format"] else []
    parts.append(k["scenario"] or "?")
    if k["batch_size"] is not None:
        parts.append(f"b{k['batch_size']:g}")
    if k["concurrency"] is not None:
        parts.append(f"c{k['concurrency']:g}")
    if k["request_rate"] is not None:
        parts.append(f"r{k['request_rate']:g}" + (f" {k['request_distribution']}" if k["request_distribution"] else ""))
    return " ".join(parts)


@dataclass
class Comparison:
    baseline: str  # sources, as given
    candidate: str
    min_effect: float
    k: float
    verdict: str  # regression | improvement | no significant change | not comparable
    summary: str  # one line
    points: pd.DataFrame  # matched ok points: values, deltas, noise, thresholds, verdicts
    unmatched: pd.DataFrame  # points not compared, and why (plus duplicated points: compared=True, the last row used)
    best: pd.DataFrame = field(default_factory=pd.DataFrame)  # per format x scenario: the best-throughput point
    reason: str = ""  # why not comparable

    @property
    def slower(self) -> pd.DataFrame:
        return self.points[self.points["throughput_verdict"] == SLOWER]

    @property
    def faster(self) -> pd.DataFrame:
        return self.points[self.points["throughput_verdict"] == FASTER]


POINT_COLUMNS = [
    *MATCH_KEYS,
    "baseline_throughput",
    "candidate_throughput",
    "throughput_delta",
    "throughput_noise",
    "throughput_threshold",
    "throughput_verdict",
    "baseline_p99_ms",
    "candidate_p99_ms",
    "p99_delta",
    "p99_noise",
    "p99_threshold",
    "p99_verdict",
    "baseline_avg_ms",
    "candidate_avg_ms",
    "avg_delta",
    "avg_verdict",
    "latency_noise",
    "latency_threshold",
    "latency_verdict",  # of p99 and mean together: higher if either rose, lower if both fell
    "noise_assumed",
    "verdict",
]
UNMATCHED_COLUMNS = [*MATCH_KEYS, "baseline_status", "candidate_status", "reason", "compared"]


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


def _fmt_num(x: float) -> str:
    return "?" if _missing(x) else (f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}")


def _pct(x: float, sign: bool = True) -> str:
    return "n/a" if _missing(x) else (f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%")


def compare_runs(
    baseline: RunResults | str | Path, candidate: RunResults | str | Path, min_effect: float = 0.05, k: float = 3.0
) -> Comparison:
    """Match the two runs' points on `MATCH_KEYS` and judge each against its noise; see the module docstring."""
    base = baseline if isinstance(baseline, RunResults) else load_run(baseline)
    cand = candidate if isinstance(candidate, RunResults) else load_run(candidate)
    b_res, c_res = base.results, cand.results
    b_keys, c_keys = _keyed(b_res), _keyed(c_res)

    rows, unmatched = [], []
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
                    }
                )
        if b_status != "ok" or c_status != "ok":
            if bi is None:
                reason = "only in the candidate" + ("" if c_status == "ok" else f" ({c_status})")
            elif ci is None:
                reason = "only in the baseline" + ("" if b_status == "ok" else f" ({b_status})")
            else:
                bad = [
                    f"{c_status} in the candidate" if c_status != "ok" else "",
                    f"{b_status} in the baseline" if b_status != "ok" else "",
                ]
                reason = ", ".join(x for x in bad if x)
                errors = [
                    str(r.loc[i[-1], "error"])
                    for r, i in ((c_res, ci), (b_res, bi))
                    if str(r.loc[i[-1], "status"]) != "ok"
                    and not _missing(r.loc[i[-1], "error"])
                    and str(r.loc[i[-1], "error"])
                ]
                if errors:
                    reason += f": {errors[0]}"
            unmatched.append(
                {**kd, "baseline_status": b_status, "candidate_status": c_status, "reason": reason, "compared": False}
            )
            continue
        b, c = b_res.loc[bi[-1]], c_res.loc[ci[-1]]
        t_noise = math.hypot(_noise(b_res, bi, "throughput_cv", TPUT), _noise(c_res, ci, "throughput_cv", TPUT))
        l_noise = math.hypot(_noise(b_res, bi, "latency_cv", AVG_MS), _noise(c_res, ci, "latency_cv", AVG_MS))
        p_noise = math.hypot(_noise(b_res, bi, "p99_cv", P99), _noise(c_res, ci, "p99_cv", P99))
        t_thr, l_thr, p_thr = (max(min_effect, k * x) for x in (t_noise, l_noise, p_noise))
        t_delta, p_delta, a_delta = _rel(c[TPUT], b[TPUT]), _rel(c[P99], b[P99]), _rel(c[AVG_MS], b[AVG_MS])
        tv = _verdict(t_delta, t_thr, FASTER, SLOWER)
        pv = _verdict(p_delta, p_thr, HIGHER_LATENCY, LOWER_LATENCY)
        av = _verdict(a_delta, l_thr, HIGHER_LATENCY, LOWER_LATENCY)
        moved = [tv] if tv not in (WITHIN, "n/a") else []
        moved += [f"{v.split()[0]} {name} latency" for name, v in (("p99", pv), ("mean", av)) if v in LATENCY_MOVES]
        rows.append(
            {
                **kd,
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
        )
    points = pd.DataFrame(rows, columns=POINT_COLUMNS)
    unmatched_df = pd.DataFrame(unmatched, columns=UNMATCHED_COLUMNS)
    comparison = Comparison(base.source, cand.source, min_effect, k, NO_CHANGE, "", points, unmatched_df)

    if points.empty:
        comparison.verdict = NOT_COMPARABLE
        comparison.reason = _not_comparable_reason(base.ok, cand.ok)
        comparison.summary = f"not comparable: {comparison.reason}"
        return comparison

    # the baseline's best matched point per format x scenario: the scenario's headline number
    groups = points.assign(_f=points["format"].fillna(""), _s=points["scenario"].fillna(""))
    groups = groups[groups["baseline_throughput"].notna()]
    best = points.loc[
        groups.groupby(["_f", "_s"], sort=True)["baseline_throughput"].idxmax()
    ]  # keeps the points' index
    comparison.best = best
    tv, lv = points["throughput_verdict"], points["latency_verdict"]
    worse = (tv == SLOWER) | (lv == HIGHER_LATENCY)
    better = ~worse & ((tv == FASTER) | (lv == LOWER_LATENCY))
    is_best = points.index.isin(best.index)
    if (worse & is_best).any() or worse.sum() > len(points) / 2:
        comparison.verdict = REGRESSION
    elif (better & is_best).any() or better.sum() > len(points) / 2:
        comparison.verdict = IMPROVEMENT
    comparison.summary = _summary(comparison, worse if comparison.verdict == REGRESSION else better)
    return comparison


SIDES = {REGRESSION: (SLOWER, HIGHER_LATENCY), IMPROVEMENT: (FASTER, LOWER_LATENCY)}
LATENCIES = {"p99": "p99", "mean": "avg"}  # as the summary names them -> their columns' stem
LATENCY_NOISE = {"p99": "p99_noise", "mean": "latency_noise"}


def _where(p, formats: bool) -> str:
    """A point in words: 'rate 100/s poisson', 'offline batch 64 concurrency 1'."""
    parts = [str(p["format"])] if formats and not _missing(p["format"]) else []
    if not _missing(p["request_rate"]):
        return " ".join([*parts, _load_label(p)])
    parts.append(str(p["scenario"]))
    parts += [
        f"{w} {p[col]:g}"
        for w, col in (("batch", "batch_size"), ("concurrency", "concurrency"))
        if not _missing(p[col])
    ]
    return " ".join(parts)


def _moves(p, verdict: str) -> tuple[bool, list[str]]:
    """What the summary shows of a point: whether its throughput, and which latencies (the metrics that made the
    verdict; p99 beside throughput when nothing changed)."""
    if verdict not in SIDES:
        return True, [] if _missing(p["p99_delta"]) else ["p99"]
    thr, lat = SIDES[verdict]
    lats = [n for n, stem in LATENCIES.items() if p[f"{stem}_verdict"] == lat] if p["latency_verdict"] == lat else []
    return p["throughput_verdict"] == thr, lats


def _size(p, verdict: str) -> float:
    """The largest relative change among what the summary shows of a point."""
    shows_throughput, lats = _moves(p, verdict)
    moves = [p["throughput_delta"]] * shows_throughput + [p[f"{LATENCIES[n]}_delta"] for n in lats]
    return max((abs(x) for x in moves if not _missing(x)), default=0.0)


def _part(p, verdict: str, best: bool, formats: bool) -> str:
    shows_throughput, lats = _moves(p, verdict)
    latency = " and ".join(
        f"{n} latency {_fmt_num(p[f'baseline_{LATENCIES[n]}_ms'])} -> {_fmt_num(p[f'candidate_{LATENCIES[n]}_ms'])} ms "
        f"({_pct(p[f'{LATENCIES[n]}_delta'])}, noise ±{_pct(p[LATENCY_NOISE[n]], sign=False)})"
        for n in lats
    )
    if not shows_throughput:
        return f"{latency} at {_where(p, formats)}"
    if best:
        label = (f"{p['format']} {p['scenario']}" if formats else str(p["scenario"])) + " best"
    else:
        label = _where(p, formats)
    text = (
        f"{label} {_fmt_num(p['baseline_throughput'])} -> {_fmt_num(p['candidate_throughput'])} infer/s "
        f"({_pct(p['throughput_delta'])}, noise ±{_pct(p['throughput_noise'], sign=False)})"
    )
    return f"{text}, {latency}" if latency else text


def _summary(c: Comparison, flagged: pd.Series) -> str:
    """One line: the verdict, the points and metrics that made it, the counts. `flagged`: the points worse (for a
    regression) or better (for an improvement) than the baseline."""
    best, pts, n = c.best, c.points, len(c.points)
    many_formats = best["format"].nunique(dropna=False) > 1
    if c.verdict in SIDES:
        shown = pts[flagged & pts.index.isin(best.index)]
        if shown.empty:  # the majority rule decided: show its largest move
            shown = pts.loc[[pts[flagged].apply(_size, axis=1, verdict=c.verdict).idxmax()]]
        thr, lat = SIDES[c.verdict]
        kinds = [v for v, col in ((thr, "throughput_verdict"), (lat, "latency_verdict")) if (shown[col] == v).any()]
        head = f"{' and '.join(kinds)} than the baseline"
    else:
        head, shown = "no significant change against the baseline", best
    parts = [_part(p, c.verdict, i in best.index, many_formats) for i, p in shown.iterrows()]
    n_slow, n_fast = int((pts["throughput_verdict"] == SLOWER).sum()), int((pts["throughput_verdict"] == FASTER).sum())
    counts = f"{n_slow} of {n} points slower" if c.verdict != IMPROVEMENT else f"{n_fast} of {n} points faster"
    if c.verdict == NO_CHANGE:
        counts = f"{n_slow} of {n} points slower, {n_fast} faster"
    for v in (HIGHER_LATENCY, LOWER_LATENCY):
        if n_lat := int((pts["latency_verdict"] == v).sum()):
            counts += f", {n_lat} with {v}"
    n_left = int((~c.unmatched["compared"].astype(bool)).sum())
    extra = f"; {n_left} not compared" if n_left else ""
    return f"{head}: {'; '.join(parts)}; {counts}{extra}"


def verdict_exit_code(comparison: Comparison) -> int:
    """0: no significant change or improvement; 1: regression; 2: not comparable."""
    return EXIT_CODES[comparison.verdict]


# --- markdown and plot ------------------------------------------------------------------------------------------------


def _load_label(p) -> str:
    if not _missing(p["request_rate"]):
        dist = p.get("request_distribution")
        return f"rate {p['request_rate']:g}/s" + ("" if _missing(dist) or not str(dist).strip() else f" {dist}")
    return "" if _missing(p["concurrency"]) else f"{p['concurrency']:g}"


def rule_sentence(min_effect: float, k: float) -> str:
    return (
        f"A change of a point's throughput, p99 or mean latency is significant beyond "
        f"max({100 * min_effect:g}%, {k:g} × noise), the noise being sqrt(CV_baseline² + CV_candidate²) over the "
        f"{STABLE_WINDOWS} windows perf_analyzer averaged (for p99, its standard error from its sample size where "
        f"larger; the spread of a run's repeats of the point where larger still). "
        f"A point is worse when its throughput is significantly lower or either latency significantly higher; better "
        f"when not worse and faster, or both latencies lower. The run regresses (improves) when a format × scenario's "
        f"best-throughput point, or more than half the matched points, are worse (better); a regression wins."
    )


def comparison_markdown(comparison: Comparison, title: str = "Comparison against the baseline") -> str:
    c = comparison
    lines = [
        f"## {title}",
        "",
        f"**Verdict: {c.verdict}** — {c.summary}",
        "",
        f"Baseline: `{c.baseline}` · Candidate: `{c.candidate}`",
        "",
        rule_sentence(c.min_effect, c.k),
        "",
    ]
    if not c.points.empty:
        table = []
        for i, p in c.points.iterrows():
            star = "*" if p["noise_assumed"] else ""
            table.append(
                {
                    "Format": p["format"],
                    "Scenario": p["scenario"],
                    "Batch": _fmt_num(p["batch_size"]),
                    "Concurrency / rate": _load_label(p),
                    "Baseline infer/s": _fmt_num(p["baseline_throughput"]),
                    "Candidate infer/s": _fmt_num(p["candidate_throughput"]),
                    "Δ throughput": _pct(p["throughput_delta"]),
                    "Noise": f"±{_pct(p['throughput_noise'], sign=False)}{star}",
                    "Threshold": _pct(p["throughput_threshold"], sign=False),
                    "Baseline p99 ms": _fmt_num(p["baseline_p99_ms"]),
                    "Candidate p99 ms": _fmt_num(p["candidate_p99_ms"]),
                    "Δ p99": _pct(p["p99_delta"]),
                    "p99 noise": f"±{_pct(p['p99_noise'], sign=False)}{star}",
                    "Baseline avg ms": _fmt_num(p["baseline_avg_ms"]),
                    "Candidate avg ms": _fmt_num(p["candidate_avg_ms"]),
                    "Δ avg": _pct(p["avg_delta"]),
                    "Avg noise": f"±{_pct(p['latency_noise'], sign=False)}{star}",
                    "Verdict": p["verdict"] + (" (best)" if i in c.best.index else ""),
                }
            )
        lines += [pd.DataFrame(table).to_markdown(index=False), ""]
        if c.points["noise_assumed"].any():
            lines += ["\\* noise assumed: no perf_analyzer log for the point in one of the runs.", ""]
    if c.verdict == NOT_COMPARABLE:
        lines += [f"Not comparable: {c.reason}.", ""]
    if not c.unmatched.empty:
        rows = [
            {
                "Model": u["model"],
                "Format": u["format"],
                "Scenario": u["scenario"],
                "Batch": _fmt_num(u["batch_size"]),
                "Concurrency / rate": _load_label(u),
                "Baseline": u["baseline_status"],
                "Candidate": u["candidate_status"],
                "Why not compared": u["reason"],
            }
            for _, u in c.unmatched.iterrows()
        ]
        lines += ["### Points not compared", "", pd.DataFrame(rows).to_markdown(index=False), ""]
    return "\n".join(lines)


COLOURS = {
    SLOWER: "#d62728",
    HIGHER_LATENCY: "#d62728",
    FASTER: "#2ca02c",
    LOWER_LATENCY: "#2ca02c",
    WITHIN: "#9e9e9e",
    "n/a": "#9e9e9e",
}
# the plot's panels: (delta column, threshold column, verdict column, axis label, legend's verdicts worse -> better)
PANELS = [
    ("throughput_delta", "throughput_threshold", "throughput_verdict", "Throughput", (SLOWER, WITHIN, FASTER)),
    ("p99_delta", "p99_threshold", "p99_verdict", "p99 latency", (HIGHER_LATENCY, WITHIN, LOWER_LATENCY)),
    ("avg_delta", "latency_threshold", "avg_verdict", "Mean latency", (HIGHER_LATENCY, WITHIN, LOWER_LATENCY)),
]


def plot_comparison(comparison: Comparison, path: str | Path) -> Path:
    """Per-point delta % bars of throughput, p99 and mean latency (one panel each, since any of them can make the
    verdict), error bars ± the point's threshold (max(min_effect, k × noise)): a bar whose error bar crosses 0 is
    within noise; coloured by verdict, hatched where the noise is assumed."""
    import matplotlib

    matplotlib.use("Agg")  # no screen on workers
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    c = comparison
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    many_formats = c.points["format"].nunique(dropna=False) > 1
    labels = [_describe_key(tuple(p[k] for k in MATCH_KEYS), formats=many_formats) for _, p in c.points.iterrows()]
    width = max(4.0, 0.7 * len(labels) + 2)
    if c.points.empty:
        fig, ax = plt.subplots(figsize=(width, 3.8))
        ax.text(0.5, 0.5, f"{c.verdict}: {c.reason}", ha="center", va="center", wrap=True, fontsize=9)
        ax.set_axis_off()
        axes = [ax]
    else:
        fig, axes = plt.subplots(len(PANELS), 1, sharex=True, figsize=(width, 2.6 * len(PANELS) + 1))
        x = np.arange(len(labels))
        for ax, (delta, threshold, verdict, name, legend) in zip(axes, PANELS):
            bars = ax.bar(
                x,
                100 * c.points[delta].fillna(0).to_numpy(),
                yerr=100 * c.points[threshold].to_numpy(),
                capsize=4,
                color=[COLOURS.get(v, "#9e9e9e") for v in c.points[verdict]],
                edgecolor="black",
                linewidth=0.5,
            )
            for bar, assumed in zip(bars, c.points["noise_assumed"]):
                if assumed:
                    bar.set_hatch("//")
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_ylabel(f"{name} change (%)", fontsize=8)
            ax.legend(handles=[Patch(color=COLOURS[v], label=v) for v in legend], fontsize=7, loc="best")
        axes[-1].set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    axes[0].set_title(f"{c.verdict} (error bars: ± max({100 * c.min_effect:g}%, {c.k:g} × noise))", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
