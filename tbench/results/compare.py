"""Compare two runs (or a run and a stored baseline) with a regression verdict that accounts for measurement noise.

A *baseline* is just a run folder: any folder (local path or fsspec URL, e.g. ``s3://bucket/runs/<run id>``) that
holds a ``results.parquet`` (or ``results.csv``) with the tidy result columns of `tbench.metrics.RESULT_COLUMNS` and,
for the noise, the perf_analyzer logs of its points under ``logs/perf_analyzer/`` (`tbench.layout.RunLayout`).
To keep a baseline, copy a run folder (or only those files) somewhere stable; nothing else is needed.

Noise of a point: perf_analyzer (count_windows mode, ``-v``) logs one "Pass [i] throughput: X infer/sec. Avg latency:
Y usec" line per measurement window and reports the average of the last 3 windows once they agree. The coefficient of
variation (sample standard deviation / mean) of throughput and of avg latency across those 3 windows, read from the log
of the attempt that counted (``source_file`` perf/X.csv -> logs/perf_analyzer/X.log), is the point's noise. A missing
or unreadable log is not an error: the point gets `DEFAULT_NOISE` and is flagged ``noise_assumed``.

Rule: a matched point is significantly slower (faster) when its throughput drops (rises) by more than
``max(min_effect, k * sqrt(cv_baseline^2 + cv_candidate^2))``; p99 latency gets the same rule for "higher latency"
("lower latency"), its noise being the avg latency windows' CV (perf_analyzer logs no per-window p99). The comparison is
a "regression" when the best-throughput point of any format x scenario (the baseline's best matched point) is
significantly slower, or more than half the matched points are; "improvement" symmetrically (a regression wins when
both hold); "not comparable" when no point matches; else "no significant change".

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
from tbench.core.metrics import RESULT_COLUMNS, THROUGHPUT
from tbench.core.storage import url_to_fs
from tbench.loadgen.perf_analyzer import DEFAULT_NOISE, STABLE_WINDOWS, Noise, noise_from_log

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
]
NUMERIC_KEYS = {"batch_size", "concurrency", "request_rate"}
P99 = "p99_ms"
TPUT = THROUGHPUT.column

REGRESSION, IMPROVEMENT, NO_CHANGE, NOT_COMPARABLE = (
    "regression",
    "improvement",
    "no significant change",
    "not comparable",
)
SLOWER, FASTER, WITHIN = "slower", "faster", "within noise"
HIGHER_LATENCY, LOWER_LATENCY = "higher latency", "lower latency"
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
    return tuple(_norm(c, row[c]) for c in MATCH_KEYS)


def _keyed(results: pd.DataFrame) -> dict[tuple, list[int]]:
    keys: dict[tuple, list[int]] = {}
    for i, row in results.iterrows():
        keys.setdefault(point_key(row), []).append(i)
    return keys


def _rel(new: float, old: float) -> float:
    if _missing(new) or _missing(old) or old == 0:
        return math.nan
    return float(new) / float(old) - 1.0


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
        parts.append(f"r{k['request_rate']:g}")
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
    "latency_noise",
    "latency_threshold",
    "latency_verdict",
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
    return "; ".join(diffs) if diffs else "no point measured in both runs (different batch sizes, concurrency or rates)"


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
        t_noise = math.hypot(b["throughput_cv"], c["throughput_cv"])
        l_noise = math.hypot(b["latency_cv"], c["latency_cv"])
        t_thr, l_thr = max(min_effect, k * t_noise), max(min_effect, k * l_noise)
        t_delta, l_delta = _rel(c[TPUT], b[TPUT]), _rel(c[P99], b[P99])
        tv = _verdict(t_delta, t_thr, FASTER, SLOWER)
        lv = _verdict(l_delta, l_thr, HIGHER_LATENCY, LOWER_LATENCY)
        both = [v for v in (tv, lv) if v not in (WITHIN, "n/a")]
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
                "p99_delta": l_delta,
                "latency_noise": l_noise,
                "latency_threshold": l_thr,
                "latency_verdict": lv,
                "noise_assumed": bool(b["noise_assumed"] or c["noise_assumed"]),
                "verdict": ", ".join(both) if both else WITHIN,
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
    n, n_slow, n_fast = (
        len(points),
        int((points["throughput_verdict"] == SLOWER).sum()),
        int((points["throughput_verdict"] == FASTER).sum()),
    )
    if (best["throughput_verdict"] == SLOWER).any() or n_slow > n / 2:
        comparison.verdict = REGRESSION
    elif (best["throughput_verdict"] == FASTER).any() or n_fast > n / 2:
        comparison.verdict = IMPROVEMENT
    comparison.summary = _summary(comparison, n_slow, n_fast)
    return comparison


def _summary(c: Comparison, n_slow: int, n_fast: int) -> str:
    best, n = c.best, len(c.points)
    many_formats = best["format"].nunique(dropna=False) > 1
    if c.verdict == REGRESSION:
        head, shown = "slower than the baseline", best[best["throughput_verdict"] == SLOWER]
    elif c.verdict == IMPROVEMENT:
        head, shown = "faster than the baseline", best[best["throughput_verdict"] == FASTER]
    else:
        head, shown = "no significant change against the baseline", best
    if (
        shown.empty and not best.empty
    ):  # the verdict comes from the majority rule: show the largest move among the best points
        shown = best.loc[[best["throughput_delta"].abs().fillna(-1).idxmax()]]
    parts = []
    for _, p in shown.iterrows():
        label = f"{p['format']} {p['scenario']}" if many_formats else f"{p['scenario']}"
        parts.append(
            f"{label} best {_fmt_num(p['baseline_throughput'])} -> {_fmt_num(p['candidate_throughput'])} infer/s "
            f"({_pct(p['throughput_delta'])}, noise ±{_pct(p['throughput_noise'], sign=False)})"
        )
    counts = f"{n_slow} of {n} points slower" if c.verdict != IMPROVEMENT else f"{n_fast} of {n} points faster"
    if c.verdict == NO_CHANGE:
        counts = f"{n_slow} of {n} points slower, {n_fast} faster"
    n_lat = int((c.points["latency_verdict"] == HIGHER_LATENCY).sum())
    if n_lat:
        counts += f", {n_lat} with higher p99 latency"
    n_left = int((~c.unmatched["compared"].astype(bool)).sum())
    extra = f"; {n_left} not compared" if n_left else ""
    return f"{head}: {'; '.join(parts)}; {counts}{extra}"


def verdict_exit_code(comparison: Comparison) -> int:
    """0: no significant change or improvement; 1: regression; 2: not comparable."""
    return EXIT_CODES[comparison.verdict]


# --- markdown and plot ------------------------------------------------------------------------------------------------


def _load_label(p) -> str:
    if not _missing(p["request_rate"]):
        return f"rate {p['request_rate']:g}/s"
    return "" if _missing(p["concurrency"]) else f"{p['concurrency']:g}"


def rule_sentence(min_effect: float, k: float) -> str:
    return (
        f"A point is significantly slower (faster) when its throughput drops (rises) by more than "
        f"max({100 * min_effect:g}%, {k:g} × noise), the noise being sqrt(CV_baseline² + CV_candidate²) over the "
        f"{STABLE_WINDOWS} windows perf_analyzer averaged (p99 latency likewise, with the avg latency windows' CV); "
        f"the run regresses when a format × scenario's best-throughput point, or more than half the matched points, "
        f"are significantly slower."
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
                    "p99 noise": f"±{_pct(p['latency_noise'], sign=False)}{star}",
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


COLOURS = {SLOWER: "#d62728", FASTER: "#2ca02c", WITHIN: "#9e9e9e", "n/a": "#9e9e9e"}


def plot_comparison(comparison: Comparison, path: str | Path) -> Path:
    """Per-point throughput delta % bars, error bars ± the point's threshold (max(min_effect, k × noise)): a bar whose
    error bar crosses 0 is within noise; coloured by verdict, hatched where the noise is assumed."""
    import matplotlib

    matplotlib.use("Agg")  # no screen on workers
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    c = comparison
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    many_formats = c.points["format"].nunique(dropna=False) > 1
    labels = [_describe_key(tuple(p[k] for k in MATCH_KEYS), formats=many_formats) for _, p in c.points.iterrows()]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(labels) + 2), 3.8))
    if c.points.empty:
        ax.text(0.5, 0.5, f"{c.verdict}: {c.reason}", ha="center", va="center", wrap=True, fontsize=9)
        ax.set_axis_off()
    else:
        x = np.arange(len(labels))
        deltas = 100 * c.points["throughput_delta"].fillna(0).to_numpy()
        bars = ax.bar(
            x,
            deltas,
            yerr=100 * c.points["throughput_threshold"].to_numpy(),
            capsize=4,
            color=[COLOURS.get(v, "#9e9e9e") for v in c.points["throughput_verdict"]],
            edgecolor="black",
            linewidth=0.5,
        )
        for bar, assumed in zip(bars, c.points["noise_assumed"]):
            if assumed:
                bar.set_hatch("//")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("Throughput change vs baseline (%)")
        ax.legend(handles=[Patch(color=COLOURS[v], label=v) for v in (SLOWER, WITHIN, FASTER)], fontsize=7, loc="best")
    ax.set_title(f"{c.verdict} (error bars: ± max({100 * c.min_effect:g}%, {c.k:g} × noise))", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
