"""A search's files in its run folder: search.md, search.html, search.json and plots/search.png (`write_search_files`),
and what an interrupted search measured, read back from its checkpoint (`partial_result`)."""

from __future__ import annotations

import json
from pathlib import Path

from tbench.core.layout import RunLayout
from tbench.results.html_report import write_html_report
from tbench.search.config_edit import candidate_of, thread_parameter
from tbench.search.confirm import combined_lines, rounds_from_checkpoint
from tbench.search.objective import Objective
from tbench.search.plan import CHECKPOINT
from tbench.search.request import SearchRequest
from tbench.search.space import Candidate
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


def config_words(path: Path | None, candidate: Candidate) -> str:
    """A configuration in words; one that batches with no dynamic batcher says so (its requests run as they come)."""
    config = read_config(path) if path is not None and path.is_file() else None
    if config is not None and config.max_batch_size > 0 and not config.HasField("dynamic_batching"):
        return f"instances {candidate.instances}, max batch {candidate.max_batch_size}, no dynamic batcher"
    return candidate.describe()


def described(configs: dict[str, Path], candidates: dict[str, Candidate]) -> str:
    """Each model's configuration in words with its threads ('doubler: instances 1, ...; plus_one: ...' for a
    pipeline's steps, the model's alone otherwise)."""
    parts = {m: config_words(configs.get(m), c) + threads_note(configs.get(m)) for m, c in candidates.items()}
    if len(parts) <= 1:
        return next(iter(parts.values()), "")
    return "; ".join(f"{m}: {text}" for m, text in parts.items())


KEEP_YOURS = "keep_yours"  # the user's config beat the best candidate, the windows separate them
AS_GOOD = "as_good"  # the user's config is ahead of or level with the best, within the windows' noise
RECOMMENDED = "recommended"  # the best candidate beat the user's config (or the user's did not meet the objective)


def yours_against_best(
    objective: Objective, yours: Observation | None, best: Observation | None, same: bool = False
) -> str | None:
    """The user's own config against the search's best, measured the same way (None: one of them is missing);
    `same`: the best is the user's config itself, measured as the search's candidate."""
    if yours is None or best is None or not best.ok:
        return None
    if same:
        return AS_GOOD
    if not objective.feasible(yours) or objective.value(yours) <= objective.value(best):
        return RECOMMENDED
    return KEEP_YOURS if objective.compare(yours, best) == "worse" else AS_GOOD


def users_config_section(
    yours: Observation | None,
    yours_text: str,
    best: Observation | None,
    best_text: str,
    recommended: list[str],
    verdict: str | None = None,
) -> str:
    """A repository search's own section: the user's config as written beside the best, measured the same way, and
    where the recommended config.pbtxt files are; where the user's was better, it says to keep it."""
    lines = ["", "## Your config beside the best", ""]
    lines += ["| | configuration | throughput (infer/s) | p99 (ms) | status |", "| --- | --- | ---: | ---: | --- |"]
    if yours is not None:
        lines.append(_row("Your config", yours, f"as written ({yours_text})"))
    if best is not None:
        lines.append(_row("Best", best, best_text))
    if verdict == KEEP_YOURS:
        lines += ["", "**Keep your config**: it did better than every configuration the search measured, by more than"]
        lines.append(
            "the windows' noise (the space searched does not hold it); the best one's file is only for reference."
        )
    elif verdict == AS_GOOD:
        lines += ["", "**Your config is as good as the best** the search measured, within the windows' noise: nothing"]
        lines.append("better was found; the best one's file is only for reference.")
    if recommended:
        lines += ["", f"Recommended: {', '.join(f'`{r}`' for r in recommended)}: your config.pbtxt with only these"]
        lines.append("fields changed, ready to copy back into your repository.")
    return "\n".join(lines) + "\n"


def _markdown(layout: RunLayout, result, title: str, plot_name: str) -> str:
    plot = result.plot(layout.plots_dir / plot_name)
    return result.to_markdown(title=title, plot=plot.relative_to(layout.run_dir).as_posix())


def _summary(result) -> dict:
    selection = result.selection
    best = selection.best
    return {
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


def _write(layout: RunLayout, text: str, summary: dict) -> None:
    (layout.run_dir / "search.md").write_text(text)
    write_html_report(layout.run_dir / "search.md", layout.run_dir / "search.html")  # the same page, self-contained
    (layout.run_dir / "search.json").write_text(json.dumps(summary, indent=2))


def write_search_files(layout: RunLayout, result, title: str) -> str:
    """search.md, search.html, search.json and plots/search.png; returns the markdown."""
    text = _markdown(layout, result, title, "search.png")
    _write(layout, text, _summary(result))
    return text


def pipeline_summary(pipeline: str, results: dict) -> dict:
    """search.json of a pipeline's steps searched in turn: each step's, and the last step's best (the pipeline with
    every step at its best) as the search's."""
    steps = {step: _summary(result) for step, result in results.items()}
    last = steps[next(reversed(steps))]
    return {
        "pipeline": pipeline,
        "steps": steps,
        "grid_size": sum(s["grid_size"] for s in steps.values()),
        "measured": sum(s["measured"] for s in steps.values()),
        "seconds": round(sum(s["seconds"] for s in steps.values()), 3),
        "best": last["best"],
        "verdict": last["verdict"],
    }


def write_repository_search_files(
    layout: RunLayout,
    results: dict,
    title: str,
    yours: Observation | None,
    recommended: dict[str, Path],
    users_configs: dict[str, Path],
    pipeline: str = "",
    yours_is_best: bool = False,
) -> str:
    """A repository search's files: search.md, search.html, search.json and its plots, with the user's own config
    measured beside the best and the recommended config.pbtxt files named. A pipeline's steps (`pipeline`), searched
    in turn, each get their section and plot (plots/search-<step>.png); returns the markdown."""
    last = results[next(reversed(results))]
    if pipeline:
        text = f"## {title}\n\nThe steps of {pipeline} searched one after another, each with the steps before it at "
        text += "their best, the pipeline measured whole.\n"
        text += "".join("\n" + _markdown(layout, r, f"Step {s}", f"search-{s}.png") for s, r in results.items())
        summary = pipeline_summary(pipeline, results)
    else:
        text, summary = _markdown(layout, last, title, "search.png"), _summary(last)
    bests = {m: r.best.candidate for m, r in results.items() if r.best is not None}
    users = {m: candidate_of(read_config(path)) for m, path in users_configs.items()}
    relative = {m: p.relative_to(layout.run_dir).as_posix() for m, p in recommended.items()}
    best_text = described(recommended, bests) if bests else ""
    verdict = yours_against_best(last.objective, yours, last.best, yours_is_best)
    text += users_config_section(
        yours, described(users_configs, users), last.best, best_text, list(relative.values()), verdict
    )
    summary |= {
        "your_config": yours.model_dump(mode="json") if yours else None,
        "your_config_verdict": verdict,  # KEEP_YOURS, AS_GOOD or RECOMMENDED (None: one was not measured)
        "recommended_config": relative,
    }
    _write(layout, text, summary)
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
