"""Where a pipeline spends its time (tbench.core.pipeline_steps): counters from Triton's real statistics replies, a
step's ceiling from its per-execution busy time (a merged batch counted once), a python pipeline holding its instance
while its calls run, the busy share at a measured throughput, the bounding step named or none; the report's section;
and on the real embedded server a BLS model's run naming itself as what bounds it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_user_repository import _cli_run, user_repository, write_model

from tbench.core.metrics import THROUGHPUT
from tbench.core.pipeline_steps import (
    PIPELINE,
    SATURATED_PCT,
    STEP,
    STEP_COLUMNS,
    bounding_step,
    busy_at,
    counters_from_statistics,
    step_rows,
)
from tbench.results.pipeline_report import bounds, pipeline_lines

GOLDEN = Path(__file__).parent / "golden" / "triton"
INSTANCES = {"bls": 1, "doubler": 2, "plus_one": 1, "pipeline": None}


def golden(which: str) -> dict:
    return counters_from_statistics(json.loads((GOLDEN / f"statistics_bls_{which}.json").read_text()))


def test_counters_sum_every_version_and_read_triton_json_strings():
    before, after = golden("before"), golden("after")
    bls = after["bls"].minus(before["bls"])
    assert (bls.requests, bls.inferences, bls.executions) == (30, 60, 30)  # 20 of batch 1, 10 of batch 4
    doubler = after["doubler"].minus(before["doubler"])  # versions 1 (idle) and 2 summed
    assert doubler.requests == 30 and doubler.busy_ns > 0
    assert after["pipeline"].requests == 0


def test_a_bls_models_steps_and_its_own_row():
    rows = {r["step"]: r for r in step_rows("bls", golden("before"), golden("after"), INSTANCES)}
    assert set(rows) == {"bls", "doubler", "plus_one"}  # the idle ensemble has no row
    assert rows["doubler"]["role"] == rows["plus_one"]["role"] == STEP and rows["bls"]["role"] == PIPELINE
    assert rows["doubler"]["calls_per_request"] == rows["plus_one"]["calls_per_request"] == 1.0
    assert rows["doubler"]["batch"] == 2.0  # 60 inferences in 30 executions
    bls = rows["bls"]
    assert 0 < bls["own_ms"] < bls["compute_ms"]  # its calls' server time taken out
    # its one instance is held while its calls run: it is full long before either step
    assert bls["ceiling_per_s"] < min(rows["doubler"]["ceiling_per_s"], rows["plus_one"]["ceiling_per_s"])
    assert all(r["busy_pct"] is None for r in rows.values())  # left to busy_at, which knows the throughput


def test_an_ensemble_has_no_row_of_its_own():
    before, after = golden("before"), golden("after")
    assert {r["step"] for r in step_rows("bls", before, after, {**INSTANCES, "bls": None})} == {"doubler", "plus_one"}
    assert step_rows("pipeline", before, after, INSTANCES) == []  # it served nothing between the replies


def _stats(name: str, requests: int, executions: int, per_request_ns: int, per_execution_ns: int) -> dict:
    """One model's statistics in Triton's JSON: `requests` merged into `executions`, each request timed
    `per_request_ns` and each execution `per_execution_ns`."""

    def d(count, ns):
        return {"count": str(count), "ns": str(ns)}

    return {
        "name": name,
        "inference_count": str(requests),
        "execution_count": str(executions),
        "inference_stats": {
            "success": d(requests, 0),
            "queue": d(requests, 0),
            "compute_infer": d(requests, requests * per_request_ns),
        },
        "batch_stats": [{"batch_size": "4", "compute_infer": d(executions, executions * per_execution_ns)}],
    }


def test_a_merged_batch_is_busy_once():
    before = counters_from_statistics({"model_stats": []})
    after = counters_from_statistics(
        {"model_stats": [_stats("ens", 400, 400, 0, 0), _stats("step", 400, 100, 1_000_000, 1_000_000)]}
    )
    (row,) = step_rows("ens", before, after, {"ens": None, "step": 1})
    assert row["batch"] == 4 and row["compute_ms"] == 1.0
    assert row["ceiling_per_s"] == pytest.approx(4000)  # 4 inferences per 1 ms execution, not 1 per ms


def test_busy_share_at_a_throughput_and_the_bounding_step():
    rows = [
        {"step": "a", "ceiling_per_s": 1000.0},
        {"step": "b", "ceiling_per_s": 4000.0},
        {"step": "c", "ceiling_per_s": None},
    ]
    busy = pd.DataFrame(busy_at(rows, 900.0))
    assert busy["busy_pct"].iloc[:2].tolist() == pytest.approx([90.0, 22.5]) and pd.isna(busy["busy_pct"].iloc[2])
    bound = bounding_step(busy)
    assert bound.step == "a" and bound.runner_up == "b" and "**a**" in bound.line()
    assert busy_at(rows, float("nan")) == rows  # a point that did not measure: no share
    idle = bounding_step(pd.DataFrame(busy_at(rows, 0.5 * SATURATED_PCT * 10)))
    assert idle.step is None and idle.runner_up == "a" and idle.line().startswith("no step")
    assert "undetermined" in bounding_step(pd.DataFrame(rows).assign(busy_pct=None)).line()


def test_the_report_names_the_bound_at_each_scenarios_best_point(tmp_path):
    results = pd.DataFrame(
        [
            {
                "scenario": "online",
                "batch_size": 1,
                "concurrency": 1.0,
                "request_rate": None,
                "status": "ok",
                THROUGHPUT.column: 300.0,
            },
            {
                "scenario": "online",
                "batch_size": 1,
                "concurrency": 4.0,
                "request_rate": None,
                "status": "ok",
                THROUGHPUT.column: 900.0,
            },
        ]
    )
    steps = pd.DataFrame(
        [
            {
                "model": "p",
                "step": s,
                "role": STEP,
                "scenario": "online",
                "batch_size": 1,
                "concurrency": c,
                "instances": 1,
                "ceiling_per_s": ceiling,
            }
            for c in (1.0, 4.0)
            for s, ceiling in (("pre", 1000.0), ("net", 5000.0))
        ],
        columns=STEP_COLUMNS,
    )
    steps["busy_pct"] = 100 * steps["concurrency"].map({1.0: 300.0, 4.0: 900.0}) / steps["ceiling_per_s"]
    (point, rate, bound) = bounds(steps, results)["online"]
    assert (point, rate, bound.step) == ("online b1 c4", 900.0, "pre")
    (tmp_path / "plots").mkdir()
    text = "\n".join(pipeline_lines(steps, results, tmp_path / "plots"))
    assert "bounded by **pre**" in text and (tmp_path / "plots" / "pipeline_steps_busy.png").is_file()
    assert pipeline_lines(pd.DataFrame(columns=STEP_COLUMNS), results, tmp_path / "plots") == []


# ---- on the real embedded server

BLS_CONFIG = """
backend: "python"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "z" data_type: TYPE_FP32 dims: [ 4 ] }
instance_group { count: 1 kind: KIND_CPU }
"""

BLS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, tensor, output):
    reply = pb_utils.InferenceRequest(model_name=model, requested_output_names=[output], inputs=[tensor]).exec()
    if reply.has_error():
        raise pb_utils.TritonModelException(reply.error().message())
    return pb_utils.get_output_tensor_by_name(reply, output)


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            y = call("doubler", pb_utils.get_input_tensor_by_name(request, "x"), "y")
            z = call("plus_one", y, "z").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("z", z.astype(np.float32))]))
        return out
"""


def bls_repository(root: Path) -> Path:
    """test_user_repository's repository and `bls`, a python model calling its two models per request."""
    user_repository(root)
    write_model(root, "bls", BLS_CONFIG, files={"model.py": BLS_MODEL})
    return root


@pytest.mark.e2e
def test_a_bls_models_run_says_where_its_time_went_and_what_bounds_it(tmp_path):
    run_dir, rows, manifest = _cli_run(tmp_path, bls_repository(tmp_path / "repo"), "bls")
    assert (rows["status"] == "ok").all(), rows.to_string()
    steps = pd.read_csv(run_dir / "pipeline_steps.csv")
    assert len(steps) == 3 * len(rows)  # every point: its two calls and its own row; the idle ensemble none
    assert set(steps["step"]) == {"bls", "doubler", "plus_one"} and set(steps["role"]) == {STEP, PIPELINE}
    called = steps[steps["role"] == STEP]
    assert (called["calls_per_request"] == 1.0).all()  # each request called each model once, counted exactly
    assert steps["busy_pct"].notna().all() and (steps["ceiling_per_s"] > 0).all()
    bounds_ = manifest["pipeline_bounds"]
    assert set(bounds_) == set(rows["scenario"])
    # one instance held through both calls: the busiest, whether or not it was full
    for scenario, b in bounds_.items():
        at = steps[(steps["scenario"] == scenario)]
        assert b["step"] in ("bls", None) and b["line"], (b, at.to_string())
    assert "## Where the pipeline spends its time" in (run_dir / "report.md").read_text()
