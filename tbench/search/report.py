"""A search's files in its run folder: search.md, search.html, search.json and plots/search.png (`write_search_files`),
and what an interrupted search measured, read back from its checkpoint (`partial_result`)."""

from __future__ import annotations

import json
from pathlib import Path

from tbench.core.layout import RunLayout
from tbench.results.html_report import write_html_report
from tbench.search.config_edit import thread_parameter
from tbench.search.confirm import combined_lines, rounds_from_checkpoint
from tbench.search.plan import CHECKPOINT
from tbench.search.request import SearchRequest
from tbench.search.strategies import Checkpoint, Observation, SearchResult
from tbench.triton.user_repository import read_config


def _figure(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _row(label: str, observation: Observation, configuration: str) -> str:
    figures = f"{_figure(observation.throughput, 1)} | {_figure(observation.p99_ms, 2)}"
    status = observation.status + (f": {observation.error}" if observation.error else "")
    return f"| {label} | {configuration} | {figures} | {status} |"


def threads_note(path: Path | None) -> str:
    """A config's threads per instance, as its backend's parameter names them ('' where it takes none or the config
    leaves them to the backend)."""
    if path is None:
        return ""
    config = read_config(path)
    key = thread_parameter(config)
    return f", {key} {config.parameters[key].string_value}" if key and key in config.parameters else ""


def users_config_section(
    yours: Observation | None, best: Observation | None, recommended: str | None, threads: tuple[str, str] = ("", "")
) -> str:
    """A repository search's own section: the user's config as written beside the best, measured the same way, and
    where the recommended config.pbtxt is."""
    lines = ["", "## Your config beside the best", ""]
    lines += ["| | configuration | throughput (infer/s) | p99 (ms) | status |", "| --- | --- | ---: | ---: | --- |"]
    if yours is not None:
        lines.append(_row("Your config", yours, f"as written ({yours.candidate.describe()}{threads[0]})"))
    if best is not None:
        lines.append(_row("Best", best, best.candidate.describe() + threads[1]))
    if recommended:
        lines += ["", f"The recommended config is `{recommended}`: your config.pbtxt with only these fields changed,"]
        lines.append("ready to copy back into your repository.")
    return "\n".join(lines) + "\n"


def write_search_files(
    layout: RunLayout,
    result,
    title: str,
    yours: Observation | None = None,
    recommended: Path | None = None,
    users_config: Path | None = None,
) -> str:
    """search.md, search.html, search.json and plots/search.png; returns the markdown. A repository search's own
    config (`yours`) and recommended config.pbtxt are written beside the best."""
    plot = result.plot(layout.plots_dir / "search.png")
    text = result.to_markdown(title=title, plot=plot.relative_to(layout.run_dir).as_posix())
    relative = recommended.relative_to(layout.run_dir).as_posix() if recommended else None
    if yours is not None or recommended is not None:
        threads = (threads_note(users_config), threads_note(recommended))
        text += users_config_section(yours, result.selection.best, relative, threads)
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
    if yours is not None or recommended is not None:
        summary["your_config"] = yours.model_dump(mode="json") if yours else None
        summary["recommended_config"] = relative
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
