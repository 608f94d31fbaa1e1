"""String inputs (Triton's TYPE_STRING / BYTES): read from an ONNX file, synthetic words or the user's strings, sent to
perf_analyzer as JSON strings, decoded for the python-backend runtime, and compared through every stage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import measured, run_flow

from tbench.core.errors import ConfigError
from tbench.core.model_file import SYNTHETIC_WORDS, read_model_file, run_model_file, synthetic_inputs
from tbench.request.benchmark import BenchmarkRequest, MeasurementOverrides

VOCAB = ["good", "bad", "movie", "great", "plot", "the", "film", "not", "very", "story"]


def write_text_model(path: Path) -> Path:
    """A text classifier over word tokens, as skl2onnx writes a bag-of-words pipeline's first step: a string input
    [batch, words], its term frequencies over a vocabulary (TfIdfVectorizer), then a linear layer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    tfidf = helper.make_node(
        "TfIdfVectorizer",
        ["tokens"],
        ["tf"],
        mode="TF",
        min_gram_length=1,
        max_gram_length=1,
        max_skip_count=0,
        ngram_counts=[0],
        ngram_indexes=list(range(len(VOCAB))),
        pool_strings=VOCAB,
    )
    weights = np.random.default_rng(0).standard_normal((len(VOCAB), 2)).astype(np.float32)
    graph = helper.make_graph(
        [tfidf, helper.make_node("MatMul", ["tf", "W"], ["scores"])],
        "text_classifier",
        [helper.make_tensor_value_info("tokens", TensorProto.STRING, ["batch", "words"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = path / "text_classifier.onnx"
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def text_model(tmp_path_factory) -> Path:
    return write_text_model(tmp_path_factory.mktemp("text"))


def test_a_string_input_is_read_and_gets_synthetic_words(text_model):
    mf = read_model_file(text_model, shapes={"tokens": [5]}, value_ranges={"tokens": [1, 3]})
    (t,) = mf.io_spec.inputs
    assert (t.dtype, t.triton_dtype, t.shape) == ("object", "BYTES", [-1]) and mf.io_spec.has_strings
    batch = synthetic_inputs(mf, 4)["tokens"]
    assert batch.shape == (4, 5) and batch.dtype == object
    counts = [len(s.split()) for s in batch.ravel()]
    assert min(counts) >= 1 and max(counts) <= 3 and all(w in SYNTHETIC_WORDS for s in batch.ravel() for w in s.split())
    single = synthetic_inputs(read_model_file(text_model, value_ranges={"tokens": [1, 1]}), 8)
    scores = run_model_file(mf, single)["scores"]
    assert np.abs(scores).sum() > 0  # single words the vocabulary knows: the model answers them


def test_a_missing_locale_is_named_with_its_fix_not_blamed_on_the_data(text_model):
    from model_adapters.file_model import ModelFileAdapter

    error = (
        "[ONNXRuntimeError] : 1 : FAIL : string_normalizer.cc:235 Failed to construct locale with name:en_US.UTF-8:"
        "locale::facet::_S_create_c_locale name not valid"
    )
    line = ModelFileAdapter(str(text_model)).rejected_inputs("m (onnx)", error, {})
    assert "asks for the locale en_US.UTF-8, which this machine lacks" in line and "locale-gen en_US.UTF-8" in line


def test_a_string_range_is_words_per_string(text_model):
    with pytest.raises(ConfigError, match="a string input's range is its words per string"):
        read_model_file(text_model, value_ranges={"tokens": [0, 2]})


def test_string_samples_go_to_perf_analyzer_as_json_strings():
    from tbench.loadgen.perf_analyzer import perf_json_value

    sample = np.array(["good movie", "bad"], dtype=object)
    assert perf_json_value(sample) == {"content": ["good movie", "bad"], "shape": [2]}
    assert perf_json_value(np.array([b"caf\xc3\xa9"], dtype=object))["content"] == ["café"]


def test_the_triton_config_declares_type_string(text_model):
    from tritonclient.grpc import model_config_pb2 as mc

    from tbench.triton.config import _dtype

    assert _dtype(read_model_file(text_model).io_spec.inputs[0]) == mc.TYPE_STRING


def test_string_outputs_compare_by_equality_whatever_their_encoding():
    from tbench.stages.correctness import compare

    ref = {"label": np.array(["pos", "neg"], dtype=object)}
    (same,) = compare(ref, {"label": np.array([b"pos", b"neg"], dtype=object)}, 1e-3, 1e-3)
    (half,) = compare(ref, {"label": np.array([b"pos", b"pos"], dtype=object)}, 1e-3, 1e-3)
    assert same.passed and not half.passed and half.max_abs_err == 0.5


def test_the_users_strings_are_taken_from_json_and_npz(text_model, tmp_path):
    from tbench.core.input_data import load_input_data

    spec = read_model_file(text_model).io_spec
    (tmp_path / "s.json").write_text(json.dumps({"data": [{"tokens": ["good", "movie"]}, {"tokens": ["bad", "plot"]}]}))
    given = load_input_data(str(tmp_path / "s.json"), spec)
    assert given.batches(2, 2).__next__()["tokens"].tolist() == [["good", "movie"], ["bad", "plot"]]
    np.savez(tmp_path / "s.npz", tokens=np.array([["great", "film"], ["not", "good"]]))
    assert load_input_data(str(tmp_path / "s.npz"), spec).one(1)["tokens"].tolist() == ["not", "good"]
    (tmp_path / "n.json").write_text(json.dumps({"data": [{"tokens": [1, 2]}]}))
    with pytest.raises(ConfigError, match="tokens takes strings"):
        load_input_data(str(tmp_path / "n.json"), spec)


@pytest.mark.e2e
def test_a_text_model_with_a_string_input_is_served_checked_and_swept(prefect_harness, tmp_path, text_model):
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model_file=str(text_model),
            shapes={"tokens": [6]},
            value_ranges={"tokens": [1, 1]},  # single words, as the vocabulary holds them
            batch_sizes=[1, 4],
            concurrency=[2],
            measurement=MeasurementOverrides(window_s=0.5, stability_percentage=50),
            output=str(tmp_path),
        ),
    )
    # the served model answers like ONNX Runtime on the same strings (undecoded bytes would score as no word: zeros)
    (accuracy,) = json.loads((run / "accuracy.json").read_text())
    assert all(o["passed"] for o in accuracy["outputs"])
    assert set(results["scenario"]) == {"offline", "online"} and len(results) == 3
    measured(results)
    assert set(results["shared_memory"].dropna()) <= {"none"}  # strings travel over gRPC
    sent = json.loads((run / "perf_input.json").read_text())["data"][0]["tokens"]
    assert sent["shape"] == [6] and all(isinstance(w, str) and w in SYNTHETIC_WORDS for w in sent["content"])
    assert "data_type: TYPE_STRING" in (run / "model_repository" / "text_classifier" / "config.pbtxt").read_text()
