"""Run comparison with a noise-aware regression verdict (tbench/results/compare.py).

The baseline fixture is a real run (dlrm ensemble on CPU, /tmp/runs/dlrm-20261122-200716-e158d2): its results.csv and
the perf_analyzer logs of its points trimmed to their "Pass" lines. Its CPU windows are noisy (CV 4-8 %), which is
what the verdicts must account for. Candidates are derived from it in tmp folders.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tbench.loadgen.perf_analyzer import Noise, cv, noise_from_log, parse_windows
from tbench.results import compare
from tbench.results.compare import (
    EXIT_CODES,
    FASTER,
    HIGHER_LATENCY,
    IMPROVEMENT,
    LOWER_LATENCY,
    MIN_P99_REQUESTS,
    NO_CHANGE,
    NOT_COMPARABLE,
    REGRESSION,
    SLOWER,
    UNDETERMINED,
    WITHIN,
    compare_runs,
    comparison_markdown,
    load_run,
    plot_comparison,
    verdict_exit_code,
)

GOLDEN = Path(__file__).parent / "golden"
RECORDED = GOLDEN / "compare" / "dlrm_cpu_baseline"


def _with_window_requests(golden: Path, requests: int = 1000) -> Path:
    """The golden run as today's runs record it: it predates `window_requests`, and its own request counts per window
    (as few as 32 at batch 1024) leave its best point's p99 undetermined, which the tests of the other rules must not
    hinge on (test_golden_run_p99_rests_on_its_own_request_counts checks the golden as recorded)."""
    run = Path(tempfile.mkdtemp(prefix="tbench-golden-")) / golden.name
    shutil.copytree(golden, run)
    results = pd.read_csv(run / "results.csv")
    results["window_requests"] = requests
    results.to_csv(run / "results.csv", index=False)
    return run


BASELINE = _with_window_requests(RECORDED)
TPUT = "throughput_infer_per_s"


def windows_only(baseline, candidate, **kw):
    """The windows' rule alone: runs stated not to move from one server process to the next (--run-cv 0), as the
    tests of that rule need; the run-to-run rule has tests of its own (tests/test_run_noise.py)."""
    return compare_runs(baseline, candidate, run_cv=0.0, run_cv_p99=0.0, **kw)


def make_run(
    tmp_path: Path,
    name: str,
    edit=None,
    logs: bool = True,
    as_parquet: bool = False,
    windows: dict[str, list[tuple[float, float]]] | None = None,
) -> Path:
    """A copy of the golden run with its results edited, logs kept or removed, or replaced by given windows
    (log stem -> [(throughput, avg latency us), ...])."""
    run = tmp_path / name
    shutil.copytree(BASELINE, run)
    results = pd.read_csv(run / "results.csv")
    if edit is not None:
        results = edit(results)
    (run / "results.csv").unlink()
    if as_parquet:
        results.to_parquet(run / "results.parquet")
    else:
        results.to_csv(run / "results.csv", index=False)
    if not logs:
        shutil.rmtree(run / "logs")
    for stem, ws in (windows or {}).items():
        (run / "logs" / "perf_analyzer" / f"{stem}.log").write_text(pass_lines(ws))
    return run


def pass_lines(windows: list[tuple[float, float]]) -> str:
    """A perf_analyzer -v log's Pass lines for (throughput, avg latency us) windows."""
    return "".join(
        f"  Pass [{i + 1}] throughput: {t:g} infer/sec. Avg latency: {lat:g} usec (std 100 usec). \n"
        for i, (t, lat) in enumerate(windows)
    )


# ResNet-50 at 100 req/s, the user's point: p99 5.68 ms, and windows with a throughput CV of 1 %, a latency CV of 3.5 %
# (combined 4.9 %: latency threshold max(5 %, 3 x 4.9 %) = 14.8 %)
RATE_POINT = {
    "model": "resnet50",
    "model_size": "small",
    "format": "onnx",
    "scenario": "rate",
    "precision": "FP32",
    "gpu": "NVIDIA H100 80GB HBM3",
    "batch_size": 1,
    "concurrency": None,
    "request_rate": 100.0,
    "request_distribution": "poisson",
    "status": "ok",
    TPUT: 100.0,
    "p99_ms": 5.68,
    "avg_ms": 4.0,
    "window_requests": 1000.0,  # a p99 over 3,000 requests: enough to decide (MIN_P99_REQUESTS)
}
STEADY = [(99.0, 3860.0), (100.0, 4000.0), (101.0, 4140.0)]


def rate_run(tmp_path: Path, name: str, *changes: dict, windows=STEADY) -> Path:
    """A run folder of rate points: one row per change (RATE_POINT updated by it), each with its own log."""
    run = tmp_path / name
    logs = run / "logs" / "perf_analyzer"
    logs.mkdir(parents=True)
    rows = []
    for i, change in enumerate(changes or [{}]):
        rows.append({**RATE_POINT, **change, "source_file": f"perf/{name}_{i}_try0.csv"})
        (logs / f"{name}_{i}_try0.log").write_text(pass_lines(windows))
    pd.DataFrame(rows).to_csv(run / "results.csv", index=False)
    return run


def scaled(factor: float, column: str = TPUT, where=None):
    def edit(df: pd.DataFrame) -> pd.DataFrame:
        rows = df.index if where is None else where(df)
        df.loc[rows, column] = df.loc[rows, column] * factor
        return df

    return edit


def stems(run: Path = BASELINE) -> list[str]:
    return [Path(s).stem for s in pd.read_csv(run / "results.csv")["source_file"]]


def quiet_windows(cv_pct: float) -> dict[str, list[tuple[float, float]]]:
    """Windows 100-d, 100, 100+d (scaled): sample CV exactly d % for throughput and latency."""
    d = cv_pct
    return {
        s: [(1000 * (100 - d), 10 * (100 - d)), (1000 * 100, 10 * 100), (1000 * (100 + d), 10 * (100 + d))]
        for s in stems()
    }


def verdicts(comparison) -> dict[int, str]:
    return {int(p["batch_size"]): p["throughput_verdict"] for _, p in comparison.points.iterrows()}


# --- noise from the logs ----------------------------------------------------------------------------------------------


def test_noise_from_real_log_lines_by_hand():
    text = (BASELINE / "logs/perf_analyzer/dlrm_offline_b2048_c1_try1.log").read_text()
    assert [w.throughput for w in parse_windows(text)] == [32627.6, 29637.4, 34777.5]
    # by hand: mean 97042.5 / 3 = 32347.5; deviations 280.1, -2710.1, 2430.0;
    # sample variance (78456.01 + 7344642.01 + 5904900.00) / 2 = 6663999.01; std 2581.4723; CV 0.0798044
    noise = noise_from_log(text)
    assert noise.throughput_cv == pytest.approx(math.sqrt(6663999.01) / 32347.5, rel=1e-9)
    assert noise.throughput_cv == pytest.approx(0.0798044, abs=1e-6)
    # latency 61966, 68390, 60754 us: mean 63703.33, sample std 4103.763 -> CV 0.0644199
    assert noise.latency_cv == pytest.approx(0.0644199, abs=1e-6)
    assert noise.windows == 3 and not noise.assumed

    # the repository's full perf_analyzer -v log: only the Pass lines count
    full = (GOLDEN / "perf_analyzer" / "ensemble_b2_c1.log").read_text()
    n = noise_from_log(full)
    assert [w.index for w in parse_windows(full)] == [1, 2, 3]
    assert n.throughput_cv == pytest.approx(88.565676 / 2409.096667, rel=1e-6)  # 2306.83, 2460.39, 2460.07
    assert n.latency_cv == pytest.approx(29.444864 / 826.0, rel=1e-6)  # 860, 809, 809 us


def test_noise_uses_last_three_windows_of_the_counting_attempt(tmp_path):
    run = load_run(BASELINE)
    by_batch = run.results.set_index("batch_size")
    # b1024 counted on try1 (try0 was unstable): its last 3 of 5 windows 60369.7, 65392.2, 64271.4
    assert by_batch.loc[1024, "source_file"].endswith("_try1.csv")
    assert by_batch.loc[1024, "throughput_cv"] == pytest.approx(
        np.std([60369.7, 65392.2, 64271.4], ddof=1) / np.mean([60369.7, 65392.2, 64271.4])
    )
    assert by_batch.loc[1024, "throughput_cv"] == pytest.approx(0.0416207, abs=1e-6)
    assert not run.results["noise_assumed"].any() and (run.results["noise_windows"] == 3).all()
    # results.parquet and fsspec URLs read the same
    parquet = load_run("file://" + str(make_run(tmp_path, "pq", as_parquet=True)))
    assert parquet.results["throughput_cv"].tolist() == pytest.approx(run.results["throughput_cv"].tolist())
    assert parquet.name == "pq"


def test_missing_logs_fall_back_to_assumed_noise(tmp_path):
    cand = load_run(make_run(tmp_path, "nologs", logs=False))
    assert cand.results["noise_assumed"].all()
    assert (cand.results["throughput_cv"] == compare.DEFAULT_NOISE).all()
    assert (cand.results["noise_note"] == "no perf_analyzer log").all()
    c = windows_only(BASELINE, cand)  # no windows to tell how far a point moves: never a pass
    assert c.verdict == UNDETERMINED and verdict_exit_code(c) == 2 and c.points["noise_assumed"].all()
    b1024 = c.points.set_index("batch_size").loc[1024]
    assert b1024["throughput_noise"] == pytest.approx(math.hypot(0.0416207, 0.05), abs=1e-6)
    assert "noise assumed" in comparison_markdown(c)


# --- verdicts ---------------------------------------------------------------------------------------------------------


def test_identical_runs_no_significant_change():
    c = windows_only(BASELINE, BASELINE)
    assert c.verdict == NO_CHANGE and verdict_exit_code(c) == 0
    assert set(c.points["verdict"]) == {WITHIN} and len(c.points) == 4 and c.unmatched.empty
    assert c.summary.startswith("no significant change against the baseline: offline best 63346 -> 63346 infer/s")


def test_throughput_scaled_by_08_is_a_regression_at_the_right_points(tmp_path):
    c = windows_only(BASELINE, make_run(tmp_path, "slow", scaled(0.8)))
    assert c.verdict == REGRESSION and verdict_exit_code(c) == 1
    # -20 % exceeds 3 x the combined noise only where the windows were steady: b1024 (sqrt(2) x 4.16 % -> 17.7 %),
    # not b64/b256/b2048 (9-11 % noise -> 27-34 %); b1024 is the offline best point, so the run regresses
    assert verdicts(c) == {64: WITHIN, 256: WITHIN, 1024: SLOWER, 2048: WITHIN}
    assert c.points["throughput_delta"].tolist() == pytest.approx([-0.2] * 4)
    assert c.best["batch_size"].tolist() == [1024]
    assert c.summary == (
        "slower than the baseline: offline best 63346 -> 50677 infer/s (-20.0%, noise ±5.9%); 1 of 4 points slower"
    )
    # halved: every point beyond its noise
    half = windows_only(BASELINE, make_run(tmp_path, "half", scaled(0.5)))
    assert set(verdicts(half).values()) == {SLOWER} and half.summary.endswith("4 of 4 points slower")


def test_majority_of_points_slower_regresses_even_if_the_best_point_holds(tmp_path):
    quiet = quiet_windows(1.0)  # 1 % windows: combined 1.4 %, threshold max(5 %, 4.2 %) = 5 %
    base = make_run(tmp_path, "base", windows=quiet)
    c = windows_only(
        base, make_run(tmp_path, "cand", scaled(0.9, where=lambda df: df["batch_size"] != 1024), windows=quiet)
    )
    assert verdicts(c) == {64: SLOWER, 256: SLOWER, 1024: WITHIN, 2048: SLOWER}
    assert c.verdict == REGRESSION and "3 of 4 points slower" in c.summary


def test_improvement_is_symmetric(tmp_path):
    c = windows_only(BASELINE, make_run(tmp_path, "fast", scaled(1.25)))
    assert verdicts(c) == {64: WITHIN, 256: WITHIN, 1024: FASTER, 2048: WITHIN}
    assert c.verdict == IMPROVEMENT and verdict_exit_code(c) == 0
    assert c.summary.startswith("faster than the baseline: offline best 63346 -> 79183 infer/s (+25.0%")


def test_two_percent_drop_with_three_percent_noise_is_within_noise(tmp_path):
    noisy = quiet_windows(3.0)  # windows 97, 100, 103: CV exactly 3 %
    base = make_run(tmp_path, "base", windows=noisy)
    assert load_run(base).results["throughput_cv"].tolist() == pytest.approx([0.03] * 4)
    cand = make_run(tmp_path, "cand", scaled(0.98), windows=noisy)
    # even with no minimum effect the 2 % drop stays inside 3 x sqrt(2) x 3 % = 12.7 %
    c = windows_only(base, cand, min_effect=0.0)
    assert set(c.points["throughput_verdict"]) == {WITHIN} and c.verdict == NO_CHANGE
    assert c.points["throughput_noise"].tolist() == pytest.approx([math.hypot(0.03, 0.03)] * 4)
    # the same drop measured with steady windows (0.1 %) is real
    steady = quiet_windows(0.1)
    c2 = windows_only(
        make_run(tmp_path, "b2", windows=steady),
        make_run(tmp_path, "c2", scaled(0.98), windows=steady),
        min_effect=0.01,
    )
    assert set(c2.points["throughput_verdict"]) == {SLOWER} and c2.verdict == REGRESSION


def test_p99_latency_rule(tmp_path):
    c = windows_only(BASELINE, make_run(tmp_path, "lat", scaled(1.5, column="p99_ms")))
    # +50 % is beyond 3 x sqrt(2) x 5-8 % (these older results have no window_requests: p99 takes the windows' CV)
    lat = {int(p["batch_size"]): p["latency_verdict"] for _, p in c.points.iterrows()}
    assert lat == {64: HIGHER_LATENCY, 256: HIGHER_LATENCY, 1024: HIGHER_LATENCY, 2048: HIGHER_LATENCY}
    assert set(c.points["throughput_verdict"]) == {WITHIN}
    assert c.verdict == REGRESSION and verdict_exit_code(c) == 1
    assert c.summary == (
        "higher latency than the baseline: p99 latency 30 -> 45 ms (+50.0%, noise ±7.9%) at offline batch 1024 "
        "concurrency 1; 0 of 4 points slower, 4 with higher latency"
    )
    assert "higher p99 latency" in comparison_markdown(c)


def test_rate_point_whose_p99_doubles_at_the_offered_rate_is_a_regression(tmp_path):
    # the user's case: two busy processes beside the server; it still serves the 100 req/s offered, p99 5.68 -> 11 ms
    base, busy = rate_run(tmp_path, "base"), rate_run(tmp_path, "busy", {"p99_ms": 11.0})
    c = windows_only(base, busy)
    p = c.points.iloc[0]
    assert p["throughput_verdict"] == WITHIN and p["p99_verdict"] == HIGHER_LATENCY and p["avg_verdict"] == WITHIN
    assert p["latency_noise"] == pytest.approx(math.hypot(0.035, 0.035)) and p["latency_threshold"] == pytest.approx(
        3 * math.hypot(0.035, 0.035)
    )
    assert c.verdict == REGRESSION and verdict_exit_code(c) == 1
    assert c.summary == (
        "higher latency than the baseline: p99 latency 5.68 -> 11 ms (+93.7%, noise ±4.9%) at rate 100/s poisson; "
        "0 of 1 points slower, 1 with higher latency"
    )
    md = comparison_markdown(c)
    assert "**Verdict: regression** — higher latency than the baseline: p99 latency" in md
    assert "higher p99 latency (best)" in md and "rate 100/s poisson" in md

    from typer.testing import CliRunner

    from tbench.cli import app

    result = CliRunner().invoke(
        app, ["compare", str(base), str(busy), "--run-cv", "0", "--run-cv-p99", "0", "--output", str(tmp_path / "out")]
    )
    assert result.exit_code == 1 and result.output.startswith("higher latency than the baseline: p99 latency")


def test_unchanged_rate_repeat_is_no_significant_change(tmp_path):
    again = rate_run(tmp_path, "again", {TPUT: 99.8, "p99_ms": 5.9, "avg_ms": 4.1})  # +3.9 %, +2.5 %: within 14.8 %
    c = windows_only(rate_run(tmp_path, "base"), again)
    assert c.verdict == NO_CHANGE and verdict_exit_code(c) == 0
    assert c.summary == (
        "no significant change against the baseline: rate best 100 -> 99.8 infer/s (-0.2%, noise ±1.4%), "
        "p99 latency 5.68 -> 5.9 ms (+3.9%, noise ±4.9%); 0 of 1 points slower, 0 faster"
    )


def test_mean_latency_up_is_a_regression(tmp_path):
    c = windows_only(rate_run(tmp_path, "base"), rate_run(tmp_path, "slow", {"avg_ms": 5.0}))  # +25 %, p99 unchanged
    assert c.points.iloc[0]["p99_verdict"] == WITHIN and c.points.iloc[0]["avg_verdict"] == HIGHER_LATENCY
    assert c.verdict == REGRESSION and verdict_exit_code(c) == 1
    assert c.summary.startswith(
        "higher latency than the baseline: mean latency 4 -> 5 ms (+25.0%, noise ±4.9%) at rate 100/s poisson"
    )


def test_lower_latency_is_an_improvement_only_when_both_fall(tmp_path):
    base = rate_run(tmp_path, "base")
    both = windows_only(base, rate_run(tmp_path, "both", {"p99_ms": 4.0, "avg_ms": 3.0}))
    assert both.verdict == IMPROVEMENT and verdict_exit_code(both) == 0
    assert both.summary.startswith(
        "lower latency than the baseline: p99 latency 5.68 -> 4 ms (-29.6%, noise ±4.9%) and mean latency 4 -> 3 ms"
    )
    tail = windows_only(base, rate_run(tmp_path, "tail", {"p99_ms": 4.0}))  # a p99 dip alone: one tail
    assert tail.points.iloc[0]["p99_verdict"] == LOWER_LATENCY and tail.verdict == NO_CHANGE
    # lower latency while serving less is no improvement: the lost throughput makes it a regression
    fewer = windows_only(base, rate_run(tmp_path, "fewer", {TPUT: 80.0, "p99_ms": 4.0, "avg_ms": 3.0}))
    assert fewer.verdict == REGRESSION and fewer.summary.startswith("slower than the baseline: rate best 100 -> 80")


def test_offline_point_with_p99_tripled_at_equal_throughput_is_a_regression(tmp_path):
    c = windows_only(
        BASELINE, make_run(tmp_path, "tail", scaled(3.0, column="p99_ms", where=lambda df: df["batch_size"] == 1024))
    )
    assert set(c.points["throughput_verdict"]) == {WITHIN}
    # b1024, the offline best point: +200 % beyond 3 x its p99 noise (the candidate's p99 standard error is the larger)
    assert c.verdict == REGRESSION and verdict_exit_code(c) == 1
    assert c.summary == (
        "higher latency than the baseline: p99 latency 30 -> 90 ms (+200.0%, noise ±10.1%) at offline batch 1024 "
        "concurrency 1; 0 of 4 points slower, 1 with higher latency"
    )


def test_constant_and_poisson_arrivals_never_match(tmp_path):
    c = windows_only(
        rate_run(tmp_path, "constant", {"request_distribution": "constant"}), rate_run(tmp_path, "poisson")
    )
    assert c.points.empty and c.verdict == NOT_COMPARABLE and verdict_exit_code(c) == 2
    assert c.unmatched["reason"].tolist() == ["only in the baseline", "only in the candidate"]
    assert "arrival distributions" in c.reason
    # both in both runs: each matches its own, the constant one 2x slower in p99 (+100 %), the Poisson one unchanged
    both = [{"request_distribution": "constant"}, {}]
    c2 = windows_only(
        rate_run(tmp_path, "b", *both), rate_run(tmp_path, "c", {**both[0], "p99_ms": 11.36}, {"p99_ms": 5.68})
    )
    assert dict(zip(c2.points["request_distribution"], c2.points["p99_verdict"])) == {
        "constant": HIGHER_LATENCY,
        "poisson": WITHIN,
    }
    # rows without a rate: an empty, missing or filled-in distribution is the same point
    c3 = windows_only(BASELINE, make_run(tmp_path, "filled", lambda df: df.assign(request_distribution="constant")))
    assert len(c3.points) == 4 and c3.unmatched.empty


def test_points_measured_at_other_shapes_or_data_never_match(tmp_path):
    """Runs at 16 and at 512 tokens, or on other samples, are not one point: not comparable, each point named; a run
    stored before these labels matches on the others."""
    at = lambda shapes, data="synthetic": lambda df: df.assign(shapes=shapes, input_data=data)  # noqa: E731
    short, long = make_run(tmp_path, "short", at("input_ids=16")), make_run(tmp_path, "long", at("input_ids=512"))
    c = windows_only(short, long)
    assert c.points.empty and c.verdict == NOT_COMPARABLE and verdict_exit_code(c) == EXIT_CODES[NOT_COMPARABLE]
    assert set(c.unmatched["shapes"]) == {"input_ids=16", "input_ids=512"}
    other_data = make_run(tmp_path, "other", at("input_ids=16", "sha256:0123456789abcdef"))
    assert windows_only(short, other_data).verdict == NOT_COMPARABLE
    same = windows_only(short, make_run(tmp_path, "again", at("input_ids=16")))
    assert len(same.points) == 4 and same.verdict == NO_CHANGE
    assert len(windows_only(BASELINE, long).points) == 4  # the golden run has no such columns: an older run


def perf_percentiles(latencies: np.ndarray) -> dict[str, np.ndarray]:
    """perf_analyzer's percentiles of each row: the sorted latencies at index p/100 x (n - 1), rounded."""
    ordered = np.sort(latencies, axis=-1)
    n = ordered.shape[-1]
    return {f"p{p}_ms": ordered[..., int(p / 100 * (n - 1) + 0.5)] for p in (50, 90, 95, 99)}


@pytest.mark.parametrize("n", [300, 1500])
@pytest.mark.parametrize(
    "draw",
    [
        lambda rng, size: 10.0 + rng.exponential(2.0, size),
        lambda rng, size: rng.lognormal(0.0, 0.5, size),
        lambda rng, size: rng.gamma(4.0, 1.0, size),
    ],
    ids=["exp_tail", "lognormal", "gamma"],
)
def test_p99_standard_error_matches_the_spread_of_sampled_p99s(n, draw):
    """Checked against what it claims to be, the spread of p99s of n requests of one distribution: the median estimate
    within 0.8-1.35x of the sampled p99s' relative standard deviation (the density at p99 taken as the p95..p99
    average gave 0.4x, and flagged 9-14% of A/A comparisons)."""
    rng = np.random.default_rng(7)
    q = perf_percentiles(draw(rng, (2000, n)))
    spread = q["p99_ms"].std() / q["p99_ms"].mean()
    estimates = [compare.p99_standard_error(a, b, n / 3) for a, b in zip(q["p95_ms"][:300], q["p99_ms"][:300])]
    assert 0.8 <= np.median(estimates) / spread <= 1.35


def test_p99_noise_is_its_standard_error_from_the_requests_it_rests_on_where_larger(tmp_path):
    """A p99 from 1,500 requests whose p95..p99 spans 4 ms: the exponential tail's scale 4 / ln 5 = 2.49 ms maps the
    rank interval 1% ± 0.26% of the requests beyond it to ± 0.65 ms, 4.6% of 14 ms; more than the windows' 3.5 %."""
    from tbench.results.compare import p99_standard_error

    spread = math.sqrt(0.0099 / 1500)
    expected = 4 / math.log(5) * math.log((0.01 + spread) / (0.01 - spread)) / 2 / 14
    assert p99_standard_error(10.0, 14.0, 500) == pytest.approx(expected)
    assert expected == pytest.approx(0.046, abs=0.001)
    assert math.isnan(p99_standard_error(10.0, 14.0, float("nan")))  # older results: no requests recorded
    few = load_run(rate_run(tmp_path, "few", {"p95_ms": 10.0, "p99_ms": 14.0, "window_requests": 500})).results
    assert few.loc[0, "p99_cv"] == pytest.approx(expected)
    many = load_run(rate_run(tmp_path, "many", {"p95_ms": 10.0, "p99_ms": 10.2, "window_requests": 5000})).results
    assert many.loc[0, "p99_cv"] == pytest.approx(many.loc[0, "latency_cv"])  # the windows' CV is the larger


def test_a_p99_from_too_few_requests_is_undetermined_and_never_passes(tmp_path):
    # 16 requests a window: 48 requests, a p99 that is the sample's largest
    few = {"p95_ms": 5.0, "p99_ms": 5.68, "window_requests": 16}
    c = windows_only(rate_run(tmp_path, "base", few), rate_run(tmp_path, "cand", {**few, "p99_ms": 5.9}))
    assert c.points.iloc[0]["p99_verdict"] == UNDETERMINED
    assert c.verdict == UNDETERMINED and verdict_exit_code(c) == 2
    assert f"p99 undetermined at rate 100/s poisson (48 requests); a p99 needs at least {MIN_P99_REQUESTS}" in c.summary
    # a throughput drop is still a regression
    slow = windows_only(rate_run(tmp_path, "b2", few), rate_run(tmp_path, "c2", {**few, TPUT: 80.0}))
    assert slow.verdict == REGRESSION and "p99 undetermined" in slow.summary


def test_two_runs_of_one_distribution_are_not_a_regression():
    """A/A at a small fixed-seed simulation: 4 concurrency points, 3 windows of 500 requests from one exponential tail
    (windows 1% apart), 150 comparisons; the old p99 noise flagged 9-14% of them."""
    rng = np.random.default_rng(3)
    concurrency = np.array([1.0, 2.0, 4.0, 8.0])

    def run(name: str) -> compare.RunResults:
        speed = 1 + 0.01 * rng.standard_normal((4, 3))
        latencies = (2.0 + rng.exponential(0.5, (4, 3, 500))) * speed[..., None] * concurrency[:, None, None]
        windows = 400 * concurrency[:, None] / speed
        rows = pd.DataFrame(
            {
                **RATE_POINT,
                "scenario": "online",
                "request_rate": np.nan,
                "concurrency": concurrency,
                TPUT: 3 / (1 / windows).sum(axis=1),
                "avg_ms": latencies.mean(axis=(1, 2)),
                "window_requests": 500.0,
                **perf_percentiles(latencies.reshape(4, -1)),
            }
        )
        avg = latencies.mean(axis=2)
        noise = [Noise(cv(t), cv(a), 3, False) for t, a in zip(windows, avg)]
        return compare.RunResults(name, name, compare.with_noise(rows, noise))

    verdicts_seen = [windows_only(run("a"), run("b")).verdict for _ in range(150)]
    assert verdicts_seen.count(REGRESSION) <= 1


def test_repeats_spread_is_the_noise_where_larger(tmp_path):
    base = rate_run(tmp_path, "base")
    # three repeats in the candidate, p99 5, 6.5, 8 ms (CV 23 %): the last, 8 ms (+41 %), is within that spread
    reps = windows_only(base, rate_run(tmp_path, "reps", {"p99_ms": 5.0}, {"p99_ms": 6.5}, {"p99_ms": 8.0}))
    p = reps.points.iloc[0]
    assert p["p99_noise"] == pytest.approx(math.hypot(0.035, 1.5 / 6.5))
    assert p["throughput_noise"] == pytest.approx(math.hypot(0.01, 0.01))  # equal throughputs: the windows' CV
    assert reps.verdict == NO_CHANGE and p["candidate_p99_ms"] == 8.0
    assert reps.unmatched["reason"].tolist() == [
        "3 rows for this point in the candidate; the last one of a trial compared"
    ]
    # the same 8 ms measured once is a regression
    assert windows_only(base, rate_run(tmp_path, "once", {"p99_ms": 8.0})).verdict == REGRESSION


def test_unmatched_and_unstable_points_are_listed_and_the_lost_ones_never_pass(tmp_path):
    def edit(df):
        df = df[df["batch_size"] != 64].copy()  # only in the baseline
        unstable = df["batch_size"] == 256
        df["error"] = df["error"].astype(object)  # all empty in the CSV: read as float
        df.loc[unstable, ["status", "error", TPUT]] = ["unstable", "not stable within 5 windows of 64 requests", np.nan]
        extra = df[df["batch_size"] == 2048].assign(batch_size=4096, source_file="perf/dlrm_offline_b4096_c1_try0.csv")
        return pd.concat([df, extra], ignore_index=True)  # b4096 only in the candidate

    c = windows_only(BASELINE, make_run(tmp_path, "partial", edit))
    assert sorted(c.points["batch_size"]) == [1024, 2048]
    reasons = {int(u["batch_size"]): u["reason"] for _, u in c.unmatched.iterrows()}
    assert reasons[64] == "only in the baseline"
    assert reasons[256] == "unstable in the candidate: not stable within 5 windows of 64 requests"
    assert reasons[4096] == "only in the candidate"
    # b64 and b256 served in the baseline, not in the candidate: neither is the best (b1024) nor a majority (2 of 3
    # judged would be; b64 was not measured): not comparable, never "no significant change"
    assert sorted(c.lost["batch_size"]) == [64, 256]
    assert c.verdict == NOT_COMPARABLE and verdict_exit_code(c) == 2
    assert "offline batch 64 concurrency 1 (not measured by the candidate)" in c.summary
    assert "offline batch 256 concurrency 1 (unstable in the candidate" in c.summary
    assert c.summary.endswith("2 lost; 1 not compared")
    md = comparison_markdown(c)
    assert "### Points not compared" in md and "lost: unstable in the candidate" in md and "only in the baseline" in md


@pytest.mark.parametrize("status", ["error", "behind", "unstable", "undetermined"])
def test_a_lost_best_point_is_a_regression(tmp_path, status):
    """The baseline kept up at 50/s and at 100/s; the candidate's 100/s point (the best) is not ok."""
    base = rate_run(tmp_path, "base", {TPUT: 50.0, "request_rate": 50.0}, {})
    cand = rate_run(tmp_path, "cand", {TPUT: 50.0, "request_rate": 50.0}, {"status": status, "error": "served 70/s"})
    c = windows_only(base, cand)
    assert c.verdict == REGRESSION and verdict_exit_code(c) == EXIT_CODES[REGRESSION] == 1
    assert f"rate 100/s poisson (best; {status} in the candidate: served 70/s)" in c.summary
    assert c.lost["best"].tolist() == [True]


def test_a_lost_point_that_is_not_the_best_never_passes(tmp_path):
    rates = [{TPUT: r, "request_rate": r} for r in (25.0, 50.0, 100.0)]
    base = rate_run(tmp_path, "base", *rates)
    cand = rate_run(tmp_path, "cand", {**rates[0], "status": "behind"}, rates[1], rates[2])
    c = windows_only(base, cand)
    assert verdict_exit_code(c) >= 1 and c.verdict == NOT_COMPARABLE
    assert "rate 25/s poisson (behind in the candidate)" in c.summary
    # two of three lost: a majority, a regression
    two = windows_only(base, rate_run(tmp_path, "two", *({**r, "status": "error"} for r in rates[:2]), rates[2]))
    assert two.verdict == REGRESSION and "the candidate lost 2 points" in two.summary
    # every point failed: a regression, not "no ok point"
    none = windows_only(base, rate_run(tmp_path, "none", *({**r, "status": "error"} for r in rates)))
    assert none.verdict == REGRESSION and none.points.empty


def test_duplicated_point_is_listed_and_compared_once(tmp_path):
    c = windows_only(BASELINE, make_run(tmp_path, "dup", lambda df: pd.concat([df, df.iloc[[0]]], ignore_index=True)))
    assert len(c.points) == 4 and c.verdict == NO_CHANGE
    assert c.unmatched["reason"].tolist() == [
        "2 rows for this point in the candidate; the last one of a trial compared"
    ]
    assert "not compared" not in c.summary


def test_different_model_is_not_comparable(tmp_path):
    c = windows_only(BASELINE, make_run(tmp_path, "other", lambda df: df.assign(model="resnet50")))
    assert c.verdict == NOT_COMPARABLE and verdict_exit_code(c) == 2
    assert c.reason == "different model (baseline dlrm; candidate resnet50)"
    assert c.summary == "not comparable: different model (baseline dlrm; candidate resnet50)"
    assert len(c.unmatched) == 8  # all four points of each run, listed
    gpu = windows_only(BASELINE, make_run(tmp_path, "gpu", lambda df: df.assign(gpu="NVIDIA A100", precision="FP16")))
    assert "different gpu" in gpu.reason and "different precision" in gpu.reason
    plot_comparison(c, tmp_path / "nc.png")  # nothing matched: still a figure


def test_nan_safe_matching_across_parquet_and_csv(tmp_path):
    def rate_points(df):  # request-rate points: no concurrency, a rate
        rows = df.iloc[:2].copy()
        rows["scenario"], rows["batch_size"] = "rate", 1
        rows["concurrency"] = None
        rows["request_rate"] = [50.0, 100.0]
        return pd.concat([df, rows], ignore_index=True)

    base = make_run(tmp_path, "base", rate_points, as_parquet=True)  # None in parquet
    cand = make_run(tmp_path, "cand", rate_points)  # empty cells -> NaN in CSV
    c = windows_only(base, cand)
    assert len(c.points) == 6 and c.unmatched.empty and c.verdict == NO_CHANGE
    assert sorted(c.points["request_rate"].dropna()) == [50.0, 100.0]


# --- outputs ----------------------------------------------------------------------------------------------------------


def test_markdown_and_plot(tmp_path):
    c = windows_only(BASELINE, make_run(tmp_path, "slow", scaled(0.8)))
    md = comparison_markdown(c)
    assert md.startswith("## Comparison against the baseline")
    assert "**Verdict: regression**" in md and c.summary in md
    assert "max(5%, the run-to-run threshold, 3 × noise)" in md  # the rule
    assert "| Format" in md and "Δ throughput" in md and "-20.0%" in md and "±5.9%" in md and "slower (best)" in md
    png = plot_comparison(c, tmp_path / "plots" / "compare.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_cli_exit_code(tmp_path):
    from typer.testing import CliRunner

    from tbench.cli import app

    result = CliRunner().invoke(
        app,
        [
            "compare",
            str(BASELINE),
            str(make_run(tmp_path, "slow", scaled(0.8))),
            "--run-cv",
            "0",
            "--output",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 1 and result.output.startswith("slower than the baseline")
    assert (tmp_path / "out" / "comparison.md").exists() and (tmp_path / "out" / "comparison.png").exists()


def test_a_folder_without_results_is_an_error_that_says_why(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results.parquet or results.csv: give a run folder"):
        load_run(tmp_path)
    # a run interrupted before its first point wrote its manifest and no results: the error says how it ended
    (tmp_path / "manifest.json").write_text(
        json.dumps({"status": "interrupted", "error": "interrupted by Ctrl-C (SIGINT) during perf-offline-onnx"})
    )
    with pytest.raises(FileNotFoundError, match=r"the run measured no point \(interrupted by Ctrl-C \(SIGINT\) during"):
        load_run(tmp_path)


def test_the_flows_baseline_stage_reports_a_verdict_or_why_not(tmp_path):
    from tbench.results.baseline import compare_with_baseline

    run = make_run(tmp_path, "slow", scaled(0.5))
    (run / "plots").mkdir(exist_ok=True)
    lines, entry = compare_with_baseline(str(BASELINE), run, run / "plots")  # one trial each: no spread to judge by
    assert entry["verdict"] == UNDETERMINED and "**Verdict: undetermined**" in "\n".join(lines)
    assert "the run-to-run spread is unknown (one trial per run)" in "\n".join(lines)
    assert "![](plots/baseline_comparison.png)" in lines and (run / "plots" / "baseline_comparison.png").exists()
    lines, entry = compare_with_baseline(str(tmp_path / "nowhere"), run, run / "plots")  # nothing lost: one line why
    assert (
        entry["verdict"] is None
        and "could not be read" in lines[2]
        and "no results.parquet or results.csv" in entry["error"]
    )


def test_golden_run_p99_rests_on_its_own_request_counts():
    """A run recorded before window_requests: its windows' --measurement-request-count is the count, and a best
    point whose p99 rests on fewer than MIN_P99_REQUESTS requests is undetermined, never passed."""
    c = windows_only(RECORDED, RECORDED)
    best = c.best.iloc[0]
    assert best["p99_requests"] < MIN_P99_REQUESTS and best["p99_verdict"] == UNDETERMINED
    assert c.verdict == UNDETERMINED and verdict_exit_code(c) == EXIT_CODES[UNDETERMINED] == 2
