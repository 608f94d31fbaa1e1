"""`tbench run --direct` (tbench/stages/direct.py): the framework's own figures at the offline batch sizes, set beside
Triton's offline points (Triton / direct), in direct.csv, the manifest and the report, never in results.csv."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tbench.core.enums import Format
from tbench.results.direct_report import direct_lines
from tbench.stages import direct
from tbench.stages.direct import DirectRow, measure_direct, time_calls, torch_device, with_triton, write_direct


def _tiny_onnx(path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _sample(batch):
    return {"x": np.ones((batch, 3), np.float32)}


@pytest.fixture
def models(tmp_path):
    _tiny_onnx(tmp_path / "model.onnx")
    torch.jit.trace(torch.nn.Linear(3, 2).eval(), torch.ones(1, 3)).save(str(tmp_path / "model.pt"))
    return {Format.ONNX: tmp_path / "model.onnx", Format.TS_TRACE: tmp_path / "model.pt"}


@pytest.mark.parametrize("fmt", [Format.ONNX, Format.TS_TRACE])
def test_each_runtime_gives_a_row_per_batch_size(models, fmt):
    threads_before = torch.get_num_threads()
    rows = measure_direct(fmt, str(models[fmt]), [1, 4], _sample, "cpu", threads=1, calls=20)
    assert [(r.format, r.batch_size, r.calls, r.threads, r.device) for r in rows] == [
        (fmt.value, 1, 20, 1, "cpu"),
        (fmt.value, 4, 20, 1, "cpu"),
    ]
    assert all(r.throughput_infer_per_s > 0 and 0 < r.p50_ms <= r.p99_ms for r in rows)
    assert torch.get_num_threads() == threads_before  # the process goes on with its own threads


def test_a_slow_model_is_cut_by_time_not_count(monkeypatch):
    monkeypatch.setattr(direct, "MAX_SECONDS", 0.0)
    assert len(time_calls(lambda: None, warm_up=1, calls=300)) == direct.MIN_CALLS


def test_triton_over_direct_is_the_best_ok_offline_point_over_the_direct_figure(tmp_path):
    rows = [
        DirectRow("onnx", 8, "cpu", 2, 100, 200.0, 40.0, 40.0, 45.0),
        DirectRow("onnx", 16, "cpu", 2, 100, 300.0, 53.0, 53.0, 60.0),
    ]
    results = pd.DataFrame(
        [
            {"format": "onnx", "scenario": "offline", "batch_size": 8, "status": "ok", "throughput_infer_per_s": 150.0},
            {"format": "onnx", "scenario": "offline", "batch_size": 8, "status": "ok", "throughput_infer_per_s": 180.0},
            {"format": "onnx", "scenario": "online", "batch_size": 16, "status": "ok", "throughput_infer_per_s": 9e9},
            {"format": "onnx", "scenario": "offline", "batch_size": 16, "status": "error", "throughput_infer_per_s": 1},
        ]
    )
    paired = with_triton(rows, results)
    assert paired[0].triton_infer_per_s == 180.0 and paired[0].triton_over_direct == pytest.approx(0.9)
    assert paired[1].triton_infer_per_s is None and paired[1].triton_over_direct is None  # no ok offline point
    table = pd.read_csv(write_direct(tmp_path, paired))
    assert list(table["batch_size"]) == [8, 16] and table.loc[0, "triton_over_direct"] == pytest.approx(0.9)
    from dataclasses import asdict

    lines = "\n".join(direct_lines([asdict(r) for r in paired]))
    assert "## Triton against the framework alone" in lines and "| 0.90 " in lines
    assert direct_lines([]) == []  # no --direct: no section


def test_the_served_gpu_is_named_as_this_process_sees_it():
    assert torch_device([], ["GPU-a"]) == "cpu"
    assert torch_device(["GPU-b"], ["GPU-a", "GPU-b"]) == "cuda:1"


def test_direct_is_a_request_field_and_a_run_option():
    from typer.testing import CliRunner

    from tbench.cli import app
    from tbench.request.benchmark import BenchmarkRequest

    assert BenchmarkRequest().direct is False and BenchmarkRequest(direct=True).resolve(False).direct is True
    assert "--direct" in CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's direct figures need torch with CUDA and a GPU")
def test_on_a_gpu_the_direct_rows_run_there(models):
    rows = measure_direct(Format.TS_TRACE, str(models[Format.TS_TRACE]), [8], _sample, "cuda:0", threads=1, calls=20)
    assert rows[0].device == "cuda:0" and rows[0].throughput_infer_per_s > 0


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.proj(x))


@pytest.mark.e2e
def test_a_run_with_direct_sets_the_framework_beside_triton(prefect_harness, tmp_path):
    """The real embedded server and perf_analyzer on a tiny TorchScript file: the runtime's tensors went through
    DLPack (manifest and Served by), and every offline point has its direct row with a positive Triton / direct."""
    import json

    from conftest import run_flow

    from tbench.request.benchmark import BenchmarkRequest, Measurement

    model_file = tmp_path / "tiny.pt"
    torch.jit.script(Tiny().eval()).save(str(model_file))
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model_file=str(model_file),
            shapes={"x": [16]},
            output=str(tmp_path),
            batch_sizes=[1, 8],
            concurrency=[2],
            direct=True,
            measurement=Measurement(window_s=0.5, stability_percentage=50),
        ),
    )
    manifest = json.loads((run / "manifest.json").read_text())
    (fmt,) = set(results["format"])
    (paths,) = manifest["tensor_paths"].values()
    assert (
        paths["path"] == "dlpack" and f"Served by: {manifest['served_by'][fmt]}.\n\nTensors: through DLPack (" in report
    )
    assert "direct" not in set(results["scenario"])  # results.csv holds Triton's points only
    direct_rows = pd.read_csv(run / "direct.csv")
    assert sorted(direct_rows["batch_size"]) == [1, 8] and set(direct_rows["format"]) == {fmt}
    assert (direct_rows["throughput_infer_per_s"] > 0).all() and (direct_rows["device"] == "cpu").all()
    ok_offline = set(results[(results["scenario"] == "offline") & (results["status"] == "ok")]["batch_size"])
    with_ratio = direct_rows[direct_rows["batch_size"].isin(ok_offline)]
    assert (with_ratio["triton_over_direct"] > 0).all() and len(with_ratio) == len(ok_offline)
    assert len(manifest["direct"]) == 2 and "## Triton against the framework alone" in report
