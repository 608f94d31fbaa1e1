"""The history as a static site that needs no server (`tbench history ROOT --output DIR`): an index of every series
with its newest value and trend, one page per model with each series' plot (changes marked, each run's noise as an
error bar) and a table of its runs linked to their reports, and a page of the regressions with what differed and the
points the runs lost (tbench.history.lost).

Written into a local folder, or into the artifact root itself (any fsspec URL) next to the runs it links to.
"""

from __future__ import annotations

import html
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tbench.core.storage import is_remote, join, url_to_fs  # noqa: E402
from tbench.history.analysis import MIN_RUNS, REGRESSION, UNDETERMINED, Finding, History  # noqa: E402
from tbench.history.series import Series  # noqa: E402

STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}
th{background:#f4f4f4}.bad{color:#b00020;font-weight:600}.good{color:#1b7a1b}.muted{color:#777}
img{max-width:100%;border:1px solid #eee}nav a{margin-right:1rem}"""


def _page(title: str, body: str) -> str:
    nav = '<nav><a href="index.html">All series</a><a href="regressions.html">Regressions</a></nav>'
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>{nav}<h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    lines = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{lines}</table>"


def _model_page(model: str) -> str:
    return "model-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in model) + ".html"


def _trend(series: Series) -> str:
    """The newest value against the mean of the runs before it, as a signed percentage coloured by good or bad."""
    values = series.runs["value"]
    if len(values) < 2:
        return '<span class="muted">one run</span>'
    change = values.iloc[-1] / values.iloc[:-1].mean() - 1
    good = (change > 0) == series.metric.higher_is_better
    return f'<span class="{"good" if good else "bad"}">{change:+.1%}</span>'


def plot(series: Series, path: Path) -> None:
    runs = series.runs
    x = list(range(len(runs)))
    fig, ax = plt.subplots(figsize=(8, 2.8))
    errors = (runs["value"] * runs["noise"].fillna(0)).to_numpy(float)
    ax.errorbar(x, runs["value"], yerr=errors, fmt="o-", ms=3, lw=1, capsize=2, color="#1f5fa8")
    start = 0
    for change in [*series.changes, None]:
        end = change.index if change is not None else len(runs)
        ax.hlines(runs["value"].iloc[start:end].mean(), start - 0.3, end - 0.7, colors="#888", linestyles=":")
        if change is not None:
            ax.axvline(change.index - 0.5, color="#b00020", ls="--", lw=1)
            ax.annotate(f"{change.relative:+.1%}", (change.index - 0.5, ax.get_ylim()[1]), color="#b00020", fontsize=8)
        start = end
    ticks = x[:: max(1, len(x) // 12)]  # a dozen dates at most: a label per run of a long history costs seconds
    labels = [runs["started_at"].iloc[i].strftime("%m-%d %H:%M") for i in ticks]
    ax.set_xticks(ticks, labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"{series.metric.label} ({series.metric.unit})", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _run_link(root: str, run_id: str) -> str:
    url = join(root, run_id, "report.html")
    href = url if is_remote(url) or url.startswith("file://") else Path(url).resolve().as_uri()
    return f'<a href="{html.escape(href)}">{html.escape(run_id)}</a>'


def _evidence(finding: Finding) -> str:
    if finding.candidate:
        return "newest run only"
    return f"p = {finding.change.p_value:.1g}" + (", confirmed by the newest run" if finding.new else "")


def write_site(history: History, out: Path) -> Path:
    """The site's pages and plots in the local folder `out`; returns index.html."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    flagged = {id(f.series) for f in history.regressions}
    models = sorted({s.key["model"] for s in history.series})
    rows = []
    for s in history.series:
        latest = s.runs.iloc[-1]
        rows.append(
            [
                f'<a href="{_model_page(s.key["model"])}#{s.slug}">{html.escape(s.name)}</a>',
                f"{latest['value']:.4g} {s.metric.unit}",
                _trend(s),
                str(len(s.runs)),
                '<span class="bad">regressed</span>' if id(s) in flagged else "",
            ]
        )
    tone = {REGRESSION: "bad", UNDETERMINED: "muted"}.get(history.verdict, "good")
    verdict = f'<p>Verdict: <b class="{tone}">{history.verdict}</b>'
    verdict += f" over {history.runs} runs and {len(history.series)} series of {html.escape(history.root)}."
    if history.too_short:
        verdict += f" {len(history.too_short)} series have fewer than {MIN_RUNS} runs: not enough to confirm a change."
    verdict += "</p>"
    if history.lost:
        verdict += (
            f'<p class="bad">{len(history.lost)} points lost: see <a href="regressions.html">Regressions</a>.</p>'
        )
    models_list = " ".join(f'<a href="{_model_page(m)}">{html.escape(m)}</a>' for m in models)
    index = _page(
        "Benchmark history",
        verdict
        + f"<p>Models: {models_list}</p>"
        + _table(["Series", "Newest", "Against the runs before", "Runs", ""], rows),
    )
    (out / "index.html").write_text(index)
    for model in models:
        sections = []
        for s in (s for s in history.series if s.key["model"] == model):
            if len(s.runs) > 1:  # one run is a value, not a history (and a plot costs a run its time)
                plot(s, out / "plots" / f"{s.slug}.png")
            run_rows = [
                [
                    r.started_at.strftime("%Y-%m-%d %H:%M"),
                    _run_link(history.root, r.run_id),
                    f"{r.value:.4g}",
                    "" if r.noise != r.noise else f"{r.noise:.1%}",
                ]
                for r in s.runs.itertuples()
            ]
            changes = "".join(f"<li>{html.escape(f.line())}</li>" for f in history.findings if f.series is s)
            title = html.escape(s.name)
            runs_table = _table(["Started", "Run", "Value", "Noise (CV)"], run_rows)
            sections.append(
                f'<h2 id="{s.slug}">{title}</h2>'
                + (f'<img src="plots/{s.slug}.png" alt="{title}">' if len(s.runs) > 1 else "")
                + (f"<ul>{changes}</ul>" if changes else '<p class="muted">No change detected.</p>')
                + f"<details><summary>Runs</summary>{runs_table}</details>"
            )
        (out / _model_page(model)).write_text(_page(f"History of {model}", "".join(sections)))
    regressions = [
        [
            html.escape(f.series.name),
            f'<span class="bad">{f.change.relative:+.1%}</span>',
            _run_link(history.root, f.run_before) + " → " + _run_link(history.root, f.run_after),
            "<br>".join(html.escape(d.line()) for d in f.differences) or '<span class="muted">nothing differed</span>',
            _evidence(f),
        ]
        for f in history.regressions
    ]
    body = (
        _table(["Series", "Change", "Runs", "What differed", "Evidence"], regressions)
        if regressions
        else "<p>No regression detected.</p>"
    )
    (out / "regressions.html").write_text(_page("Regressions", body + _lost_table(history)))
    return out / "index.html"


def _lost_table(history: History) -> str:
    if not history.lost:
        return ""
    rows = [
        [
            html.escape(p.name),
            f'<span class="bad">{html.escape(p.status)}</span>' + (f"<br>{html.escape(p.error)}" if p.error else ""),
            _run_link(history.root, p.last_ok_run) + " → " + _run_link(history.root, p.lost_run),
            "lost by the newest run" if p.new else f"still lost in {_run_link(history.root, p.newest_run)}",
        ]
        for p in history.lost
    ]
    return "<h2>Points lost</h2>" + _table(["Point", "Status now", "Ok → lost", "When"], rows)


def publish_site(history: History, target: str) -> str:
    """The site written to `target` (a local folder or any fsspec URL); returns the URL of its index."""
    if not is_remote(target):
        return str(write_site(history, Path(target)))
    with tempfile.TemporaryDirectory(prefix="tbench-history-") as tmp:
        write_site(history, Path(tmp))
        fs, base = url_to_fs(target)
        for f in sorted(Path(tmp).rglob("*")):
            if f.is_file():
                fs.put_file(str(f), f"{base}/{f.relative_to(tmp).as_posix()}")
    return join(target, "index.html")


def default_target(root: str) -> str:
    return join(root, "history")
