"""The history of stored runs (tbench.history): series built from the results dataset, step changes found and put down
to what differed in the manifests, the static site and the CLI verdict. Runs are written as the store writes them
(results into the Hive-partitioned dataset, a manifest per run folder), with a planted step: one model instance fewer
from the tenth run on."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import headless_chromium, needs_chromium

from tbench.core.metrics import OK, POINT_STATUSES, RESULT_COLUMNS
from tbench.history.analysis import (
    EXIT_CODES,
    MIN_RUNS,
    NO_REGRESSION,
    REGRESSION,
    UNDETERMINED,
    Finding,
    analyse,
)
from tbench.history.attribute import MACHINE_MOVED, OTHER_CPU_MOVED_PCT, differences
from tbench.history.lost import ABSENT, FAILED, LostPoint
from tbench.history.series import build_series, load_points
from tbench.history.site import write_site
from tbench.results.dataset import add_run_to_dataset

TBENCH = str(Path(sys.executable).with_name("tbench"))
RUNS, STEP_AT, DROP = 12, 9, 0.15


def store_run(
    root: Path,
    night: int,
    throughput: float,
    instances: int,
    onnxruntime: str = "1.32.0",
    other_cpu_pct: float | None = None,
    status: str = OK,
    error: str | None = None,
    others: tuple[int, ...] = (),
) -> str:
    started = dt.datetime(2026, 11, 1, 2, 0, tzinfo=dt.UTC) + dt.timedelta(days=night)
    run_id = f"tiny-{started:%Y%m%d-%H%M%S}-{night:06x}"
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    rows = []
    # the point at concurrency 4 with `status` (ABSENT: not measured), and ok points at the concurrencies `others`
    for concurrency, point_status in ((4, status), *((c, OK) for c in others)):
        if point_status == ABSENT:
            continue
        row = {c: np.nan for c in RESULT_COLUMNS}
        served = point_status == OK
        row.update(
            model="tiny", model_size="file", gpu="CPU", format="onnx", precision="fp32", scenario="online",
            batch_size=1, concurrency=concurrency, request_distribution=None, status=point_status,
            error=None if served else error, throughput_infer_per_s=throughput if served else np.nan,
            p50_ms=4000 / throughput, p99_ms=6000 / throughput, throughput_cv=0.01, latency_cv=0.01,
        )  # fmt: skip
        rows.append(row)
    pd.DataFrame(rows, columns=RESULT_COLUMNS).to_parquet(run_dir / "results.parquet")
    manifest = {
        "run_id": run_id,
        "status": "completed",
        "started_at": started.isoformat(),
        "finished_at": (started + dt.timedelta(minutes=5)).isoformat(),
        "request": {"model": "tiny", "model_instances": instances, "max_batch_size": 8},
        "hardware": {"hostname": "worker-1", "cpu_cores": 2, "gpus": []},
        "environment": {"server": {"mode": "embedded", "version": "2.51.0"}, "tools": {"onnxruntime": onnxruntime}},
    }
    if other_cpu_pct is not None:  # as tbench.node.host_load records it
        manifest["host"] = {"other_cpu_pct": {"mean": other_cpu_pct, "max": other_cpu_pct * 1.1}}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    add_run_to_dataset(run_dir, str(root), run_id, "completed")
    return run_id


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("artifacts")
    rng = np.random.default_rng(3)
    for night in range(RUNS):
        level = 1000 * (1 - DROP) if night >= STEP_AT else 1000
        store_run(root, night, level * (1 + rng.normal(0, 0.01)), 1 if night >= STEP_AT else 2)
    return root


def test_a_series_is_one_metric_of_one_point_over_the_runs_in_order(root):
    points, manifests = load_points(str(root))
    series = build_series(points)
    assert len(manifests) == RUNS and [s.metric.label for s in series] == ["throughput", "p50 latency", "p99 latency"]
    throughput = series[0]
    assert throughput.point == "concurrency 4" and len(throughput.runs) == RUNS
    assert throughput.runs["started_at"].is_monotonic_increasing and throughput.runs["noise"].eq(0.01).all()


def test_the_planted_step_is_found_where_it_was_planted_and_put_down_to_the_instances(root):
    history = analyse(str(root))
    assert history.verdict == "regression"
    found = {f.series.metric.label: f for f in history.findings if not f.candidate}
    assert set(found) == {"throughput", "p50 latency", "p99 latency"}  # nothing else: the runs before are flat
    assert all(f.change.index == STEP_AT and f.regression and f.new for f in found.values())
    assert found["throughput"].change.relative == pytest.approx(-DROP, abs=0.03)
    (cause,) = found["throughput"].differences
    assert cause.line() == "model instances: 2 → 1" and cause.at_change


def test_differences_list_what_the_runs_after_agree_on_and_the_runs_before_never_had():
    def manifest(ort, host):
        return {"environment": {"tools": {"onnxruntime": ort}}, "hardware": {"hostname": host}}

    before = [manifest("1.32.0", "a"), manifest("1.32.0", "b")]
    after = [manifest("1.33.0", "a"), manifest("1.33.0", "b")]
    assert [d.line() for d in differences(before, after)] == ["tool versions: onnxruntime: 1.32.0 → 1.33.0"]


def test_a_flip_up_to_a_segment_off_the_change_and_reverted_later_is_named():
    """The history calibration's case: a change put 3 runs (MIN_SIZE) before the run whose runtime flipped, and a later
    revert that was not found, so the runs after the change hold both versions."""
    from tbench.history.detect import MIN_SIZE

    def manifest(ort):
        return {"environment": {"tools": {"onnxruntime": ort}}}

    before = [manifest("1.17.0")] * 9
    after = [manifest("1.17.0")] * MIN_SIZE + [manifest("1.18.0")] * 7 + [manifest("1.17.0")] * 5
    (cause,) = differences(before, after)
    assert cause.line() == "tool versions: onnxruntime: 1.17.0 → 1.18.0" and not cause.at_change


def test_the_site_has_an_index_model_pages_with_plots_and_the_regressions(root, tmp_path):
    history = analyse(str(root))
    index = write_site(history, tmp_path / "site")
    text = index.read_text()
    assert "regression" in text and "tiny file · onnx fp32 · CPU · online concurrency 4 · throughput" in text
    model_page = (tmp_path / "site" / "model-tiny.html").read_text()
    assert model_page.count("<img") == 3 and len(list((tmp_path / "site" / "plots").glob("*.png"))) == 3
    assert "model instances: 2 → 1" in (tmp_path / "site" / "regressions.html").read_text()
    assert (root / history.series[0].runs["run_id"].iloc[0]).as_uri() in model_page  # each run links to its folder


def test_the_cli_exits_1_on_a_regression_0_on_a_flat_history_and_2_on_too_few_runs(root, tmp_path):
    done = subprocess.run(
        [TBENCH, "history", str(root), "--output", str(tmp_path / "site")], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("regression: 3 series over 12 runs") and "model instances: 2 → 1" in done.stderr
    flat = tmp_path / "flat"
    for night in range(8):
        store_run(flat, night, 1000 * (1 + 0.01 * np.sin(night)), 2)
    done = subprocess.run([TBENCH, "history", str(flat)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("no regression"), done.stdout + done.stderr
    assert (flat / "history" / "index.html").is_file()
    short = tmp_path / "short"  # fewer runs than a change needs to be confirmed: the CLI says so, and exits 2
    for night in range(MIN_RUNS - 1):
        store_run(short, night, 1000 * (1 + 0.01 * np.sin(night)), 2)
    done = subprocess.run([TBENCH, "history", str(short)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout.startswith("undetermined: 3 series over 5 runs (not enough runs")


@needs_chromium
def test_the_site_reads_in_a_real_browser(root, tmp_path):
    from selenium.webdriver.common.by import By

    index = write_site(analyse(str(root)), tmp_path / "site")
    browser = headless_chromium()
    try:
        browser.get(index.as_uri())
        assert "Verdict: regression" in browser.find_element(By.TAG_NAME, "body").text
        browser.find_element(By.LINK_TEXT, "Regressions").click()
        assert "model instances: 2 → 1" in browser.find_element(By.TAG_NAME, "body").text
        browser.get(index.as_uri())
        browser.find_element(By.PARTIAL_LINK_TEXT, "throughput").click()
        images = browser.find_elements(By.TAG_NAME, "img")
        # every plot loaded (a broken image has no natural width)
        assert len(images) == 3 and all(
            browser.execute_script("return arguments[0].naturalWidth", i) > 0 for i in images
        )
    finally:
        browser.quit()


def test_a_run_is_news_when_it_is_in_a_confirmed_regression_among_the_newest_runs(root):
    history = analyse(str(root))
    run_ids = list(history.series[0].runs["run_id"])
    assert {f.series.metric.label for f in history.news(run_ids[-1])} == {"throughput", "p50 latency", "p99 latency"}
    assert history.news(run_ids[STEP_AT - 1]) == []  # a run before the step
    assert history.regressed(run_ids[-1]) == history.news(run_ids[-1])  # every one a regression, posted


def jitter(night: int) -> float:
    return 1 + 0.005 * np.sin(1.7 * night)


def throughput_finding(history, index: int):
    (finding,) = [f for f in history.findings if f.series.metric.label == "throughput" and f.change.index == index]
    return finding


# a 10% drop at night 8 with two odd nights among the five after it: confirmed by the fifth (tests/test_history_detect)
LATE = [1000, 1004, 996, 1002, 998, 1001, 999, 1003] + [901, 700, 899, 1150, 902, 898, 903]


def test_a_change_confirmed_on_the_fifth_run_after_it_alerts_once_on_that_run(tmp_path):
    told, codes = {}, {}
    for night, throughput in enumerate(LATE):
        run_id = store_run(tmp_path, night, throughput, 2)
        history = analyse(str(tmp_path))  # as the nightly history stage judges the run just stored
        told[night] = {f.series.metric.label for f in history.news(run_id)}
        codes[night] = EXIT_CODES[history.verdict]
    assert [n for n, labels in told.items() if "throughput" in labels] == [12]  # the fifth run after the step
    assert codes[12] == 1 and all(codes[n] == 1 for n, labels in told.items() if labels)
    assert all(codes[n] == 0 for n, labels in told.items() if not labels and n + 1 >= MIN_RUNS)
    for label in ("throughput", "p50 latency", "p99 latency"):  # each series tells its change once at most
        assert sum(label in labels for labels in told.values()) <= 1


def test_a_later_change_of_the_same_field_keeps_the_cause_of_the_first(tmp_path):
    """onnxruntime 1.17 -> 1.18 came with the regression; 1.19 later changed nothing."""
    for night in range(22):
        runtime = "1.17.0" if night < 8 else "1.18.0" if night < 16 else "1.19.0"
        store_run(tmp_path, night, (850 if night >= 8 else 1000) * jitter(night), 2, onnxruntime=runtime)
    finding = throughput_finding(analyse(str(tmp_path)), 8)
    assert finding.regression and finding.differences[0].line() == "tool versions: onnxruntime: 1.17.0 → 1.18.0"
    assert finding.differences[0].at_change


def test_a_revert_names_the_field_at_both_changes(tmp_path):
    for night in range(24):
        runtime = "1.18.0" if 8 <= night < 16 else "1.17.0"
        store_run(tmp_path, night, (850 if 8 <= night < 16 else 1000) * jitter(night), 2, onnxruntime=runtime)
    history = analyse(str(tmp_path))
    regression, recovery = throughput_finding(history, 8), throughput_finding(history, 16)
    assert regression.regression and not recovery.regression
    assert [d.line() for d in regression.differences] == ["tool versions: onnxruntime: 1.17.0 → 1.18.0"]
    assert [d.line() for d in recovery.differences] == ["tool versions: onnxruntime: 1.18.0 → 1.17.0"]


def test_a_noisy_neighbour_is_named(tmp_path):
    """The issue's reproduction: 8 runs, two busy loops beside runs 5-8; the manifests' host load names them."""
    for night in range(8):
        busy = night >= 4
        store_run(tmp_path, night, (330 if busy else 1000) * jitter(night), 2, other_cpu_pct=190.0 if busy else 8.0)
    finding = throughput_finding(analyse(str(tmp_path)), 4)
    assert [d.line() for d in finding.differences] == ["other processes used 1.9 cores from run 5, 0.1 before"]


def test_other_processes_cpu_that_moved_less_than_its_threshold_is_not_named():
    def manifest(cpu):
        return {"host": {"other_cpu_pct": {"mean": cpu, "max": cpu}}}

    before, after = [manifest(10.0)] * 4, [manifest(10.0 + OTHER_CPU_MOVED_PCT - 1)] * 3
    assert differences(before, after) == []
    assert len(differences(before, [manifest(10.0 + OTHER_CPU_MOVED_PCT)] * 3)) == 1


def test_a_machine_whose_cpu_slowed_is_named_by_its_probe_not_by_its_units():
    """The CPU probe before each run's sweeps fell 20% from run 5 (the same hardware name, a slower host): named. A move
    inside MACHINE_MOVED of the level before is not, on a fast machine or a slow one."""

    def manifest(speed):
        return {"host": {"cpu_speed": {"start": speed, "end": speed * 0.95, "best": speed}}}

    before, after = [manifest(40.0)] * 4, [manifest(32.0)] * 3
    assert [d.line() for d in differences(before, after)] == [
        "the machine's CPU probe read 32.0 M steps/s from run 5, 40.0 before"
    ]
    for level in (4.0, 40.0):
        steady = [manifest(level * (1 - MACHINE_MOVED) * 1.01)] * 3
        assert differences([manifest(level)] * 4, steady) == []


def test_a_neighbour_that_left_later_is_still_named_at_the_change():
    """The calibration's case: a neighbour beside 6 runs that then left, its leaving too small a step to be found, so
    the segment after the change runs to the end, mostly idle: the runs that confirmed the change name it."""

    def manifest(cpu):
        return {"host": {"other_cpu_pct": {"mean": cpu, "max": cpu}}}

    before, after = [manifest(10.0)] * 8, [manifest(150.0)] * 6 + [manifest(10.0)] * 8
    assert [d.line() for d in differences(before, after, first_run=0)] == [
        "other processes used 1.5 cores from run 9, 0.1 before"
    ]
    # placed two runs early by a noisy series: found at the runs where it began, not at the change
    early = differences(before, [manifest(10.0)] * 2 + after, first_run=0)
    assert [d.line() for d in early] == ["other processes used 1.5 cores from run 11, 0.1 before"]
    assert not early[0].at_change


def test_too_few_runs_are_undetermined_not_no_regression(tmp_path):
    for night in range(MIN_RUNS - 1):
        store_run(tmp_path, night, 1000 * jitter(night), 2)
    history = analyse(str(tmp_path))
    assert history.verdict == UNDETERMINED and EXIT_CODES[history.verdict] == 2
    assert "not enough runs" in history.summary()
    store_run(tmp_path, MIN_RUNS - 1, 1000, 2)
    assert analyse(str(tmp_path)).verdict not in (UNDETERMINED, REGRESSION)  # flat, and long enough to judge


BEHIND_ERROR = "served 61.2 req/s of 100 offered (more than 4.7% behind)"  # as tbench.loadgen.behind words it


def test_a_point_lost_by_the_newest_run_is_a_regression_told_once_on_that_run(tmp_path):
    """Eight nights served, then two behind: the first is a regression (exit 1) whose summary names the point, its
    status and its error, told once; the second, still behind, is no news and no longer gates."""
    told, codes, summaries = {}, {}, {}
    for night in range(10):
        status = "behind" if night >= 8 else OK
        run_id = store_run(tmp_path, night, 1000 * jitter(night), 2, status=status, error=BEHIND_ERROR, others=(2,))
        history = analyse(str(tmp_path))  # as the nightly history stage judges the run just stored
        told[night], summaries[night] = history.news(run_id), history.summary()
        codes[night] = EXIT_CODES[history.verdict]
    assert [n for n, news in told.items() if news] == [8]
    (lost,) = told[8]
    assert isinstance(lost, LostPoint) and lost.status == "behind" and lost.fails
    assert lost.last_ok_run.endswith("000007") and lost.lost_run.endswith("000008")
    assert codes[8] == EXIT_CODES[REGRESSION] == 1 and codes[9] == EXIT_CODES[NO_REGRESSION] == 0
    assert "tiny file · onnx fp32 · CPU · online concurrency 4: lost, behind in run" in summaries[8]
    assert BEHIND_ERROR in summaries[8] and "lost" not in summaries[9]
    (still,) = history.lost  # the night after: shown, not told
    assert not still.new and still.lost_run == lost.lost_run and "still behind in run" in still.line()
    throughput = next(s for s in history.series if s.metric.label == "throughput" and s.key["concurrency"] == 4)
    assert len(throughput.runs) == 8  # a series holds the nights that served the point


@pytest.mark.parametrize("status", [*(s for s in POINT_STATUSES if s != OK), ABSENT])
def test_a_lost_point_never_passes_exit_1_when_it_fails_its_rule_else_2(tmp_path, status):
    for night in range(3):
        store_run(tmp_path, night, 1000 * jitter(night), 2, others=(2,))
    run_id = store_run(tmp_path, 3, 1000, 2, status=status, error="boom" if status == "error" else None, others=(2,))
    history = analyse(str(tmp_path))
    (lost,) = history.news(run_id)
    assert lost.status == status and lost.new
    assert EXIT_CODES[history.verdict] == (1 if status in FAILED else 2)
    assert history.regressed(run_id) == ([lost] if status in FAILED else [])  # posted to the team only as it fails
    assert f"concurrency 4: lost, {status} in run {run_id}" in history.summary()
    assert ("boom" in history.summary()) == (status == "error")


def test_a_regression_told_before_the_point_was_lost_is_not_told_again(tmp_path):
    """A drop confirmed by night 11, then the point errors on night 12: the newest run's news is the lost point alone
    (the series' newest run is night 11, whose news the nightly stage told then)."""
    for night in range(12):
        confirming = store_run(tmp_path, night, (850 if night >= 9 else 1000) * jitter(night), 2, others=(2,))
    assert any(isinstance(a, Finding) for a in analyse(str(tmp_path)).news(confirming))
    run_id = store_run(tmp_path, 12, 850, 2, status="error", error="model failed to load", others=(2,))
    history = analyse(str(tmp_path))
    assert [type(a) for a in history.news(run_id)] == [LostPoint] and history.alerts == history.news(run_id)
    assert history.verdict == REGRESSION and any(f.regression for f in history.findings)  # still on the site


def test_the_site_lists_the_points_lost(tmp_path):
    for night in range(4):
        store_run(tmp_path, night, 1000, 2, status=OK if night < 3 else "unstable", others=(2,))
    write_site(analyse(str(tmp_path)), tmp_path / "site")
    page = (tmp_path / "site" / "regressions.html").read_text()
    assert "Points lost" in page and "online concurrency 4" in page and "unstable" in page
