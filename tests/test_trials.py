"""`--trials N` end to end on the real server: every point measured in N server processes, each row labelled with its
trial, the placement in the manifest, and `tbench compare` judging the run against itself by the spread its trials
measured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from conftest import run_flow

from tbench.request.benchmark import BenchmarkRequest
from tbench.request.measurement import Measurement
from tbench.results.compare import UNDETERMINED, WITHIN, compare_runs


def _matmul_onnx(path: Path) -> Path:
    """A one-op ONNX file (x @ W, dynamic batch): the server's and perf_analyzer's time, not a model's."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [weight],
    )
    out = path / "matmul.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), out)
    return out


def test_every_point_is_measured_in_each_trial_and_compare_judges_by_their_spread(prefect_harness, tmp_path):
    request = BenchmarkRequest(
        model_file=str(_matmul_onnx(tmp_path)),
        output=str(tmp_path),
        trials=2,
        scenarios=["offline"],
        batch_sizes=[1, 4],
        measurement=Measurement(window_s=0.5, stability_percentage=50),
    )
    run, results, _ = run_flow(tmp_path, request)
    ok = results[results["status"] == "ok"]
    assert sorted(ok["trial"].unique().tolist()) == [1, 2]
    assert ok.groupby("batch_size")["trial"].nunique().eq(2).all()  # each point in both server processes
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["trials"] == 2 and manifest["placement"]["reason"]
    assert manifest["placement"]["intra_op_threads"] >= 1
    assert "server-restart-trial2" in manifest["stages"] and not any(s.startswith("reload") for s in manifest["stages"])
    # each server process served the offline config from its start (--model-config-name): no reload before a sweep,
    # and the flow read it back (static batching) before measuring
    log = (run / "logs" / "tritonserver.log").read_text()
    assert log.count("Signal (15) received") == 2 and log.count("successfully loaded") == 2
    assert log.count("--model-config-name=offline") == 2

    c = compare_runs(run, run)  # a run against itself: its trials measure the spread, and nothing moved
    assert c.spread.startswith("run-to-run spread") and "measured over up to 2 trials" in c.spread
    assert set(c.points["throughput_verdict"]) <= {WITHIN, UNDETERMINED}
    assert (c.points["trials"] == "2/2").all()
