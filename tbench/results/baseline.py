"""Stage: this run against a stored baseline run (`request.baseline`), with the noise-aware verdict of tbench.compare.
A baseline that cannot be read costs the run nothing: the report says why and everything measured is kept."""

from __future__ import annotations

from pathlib import Path

from tbench.results.compare import compare_runs, comparison_markdown, plot_comparison


def compare_with_baseline(baseline: str, run_dir: Path, plots_dir: Path) -> tuple[list[str], dict]:
    """(report lines, manifest entry) for this run folder against the baseline folder or URL."""
    try:
        result = compare_runs(baseline, run_dir)
    except Exception as err:  # unreachable storage, a folder without results: one line in the report
        reason = f"{type(err).__name__}: {err}".splitlines()[0]
        return [
            "## Comparison against the baseline",
            "",
            f"The baseline `{baseline}` could not be read: {reason}.",
            "",
        ], {"baseline": baseline, "verdict": None, "error": reason}
    plot = plot_comparison(result, plots_dir / "baseline_comparison.png")
    lines = [comparison_markdown(result), "", f"![]({plot.relative_to(run_dir).as_posix()})", ""]
    return lines, {"baseline": baseline, "verdict": result.verdict, "summary": result.summary}
