"""The run-to-run rule of `tbench compare` (tbench/results/run_noise.py): trials measure the spread, a change inside
what it resolves is undetermined, an unknown spread decides nothing, a busy neighbour is named, never blamed on the
model. Runs are simulated with fixed seeds: each trial's speed drawn around the truth with a known CV."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tbench.results.compare import (
    EXIT_CODES,
    IMPROVEMENT,
    MACHINE_MOVED,
    NO_CHANGE,
    REGRESSION,
    UNDETERMINED,
    compare_runs,
    comparison_markdown,
    verdict_exit_code,
)
from tbench.results.run_noise import RunSpread, pooled_spread

TPUT = "throughput_infer_per_s"
CONCURRENCY = (1, 2, 4, 8)
SPEEDUP = np.array([1.0, 1.8, 2.5, 2.9])


def trial_run(
    tmp_path: Path,
    name: str,
    rng,
    trials: int,
    run_cv: float,
    factor: float = 1.0,
    busy_pct: float | None = None,
    cpu_speed: tuple[float, float] | None = None,
) -> Path:
    """A run folder: every point measured in `trials` server processes, each process's speed off by N(0, run_cv),
    its windows steady (1% CV, from real-looking Pass lines); `busy_pct`: other processes' CPU in its manifest;
    `cpu_speed`: its CPU probe before and after the sweeps."""
    run = tmp_path / name
    logs = run / "logs" / "perf_analyzer"
    logs.mkdir(parents=True)
    rows = []
    for trial in range(1, trials + 1):
        speed = factor * (1 + run_cv * rng.standard_normal())
        for c, s in zip(CONCURRENCY, SPEEDUP):
            tput = 400.0 * s * speed
            avg = 2.5 * c / (s * speed)
            stem = f"{name}_c{c}_t{trial}_try0"
            windows = [(tput * f, 1000 * avg / f) for f in (0.99, 1.0, 1.01)]
            (logs / f"{stem}.log").write_text(
                "".join(
                    f"  Pass [{i}] throughput: {t:.2f} infer/sec. Avg latency: {lat:.0f} usec (std 10 usec). \n"
                    for i, (t, lat) in enumerate(windows, 1)
                )
            )
            rows.append(
                {
                    "model": "resnet50",
                    "model_size": "small",
                    "format": "onnx",
                    "scenario": "online",
                    "precision": "FP32",
                    "gpu": "CPU",
                    "batch_size": 1,
                    "concurrency": c,
                    "status": "ok",
                    TPUT: tput,
                    "avg_ms": avg,
                    "p95_ms": 1.5 * avg,
                    "p99_ms": 2.0 * avg,
                    "window_requests": 2000,
                    "trial": trial,
                    "source_file": f"perf/{stem}.csv",
                }
            )
    pd.DataFrame(rows).to_csv(run / "results.csv", index=False)
    host = {}
    if busy_pct is not None:
        host["other_cpu_pct"] = {"mean": busy_pct, "max": 190}
    if cpu_speed is not None:
        host["cpu_speed"] = dict(zip(("start", "end"), cpu_speed))
    if host:
        (run / "manifest.json").write_text(json.dumps({"host": host}))
    return run


def test_pooled_spread_recovers_the_trials_cv():
    rng = np.random.default_rng(0)
    groups = [pd.DataFrame({TPUT: 100 * (1 + 0.04 * rng.standard_normal(5))}) for _ in range(40)]
    cvs, df = pooled_spread(groups, [TPUT])
    assert cvs[TPUT] == pytest.approx(0.04, rel=0.15) and df == 160


def test_threshold_and_trials_needed():
    spread = RunSpread({TPUT: 0.03}, measured=True, source="test")
    assert spread.threshold(TPUT, 4, 4) < spread.threshold(TPUT, 2, 2)
    n = spread.trials_needed(TPUT, 0.05)
    assert spread.threshold(TPUT, n, n) <= math.log1p(0.05) < spread.threshold(TPUT, n - 1, n - 1)  # log scale
    # measured from few trials, a spread is known less well than a stated one: it asks for more
    assert RunSpread({TPUT: 0.03}).trials_needed(TPUT, 0.05) < n
    assert RunSpread({TPUT: 0.5}, measured=True).trials_needed(TPUT, 0.05) is None  # beyond --trials' bound
    assert not RunSpread().known(TPUT) and math.isnan(RunSpread().threshold(TPUT, 3, 3))


def test_one_trial_each_decides_nothing_and_says_how_to(tmp_path):
    rng = np.random.default_rng(1)
    c = compare_runs(trial_run(tmp_path, "a", rng, 1, 0.05), trial_run(tmp_path, "b", rng, 1, 0.05, factor=0.7))
    assert c.verdict == UNDETERMINED and verdict_exit_code(c) == EXIT_CODES[UNDETERMINED] == 2
    assert "the run-to-run spread is unknown (one trial per run)" in c.summary and "--trials" in c.summary
    stated = compare_runs(
        trial_run(tmp_path, "c", rng, 1, 0.0), trial_run(tmp_path, "d", rng, 1, 0.0, factor=0.7), run_cv=0.05
    )
    assert stated.verdict == REGRESSION and "stated: throughput 5%, avg 5%" in stated.spread
    # the tail's spread is not the mean's: with --run-cv alone an unchanged run's p99 is not judged, and says why
    same = compare_runs(trial_run(tmp_path, "e", rng, 1, 0.0), trial_run(tmp_path, "f", rng, 1, 0.0), run_cv=0.02)
    assert same.verdict == UNDETERMINED and "the p99's run-to-run spread is unknown" in same.summary


def test_a_a_with_trials_never_regresses(tmp_path):
    rng = np.random.default_rng(2)
    verdicts = [
        compare_runs(trial_run(tmp_path, f"a{i}", rng, 6, 0.02), trial_run(tmp_path, f"b{i}", rng, 6, 0.02)).verdict
        for i in range(40)
    ]
    assert verdicts.count(REGRESSION) <= 1 and verdicts.count(NO_CHANGE) >= 30


def test_a_planted_slowdown_is_found_with_the_trials_the_spread_asks_for(tmp_path):
    rng = np.random.default_rng(3)
    n = RunSpread({TPUT: 0.03}, measured=True).trials_needed(TPUT, 0.05)  # what compare asks for at 3%
    found = [
        compare_runs(
            trial_run(tmp_path, f"a{i}", rng, n, 0.03), trial_run(tmp_path, f"b{i}", rng, n, 0.03, factor=0.9)
        ).verdict
        for i in range(20)
    ]
    assert found.count(REGRESSION) >= 18


def test_a_spread_too_wide_for_the_effect_is_undetermined_with_the_trials_it_needs(tmp_path):
    rng = np.random.default_rng(4)
    c = compare_runs(trial_run(tmp_path, "a", rng, 2, 0.08), trial_run(tmp_path, "b", rng, 2, 0.08, factor=0.97))
    assert c.verdict == UNDETERMINED and "per run would resolve 5%" in c.summary
    assert c.points["trials"].eq("2/2").all()


def test_a_busy_neighbour_is_named_never_blamed_on_the_model(tmp_path):
    rng = np.random.default_rng(5)
    base = trial_run(tmp_path, "a", rng, 3, 0.02, busy_pct=0.3)
    slowed = trial_run(tmp_path, "b", rng, 3, 0.02, factor=0.6, busy_pct=95.0)
    c = compare_runs(base, slowed)
    assert c.verdict == UNDETERMINED and "other processes used 95% CPU during the candidate's sweeps" in c.summary
    quiet = trial_run(tmp_path, "c", rng, 3, 0.02, factor=0.6, busy_pct=0.4)
    assert compare_runs(base, quiet).verdict == REGRESSION
    # undecided for another reason (one trial each), the neighbour is still named beside it
    alone = compare_runs(trial_run(tmp_path, "d", rng, 1, 0.02), trial_run(tmp_path, "e", rng, 1, 0.02, busy_pct=95.0))
    assert alone.verdict == UNDETERMINED and "one trial per run" in alone.summary
    assert "other processes used 95% CPU during the candidate's sweeps" in alone.summary


def test_a_machine_that_sped_up_between_the_runs_is_said_beside_the_verdict(tmp_path):
    """The CPU probe's best reading 15% higher during the candidate: the points' verdict stands (its error rates are
    measured without the probe) and the line says the machine moved; a probe within MACHINE_MOVED says nothing."""
    rng = np.random.default_rng(7)
    base = trial_run(tmp_path, "a", rng, 3, 0.02, cpu_speed=(30.0, 30.4))
    faster = trial_run(tmp_path, "b", rng, 3, 0.02, factor=1.3, cpu_speed=(34.5, 35.0))
    c = compare_runs(base, faster)
    assert c.verdict == IMPROVEMENT
    assert "the machine's CPU ran 15% faster during the candidate's run than the baseline's" in c.summary
    steady = trial_run(tmp_path, "c", rng, 3, 0.02, factor=1.3, cpu_speed=(32.0, 33.0))
    assert MACHINE_MOVED > 33.0 / 30.4 - 1 and "machine's CPU" not in compare_runs(base, steady).summary
    unknown = trial_run(tmp_path, "d", rng, 3, 0.02, factor=1.3)  # a run from before the probe
    assert "machine's CPU" not in compare_runs(base, unknown).summary


def test_a_point_most_trials_failed_is_lost_one_failed_trial_is_left_out(tmp_path):
    rng = np.random.default_rng(6)
    base = trial_run(tmp_path, "a", rng, 3, 0.01)

    def failing(name: str, trials: int) -> Path:
        run = trial_run(tmp_path, name, rng, 3, 0.01)
        df = pd.read_csv(run / "results.csv")
        best = (df["concurrency"] == CONCURRENCY[-1]) & (df["trial"] <= trials)
        df.loc[best, ["status", TPUT]] = ["behind", np.nan]
        df.to_csv(run / "results.csv", index=False)
        return run

    assert compare_runs(base, failing("two", 2)).verdict == REGRESSION  # the best point lost
    one = compare_runs(base, failing("one", 1))
    assert one.verdict != REGRESSION and (one.points["trials"] == "3/2").sum() == 1


def test_a_change_is_judged_on_the_log_of_its_ratio_as_far_up_as_down(tmp_path):
    """A stated 20% spread, one trial each: the threshold is 3 spreads on the log scale (x2.35 up, /2.35 down). On a
    linear scale a latency x2 would have passed it (+100% > 85%) while a throughput /2.2 could never have (-55%)."""
    from tbench.results.compare import FASTER, HIGHER_LATENCY, SLOWER, WITHIN

    rng = np.random.default_rng(7)
    base = trial_run(tmp_path, "a", rng, 1, 0.0)
    doubled = compare_runs(base, trial_run(tmp_path, "b", rng, 1, 0.0, factor=0.5), run_cv=0.2, run_cv_p99=0.2)
    assert doubled.points["avg_verdict"].ne(HIGHER_LATENCY).all() and doubled.verdict != REGRESSION
    halved = compare_runs(base, trial_run(tmp_path, "c", rng, 1, 0.0, factor=1 / 2.6), run_cv=0.2, run_cv_p99=0.2)
    assert halved.points["throughput_verdict"].eq(SLOWER).all() and halved.verdict == REGRESSION
    faster = compare_runs(base, trial_run(tmp_path, "d", rng, 1, 0.0, factor=2.6), run_cv=0.2, run_cv_p99=0.2)
    assert faster.points["throughput_verdict"].eq(FASTER).all()
    same = compare_runs(base, trial_run(tmp_path, "e", rng, 1, 0.0, factor=1.02), run_cv=0.01, run_cv_p99=0.01)
    assert same.points["throughput_verdict"].eq(WITHIN).all()


def test_the_p99_has_its_own_smallest_effect_and_the_line_says_which_metric_needs_the_trials(tmp_path):
    """A tail that moves 6% per trial needs many trials to resolve 5%, and the line says the p99 is what needs them;
    asked to resolve 15% on the p99 (and 5% on the means, 1.5% spread), eight trials decide."""
    rng = np.random.default_rng(8)

    def noisy_tail(name: str) -> Path:
        run = trial_run(tmp_path, name, rng, 8, 0.015)
        df = pd.read_csv(run / "results.csv")
        df["p99_ms"] *= 1 + 0.06 * rng.standard_normal(len(df))
        df.to_csv(run / "results.csv", index=False)
        return run

    a, b = noisy_tail("a"), noisy_tail("b")
    tight = compare_runs(a, b)
    assert tight.verdict == UNDETERMINED and "would resolve 5% of the p99" in tight.summary
    loose = compare_runs(a, b, min_effect_p99=0.15)
    assert loose.verdict == NO_CHANGE and "(15% for the p99)" in comparison_markdown(loose)
