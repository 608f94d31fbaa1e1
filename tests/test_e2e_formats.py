"""End to end through the flow for the TensorFlow formats and for user model files (ONNX, TorchScript, SavedModel
with several inputs and outputs, an integer input and a dynamic non-batch dimension)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import measured, run_flow

from tbench.request.benchmark import BenchmarkRequest, Measurement

pytestmark = pytest.mark.e2e

QUICK = dict(batch_sizes=[1, 2], concurrency=[2], measurement=Measurement(window_s=0.5, stability_percentage=50))


def test_tensorflow_run_serves_the_savedmodel_and_its_onnx(prefect_harness, tmp_path):
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model="resnet50", framework="tensorflow", size="small", serve_formats=["all"], output=str(tmp_path), **QUICK
        ),
    )
    assert set(results["format"]) == {"tf-savedmodel", "onnx"} and (results["status"] == "ok").sum() >= 4
    assert set(results["backend"]) == {"python (tensorflow)", "python (onnxruntime)"}
    assert set(results["model_format"]) == {"TensorFlow SavedModel", "ONNX"}
    assert (run / "models/tf-savedmodel/model.savedmodel/saved_model.pb").exists()
    assert (run / "model_repository/resnet50_tf_savedmodel/1/model.savedmodel/saved_model.pb").exists()
    assert "## Format `tf-savedmodel`" in report and "## Format `onnx`" in report
    correctness = json.loads((run / "correctness.json").read_text())
    assert [c["format"] for c in correctness] == ["tf-savedmodel", "onnx"]
    assert all(o["passed"] for c in correctness for o in c["outputs"])


# ---- a user's model file: two inputs (features [S, 8] with S dynamic, int64 token ids [S]) and two outputs


def _torch_module():
    import torch

    class Scorer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(16, 8)
            self.proj = torch.nn.Linear(8, 4)

        def forward(self, features, ids):
            hidden = self.proj(features + self.emb(ids))  # [B, S, 4]
            return hidden, hidden.mean(dim=1)  # a dynamic-length output and a fixed one

    return Scorer().eval()


def _write_onnx(path: Path) -> Path:
    import torch

    module, out = _torch_module(), path / "scorer.onnx"
    torch.onnx.export(
        module,
        (torch.randn(2, 5, 8), torch.zeros(2, 5, dtype=torch.int64)),
        str(out),
        dynamo=False,
        input_names=["features", "ids"],
        output_names=["hidden", "pooled"],
        dynamic_axes={
            "features": {0: "b", 1: "s"},
            "ids": {0: "b", 1: "s"},
            "hidden": {0: "b", 1: "s"},
            "pooled": {0: "b"},
        },
    )
    return out


def _write_torchscript(path: Path) -> Path:
    import torch

    out = path / "scorer.pt"
    torch.jit.script(_torch_module()).save(str(out))
    return out


def _write_savedmodel(path: Path) -> Path:
    import tensorflow as tf

    class Scorer(tf.Module):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.emb = tf.Variable(rng.standard_normal((16, 8)).astype("float32"))
            self.w = tf.Variable(rng.standard_normal((8, 4)).astype("float32"))

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, None, 8], tf.float32, name="features"),
                tf.TensorSpec([None, None], tf.int64, name="ids"),
            ]
        )
        def __call__(self, features, ids):
            hidden = tf.einsum("bsf,fo->bso", features + tf.gather(self.emb, ids), self.w)
            return {"hidden": hidden, "pooled": tf.reduce_mean(hidden, axis=1)}

    module, out = Scorer(), path / "scorer_savedmodel"
    tf.saved_model.save(module, str(out), signatures=module.__call__)
    return out


@pytest.mark.parametrize(
    "writer, extra",
    [
        (_write_onnx, {"shapes": {"features": [6, 8], "ids": [6]}}),
        (_write_torchscript, {"shapes": {"features": [-1, 8], "ids": [-1]}, "input_dtypes": {"ids": "int64"}}),
        (_write_savedmodel, {}),
    ],
    ids=["onnx", "torchscript", "savedmodel"],
)
def test_a_model_file_is_read_served_checked_and_swept(prefect_harness, tmp_path, writer, extra):
    model_file = writer(tmp_path)
    run, results, report = run_flow(
        tmp_path, BenchmarkRequest(model_file=str(model_file), output=str(tmp_path), **extra, **QUICK)
    )
    iospec = json.loads((run / "io_spec.json").read_text())
    assert {t["name"]: t["dtype"] for t in iospec["inputs"]} == {"features": "float32", "ids": "int64"}
    assert {t["name"]: t["shape"] for t in iospec["inputs"]}["features"] == [-1, 8]
    (accuracy,) = json.loads((run / "accuracy.json").read_text())
    assert (
        accuracy["metric"] is None and len(accuracy["outputs"]) == 2 and all(o["passed"] for o in accuracy["outputs"])
    )
    ok = results[results["status"] == "ok"]
    assert set(ok["scenario"]) == {"offline", "online"} and len(ok) >= 2
    (log,) = (run / "logs" / "perf_analyzer").glob("*_offline_b2_c1_try0.log")
    argv = log.read_text().splitlines()[0]
    seq = extra.get("shapes", {}).get("ids", [16])[0]
    seq = 16 if seq == -1 else seq  # dynamic dims the user leaves open get the default length
    assert f"--shape features:{seq},8" in argv and f"--shape ids:{seq}" in argv and "--input-data" in argv
    # dims nobody sized are named beside the figures, with the --shape line that chooses them
    guessed = json.loads((run / "manifest.json").read_text())["guessed_shapes"]
    summary = report.split("## Summary")[1].split("\n## ")[0]
    if "shapes" in extra:
        assert guessed == {} and "Shapes tbench chose" not in report
    else:
        assert guessed == {"features": [16, 8], "ids": [16]}
        assert "**Shapes tbench chose**" in summary and "--shape features:16,8 --shape ids:16" in summary
    # and so are the integers nobody ranged (ids: no --value-range in any case)
    chosen = json.loads((run / "manifest.json").read_text())["guessed_values"]
    assert list(chosen) == ["ids"] and f"drawn from ids {chosen['ids']}" in summary
    assert "Served by: python" in report and "### Accuracy through Triton" in report


def test_a_shape_sweep_measures_every_point_at_every_shape(prefect_harness, tmp_path):
    """--shape ids:4,12: two shape sets; features shares ids' named dim (s) and moves with it. Each point is measured
    at each set, the results keep the shape in their own column, and the report plots them against shape."""
    model_file = _write_onnx(tmp_path)
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(model_file=str(model_file), shapes={"ids": [4, 12]}, output=str(tmp_path), **QUICK),
    )
    ok = results[results["status"] == "ok"]
    assert set(ok["shapes"]) == {"features=4x8; ids=4", "features=12x8; ids=12"}
    for _, points in ok.groupby("shapes"):
        assert {(r.scenario, r.batch_size, r.concurrency) for r in points.itertuples()} == {
            ("offline", 1, 1),
            ("offline", 2, 1),
            ("online", 1, 2),
        }
    assert {p.name for p in (run / "perf").glob("*_offline_b2_c1_*_try0.csv")} == {
        "scorer_offline_b2_c1_features4x8_ids4_try0.csv",
        "scorer_offline_b2_c1_features12x8_ids12_try0.csv",
    }
    (log,) = (run / "logs" / "perf_analyzer").glob("*_offline_b2_c1_features12x8_ids12_try0.log")
    assert "--shape features:12,8" in log.read_text().splitlines()[0]
    assert "### By shape" in report and (run / "plots" / "onnx_shapes_throughput_p99.png").is_file()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["guessed_shapes"] == {} and len(manifest["measured_shapes"]) == 4
    # the summary gives each shape set its own best (the best of both would be the shorter one's)
    best = [(b["scenario"], b["shapes"]) for b in manifest["summary"]["best"]]
    assert sorted(best) == sorted((s, shapes) for s in ("offline", "online") for shapes in set(ok["shapes"]))
    assert "| Shapes " in report.split("## Summary")[1].split("\n## ")[0]


# ---- a file as large models are saved (weights in a separate file) with FP16 inputs and outputs


def _write_fp16_external_data_onnx(path: Path) -> Path:
    """An MLP exported in half precision (FP16 io), its weights saved beside it in weights.bin (external data)."""
    import onnx
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).half().eval()
    exported = path / "exported.onnx"
    torch.onnx.export(
        module,
        (torch.randn(2, 16).half(),),
        str(exported),
        dynamo=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
    )
    folder = path / "handed_over"
    folder.mkdir()
    out = folder / "mlp.onnx"
    onnx.save_model(
        onnx.load(str(exported)), str(out), save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    return out


def test_a_file_with_external_data_and_fp16_inputs_is_served_and_swept(prefect_harness, tmp_path):
    model_file = _write_fp16_external_data_onnx(tmp_path)
    assert (model_file.parent / "weights.bin").stat().st_size > 1000 and model_file.stat().st_size < 1000
    run, results, report = run_flow(
        tmp_path, BenchmarkRequest(model_file=str(model_file), output=str(tmp_path), **QUICK)
    )
    iospec = json.loads((run / "io_spec.json").read_text())
    assert [t["dtype"] for t in iospec["inputs"] + iospec["outputs"]] == ["float16", "float16"]
    # the weights travelled with the model: into the run folder and into the Triton repository
    assert (run / "models/onnx/weights.bin").exists()
    assert (run / "model_repository/mlp/1/weights.bin").exists()
    (accuracy,) = json.loads((run / "accuracy.json").read_text())
    assert all(o["passed"] for o in accuracy["outputs"])
    # perf_analyzer takes FP16 data only as bytes (b64): every point measured
    assert (results["status"] == "ok").all() and set(results["scenario"]) == {"offline", "online"}, results[
        ["scenario", "batch_size", "status", "error"]
    ]
    sample = json.loads((run / "perf_input.json").read_text())["data"][0]["x"]
    assert set(sample) == {"b64", "shape"} and sample["shape"] == [16]


# ---- files as other teams export them: no batch axis, and tensors whose only axis is the batch


def _write_fixed_batch_onnx(path: Path) -> Path:
    """A small vision net exported at a fixed batch of 1, as model-zoo and vendor files are: no batch axis."""
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    ).eval()
    out = path / "fixed.onnx"
    torch.onnx.export(
        module, (torch.randn(1, 3, 16, 16),), str(out), dynamo=False, input_names=["image"], output_names=["logits"]
    )
    return out


def _write_one_sample_torchscript(path: Path) -> Path:
    """A module written for one sample (it views its input as [1, 12]): it runs at batch 1 only."""
    import torch

    class OneSample(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(12, 3)

        def forward(self, x):
            return self.fc(x.view(1, 12))

    out = path / "one_sample.pt"
    torch.jit.script(OneSample().eval()).save(str(out))
    return out


@pytest.mark.parametrize(
    "writer, extra, served_input",
    [
        (_write_fixed_batch_onnx, {}, [1, 3, 16, 16]),
        (_write_one_sample_torchscript, {"shapes": {"x": [3, 4]}}, [1, 3, 4]),
    ],
    ids=["onnx", "torchscript"],
)
def test_a_model_without_a_batch_axis_is_served_unbatched(prefect_harness, tmp_path, writer, extra, served_input):
    model_file = writer(tmp_path)
    quick = {**QUICK, "batch_sizes": None, "concurrency": [1, 2]}
    run, results, report = run_flow(
        tmp_path, BenchmarkRequest(model_file=str(model_file), output=str(tmp_path), **extra, **quick)
    )
    (config_path,) = (run / "model_repository").glob("*/config.pbtxt")
    config = config_path.read_text()
    assert "max_batch_size" not in config and "dynamic_batching" not in config  # 0: Triton's default, left out
    iospec = json.loads((run / "io_spec.json").read_text())
    assert iospec["inputs"][0]["shape"] == served_input
    (accuracy,) = json.loads((run / "accuracy.json").read_text())
    assert all(o["passed"] for o in accuracy["outputs"])
    measured(results)
    assert list(results[results["scenario"] == "offline"]["batch_size"]) == [1]
    assert sorted(results[results["scenario"] == "online"]["concurrency"]) == [1, 2]
    assert "no batch axis" in report and "max_batch_size 0" in report
    sample = json.loads((run / "perf_input.json").read_text())["data"][0]
    assert next(iter(sample.values()))["shape"] == served_input  # a whole request, not a row of a batch


def _write_one_d_onnx(path: Path) -> Path:
    """A classifier whose label output and weight input have the batch as their only axis (skl2onnx's zipmap=False
    labels are shaped so): Triton takes them as dims [1] reshaped to []."""
    import torch

    class Labeller(torch.nn.Module):
        def forward(self, features, weight):
            scores = features * weight.unsqueeze(1)
            return scores.argmax(dim=1), scores.max(dim=1).values

    out = path / "labeller.onnx"
    torch.onnx.export(
        Labeller(),
        (torch.randn(2, 4), torch.rand(2)),
        str(out),
        dynamo=False,
        input_names=["features", "weight"],
        output_names=["label", "score"],
        dynamic_axes={n: {0: "b"} for n in ("features", "weight", "label", "score")},
    )
    return out


def test_tensors_whose_only_axis_is_the_batch_are_served_and_swept(prefect_harness, tmp_path):
    model_file = _write_one_d_onnx(tmp_path)
    run, results, report = run_flow(
        tmp_path, BenchmarkRequest(model_file=str(model_file), output=str(tmp_path), **QUICK)
    )
    config = (run / "model_repository/labeller/config.pbtxt").read_text()
    assert config.count("reshape {") == 3 and "max_batch_size: 8" in config  # weight, label, score
    (accuracy,) = json.loads((run / "accuracy.json").read_text())
    assert {o["output"] for o in accuracy["outputs"] if o["passed"]} == {"label", "score"}
    assert (results["status"] == "ok").all(), results[["scenario", "batch_size", "status", "error"]]
    assert json.loads((run / "perf_input.json").read_text())["data"][0]["weight"]["shape"] == [1]
