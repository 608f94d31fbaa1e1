"""A/B sessions (`tbench run --model-file NEW --against OLD --trials N`; tbench/results/session.py,
tbench/stages/ab_session.py, flows/session.py): the two model files measured round by round, back to back, and
compared paired by round, so that a stretch of the machine that moves a whole run (22% here, in every trial of a run)
moves both sides of its round and cancels. Simulated with fixed seeds; one session on the real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_run_noise import trial_run
from typer.testing import CliRunner

from tbench.cli import app
from tbench.request.benchmark import BenchmarkRequest
from tbench.results.compare import NO_CHANGE, REGRESSION, UNDETERMINED, compare_runs
from tbench.results.run_results import load_run
from tbench.results.session import Pairing, combine_runs, load_side
from tbench.stages.ab_session import SIDES, round_order, round_request, side_requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tiny_model import build_tiny_image_onnx  # noqa: E402 - the tiny model, and the same made slower

ROUND_DRIFT = 0.15  # a whole round's slowness, both sides alike (the planted record's slow runs: 13% and 22%)
TRIAL_CV = 0.015  # what is left between two runs measured back to back


def session(tmp_path: Path, name: str, rng, rounds: int, factor: float = 1.0, lost: tuple = ()) -> dict[str, list]:
    """A session's run folders per side: every round's drift multiplies both of its runs; `lost`: (side, round) runs
    that never ran."""
    runs = {side: [] for side in SIDES}
    for round_ in range(1, rounds + 1):
        drift = float(np.exp(ROUND_DRIFT * rng.standard_normal()))
        for side in round_order(round_):
            if (side, round_) in lost:
                continue
            scale = drift * (factor if side == "candidate" else 1.0)
            run = trial_run(tmp_path, f"{name}-{side}-{round_}", rng, 1, TRIAL_CV, factor=scale)
            place = {"id": name, "side": side, "round": round_}
            (run / "manifest.json").write_text(json.dumps({"request": {"session": place}}))
            runs[side].append(run)
    return runs


def test_a_whole_run_shift_hides_a_10pct_slowdown_from_welch_and_not_from_the_rounds(tmp_path):
    rng = np.random.default_rng(10)
    paired, unpaired = [], []
    for i in range(20):
        runs = session(tmp_path, f"s{i}", rng, 8, factor=0.9)
        paired.append(compare_runs(runs["baseline"], runs["candidate"]).verdict)
        plain = [[load_run(r) for r in runs[side]] for side in SIDES]
        for side in plain:  # the same runs without their session: trials of two unrelated runs
            for r in side:
                r.manifest.clear()
        unpaired.append(compare_runs(combine_runs(plain[0]), combine_runs(plain[1])).verdict)
    assert paired.count(REGRESSION) >= 18
    assert unpaired.count(REGRESSION) <= 10  # the round drift's spread is what Welch's test has to resolve


def test_a_a_sessions_never_regress_whatever_the_rounds_drift(tmp_path):
    rng = np.random.default_rng(11)
    verdicts = []
    for i in range(40):
        runs = session(tmp_path, f"aa{i}", rng, 6)
        verdicts.append(compare_runs(runs["baseline"], runs["candidate"]).verdict)
    assert verdicts.count(REGRESSION) <= 1 and verdicts.count(NO_CHANGE) >= 30


def test_a_lost_round_pairs_with_nothing_and_the_line_says_rounds(tmp_path):
    rng = np.random.default_rng(12)
    runs = session(tmp_path, "lost", rng, 4, lost=(("candidate", 3),))
    base, cand = load_side(runs["baseline"]), load_side(",".join(map(str, runs["candidate"])))
    assert Pairing.of(base, cand) == Pairing("lost", (1, 2, 4))
    assert sorted(base.results["trial"].unique()) == [1, 2, 3, 4]  # a session's trials are its rounds
    c = compare_runs(base, cand)
    assert "paired over 3 rounds of one A/B session" in c.spread
    few = session(tmp_path, "few", rng, 2)
    undecided = compare_runs(few["baseline"], few["candidate"])
    assert undecided.verdict == UNDETERMINED and "rounds would resolve" in undecided.summary


def test_runs_of_different_sessions_or_plain_runs_do_not_pair(tmp_path):
    rng = np.random.default_rng(13)
    one, two = session(tmp_path, "one", rng, 3), session(tmp_path, "two", rng, 3)
    assert Pairing.of(load_side(one["baseline"]), load_side(two["candidate"])) is None
    assert Pairing.of(load_side(one["candidate"]), load_side(one["baseline"])) is None  # sides swapped
    a, b = trial_run(tmp_path, "a", rng, 3, 0.02), trial_run(tmp_path, "b", rng, 2, 0.02)
    both = combine_runs([load_run(a), load_run(b)])
    assert sorted(both.results["trial"].unique()) == [1, 2, 3, 4, 5]  # plain runs' trials follow each other
    assert Pairing.of(both, both) is None


def test_rounds_alternate_and_each_run_is_one_marked_trial(tmp_path):
    assert [round_order(r)[0] for r in (1, 2, 3, 4)] == ["baseline", "candidate", "baseline", "candidate"]
    request = BenchmarkRequest(model_file="new.onnx", trials=6, baseline="runs/old")
    sides = side_requests(request, "old.onnx")
    assert sides["baseline"].model_file == "old.onnx" and sides["candidate"].model_file == "new.onnx"
    assert sides["baseline"].baseline is None and sides["candidate"].baseline is None
    run = round_request(sides["baseline"], "ab-x", "baseline", 3)
    assert run.trials == 1 and run.session.model_dump() == {"id": "ab-x", "side": "baseline", "round": 3}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model-file", "{b}", "--against", "{a}"], "error: --against measures the two files round by round"),
        (["resnet50", "--against", "{a}", "--trials", "3"], "error: --against MODEL_FILE measures a model file"),
        (["--model-file", "{b}", "--against", "/nonexistent/old.onnx", "--trials", "3"], "/nonexistent/old.onnx"),
    ],
)
def test_against_refuses_in_one_line_before_anything_starts(tmp_path, args, message):
    a = build_tiny_image_onnx(tmp_path / "a" / "tiny.onnx")
    b = build_tiny_image_onnx(tmp_path / "b" / "tiny.onnx", extra_layers=1)
    argv = ["run", *(x.format(a=a, b=b) for x in args), "--output", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not list(tmp_path.glob("runs/tiny-*")) and not list(tmp_path.glob("runs/sessions/*"))  # nothing ran


@pytest.mark.e2e
def test_a_session_on_the_real_server_pairs_its_rounds_and_compare_says_the_same(tmp_path):
    """Two rounds of the tiny model against itself made slower: four runs in the alternating order, the session's
    folder, and `tbench compare` on the lists it names giving its verdict."""
    a = build_tiny_image_onnx(tmp_path / "a" / "tiny.onnx")
    b = build_tiny_image_onnx(tmp_path / "b" / "tiny.onnx", extra_layers=2)
    tbench = str(Path(sys.executable).with_name("tbench"))
    argv = [tbench, "run", "--model-file", str(b), "--against", str(a), "--trials", "2"]
    argv += ["--scenarios", "offline", "--batch-sizes", "1", "--output", str(tmp_path / "runs")]
    argv += ["--window-s", "0.5", "--stability", "50"]  # the session's plumbing, not its numbers: short windows
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1, 2), done.stdout + done.stderr
    folder = Path(done.stdout.strip().splitlines()[-2])
    record = json.loads((folder / "session.json").read_text())
    assert record["order"] == ["1:baseline", "1:candidate", "2:candidate", "2:baseline"]
    assert record["exit_code"] == done.returncode and record["summary"] == done.stdout.strip().splitlines()[-1]
    assert (folder / "comparison.md").is_file() and (folder / "comparison.png").stat().st_size > 0
    for side in SIDES:
        manifests = [json.loads((Path(r) / "manifest.json").read_text()) for r in record["runs"][side]]
        assert [m["request"]["session"]["side"] for m in manifests] == [side, side]
        assert all(m["request"]["trials"] == 1 for m in manifests)
    again = subprocess.run(
        [tbench, *record["command"].split()[1:], "--output", str(tmp_path / "cmp")], capture_output=True
    )
    assert again.returncode == record["exit_code"]
    table = pd.read_csv(Path(record["runs"]["candidate"][0]) / "results.csv")
    assert table["model"].iloc[0] == "tiny"
