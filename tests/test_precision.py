"""Precision is what runs: FP16 ONNX and TorchScript conversions, the refusals, the results' precision column."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from model_adapters.base import Batch, ModelAdapter
from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format, Precision
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.precision import results_precision, served_precision
from tbench.core.runtimes import run_file, source_digest
from tbench.request.benchmark import DEFAULT_TOLERANCES, BenchmarkRequest
from tbench.stages.converters.registry import REGISTRY, ConversionOptions
from tbench.stages.correctness import check_artifacts
from tbench.stages.export import cache_key, export_model, file_precision, tool_versions

FP16_TOL = DEFAULT_TOLERANCES[Precision.FP16]


class Tagger(torch.nn.Module):
    """A float and an integer input, a float and an integer output: only float io is cast at the boundary."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 4)
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, features, ids):
        tokens = torch.softmax(self.norm(self.proj(features + self.embed(ids))), dim=-1)
        return tokens, tokens.argmax(dim=-1)


class TaggerAdapter(ModelAdapter):
    name = "tagger"
    framework = "pytorch"
    metric_name = None

    def build(self):
        return Tagger().eval()

    def io_spec(self) -> IoSpec:
        return IoSpec(
            inputs=[
                TensorSpec(name="input__0", dtype="float32", shape=[5, 8]),
                TensorSpec(name="input__1", dtype="int64", shape=[5]),
            ],
            outputs=[
                TensorSpec(name="output__0", dtype="float32", shape=[5, 4]),
                TensorSpec(name="output__1", dtype="int64", shape=[5]),
            ],
        )

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        for start in range(0, n_samples, batch_size):
            n = min(batch_size, n_samples - start)
            yield Batch(
                inputs={
                    "input__0": rng.standard_normal((n, 5, 8)).astype(np.float32),
                    "input__1": rng.integers(0, 16, (n, 5)).astype(np.int64),
                }
            )

    def predict(self, outputs):
        raise NotImplementedError

    def metric(self, predictions, labels):
        raise NotImplementedError

    def defaults(self, profile: str):
        raise NotImplementedError


@pytest.fixture(scope="module")
def tagger():
    adapter = TaggerAdapter()
    module = adapter.build()
    return adapter, module, source_digest("pytorch", module)


FP16 = ConversionOptions(precision=Precision.FP16)


def _onnx_float_initializers(path: str) -> set[int]:
    import onnx

    return {
        i.data_type
        for i in onnx.load(path).graph.initializer
        if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    }


def _close(adapter, module, artifact) -> None:
    (result,) = check_artifacts(adapter, module, [artifact], *FP16_TOL)
    assert result.passed, result.outputs


def test_fp16_onnx_holds_fp16_weights_keeps_fp32_io_and_answers_within_fp16_tolerance(tagger, tmp_path):
    import onnx

    adapter, module, digest = tagger
    artifact = export_model(adapter, module, Format.ONNX, tmp_path, digest, FP16)
    assert artifact.precision is Precision.FP16 and Path(artifact.path) == tmp_path / "onnx-fp16" / "model.onnx"
    assert (tmp_path / "onnx" / "model.onnx").exists()  # the FP32 ONNX it was converted from
    assert _onnx_float_initializers(artifact.path) == {onnx.TensorProto.FLOAT16}
    graph = onnx.load(artifact.path).graph
    elem = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    assert elem == {
        "input__0": onnx.TensorProto.FLOAT,
        "input__1": onnx.TensorProto.INT64,
        "output__0": onnx.TensorProto.FLOAT,
        "output__1": onnx.TensorProto.INT64,
    }
    assert file_precision(Format.ONNX, Path(artifact.path)) is Precision.FP16
    assert file_precision(Format.ONNX, tmp_path / "onnx" / "model.onnx") is Precision.FP32
    _close(adapter, module, artifact)
    assert "onnx -> onnx" in (tmp_path / "onnx-fp16" / "convert.log").read_text()


@pytest.mark.parametrize("fmt", [Format.TS_TRACE, Format.TS_SCRIPT])
def test_fp16_torchscript_is_the_module_in_half_behind_fp32_io(tagger, tmp_path, fmt):
    adapter, module, digest = tagger
    artifact = export_model(adapter, module, fmt, tmp_path, digest, FP16)
    assert artifact.precision is Precision.FP16 and artifact.io_spec == adapter.io_spec()
    loaded = torch.jit.load(artifact.path)
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}
    assert (
        next(module.parameters()).dtype == torch.float32
    )  # the source module (the correctness reference) is untouched
    out = run_file(fmt, artifact.path, artifact.io_spec, adapter.sample_batch(3))
    assert out["output__0"].dtype == np.float32 and out["output__1"].dtype == np.int64
    assert file_precision(fmt, Path(artifact.path)) is Precision.FP16
    _close(adapter, module, artifact)


def test_fp16_from_other_teams_files(tmp_path):
    """Model files served as they are: an FP32 ONNX or TorchScript file is converted to FP16, an FP16 one is left as
    it is."""
    from model_adapters.file_model import ModelFileAdapter

    module, example = Tagger().eval(), (torch.randn(2, 5, 8), torch.randint(0, 16, (2, 5)))
    onnx_file, ts_file = tmp_path / "tagger.onnx", tmp_path / "tagger.pt"
    torch.onnx.export(
        module,
        example,
        str(onnx_file),
        input_names=["features", "ids"],
        output_names=["tokens", "best"],
        dynamic_axes={n: {0: "batch"} for n in ("features", "ids", "tokens", "best")},
        dynamo=False,
    )
    torch.jit.save(torch.jit.script(module), str(ts_file))
    for path, fmt, shapes in (
        (onnx_file, Format.ONNX, None),
        (ts_file, Format.TS_SCRIPT, {"features": [5, 8], "ids": [5]}),
    ):
        adapter = ModelFileAdapter(str(path), shapes, {"ids": "int64"} if shapes else None)
        artifact = export_model(adapter, path, fmt, tmp_path / fmt.value, source_digest(fmt.value, path), FP16)
        assert artifact.precision is Precision.FP16 and Path(artifact.path).parent.name == f"{fmt.value}-fp16"
        _close(adapter, path, artifact)
        # an FP16 file from another team is what it holds, whatever the request
        again = ModelFileAdapter(artifact.path, shapes, {"ids": "int64"} if shapes else None)
        kept = export_model(
            again, Path(artifact.path), fmt, tmp_path / "kept", source_digest(fmt.value, Path(artifact.path))
        )
        assert kept.precision is Precision.FP16 and not (tmp_path / "kept" / f"{fmt.value}-fp16").exists()


def test_the_cache_key_holds_the_precision_and_fp32_steps_are_shared(tagger, tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))
    adapter, module, digest = tagger
    step = REGISTRY[("onnx", Format.ONNX)]
    keys = {
        cache_key(digest, step, ConversionOptions(precision=p), tool_versions(step), adapter.io_spec())
        for p in Precision
    }
    assert len(keys) == 3
    half = export_model(adapter, module, Format.ONNX, tmp_path / "a", digest, FP16)
    full = export_model(adapter, module, Format.ONNX, tmp_path / "b", digest)
    assert not half.cached and full.cached and full.precision is Precision.FP32  # fp16 ran the FP32 export first
    half_ts = export_model(adapter, module, Format.TS_TRACE, tmp_path / "c", digest, FP16)
    full_ts = export_model(adapter, module, Format.TS_TRACE, tmp_path / "d", digest)
    assert not half_ts.cached and not full_ts.cached and half_ts.precision is not full_ts.precision


def test_a_savedmodel_holds_fp32_whatever_is_asked():
    assert REGISTRY[("tensorflow", Format.TF_SAVEDMODEL)].precisions == (Precision.FP32,)
    assert ("tf-savedmodel", Format.TF_SAVEDMODEL) not in REGISTRY  # fp16 is an accelerator there, not a file


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"precision": "int8"}, "precision int8 cannot be carried by onnx: int8 is carried by trt, tf-trt only"),
        (
            {"precision": "int8", "formats": ["ts-script"]},
            "precision int8 cannot be carried by ts-script: int8 is carried by trt, tf-trt only",
        ),
        (
            {"precision": "int8", "model": "dlrm", "size": "tiny"},
            r"precision int8 cannot be carried by any part of the ensemble \(sparse as tf-savedmodel, dense as onnx\)",
        ),
        (
            {"precision": "fp16", "framework": "tensorflow", "size": "small"},
            "precision fp16 of tf-savedmodel is TensorFlow's automatic mixed precision on a GPU, "
            "which the embedded server",
        ),
        (
            {"precision": "fp16", "framework": "tensorflow", "size": "small", "server": "local"},
            "precision fp16 of tf-savedmodel is TensorFlow's automatic mixed precision on a GPU; this machine has none",
        ),
        ({"precision": "fp16", "serve_formats": ["trt"], "server": "local"}, "precision fp16 of trt needs a GPU"),
    ],
)
def test_a_precision_the_format_cannot_carry_is_one_config_error_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        BenchmarkRequest(**kwargs).resolve(has_gpu=False)
    assert "\n" not in str(err.value)


def test_fp16_onnx_and_torchscript_resolve_without_a_gpu():
    r = BenchmarkRequest(precision="fp16", formats=["onnx", "ts-trace", "ts-script"], serve_formats=["all"]).resolve(
        False
    )
    assert r.precision is Precision.FP16 and r.tolerance_atol == FP16_TOL[0]
    assert BenchmarkRequest(model="dlrm", size="tiny", precision="fp16").resolve(False).precision is Precision.FP16


def test_fp16_savedmodel_is_automatic_mixed_precision_on_a_gpu():
    kwargs = dict(framework="tensorflow", size="small", precision="fp16", server="local", profile="cpu")
    assert BenchmarkRequest(**kwargs).resolve(True).accelerators == {"tf-savedmodel": "auto_mixed_precision"}
    trt = BenchmarkRequest(**kwargs, accelerators={"tf-savedmodel": "tensorrt"}).resolve(True)
    assert trt.accelerators == {"tf-savedmodel": "tensorrt"}
    with pytest.raises(ConfigError, match="accelerator 'openvino' is neither"):
        BenchmarkRequest(**kwargs, accelerators={"tf-savedmodel": "openvino"}).resolve(True)
    assert BenchmarkRequest(**{**kwargs, "precision": "fp32"}).resolve(True).accelerators == {}


def test_search_variants_are_refused_the_same_way():
    from tbench.search.plan import variant_plan
    from tbench.search.strategies import SearchSpace

    req = BenchmarkRequest().resolve(False)
    assert variant_plan(SearchSpace(formats=["onnx:fp16", "ts-trace:fp32"]), req, False)["onnx:fp16"] == (
        Format.ONNX,
        Precision.FP16,
    )
    with pytest.raises(ConfigError, match="variant 'onnx:int8': precision int8 cannot be carried by onnx"):
        variant_plan(SearchSpace(formats=["onnx:int8"]), req, False)


# ---------------------------------------------------------------- the results' precision column


def _artifact(fmt: Format, precision: Precision) -> ModelArtifact:
    spec = IoSpec(
        inputs=[TensorSpec(name="x", dtype="float32", shape=[1])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[1])],
    )
    return ModelArtifact(format=fmt, precision=precision, path="/m", io_spec=spec, source_hash="x", seconds=0.0)


def test_the_precision_column_is_what_the_served_artifact_holds():
    none = lambda fmt: ""  # noqa: E731
    # an FP32 file served while FP16 was asked for says FP32: what ran, not what was asked
    assert results_precision([_artifact(Format.ONNX, Precision.FP32)], Precision.FP16, none) == "FP32"
    assert results_precision([_artifact(Format.ONNX, Precision.FP16)], Precision.FP16, none) == "FP16"
    assert results_precision([_artifact(Format.TRT, Precision.INT8)], Precision.INT8, none) == "INT8"
    # the guides' labels: automatic mixed precision keeps FP32; the TensorRT accelerator builds at precision_mode
    assert served_precision(Precision.FP32, "Automatic FP16", Precision.FP16) == "FP32"
    assert served_precision(Precision.FP32, "TensorRT", Precision.FP16) == "FP16"
    # an ensemble: its parts', in order, one value when they agree
    parts = [_artifact(Format.TF_SAVEDMODEL, Precision.FP32), _artifact(Format.ONNX, Precision.FP16)]
    assert results_precision(parts, Precision.FP16, none) == "FP32 + FP16"
    assert results_precision([parts[1], parts[1]], Precision.FP16, none) == "FP16"


@pytest.mark.e2e
def test_an_fp16_run_serves_fp16_files_and_says_so(prefect_harness, tmp_path):
    """The embedded server on a CPU: FP16 ONNX and TorchScript served, the rows say FP16, artifacts.json too."""
    import json

    from conftest import run_flow

    from tbench.request.benchmark import Measurement

    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model="resnet50",
            size="small",
            output=str(tmp_path),
            precision="fp16",
            formats=["onnx", "ts-script"],
            serve_formats=["all"],
            scenarios=["offline"],
            batch_sizes=[2],
            measurement=Measurement(window_s=0.5, stability_percentage=50),
        ),
    )
    assert set(results["precision"]) == {"FP16"} and set(results["format"]) == {"onnx", "ts-script"}
    assert (run / "models" / "onnx-fp16" / "model.onnx").exists()
    assert {a["format"]: a["precision"] for a in json.loads((run / "artifacts.json").read_text())} == {
        "onnx": "fp16",
        "ts-script": "fp16",
    }
