"""Measured points re-used by a re-run with the same inputs: on the real server with the real perf_analyzer, and
through the flow (a run interrupted after some points resumes without measuring them again)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tbench.core.enums import Scenario
from tbench.core.layout import RunLayout
from tbench.loadgen.perf_analyzer import Point
from tbench.request.benchmark import BenchmarkRequest, Measurement
from tbench.results.point_cache import PointCache
from tbench.stages.sweep import run_sweep

pytestmark = pytest.mark.e2e

QUICK = Measurement(window_s=0.5, stability_percentage=50, max_trials=8)


def test_a_sweep_takes_cached_points_and_measures_only_the_rest(served_small, small_artifacts, tmp_path):
    context = {"model": "resnet50-small", "measurement": QUICK.model_dump()}
    cache = PointCache(context, tmp_path / "cache")
    sweep = dict(
        model="resnet50",
        grpc_url=served_small.endpoints.grpc_url,
        spec=small_artifacts[0].io_spec,
        m=QUICK,
        static={"model": "resnet50"},
    )
    first = RunLayout(tmp_path, "first").create()
    run_sweep([Point(Scenario.OFFLINE, 1, 1)], layout=first, cache=cache, **sweep)  # an interrupted run: one point
    second = RunLayout(tmp_path, "second").create()
    table = run_sweep(
        [Point(Scenario.OFFLINE, 1, 1), Point(Scenario.OFFLINE, 4, 1)], layout=second, cache=cache, **sweep
    )
    by_batch = table.set_index("batch_size")
    assert by_batch.loc[1, "reused_from"] == "first" and pd.isna(by_batch.loc[4, "reused_from"])
    assert (table["status"] == "ok").all()
    # the reused point's files came along, so the run folder is complete
    assert (second.run_dir / by_batch.loc[1, "source_file"]).is_file()
    assert list((second.run_dir / "logs" / "perf_analyzer").glob("*b1_c1*.log"))
    # other settings are another key: nothing reused
    other = PointCache({**context, "measurement": {"window_s": 2.0}}, tmp_path / "cache")
    third = RunLayout(tmp_path, "third").create()
    table = run_sweep([Point(Scenario.OFFLINE, 1, 1)], layout=third, cache=other, **sweep)
    assert table["reused_from"].isna().all()


def test_a_rerun_with_reuse_converts_and_measures_nothing_again(prefect_harness, tmp_path, monkeypatch):
    """The first run without --reuse: every run keeps its points, so a run interrupted without it is resumed."""
    from conftest import run_flow

    monkeypatch.setenv("TBENCH_POINT_CACHE_DIR", str(tmp_path / "points"))
    request = BenchmarkRequest(
        model="resnet50",
        size="small",
        formats=["onnx"],
        batch_sizes=[4],
        concurrency=[2],
        output=str(tmp_path),
        measurement=QUICK,
    )
    first, results1, _ = run_flow(tmp_path, request)
    again, results_again, _ = run_flow(tmp_path, request)  # without --reuse: measured again
    assert results_again["reused_from"].isna().all()
    second, results2, report = run_flow(tmp_path, request.model_copy(update={"reuse_measurements": True}))
    assert results1["reused_from"].isna().all()
    assert (results2["reused_from"] == first.name).all() and len(results2) == len(results1) == 2
    cols = ["scenario", "batch_size", "concurrency", "throughput_infer_per_s", "p99_ms"]
    key = ["scenario", "batch_size", "concurrency"]
    assert (
        results2[cols]
        .sort_values(key)
        .reset_index(drop=True)
        .equals(results1[cols].sort_values(key).reset_index(drop=True))
    )
    assert all(a["cached"] for a in json.loads((second / "artifacts.json").read_text()))  # no conversion ran either
