"""A search's files in its run folder: search.md, search.html, search.json and plots/search.png (`write_search_files`),
and what an interrupted search measured, read back from its checkpoint (`partial_result`)."""

from __future__ import annotations

import json

from tbench.core.layout import RunLayout
from tbench.results.html_report import write_html_report
from tbench.search.confirm import combined_lines, rounds_from_checkpoint
from tbench.search.plan import CHECKPOINT
from tbench.search.request import SearchRequest
from tbench.search.strategies import Checkpoint, SearchResult


def write_search_files(layout: RunLayout, result, title: str) -> str:
    """search.md, search.html, search.json and plots/search.png; returns the markdown."""
    plot = result.plot(layout.plots_dir / "search.png")
    text = result.to_markdown(title=title, plot=plot.relative_to(layout.run_dir).as_posix())
    (layout.run_dir / "search.md").write_text(text)
    write_html_report(
        layout.run_dir / "search.md", layout.run_dir / "search.html"
    )  # search.html: the same page, self-contained
    selection = result.selection
    best = selection.best
    summary = {
        "strategy": result.strategy,
        "objective": result.objective.model_dump(),
        "grid_size": result.grid_size,
        "budget": result.budget,
        "measured": result.measured,
        "new_measurements": result.new_measurements,
        "seconds": round(result.seconds, 3),
        "best": best.model_dump(mode="json") if best else None,
        "verdict": selection.verdict,  # best | tie | undetermined | none (tbench.search.objective.select)
        "verdict_reason": selection.reason,
        "not_separated": [o.candidate.key for o in selection.contenders],
        # the confirmation (tbench.search.confirm): the rounds, the candidates each re-measured and their windows
        "remeasurements": result.remeasurements,
        "confirmation": [r.model_dump(mode="json") for r in result.confirmation],
    }
    (layout.run_dir / "search.json").write_text(json.dumps(summary, indent=2))
    return text


def partial_result(layout: RunLayout, search: SearchRequest):
    """What an interrupted search measured, from its checkpoint (resume it with resume_from=<this run folder>)."""
    keys = {c.key for c in search.space.grid()}
    lines = [o for o in Checkpoint(layout.run_dir / CHECKPOINT).load() if o.candidate.key in keys]
    observations = combined_lines(lines)
    return SearchResult(
        strategy=f"{search.strategy} (interrupted)",
        objective=search.objective,
        grid_size=len(keys),
        budget=len(keys),
        observations=observations,
        new_measurements=len(observations),
        confirmation=rounds_from_checkpoint(lines, observations),
    )
