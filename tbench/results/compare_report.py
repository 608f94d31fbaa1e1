"""`tbench compare`'s words and pictures: the one-line summary, the markdown section and the plot of a `Comparison`
(the rule is tbench.results.compare, which re-exports these names; the vocabulary tbench.results.comparison)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tbench.loadgen.perf_analyzer import STABLE_WINDOWS
from tbench.results.comparison import (
    FASTER,
    HIGHER_LATENCY,
    IMPROVEMENT,
    LOWER_LATENCY,
    MATCH_KEYS,
    MIN_P99_REQUESTS,
    NO_CHANGE,
    NOT_COMPARABLE,
    REGRESSION,
    SLOWER,
    UNDETERMINED,
    WITHIN,
    Comparison,
    _missing,
    too_few_p99_requests,
)


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


def _fmt_num(x: float) -> str:
    return "?" if _missing(x) else (f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}")


def _pct(x: float, sign: bool = True) -> str:
    return "n/a" if _missing(x) else (f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%")


# --- the summary line ------------------------------------------------------------------------------------------


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


def _many_formats(c: Comparison) -> bool:
    return len({*c.points["format"].tolist(), *c.lost["format"].tolist()}) > 1


def _lost_text(lost: pd.DataFrame, formats: bool, shown: int = 5) -> str:
    """The points the candidate lost, named: 'the candidate lost 1 point ok in the baseline: online concurrency 8
    (best; error in the candidate: CUDA out of memory)'."""
    names = [
        f"{_where(u, formats)} ({'best; ' if u['best'] else ''}"
        f"{u['reason'] if u['measured'] else 'not measured by the candidate'})"
        for _, u in lost.iterrows()
    ]
    more = [f"and {len(names) - shown} more"] if len(names) > shown else []
    noun = "point" if len(names) == 1 else "points"
    return f"the candidate lost {len(names)} {noun} ok in the baseline: {', '.join(names[:shown] + more)}"


def _undetermined_text(points: pd.DataFrame, formats: bool) -> str:
    """'p99 undetermined at rate 10/s poisson (48 requests; a p99 needs at least 150)'."""
    names = [f"{_where(p, formats)} ({p['p99_requests']:g} requests" for _, p in points.iterrows()]
    return f"p99 undetermined at {', '.join(n + ')' for n in names)}; a p99 needs at least {MIN_P99_REQUESTS} requests"


def _undecided_reason(lost: pd.DataFrame, undetermined_best: pd.DataFrame) -> str:
    """Why a comparison that found nothing worse cannot pass: points lost (not measured, or not ok, in the
    candidate) or a best point whose p99 its requests cannot decide."""
    formats = pd.concat([lost["format"], undetermined_best["format"]]).nunique(dropna=False) > 1
    parts = [_lost_text(lost, formats)] if not lost.empty else []
    parts += [_undetermined_text(undetermined_best, formats)] if not undetermined_best.empty else []
    return "; ".join(parts)


def _counts(c: Comparison) -> str:
    pts, n = c.points, len(c.points)
    n_slow, n_fast = int((pts["throughput_verdict"] == SLOWER).sum()), int((pts["throughput_verdict"] == FASTER).sum())
    counts = f"{n_slow} of {n} points slower" if c.verdict != IMPROVEMENT else f"{n_fast} of {n} points faster"
    if c.verdict in (NO_CHANGE, NOT_COMPARABLE, UNDETERMINED):
        counts = f"{n_slow} of {n} points slower, {n_fast} faster"
    for v in (HIGHER_LATENCY, LOWER_LATENCY):
        if n_lat := int((pts["latency_verdict"] == v).sum()):
            counts += f", {n_lat} with {v}"
    if n_lost := len(c.lost):
        counts += f", {n_lost} lost"
    n_left = int((~c.unmatched["compared"].astype(bool)).sum()) - n_lost
    return counts + (f"; {n_left} not compared" if n_left else "")


def _summary(c: Comparison, flagged: pd.Series) -> str:
    """One line: the verdict, the points and metrics that made it (and every point lost), the counts. `flagged`: the
    points worse (for a regression) or better (for an improvement) than the baseline."""
    best, pts = c.best, c.points
    formats = _many_formats(c)
    if c.verdict in (NOT_COMPARABLE, UNDETERMINED):
        return f"{c.verdict}: {c.reason}; {_counts(c)}"
    shown, head = best, "no significant change against the baseline"
    if c.verdict in SIDES:
        shown = pts[flagged & pts.index.isin(best.index)]
        if shown.empty and flagged.any():  # the majority rule decided: show its largest move
            shown = pts.loc[[pts[flagged].apply(_size, axis=1, verdict=c.verdict).idxmax()]]
        thr, lat = SIDES[c.verdict]
        kinds = [v for v, col in ((thr, "throughput_verdict"), (lat, "latency_verdict")) if (shown[col] == v).any()]
        head = f"{' and '.join(kinds)} than the baseline" if kinds else c.verdict
    parts = [_part(p, c.verdict, i in best.index, formats) for i, p in shown.iterrows()]
    parts += [_lost_text(c.lost, formats)] if not c.lost.empty else []
    few = too_few_p99_requests(pts)  # the spread's cases are the reason's
    undetermined = pts[(pts["p99_verdict"] == UNDETERMINED) & few]
    parts += [_undetermined_text(undetermined, formats)] if not undetermined.empty else []
    return f"{head}: {'; '.join(parts)}; {_counts(c)}"


# --- markdown and plot ------------------------------------------------------------------------------------------------


def _load_label(p) -> str:
    if not _missing(p["request_rate"]):
        dist = p.get("request_distribution")
        return f"rate {p['request_rate']:g}/s" + ("" if _missing(dist) or not str(dist).strip() else f" {dist}")
    return "" if _missing(p["concurrency"]) else f"{p['concurrency']:g}"


def rule_sentence(min_effect: float, k: float, min_effect_p99: float | None = None) -> str:
    p99 = "" if min_effect_p99 is None else f" ({100 * min_effect_p99:g}% for the p99)"
    return (
        f"A point's figure is the geometric mean of its trials (each a server process of its own). "
        f"A change of a point's throughput, p99 or mean latency, as the log of its ratio (as far up as down), is "
        f"significant beyond max({100 * min_effect:g}%{p99}, the run-to-run threshold, {k:g} × noise): the run-to-run "
        f"threshold is Welch's test on the spread between trials (a paired test on the rounds' ratios for the two "
        f"sides of one A/B session, `tbench run --against`; or a stated --run-cv); without either, nothing is "
        f"decided "
        f"(undetermined), nor is a change the spread cannot resolve. The noise is sqrt(CV_baseline² + "
        f"CV_candidate²) over the "
        f"{STABLE_WINDOWS} windows perf_analyzer averaged (for p99, its standard error from its sample size where "
        f"larger; the spread of a run's repeats of the point where larger still). "
        f"A point is worse when its throughput is significantly lower or either latency significantly higher; better "
        f"when not worse and faster, or both latencies lower. The run regresses (improves) when a format × scenario's "
        f"best-throughput point, or more than half the points, are worse (better); a regression wins. A point ok in "
        f"the baseline and not ok in the candidate is lost: lost at a best point or at most points, the run regresses; "
        f"otherwise, or not measured by the candidate, the runs are not comparable. A p99 from fewer than "
        f"{MIN_P99_REQUESTS} requests is {UNDETERMINED} (near the sample's largest); at a best point the runs are "
        f"not comparable unless something else regressed."
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
        rule_sentence(c.min_effect, c.k, c.min_effect_p99),
        "",
    ]
    if not c.points.empty:
        table = []
        for _, p in c.points.iterrows():
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
                    "Verdict": p["verdict"] + (" (best)" if p["best"] else ""),
                }
            )
        lines += [pd.DataFrame(table).to_markdown(index=False), ""]
        if c.points["noise_assumed"].any():
            lines += ["\\* noise assumed: no perf_analyzer log for the point in one of the runs.", ""]
    if c.verdict in (NOT_COMPARABLE, UNDETERMINED):
        lines += [f"{c.verdict.capitalize()}: {c.reason}.", ""]
    if c.spread:
        lines += [f"Judged against the {c.spread}.", ""]
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
                "Why not compared": ("lost (best): " if u["best"] else "lost: " if u["lost"] else "") + u["reason"],
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
