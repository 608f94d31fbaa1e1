"""PyTorch -> ONNX through torch.export's exporter where it takes the model, the legacy (TorchScript-based) exporter
only as the fallback with its reason kept; which one made the file is on the artifact (artifacts.json, the manifest)
and in the cache key's tools; the io names, dynamic batch and dynamic dims are the io spec's either way."""

import json
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tbench.core.enums import Format
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.runtimes import source_digest
from tbench.stages.converters.pytorch import DYNAMO, LEGACY, fallback_reason, pytorch_to_onnx
from tbench.stages.converters.registry import REGISTRY, ConversionOptions
from tbench.stages.correctness import check_artifacts
from tbench.stages.export import cache_key, export_model, tool_versions

LEGACY_WARNING = "legacy TorchScript-based ONNX export"


class Pooled(torch.nn.Module):
    """Two inputs sharing a dynamic length (tokens and their mask), one output of fixed size, one of that length."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, tokens, mask):
        x = self.emb(tokens) * mask.unsqueeze(-1)
        return x.sum(1) / mask.sum(1, keepdim=True).clamp(min=1), self.head(x).squeeze(-1)


POOLED = IoSpec(
    inputs=[TensorSpec(name="tokens", dtype="int64", shape=[-1]), TensorSpec(name="mask", dtype="float32", shape=[-1])],
    outputs=[
        TensorSpec(name="pooled", dtype="float32", shape=[4]),
        TensorSpec(name="scores", dtype="float32", shape=[-1]),
    ],
)


def _pooled_sample(batch: int, length: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "tokens": rng.integers(0, 50, (batch, length)).astype(np.int64),
        "mask": (rng.random((batch, length)) > 0.2).astype(np.float32),
    }


class Branchy(torch.nn.Module):
    """A branch on a tensor's value: torch.export cannot take it (data-dependent control flow); tracing can."""

    def forward(self, x):
        if x.sum().item() > 0:
            return x * 2
        return x - 1


BRANCHY = IoSpec(
    inputs=[TensorSpec(name="x", dtype="float32", shape=[3])],
    outputs=[TensorSpec(name="y", dtype="float32", shape=[3])],
)


def _dims(value) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def _export(module, spec, sample, out):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.inference_mode():  # as the export stage runs it
            record = pytorch_to_onnx(module.eval(), out, spec, ConversionOptions(), sample)
    return record, [str(w.message) for w in caught]


def test_torch_export_takes_the_model_with_the_specs_names_and_dynamic_dims(tmp_path):
    module, out = Pooled(), tmp_path / "model.onnx"
    record, caught = _export(module, POOLED, _pooled_sample(2, 5), out)
    assert record["exporter"] == DYNAMO and record["onnx_opset"] == 18  # its own where none is asked
    assert not [m for m in caught if LEGACY_WARNING in m]  # the deprecated exporter did not run
    model = onnx.load(str(out))
    assert [i.name for i in model.graph.input] == ["tokens", "mask"]
    assert [o.name for o in model.graph.output] == ["pooled", "scores"]
    tokens, mask = model.graph.input
    pooled, scores = model.graph.output
    assert _dims(tokens)[0] == "batch" and isinstance(_dims(tokens)[1], str)
    assert _dims(mask)[0] == "batch" and isinstance(_dims(mask)[1], str)  # the same length as tokens' (its name)
    assert _dims(pooled) == ["batch", 4] and _dims(scores)[0] == "batch" and isinstance(_dims(scores)[1], str)
    assert not (tmp_path / "model.onnx.data").exists()  # the weights inside the one file, as before

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for batch, length in ((1, 3), (3, 11)):  # another batch and length than the example's
        sample = _pooled_sample(batch, length, seed=batch)
        got = session.run(None, sample)
        with torch.no_grad():
            want = module(*(torch.from_numpy(sample[n]) for n in ("tokens", "mask")))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)


def test_a_model_torch_export_refuses_falls_back_to_the_legacy_exporter_saying_why(tmp_path):
    out = tmp_path / "model.onnx"
    record, caught = _export(Branchy(), BRANCHY, {"x": np.ones((2, 3), np.float32)}, out)
    exporter = record["exporter"]
    assert exporter.startswith(f"{LEGACY} (fallback: ") and exporter.endswith(")")
    assert "\n" not in exporter and len(exporter) < 260
    assert any(LEGACY_WARNING in m for m in caught)  # the fallback is the deprecated exporter, and says so
    model = onnx.load(str(out))
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == ["y"]
    assert _dims(model.graph.input[0]) == ["batch", 3] and _dims(model.graph.output[0]) == ["batch", 3]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": np.ones((4, 3), np.float32)})[0], np.full((4, 3), 2.0))


def test_the_fallback_reason_is_the_cause_torch_export_gave():
    try:
        try:
            raise ValueError("Could not guard on data-dependent expression u0 > 0\n(see the advice below)")
        except ValueError as inner:
            raise RuntimeError("Failed to export the model with torch.export.\nA page of advice") from inner
    except RuntimeError as err:
        assert fallback_reason(err) == "ValueError: Could not guard on data-dependent expression u0 > 0"


def test_the_cache_key_holds_the_exporters_tools():
    conv = REGISTRY[("pytorch", Format.ONNX)]
    assert conv.tools == ("torch", "onnx", "onnxscript")
    versions = tool_versions(conv)
    assert versions["onnxscript"] != "unknown"  # installed with the node's stack (pyproject.toml)
    options = ConversionOptions()
    with_it = cache_key("abc", conv, options, versions, POOLED)
    without = cache_key("abc", conv, options, {**versions, "onnxscript": "unknown"}, POOLED)
    assert with_it != without  # a machine without onnxscript falls back to the legacy exporter: another file


def test_the_artifact_says_which_exporter_made_it_cached_or_not(small_adapter, small_module, tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))
    digest = source_digest("pytorch", small_module)
    first = export_model(small_adapter, small_module, Format.ONNX, tmp_path / "a", digest)
    again = export_model(small_adapter, small_module, Format.ONNX, tmp_path / "b", digest)
    assert (first.exporter, first.cached) == (DYNAMO, False)
    assert (again.exporter, again.cached) == (DYNAMO, True)  # read back from the cached step's record
    assert json.loads(first.model_dump_json())["exporter"] == DYNAMO  # so in artifacts.json
    assert "exporter: dynamo" in (tmp_path / "a" / "onnx" / "convert.log").read_text()
    assert json.loads((tmp_path / "a" / "onnx" / "conversion.json").read_text())["exporter"] == DYNAMO
    (result,) = check_artifacts(small_adapter, small_module, [first], atol=1e-4, rtol=1e-4)
    assert result.passed  # the correctness stage's check against eager, as for every format
    ts = export_model(small_adapter, small_module, Format.TS_TRACE, tmp_path / "c", digest)
    assert ts.exporter is None  # only the ONNX step names an exporter


@pytest.mark.parametrize("opset", [15, 18])
def test_the_asked_opset_is_the_files(tmp_path, opset):
    out = tmp_path / "model.onnx"
    with torch.inference_mode():
        record = pytorch_to_onnx(
            Pooled().eval(), out, POOLED, ConversionOptions(onnx_opset=opset), _pooled_sample(2, 5)
        )
    assert record == {"exporter": DYNAMO, "onnx_opset": opset}


def test_an_opset_it_cannot_convert_down_to_is_written_by_the_legacy_exporter(small_adapter, small_module, tmp_path):
    """Asked for opset 15, torch.export's exporter builds at 18 and converts down; the small ResNet-50's ReduceMean does
    not convert (ONNX's converter needs its axes as a constant): the legacy exporter writes 15, saying why."""
    out = tmp_path / "model.onnx"
    sample = small_adapter.sample_batch(2)
    with torch.inference_mode():
        record = pytorch_to_onnx(small_module, out, small_adapter.io_spec(), ConversionOptions(onnx_opset=15), sample)
    assert record["onnx_opset"] == 15 and onnx.load(str(out)).opset_import[0].version == 15
    assert record["exporter"].startswith(f"{LEGACY} (fallback: ValueError: opset 15 asked: it writes 18")
