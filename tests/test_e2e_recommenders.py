"""End to end on the embedded server for the recommender systems: Wide&Deep (one SavedModel, many inputs, online
requests of many samples) and DLRM / DCNv2 as a Triton ensemble of a sparse SavedModel and a dense ONNX model."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_flow

from tbench.request.benchmark import BenchmarkRequest, Measurement

pytestmark = pytest.mark.e2e

QUICK = Measurement(window_s=0.5, stability_percentage=50)


# one batch size for DCNv2: the ensemble's path is DLRM's (its own dense part runs in tests/test_dlrm.py too)
@pytest.mark.parametrize(("model", "batch_sizes"), [("dlrm", [64, 256]), ("dcnv2", [256])], ids=["dlrm", "dcnv2"])
def test_ensemble_of_sparse_and_dense_parts(prefect_harness, tmp_path, model, batch_sizes):
    baseline = Path(__file__).parent / "golden" / "compare" / "dlrm_cpu_baseline"  # a CPU run of dlrm small
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model=model,
            size="tiny",
            batch_sizes=batch_sizes,
            max_batch_size=256,
            accuracy_samples=512,
            output=str(tmp_path),
            measurement=QUICK,
            baseline=str(baseline),
        ),
    )
    assert set(results["scenario"]) == {"offline"} and (results["status"] == "ok").all()
    assert set(results["format"]) == {"ensemble"}
    assert results["model_format"].iloc[0] == "NVIDIA Triton Ensemble (TensorFlow SavedModel + ONNX)"
    # the repository: both composing models and the ensemble over them, its steps derived from the parts' tensors
    repo = run / "model_repository"
    assert (repo / f"{model}_sparse/1/model.savedmodel/saved_model.pb").exists()
    assert (repo / f"{model}_dense/1/model.onnx").exists()
    ensemble = (repo / model / "config.pbtxt").read_text()
    assert (
        'platform: "ensemble"' in ensemble
        and f'model_name: "{model}_sparse"' in ensemble
        and f'model_name: "{model}_dense"' in ensemble
    )
    # each part checked against its own framework part, and the whole answered the same through the ensemble
    correctness = json.loads((run / "correctness.json").read_text())
    assert {(c["model"], c["format"]) for c in correctness if c["model"]} == {
        (f"{model}_sparse", "tf-savedmodel"),
        (f"{model}_dense", "onnx"),
    }
    accuracy = json.loads((run / "accuracy.json").read_text())[0]
    assert accuracy["format"] == "ensemble" and accuracy["metric"] == "AUC" and accuracy["samples"] == 512
    assert abs(accuracy["difference"]) < 1e-3 and accuracy["agreement"] > 0.99
    # perf_analyzer's per composing model rows, for every measured point
    composing = pd.read_csv(run / "composing.csv")
    assert set(composing["composing_model"]) == {f"{model}_sparse", f"{model}_dense"}
    assert len(composing) == 2 * len(results) and (composing["server_compute_infer_ms"] > 0).all()
    assert "### Composing models" in report and "Embedding tables" in report
    # where its time went, from Triton's statistics: both parts at every point, the bounding step named
    steps = pd.read_csv(run / "pipeline_steps.csv")
    assert len(steps) == 2 * len(results) and set(steps["step"]) == {f"{model}_sparse", f"{model}_dense"}
    assert (steps["format"] == "ensemble").all() and (steps["ceiling_per_s"] > 0).all()
    bounded = json.loads((run / "manifest.json").read_text())["pipeline_bounds"]
    assert set(bounded) == {"offline"} and "## Where the pipeline spends its time" in report
    # the baseline stage ran and said why a tiny run cannot be judged against a small one of another model or size
    comparison = json.loads((run / "manifest.json").read_text())["comparison"]
    assert comparison["verdict"] == "not comparable" and "## Comparison against the baseline" in report
    page = (run / "report.html").read_text()  # the same report as one page, every plot inside it
    assert (
        page.count("data:image/png;base64,") == len(list((run / "plots").glob("*.png"))) and 'src="plots/' not in page
    )


def test_widedeep_offline_and_online_with_many_samples_per_request(prefect_harness, tmp_path):
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model="widedeep",
            size="small",
            batch_sizes=[1, 64],
            concurrency=[1, 2],
            online_batch_size=32,
            max_batch_size=128,
            preferred_batch_sizes=[64],
            accuracy_samples=256,
            output=str(tmp_path),
            measurement=QUICK,
        ),
    )
    assert (results["status"] == "ok").all() and set(results["scenario"]) == {"offline", "online"}
    assert set(results.loc[results["scenario"] == "online", "batch_size"]) == {32}
    accuracy = json.loads((run / "accuracy.json").read_text())[0]
    assert accuracy["metric"] == "MAP@12" and abs(accuracy["difference"]) < 1e-3
    # perf_analyzer sent real samples (JSON input data): integer ids stay inside their vocabularies
    data = json.loads((run / "perf_input.json").read_text())["data"]
    assert len(data) >= 64 and "platform" in data[0]
    assert "each client sends batch 32" in report
