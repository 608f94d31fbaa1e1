"""An A/B session's own folder (`tbench run --against`): which runs each side made, in which order, and the comparison
of the two sides paired by round, under ``<output>/sessions/<session id>/``: session.json, comparison.md and
comparison.png, beside the runs themselves.

Plain functions; the flow (flows/session.py) runs the rounds."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tbench.core.layout import new_run_id
from tbench.core.storage import join, url_to_fs
from tbench.request.benchmark import BenchmarkRequest, SessionRound
from tbench.results.compare import compare_runs, comparison_markdown, plot_comparison, verdict_exit_code

SESSION_FILE = "session.json"
SIDES = ("baseline", "candidate")


def new_session_id(model: str) -> str:
    return "ab-" + new_run_id(model)


def round_order(round_: int) -> tuple[str, str]:
    """Baseline first in odd rounds, candidate first in even ones (ABBA...): a machine that drifts steadily through
    the session favours neither side."""
    return SIDES if round_ % 2 else SIDES[::-1]


def side_requests(request: BenchmarkRequest, against: str) -> dict[str, BenchmarkRequest]:
    """The two sides of the session: the candidate is the request as given, the baseline the same request with the
    --against model file; neither compares with a stored baseline of its own."""
    candidate = request.model_copy(update={"baseline": None})
    return {"baseline": candidate.model_copy(update={"model_file": against}), "candidate": candidate}


def round_request(side: BenchmarkRequest, session_id: str, side_name: str, round_: int) -> BenchmarkRequest:
    """One side's run in one round: a single trial (the rounds are the trials), marked with its place in the session
    so that `tbench compare` pairs it."""
    place = SessionRound(id=session_id, side=side_name, round=round_)
    return side.model_copy(update={"trials": 1, "session": place})


def write_session(output: str, session_id: str, record: dict, min_effect: float = 0.05) -> tuple[str, dict]:
    """Compare the sides' runs (paired by round) and store session.json, comparison.md and comparison.png under
    ``<output>/sessions/<session_id>``; returns the folder's URL and the record with the verdict."""
    runs = record["runs"]
    if all(runs[side] for side in SIDES):
        comparison = compare_runs(runs["baseline"], runs["candidate"], min_effect=min_effect)
        verdict = {
            "verdict": comparison.verdict,
            "summary": comparison.summary,
            "exit_code": verdict_exit_code(comparison),
            "command": f"tbench compare {','.join(runs['baseline'])} {','.join(runs['candidate'])}",
        }
    else:
        comparison = None
        missing = " and ".join(side for side in SIDES if not runs[side])
        verdict = {"verdict": "not comparable", "summary": f"no run of the {missing} completed", "exit_code": 2}
    record = {**record, **verdict}
    url = join(output, "sessions", session_id)
    fs, root = url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        files = {SESSION_FILE: Path(tmp) / SESSION_FILE}
        files[SESSION_FILE].write_text(json.dumps(record, indent=2))
        if comparison is not None:
            files["comparison.md"] = Path(tmp) / "comparison.md"
            files["comparison.md"].write_text(comparison_markdown(comparison))
            files["comparison.png"] = plot_comparison(comparison, Path(tmp) / "comparison.png")
        for name, path in files.items():
            fs.put(str(path), root.rstrip("/") + "/" + name)
    return url, record


def read_session(url: str) -> dict:
    fs, root = url_to_fs(url)
    with fs.open(root.rstrip("/") + "/" + SESSION_FILE) as f:
        return json.load(f)
