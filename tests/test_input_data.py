"""Input data and value ranges for any model: a BERT-like classifier (int64 input_ids, attention_mask and
token_type_ids, dynamic batch and sequence) whose token_type_ids index a 2-row embedding table, so synthetic
integers in [0, 16) are out of range for it."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch

from model_adapters.file_model import ModelFileAdapter
from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Precision
from tbench.core.errors import ConfigError, CorrectnessError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.model_file import read_model_file, synthetic_inputs
from tbench.request.benchmark import BenchmarkRequest, adapter_for
from tbench.stages.correctness import check_artifacts

NAMES = ["input_ids", "attention_mask", "token_type_ids"]
VOCAB, TYPES, SEQ = 30, 2, 6


class BertLike(torch.nn.Module):
    """Token and token-type embeddings, a masked mean over the sequence and a linear head: logits [B, 3]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.word = torch.nn.Embedding(VOCAB, 8)
        self.token_type = torch.nn.Embedding(TYPES, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask, token_type_ids):
        hidden = self.word(input_ids) + self.token_type(token_type_ids)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0))


def write_bert_onnx(path):
    example = tuple(torch.zeros(2, 5, dtype=torch.int64) for _ in NAMES)
    torch.onnx.export(
        BertLike().eval(),
        example,
        str(path),
        dynamo=False,
        input_names=NAMES,
        output_names=["logits"],
        dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in NAMES}, "logits": {0: "batch"}},
    )
    return path


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory):
    return write_bert_onnx(tmp_path_factory.mktemp("bert") / "bert.onnx")


@pytest.fixture(scope="module")
def bert_ts(tmp_path_factory):
    """The same model as TorchScript with its io spec inside: there is no graph to read its tables' sizes from."""
    path = tmp_path_factory.mktemp("bert_ts") / "bert.pt"
    spec = IoSpec(
        inputs=[TensorSpec(name=n, dtype="int64", shape=[-1]) for n in NAMES],
        outputs=[TensorSpec(name="output__0", dtype="float32", shape=[3])],
    )
    torch.jit.save(
        torch.jit.script(BertLike().eval()), str(path), _extra_files={"io_spec.json": spec.model_dump_json()}
    )
    return path


def untraced(adapter: ModelFileAdapter) -> ModelFileAdapter:
    """As for a model whose embedding lookups tbench cannot see: no range read from the graph."""
    adapter.file = adapter.file.model_copy(update={"table_rows": {}})
    return adapter


def artifact_of(adapter: ModelFileAdapter) -> ModelArtifact:
    """The model file itself as the exported artifact (a model file is served in its own format)."""
    return ModelArtifact(
        format=adapter.file.format,
        precision=Precision.FP32,
        path=adapter.path,
        io_spec=adapter.io_spec(),
        source_hash="test",
        seconds=0.0,
    )


def correctness(adapter: ModelFileAdapter):
    results = check_artifacts(adapter, adapter.build(), [artifact_of(adapter)], atol=1e-4, rtol=1e-4)
    assert results and all(r.passed for r in results)
    return results


def samples(n: int = 3, seq: int = SEQ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    mask = np.ones((n, seq), dtype=np.int64)
    mask[:, -2:] = 0  # padding at the end
    return {
        "input_ids": rng.integers(0, VOCAB, (n, seq)),
        "attention_mask": mask,
        "token_type_ids": np.repeat([[0] * (seq // 2) + [1] * (seq - seq // 2)], n, axis=0),
    }


# ---------------------------------------------------------------- synthetic data and its ranges


def test_embedding_tables_bound_the_synthetic_integers(bert_onnx):
    """ONNX: an int input that indexes an embedding table (Gather on an initializer) is drawn below the table's rows."""
    mf = read_model_file(bert_onnx)
    assert mf.table_rows == {"input_ids": VOCAB, "token_type_ids": TYPES}
    data = synthetic_inputs(mf, batch_size=64)
    assert set(np.unique(data["token_type_ids"])) == {0, 1}
    assert data["input_ids"].max() < VOCAB and data["input_ids"].max() >= 16  # the vocabulary, not [0, 16)
    assert set(np.unique(data["attention_mask"])) == {1}  # a mask: every position kept, as an unpadded batch
    correctness(ModelFileAdapter(str(bert_onnx)))


def test_the_integers_nobody_ranged_are_named_with_where_they_came_from(bert_onnx, tmp_path, monkeypatch):
    """The terminal (before the first point) and the report say which synthetic integers were sent, and why: the
    figures hold for them (a GPT-2 ran with masks of 0..15 once, and nothing said so)."""
    from tbench.core import progress
    from tbench.stages import sweep

    adapter = ModelFileAdapter(str(bert_onnx))
    assert adapter.guessed_values == {
        "input_ids": f"0..{VOCAB - 1} (the rows of the table it indexes)",
        "attention_mask": "1 (a mask: every position kept)",
        "token_type_ids": f"0..{TYPES - 1} (the rows of the table it indexes)",
    }
    ranged = ModelFileAdapter(str(bert_onnx), value_ranges={"input_ids": [0, 5], "attention_mask": [0, 1]})
    assert list(ranged.guessed_values) == ["token_type_ids"]
    said = []
    monkeypatch.setattr(progress, "warn", said.append)
    sweep.measured_inputs(ranged, ranged.build(), tmp_path / "perf_input.json")
    assert said == [
        "dynamic dims no --shape sets are measured as input_ids at [16], attention_mask at [16], token_type_ids at "
        "[16]; to choose: --shape input_ids:16 --shape attention_mask:16 --shape token_type_ids:16",
        f"integer inputs no --value-range sets are drawn from token_type_ids 0..{TYPES - 1} (the rows of the table "
        "it indexes); to choose: --value-range NAME:LO,HI or --input-data PATH",
    ]
    given = ModelFileAdapter(str(bert_onnx)).use_input_data(str(write_input_data(tmp_path, samples(), "npz")))
    assert given.guessed_values == {}  # the user's samples: nothing chosen


@pytest.mark.parametrize("model", ["onnx", "torchscript"])
def test_out_of_range_synthetic_integers_fail_in_one_line_naming_the_input(bert_onnx, bert_ts, model):
    adapter = untraced(ModelFileAdapter(str(bert_onnx))) if model == "onnx" else ModelFileAdapter(str(bert_ts))
    with pytest.raises(CorrectnessError) as err:
        check_artifacts(adapter, adapter.build(), [artifact_of(adapter)], atol=1e-4, rtol=1e-4)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith(f"bert ({adapter.framework}) failed on synthetic inputs: ")
    # the runtime's own error line, then the one input the model rejects (input_ids' 0..15 fit its 30 rows)
    assert ("indices element out of data bounds" if model == "onnx" else "index out of range") in message
    assert message.endswith(
        "the synthetic integers of token_type_ids (0..15) may be out of range: "
        "give --value-range token_type_ids:LO,HI or --input-data PATH"
    )


@pytest.mark.parametrize("model", ["onnx", "torchscript"])
def test_a_value_range_makes_the_synthetic_data_fit(bert_onnx, bert_ts, model):
    path = bert_onnx if model == "onnx" else bert_ts
    adapter = ModelFileAdapter(str(path), value_ranges={"token_type_ids": [0, 1]})
    if model == "onnx":
        untraced(adapter)
    assert set(np.unique(adapter.sample_batch(32)["token_type_ids"])) == {0, 1}
    correctness(adapter)
    assert "value_ranges={'token_type_ids': [0, 1]}" in adapter.reproduce_expr()


def test_value_ranges_are_inclusive_for_integers_and_uniform_for_floats(bert_onnx, tmp_path):
    mf = read_model_file(bert_onnx, value_ranges={"input_ids": [3.5, 5.2], "attention_mask": [1, 1]})
    data = synthetic_inputs(mf, batch_size=64)
    assert set(np.unique(data["input_ids"])) == {4, 5}  # the integers within [3.5, 5.2]
    assert set(np.unique(data["attention_mask"])) == {1}
    linear = tmp_path / "linear.onnx"
    torch.onnx.export(
        torch.nn.Linear(4, 2),
        (torch.randn(2, 4),),
        str(linear),
        dynamo=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
    )
    x = synthetic_inputs(read_model_file(linear, value_ranges={"x": [-0.5, 0.25]}), batch_size=256)["x"]
    assert x.dtype == np.float32 and -0.5 <= x.min() < -0.4 and 0.15 < x.max() <= 0.25


@pytest.mark.parametrize(
    "ranges, message",
    [
        (
            {"token_types": [0, 1]},
            "--value-range names unknown input(s) token_types; the model's inputs are input_ids, "
            "attention_mask, token_type_ids",
        ),
        ({"token_type_ids": [1, 0]}, "--value-range token_type_ids:1,0 needs two finite numbers LO,HI with LO <= HI"),
        ({"token_type_ids": [1]}, "--value-range token_type_ids:1 needs two finite numbers"),
        (
            {"token_type_ids": [0.2, 0.8]},
            "--value-range token_type_ids:0.2,0.8 holds no integer, and token_type_ids is int64",
        ),
        ({"token_type_ids": [0, 1e30]}, "--value-range token_type_ids:0,1e+30 does not fit token_type_ids's int64"),
    ],
)
def test_bad_value_ranges_are_one_clear_line(bert_onnx, ranges, message):
    with pytest.raises(ConfigError) as err:
        read_model_file(bert_onnx, value_ranges=ranges)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# ---------------------------------------------------------------- input data


def write_json(path, data: dict[str, np.ndarray], form: str):
    n = len(next(iter(data.values())))
    if form == "json":  # perf_analyzer's plainest form: flat values, the shape implied by the one dynamic dim
        entries = [{k: v[i].ravel().tolist() for k, v in data.items()} for i in range(n)]
    else:  # "content" and "shape", and base64 little-endian bytes
        entries = [
            {
                "input_ids": {"content": data["input_ids"][i].tolist(), "shape": [SEQ]},
                "attention_mask": {
                    "content": {"b64": base64.b64encode(data["attention_mask"][i].astype("<i8").tobytes()).decode()},
                    "shape": [SEQ],
                },
                "token_type_ids": {"b64": base64.b64encode(data["token_type_ids"][i].astype("<i8").tobytes()).decode()},
            }
            for i in range(n)
        ]
    path.write_text(json.dumps({"data": entries, "validation_data": []}))
    return path


def write_input_data(tmp_path, data: dict[str, np.ndarray], form: str):
    if form.startswith("json"):
        return write_json(tmp_path / "input.json", data, form)
    if form == "npz":
        np.savez(
            tmp_path / "input.npz", **{k: v.astype(np.int32) if v.dtype.kind == "i" else v for k, v in data.items()}
        )  # int32: cast to int64
        return tmp_path / "input.npz"
    folder = tmp_path / "inputs"
    folder.mkdir()
    for name, value in data.items():
        np.save(folder / f"{name}.npy", value)
    return folder


@pytest.mark.parametrize("form", ["json", "json-content-shape-b64", "npz", "npy-folder"])
def test_each_input_data_form_feeds_correctness_and_perf(bert_onnx, tmp_path, form):
    from tbench.stages.sweep import prepare_inputs

    given = samples(3)
    path = write_input_data(tmp_path, given, form)
    adapter = untraced(ModelFileAdapter(str(bert_onnx))).use_input_data(str(path))  # no range to rely on
    batch = adapter.sample_batch(5, seed=99)  # the seed does not matter: the samples in order, cycling
    for name in NAMES:
        assert batch[name].dtype == np.int64
        np.testing.assert_array_equal(batch[name], given[name][[0, 1, 2, 0, 1]])
    assert [len(b.inputs["input_ids"]) for b in adapter.batches(7, 3)] == [3, 3, 1]
    assert adapter.input_shapes() == {n: [SEQ] for n in NAMES}
    correctness(adapter)
    perf = prepare_inputs(adapter, adapter.build(), tmp_path / "perf_input.json", samples=4)
    entries = json.loads(perf.data_file.read_text())["data"]
    assert perf.shapes == {n: [SEQ] for n in NAMES} and len(entries) == 4
    assert entries[3]["token_type_ids"] == {"content": given["token_type_ids"][0].tolist(), "shape": [SEQ]}
    assert adapter.reproduce_expr().endswith(f".use_input_data({str(path)!r})")


def test_input_data_the_model_rejects_names_the_file(bert_onnx, tmp_path):
    bad = samples(2)
    bad["token_type_ids"][:] = 5
    path = write_input_data(tmp_path, bad, "npz")
    adapter = ModelFileAdapter(str(bert_onnx)).use_input_data(str(path))
    with pytest.raises(CorrectnessError) as err:
        check_artifacts(adapter, adapter.build(), [], atol=1e-4, rtol=1e-4)
    assert str(err.value).startswith(f"bert (onnx) failed on the input data from {path}: [ONNXRuntimeError]")
    assert "indices element out of data bounds" in str(err.value) and "\n" not in str(err.value)


def _without(data, name):
    return {k: v for k, v in data.items() if k != name}


@pytest.mark.parametrize(
    "form, data, message",
    [
        (
            "npz",
            _without(samples(), "token_type_ids"),
            "lacks input(s) token_type_ids; the model's inputs are input_ids, attention_mask, token_type_ids",
        ),
        (
            "npy-folder",
            {**samples(), "token_type_id": samples()["token_type_ids"]},
            "names unknown input(s) token_type_id",
        ),
        (
            "npz",
            {**samples(), "attention_mask": np.ones((3, SEQ, 2), dtype=np.int64)},
            "attention_mask has samples of shape [6,2] (array [3,6,2], samples on axis 0); the model takes [-1]",
        ),
        (
            "npz",
            {**samples(), "input_ids": samples()["input_ids"] + 0.5},
            "input_ids holds non-integer values; the model takes int64",
        ),
        (
            "npz",
            {**samples(), "input_ids": samples(2)["input_ids"]},
            "the inputs hold different numbers of samples (input_ids: 2, attention_mask: 3, token_type_ids: 3)",
        ),
        (
            "json",
            _without(samples(), "attention_mask"),
            "sample 0 lacks input(s) attention_mask; every sample needs every input",
        ),
        ("json", {k: v.astype(str) for k, v in samples().items()}, "sample 0 of input_ids holds strings, not numbers"),
    ],
)
def test_bad_input_data_is_one_clear_line(bert_onnx, tmp_path, form, data, message):
    path = write_input_data(tmp_path, data, form)
    with pytest.raises(ConfigError) as err:
        ModelFileAdapter(str(bert_onnx)).use_input_data(str(path))
    assert (
        message in str(err.value) and str(err.value).startswith(f"--input-data {path}") and "\n" not in str(err.value)
    )


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"inputs": []}, 'is not perf_analyzer input data: it needs a "data" list of samples'),
        ({"data": []}, 'holds no samples: its "data" list is empty'),
        (
            {"data": [{**{n: [1] * SEQ for n in NAMES}, "input_ids": {"b64": "AAA="}}]},
            "b64 holds 2 bytes, not a whole number of int64 values",
        ),
        (
            {"data": [{**{n: [1] * SEQ for n in NAMES}, "input_ids": {"content": [1] * 6, "shape": [4]}}]},
            "sample 0 of input_ids has 6 values, not the 4 of its shape [4]",
        ),
    ],
)
def test_bad_json_input_data_is_one_clear_line(bert_onnx, tmp_path, doc, message):
    path = tmp_path / "input.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        ModelFileAdapter(str(bert_onnx)).use_input_data(str(path))
    assert message in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- requests, registered models, the CLI


def test_requests_check_their_input_options(bert_onnx, tmp_path):
    path = write_input_data(tmp_path, samples(), "npz")
    req = BenchmarkRequest(model_file=str(bert_onnx), input_data=str(path)).resolve(has_gpu=False)
    assert req.input_data == str(path) and adapter_for(req).given_samples.count == 3
    assert BenchmarkRequest(model_file=str(bert_onnx), value_ranges={"token_type_ids": [0, 1]}).resolve(
        has_gpu=False
    ).value_ranges == {"token_type_ids": [0.0, 1.0]}
    for kwargs, message in [
        (
            dict(model="resnet50", value_ranges={"x": [0, 1]}),
            "--value-range shapes a model file's synthetic data; model "
            "'resnet50' makes its own (give --input-data PATH or --dataset DIR instead)",
        ),
        (
            dict(model="resnet50", input_data=str(path), dataset=str(tmp_path)),
            "give --dataset or --input-data, not both",
        ),
        (
            dict(model_file=str(bert_onnx), input_data=str(path), value_ranges={"input_ids": [0, 1]}),
            "--value-range shapes synthetic data, and --input-data replaces it: give one or the other",
        ),
        (
            dict(model_file=str(bert_onnx), input_data=str(path), shapes={"input_ids": [8]}),
            f"--shape input_ids:8 contradicts --input-data {path}, whose samples of input_ids have shape 6",
        ),
    ]:
        with pytest.raises(ConfigError) as err:
            BenchmarkRequest(**kwargs).resolve(has_gpu=False)
        assert str(err.value) == message


def test_a_registered_model_takes_input_data_too(tmp_path):
    images = np.random.default_rng(0).standard_normal((2, 3, 32, 32))  # float64: cast to the model's float32
    np.savez(tmp_path / "images.npz", input__0=images)
    adapter = adapter_for(BenchmarkRequest(model="resnet50", size="small", input_data=str(tmp_path / "images.npz")))
    (first, second) = adapter.batches(3, 2, seed=2024)
    assert first.labels is None and first.inputs["input__0"].dtype == np.float32
    np.testing.assert_allclose(second.inputs["input__0"], images[:1].astype(np.float32))
    assert adapter.input_shapes() == {"input__0": [3, 32, 32]}
    assert adapter.reproduce_expr().startswith("model_adapters.get('resnet50', 'small'")
    np.savez(tmp_path / "small.npz", input__0=images[:, :, :16, :16])
    with pytest.raises(ConfigError, match=r"input__0 has samples of shape \[3,16,16\].*the model takes \[3,32,32\]"):
        adapter.use_input_data(str(tmp_path / "small.npz"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--value-range", "token_type_ids:1"], "error: cannot read --value-range (NAME:LO,HI) 'token_type_ids:1'"),
        (["--value-range", "token_types:0,1"], "error: --value-range names unknown input(s) token_types"),
        (
            ["--input-data", "/nonexistent/input.json"],
            "error: --input-data /nonexistent/input.json does not exist; give a "
            "perf_analyzer JSON file, an .npz file or a folder of NAME.npy files",
        ),
    ],
)
@pytest.mark.parametrize(
    "command", [["run"], ["search"], ["capacity", "--slo-p99-ms", "50", "--traffic", "10"]], ids=lambda c: c[0]
)
def test_the_cli_reads_the_input_options_and_fails_in_one_line(bert_onnx, args, message, command):
    """Every command that measures a model takes a model file and its input options, read the same way."""
    from typer.testing import CliRunner

    from tbench.cli import app

    result = CliRunner().invoke(app, [*command, "--model-file", str(bert_onnx), *args])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(message), result.output


# ---------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_a_bert_like_model_file_with_input_data_runs_end_to_end(prefect_harness, tmp_path):
    from conftest import run_flow

    from tbench.request.benchmark import Measurement

    model = write_bert_onnx(tmp_path / "bert.onnx")
    data = write_input_data(tmp_path, samples(4), "json")
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model_file=str(model),
            input_data=str(data),
            output=str(tmp_path),
            batch_sizes=[1, 2],
            concurrency=[1],
            measurement=Measurement(window_s=0.5, stability_percentage=50),
        ),
    )
    assert len(results) == 3 and (results["status"] == "ok").all(), results[
        ["scenario", "batch_size", "status", "error"]
    ]
    (accuracy,) = json.loads((run / "accuracy.json").read_text())
    assert all(o["passed"] for o in accuracy["outputs"])
    sent = json.loads((run / "perf_input.json").read_text())["data"]
    assert sent[0]["token_type_ids"] == {"content": samples(4)["token_type_ids"][0].tolist(), "shape": [SEQ]}
    (log,) = (run / "logs" / "perf_analyzer").glob("*_offline_b2_c1_try0.log")
    assert f"--shape token_type_ids:{SEQ}" in log.read_text().splitlines()[0]
    assert "| Input data " in report and str(data) in report
    # the report says at which length the dynamic dims were measured: a model's speed depends on it
    assert f"token_type_ids [-1] measured as [{SEQ}]" in report
    assert (
        f"token_type_ids [-1] measured as [{SEQ}]" in json.loads((run / "manifest.json").read_text())["measured_shapes"]
    )


def varying_samples(lengths: list[int]) -> dict:
    """perf_analyzer JSON input data whose samples have their own lengths, as a tokenizer without padding gives."""
    rng = np.random.default_rng(0)
    return {
        "data": [
            {
                "input_ids": {"content": rng.integers(0, VOCAB, n).tolist(), "shape": [n]},
                "attention_mask": {"content": [1] * n, "shape": [n]},
                "token_type_ids": {"content": rng.integers(0, TYPES, n).tolist(), "shape": [n]},
            }
            for n in lengths
        ]
    }


def test_samples_of_varying_lengths_are_kept_each_at_its_own_shape(bert_onnx, tmp_path):
    path = tmp_path / "varying.json"
    path.write_text(json.dumps(varying_samples([12, 12, 30, 7, 7, 7])))
    given = ModelFileAdapter(str(bert_onnx)).use_input_data(str(path)).given_samples
    assert given.varying and given.count == 6 and given.shapes()["input_ids"] == [30]
    assert given.distribution()["input_ids"] == "[7..30] (median [9.5]) over 6 samples"
    # a batch holds consecutive samples of one shape: a request carries one shape
    assert [b["input_ids"].shape for b in given.batches(8, 4)] == [(2, 12), (1, 30), (3, 7), (2, 12)]
    assert given.one(2)["input_ids"].shape == (30,) and given.one(2)["input_ids"].dtype == np.int64


def test_the_samples_sent_are_spread_over_a_sorted_file_and_described_as_sent(bert_onnx, tmp_path):
    """A file sorted by length, of which perf_analyzer gets only some: those spread over it, and the report's
    distribution is theirs, saying how many of the file's they are (a prefix measured the shortest samples only)."""
    path = tmp_path / "sorted.json"
    path.write_text(json.dumps(varying_samples(list(range(8, 108)))))  # 100 samples, 8..107 tokens
    given = ModelFileAdapter(str(bert_onnx)).use_input_data(str(path)).given_samples
    order = given.spread(100)
    assert sorted(order) == list(range(100))  # all of them when all fit
    assert order[:3] == [0, 99, 50]  # and any prefix spans the file
    first = given.spread(5)
    assert first == order[:5] and max(first) == 99 and min(first) == 0
    assert (
        given.distribution(first)["input_ids"]
        == "[8..107] (median [58]) over 5 samples of the 100 given, spread over them"
    )
    assert given.distribution()["input_ids"] == "[8..107] (median [57.5]) over 100 samples"


def test_varying_samples_measure_batch_1_and_refuse_a_batch(bert_onnx, tmp_path):
    path = tmp_path / "varying.json"
    path.write_text(json.dumps(varying_samples([12, 30])))
    r = BenchmarkRequest(model_file=str(bert_onnx), input_data=str(path)).resolve(has_gpu=False)
    assert r.batch_sizes == [1]
    with pytest.raises(ConfigError, match=r"^--batch-sizes: the samples of input_ids in .* vary in shape \(\[12..30\]"):
        BenchmarkRequest(model_file=str(bert_onnx), input_data=str(path), batch_sizes=[1, 4]).resolve(has_gpu=False)


@pytest.mark.e2e
def test_samples_of_varying_lengths_are_sent_each_at_its_own_shape(prefect_harness, tmp_path):
    from conftest import run_flow

    from tbench.request.benchmark import Measurement

    model = write_bert_onnx(tmp_path / "bert.onnx")
    data = tmp_path / "varying.json"
    data.write_text(json.dumps(varying_samples([12, 40, 96, 12, 25])))
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            model_file=str(model),
            input_data=str(data),
            output=str(tmp_path),
            concurrency=[2],
            measurement=Measurement(window_s=0.5, stability_percentage=50),
        ),
    )
    assert (results["status"] == "ok").all() and list(results["batch_size"]) == [1, 1], results
    (accuracy,) = json.loads((run / "accuracy.json").read_text())
    assert all(o["passed"] for o in accuracy["outputs"])
    sent = json.loads((run / "perf_input.json").read_text())["data"]
    # every sample, in an order whose every prefix spans the file (the first, the last, the middle, ...)
    assert [s["input_ids"]["shape"] for s in sent] == [[12], [25], [96], [40], [12]]
    logs = list((run / "logs" / "perf_analyzer").glob("*.log"))
    assert logs
    for log in logs:
        assert "--shape" not in log.read_text().splitlines()[0]  # the data gives each request's shape
    assert "input_ids [-1] measured as each request at its own shape, [12..96] (median [25]) over 5 samples" in report


def test_what_the_points_were_measured_at_is_labelled_by_content(bert_onnx, tmp_path):
    """The results' shapes and input_data labels: the dynamic dims as measured (none for a fixed-shape model), the
    samples by content whatever file form they came in."""
    from tbench.core.measured import SYNTHETIC, input_data_label, shapes_label

    spec = IoSpec(
        inputs=[
            TensorSpec(name="input_ids", dtype="int64", shape=[-1]),
            TensorSpec(name="x", dtype="float32", shape=[3]),
        ],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[1])],
    )
    assert shapes_label(spec, {"input_ids": [128], "x": [3]}) == "input_ids=128"
    assert shapes_label(spec, {"input_ids": [128]}, varying=("input_ids",)) == "input_ids=varies"
    fixed = IoSpec(inputs=[spec.inputs[1]], outputs=spec.outputs)
    assert shapes_label(fixed, {"x": [3]}) is None and input_data_label(None) == SYNTHETIC
    as_json = tmp_path / "samples.json"
    as_json.write_text(json.dumps(varying_samples([12, 30])))
    given = ModelFileAdapter(str(bert_onnx)).use_input_data(str(as_json)).given_samples
    label = input_data_label(given)
    assert label.startswith("sha256:") and len(label) == len("sha256:") + 16
    other = tmp_path / "other.json"
    other.write_text(json.dumps(varying_samples([12, 31])))
    assert input_data_label(ModelFileAdapter(str(bert_onnx)).use_input_data(str(other)).given_samples) != label
    again = tmp_path / "again.json"  # the same samples, written again: the same label
    again.write_text(json.dumps(varying_samples([12, 30]), indent=2))
    assert input_data_label(ModelFileAdapter(str(bert_onnx)).use_input_data(str(again)).given_samples) == label
